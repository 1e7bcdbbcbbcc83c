package kubectl

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

const ssaConfigMap = `apiVersion: v1
kind: ConfigMap
metadata:
  name: ssa
data:
%s`

func cmData(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, "  %s: %q\n", kv[i], kv[i+1])
	}
	return fmt.Sprintf(ssaConfigMap, b.String())
}

// TestServerSideApplyWithKubectl: `kubectl apply --server-side` creates and
// updates, a field another manager set is a conflict that names it until
// --force-conflicts, `kubectl diff --server-side` shows the merge without
// storing it, and client-side and server-side apply hand over to each other
// as upstream (kubectl's managedFields migration one way, the server's
// last-applied-configuration upkeep the other).
func TestServerSideApplyWithKubectl(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("ssa-")
	data := func() string { return k.run("get", "cm", "ssa", "-n", ns, "-o", "jsonpath={.data}") }
	mgrs := func() string {
		return k.run("get", "cm", "ssa", "-n", ns, "--show-managed-fields", "-o", `jsonpath={range .metadata.managedFields[*]}{.manager}/{.operation};{end}`)
	}

	// Client-side apply first, then server-side: the client-side manager's
	// fields move to kubectl's apply entry, so b (dropped from the file) goes.
	k.apply(cmData("a", "1", "b", "2"), "-n", ns)
	if out := k.apply(cmData("a", "1", "c", "3"), "-n", ns, "--server-side"); strings.TrimSpace(out) != "configmap/ssa serverside-applied" {
		t.Errorf("server-side apply: %q", out)
	}
	if got := data(); got != `{"a":"1","c":"3"}` {
		t.Errorf("after server-side over client-side apply: data %s", got)
	}
	if got := mgrs(); !strings.Contains(got, "kubectl/Apply;") || strings.Contains(got, "kubectl-client-side-apply") {
		t.Errorf("managers after migration: %s", got)
	}
	// And back: the server kept last-applied-configuration up to date, so a
	// client-side apply without c removes it.
	if la := k.run("get", "cm", "ssa", "-n", ns, "-o", `jsonpath={.metadata.annotations.kubectl\.kubernetes\.io/last-applied-configuration}`); !strings.Contains(la, `"c":"3"`) {
		t.Errorf("last-applied-configuration not kept by server-side apply: %s", la)
	}
	k.apply(cmData("a", "1"), "-n", ns)
	if got := data(); got != `{"a":"1"}` {
		t.Errorf("client-side apply after server-side: data %s", got)
	}

	// A field another manager set is a conflict naming the manager and field.
	k.run("patch", "cm", "ssa", "-n", ns, "--type", "merge", "-p", `{"data":{"a":"patched-again"}}`)
	errOut := k.fails(cmData("a", "1"), "apply", "--server-side", "-n", ns, "-f", "-")
	if !strings.Contains(errOut, `conflict with "kubectl-patch"`) || !strings.Contains(errOut, ".data.a") {
		t.Errorf("conflict: %s", errOut)
	}
	if got := data(); got != `{"a":"patched-again"}` {
		t.Errorf("a conflicting apply changed the object: %s", got)
	}
	// kubectl diff --server-side shows the forced merge and stores nothing.
	out, errOut, err := k.try(cmData("a", "1", "d", "4"), "diff", "--server-side", "--force-conflicts", "-n", ns, "-f", "-")
	if err == nil || !strings.Contains(out, `+  d: "4"`) || !strings.Contains(out, `-  a: patched-again`) {
		t.Errorf("kubectl diff --server-side: err %v (want exit 1)\n%s\n%s", err, out, errOut)
	}
	if got := data(); got != `{"a":"patched-again"}` {
		t.Errorf("diff changed the object: %s", got)
	}
	k.apply(cmData("a", "1"), "-n", ns, "--server-side", "--force-conflicts")
	if got := data(); got != `{"a":"1"}` {
		t.Errorf("after --force-conflicts: %s", got)
	}
	if got := mgrs(); strings.Contains(got, "kubectl-patch") {
		t.Errorf("forced apply left the patcher owning a: %s", got)
	}
}

// TestServerSideApplyWithOlderKubectls: every kubectl 1.27–1.33 applies
// server-side (create, no-op, change) against the current server.
func TestServerSideApplyWithOlderKubectls(t *testing.T) {
	requireE2E(t, defaultKubectl)
	s := sharedServer(t)
	for _, v := range versionedKubectls {
		t.Run(v, func(t *testing.T) {
			bin := filepath.Join(sdkBin, "kubectl."+v)
			requireE2E(t, bin)
			k := newKC(t, bin, s)
			ns := k.namespace("ssa" + strings.ReplaceAll(v, ".", "") + "-")
			for _, img := range []string{"nginx:1.27", "nginx:1.27", "nginx:1.28"} {
				if out := k.apply(fmt.Sprintf(deploymentYAML, img, "a"), "-n", ns, "--server-side"); !strings.Contains(out, "serverside-applied") {
					t.Errorf("apply --server-side: %q", out)
				}
			}
			if got := k.run("get", "deploy", "web", "-n", ns, "-o", `jsonpath={.spec.template.spec.containers[0].image} {.metadata.generation}`); got != "nginx:1.28 2" {
				t.Errorf("after server-side applies: %q (want the new image, generation 2)", got)
			}
		})
	}
}
