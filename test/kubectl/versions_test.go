package kubectl

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/internal/version"
)

// TestKubectlVersionsSmoke runs a smaller set against every kubectl from
// 1.27 to 1.33: discovery (aggregated v2beta1 or v2), create, apply twice,
// get as table and jsonpath, patch, scale, explain (OpenAPI v3), default
// server-side validation, delete.
func TestKubectlVersionsSmoke(t *testing.T) {
	requireE2E(t, defaultKubectl)
	s := sharedServer(t)
	for _, v := range versionedKubectls {
		t.Run(v, func(t *testing.T) {
			bin := filepath.Join(sdkBin, "kubectl."+v)
			requireE2E(t, bin)
			k := newKC(t, bin, s)
			if out := k.run("version", "-o", "json"); !strings.Contains(out, `"gitVersion": "`+version.KubeGitVersion+`"`) {
				t.Errorf("version: %s", out)
			}
			res := k.run("api-resources", "-o", "name")
			for _, want := range []string{"pods", "deployments.apps", "leases.coordination.k8s.io", "endpointslices.discovery.k8s.io"} {
				if !strings.Contains(res, want+"\n") {
					t.Errorf("api-resources lacks %s", want)
				}
			}
			ns := k.namespace("v" + strings.ReplaceAll(v, ".", "") + "-")
			if out := k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.27", "a"), "-n", ns); !strings.Contains(out, "created") {
				t.Errorf("apply: %q", out)
			}
			if out := k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.28", "a"), "-n", ns); !strings.Contains(out, "configured") {
				t.Errorf("second apply: %q", out)
			}
			if got := k.run("get", "deploy", "web", "-n", ns, "-o", `jsonpath={range .spec.template.spec.containers[*]}{.image};{end}`); got != "nginx:1.28;busybox:1.36;" {
				t.Errorf("images after apply: %q", got)
			}
			table := k.run("get", "deploy", "-n", ns)
			if h := strings.Join(fields(header(table)), " "); h != "NAME READY UP-TO-DATE AVAILABLE AGE" {
				t.Errorf("table header = %q", h)
			}
			k.run("patch", "deploy", "web", "-n", ns, "-p", `{"metadata":{"labels":{"patched":"yes"}}}`)
			k.run("scale", "deploy", "web", "-n", ns, "--replicas=4")
			if got := k.run("get", "deploy", "web", "-n", ns, "-o", "jsonpath={.spec.replicas} {.metadata.labels.patched}"); got != "4 yes" {
				t.Errorf("after patch and scale: %q", got)
			}
			if out := k.run("explain", "deployment.spec.replicas"); !strings.Contains(out, "replicas") || !strings.Contains(out, "<integer>") {
				t.Errorf("explain: %s", out)
			}
			errOut := k.fails(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bad"},"datax":{}}`, "create", "-n", ns, "-f", "-")
			if !strings.Contains(errOut, `unknown field "datax"`) {
				t.Errorf("validation: %q", errOut)
			}
			if out := k.run("delete", "deploy", "web", "-n", ns, "--wait=true"); !strings.Contains(out, "deleted") {
				t.Errorf("delete: %q", out)
			}
		})
	}
}
