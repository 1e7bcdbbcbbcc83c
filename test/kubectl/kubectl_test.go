package kubectl

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
)

func TestAPIResourcesListsTheCatalog(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	out := k.run("api-resources")
	if h := fields(header(out)); strings.Join(h, " ") != "NAME SHORTNAMES APIVERSION NAMESPACED KIND" {
		t.Errorf("header = %q", h)
	}
	for _, r := range catalog.All() {
		if r.StoredAs != nil && r.StoredAs.Group == r.Group {
			continue // a second version of its group (autoscaling/v1): api-resources lists the preferred one
		}
		var row []string
		for _, l := range strings.Split(out, "\n") {
			if f := fields(l); len(f) >= 4 && f[0] == r.Resource && f[len(f)-3] == r.GroupVersion().String() {
				row = f
			}
		}
		if row == nil {
			t.Errorf("api-resources has no %s row for %s", r.Resource, r.GroupVersion())
			continue
		}
		if row[len(row)-1] != r.Kind || row[len(row)-2] != fmt.Sprint(r.Namespaced) || row[len(row)-3] != r.GroupVersion().String() {
			t.Errorf("%s row = %q", r.Resource, row)
		}
		if len(r.ShortNames) > 0 && row[1] != strings.Join(r.ShortNames, ",") {
			t.Errorf("%s short names = %q, want %q", r.Resource, row[1], r.ShortNames)
		}
	}
	wide := k.run("api-resources", "-o", "wide", "--api-group=apps")
	dep := rowOf(t, wide, "deployments")
	verbs := strings.Join(dep, " ")
	if !strings.Contains(verbs, "create,delete,deletecollection,get,list,patch,update,watch") && !strings.Contains(verbs, "[create delete deletecollection get list patch update watch]") || dep[len(dep)-1] != "all" {
		t.Errorf("apps wide row = %q", dep)
	}
	versions := k.run("api-versions")
	for _, v := range []string{"v1", "apps/v1", "coordination.k8s.io/v1", "discovery.k8s.io/v1"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(v) + `$`).MatchString(versions) {
			t.Errorf("api-versions lacks %s:\n%s", v, versions)
		}
	}
	if out := k.run("get", "ns", "-o", "name"); !strings.Contains(out, "namespace/kube-system") || !strings.Contains(out, "namespace/kube-node-lease") {
		t.Errorf("initial namespaces: %s", out)
	}
}

const deploymentYAML = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web, tier: front}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: %s
        ports:
        - containerPort: 80
        env:
        - {name: MODE, value: "%s"}
      - name: sidecar
        image: busybox:1.36
        command: ["sleep", "infinity"]
`

func TestApplyRepeatedWithChanges(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("apply-")

	if out := k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.27", "a"), "-n", ns); strings.TrimSpace(out) != "deployment.apps/web created" {
		t.Errorf("first apply: %q", out)
	}
	if out := k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.27", "a"), "-n", ns); strings.TrimSpace(out) != "deployment.apps/web unchanged" {
		t.Errorf("same apply: %q", out)
	}
	gen1 := k.run("get", "deploy", "web", "-n", ns, "-o", "jsonpath={.metadata.generation}")

	// A change to the image and env: configured, both containers kept
	// (strategic merge by name), generation bumped.
	if out := k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.28", "b"), "-n", ns); strings.TrimSpace(out) != "deployment.apps/web configured" {
		t.Errorf("changed apply: %q", out)
	}
	got := k.run("get", "deploy", "web", "-n", ns, "-o",
		`jsonpath={range .spec.template.spec.containers[*]}{.name}={.image};{end}{.spec.template.spec.containers[0].env[0].value}`)
	if got != "web=nginx:1.28;sidecar=busybox:1.36;b" {
		t.Errorf("after apply: %q", got)
	}
	gen2 := k.run("get", "deploy", "web", "-n", ns, "-o", "jsonpath={.metadata.generation}")
	if gen1 == gen2 {
		t.Errorf("generation not bumped by a spec change: %s -> %s", gen1, gen2)
	}

	// Removing the sidecar and a label in the file removes them from the
	// object (three-way merge with last-applied-configuration).
	noSidecar := strings.Replace(fmt.Sprintf(deploymentYAML, "nginx:1.28", "b"), "      - name: sidecar\n        image: busybox:1.36\n        command: [\"sleep\", \"infinity\"]\n", "", 1)
	noSidecar = strings.Replace(noSidecar, "labels: {app: web, tier: front}", "labels: {app: web}", 1)
	k.apply(noSidecar, "-n", ns)
	got = k.run("get", "deploy", "web", "-n", ns, "-o", `jsonpath={range .spec.template.spec.containers[*]}{.name};{end}{.metadata.labels}`)
	if got != `web;{"app":"web"}` {
		t.Errorf("after removing sidecar and label: %q", got)
	}
	// Changes made by others (kubectl scale) survive an apply that does not
	// mention them... replicas is in the file, so apply sets it back.
	k.run("scale", "deploy", "web", "-n", ns, "--replicas=5")
	k.apply(noSidecar, "-n", ns)
	if r := k.run("get", "deploy", "web", "-n", ns, "-o", "jsonpath={.spec.replicas}"); r != "2" {
		t.Errorf("replicas after re-apply = %s, want 2", r)
	}
	if a := k.run("get", "deploy", "web", "-n", ns, "-o", `jsonpath={.metadata.annotations.kubectl\.kubernetes\.io/last-applied-configuration}`); !strings.Contains(a, `"nginx:1.28"`) {
		t.Errorf("last-applied-configuration = %q", a)
	}
}

func TestGetOutputFormatsAndSelectors(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("get-")
	for i, env := range []string{"prod", "prod", "dev"} {
		k.run("create", "configmap", fmt.Sprintf("cm-%d", i), "-n", ns, "--from-literal=k=v", fmt.Sprintf("--from-literal=i=%d", i))
		k.run("label", "configmap", fmt.Sprintf("cm-%d", i), "-n", ns, "env="+env)
	}

	table := k.run("get", "configmaps", "-n", ns)
	if h := strings.Join(fields(header(table)), " "); h != "NAME DATA AGE" {
		t.Errorf("configmap header = %q\n%s", h, table)
	}
	if row := rowOf(t, table, "cm-1"); row[1] != "2" {
		t.Errorf("cm-1 row = %q", row)
	}

	// Label columns come from the rows' PartialObjectMetadata; --sort-by
	// from the rows' full objects (includeObject=Object).
	labelled := k.run("get", "configmaps", "-n", ns, "-L", "env", "--show-labels")
	if h := strings.Join(fields(header(labelled)), " "); h != "NAME DATA AGE ENV LABELS" {
		t.Errorf("-L/--show-labels header = %q", h)
	}
	if row := rowOf(t, labelled, "cm-2"); row[3] != "dev" || row[4] != "env=dev" {
		t.Errorf("-L/--show-labels row = %q", row)
	}
	sorted := k.run("get", "configmaps", "-n", ns, "--sort-by=.metadata.labels.env", "--no-headers")
	var order []string
	for _, l := range strings.Split(strings.TrimSpace(sorted), "\n") {
		order = append(order, fields(l)[0])
	}
	if o := strings.Join(order, ","); o != "cm-2,cm-0,cm-1" && o != "cm-2,cm-1,cm-0" {
		t.Errorf("--sort-by order = %q", order)
	}

	var obj map[string]any
	if err := json.Unmarshal([]byte(k.run("get", "cm", "cm-0", "-n", ns, "-o", "json")), &obj); err != nil {
		t.Fatal(err)
	}
	md := obj["metadata"].(map[string]any)
	if obj["kind"] != "ConfigMap" || obj["apiVersion"] != "v1" || md["uid"] == "" || md["resourceVersion"] == "" || md["creationTimestamp"] == nil {
		t.Errorf("-o json = %v", obj)
	}
	y := k.run("get", "cm", "cm-0", "-n", ns, "-o", "yaml")
	for _, want := range []string{"apiVersion: v1", "kind: ConfigMap", "  name: cm-0", "  namespace: " + ns, "  k: v", "    env: prod"} {
		if !strings.Contains(y, want+"\n") {
			t.Errorf("-o yaml lacks %q:\n%s", want, y)
		}
	}

	names := func(t *testing.T, args ...string) string {
		return strings.TrimSpace(k.with(t).run(append([]string{"get", "cm", "-n", ns, "-o", "name"}, args...)...))
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"label equality", []string{"-l", "env=prod"}, "configmap/cm-0\nconfigmap/cm-1"},
		{"label inequality", []string{"-l", "env!=prod"}, "configmap/cm-2"},
		{"label set", []string{"-l", "env in (dev,qa)"}, "configmap/cm-2"},
		{"label exists", []string{"-l", "env"}, "configmap/cm-0\nconfigmap/cm-1\nconfigmap/cm-2"},
		{"label absent", []string{"-l", "!env"}, ""},
		{"field name", []string{"--field-selector", "metadata.name=cm-1"}, "configmap/cm-1"},
		{"field name inequality", []string{"--field-selector", "metadata.name!=cm-1"}, "configmap/cm-0\nconfigmap/cm-2"},
		{"field and label", []string{"--field-selector", "metadata.namespace=" + ns, "-l", "env=dev"}, "configmap/cm-2"},
		{"chunked list", []string{"--chunk-size=1"}, "configmap/cm-0\nconfigmap/cm-1\nconfigmap/cm-2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := names(t, tc.args...); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}

	jp := k.run("get", "cm", "-n", ns, "-l", "env=prod", "-o", `jsonpath={range .items[*]}{.metadata.name}:{.data.i} {end}`)
	if jp != "cm-0:0 cm-1:1 " {
		t.Errorf("jsonpath = %q", jp)
	}
	cc := k.run("get", "cm", "-n", ns, "-o", "custom-columns=N:.metadata.name,ENV:.metadata.labels.env", "--sort-by=.metadata.name")
	if !strings.Contains(cc, "cm-2   dev") {
		t.Errorf("custom-columns:\n%s", cc)
	}

	all := k.run("get", "configmaps", "-A")
	if h := strings.Join(fields(header(all)), " "); h != "NAMESPACE NAME DATA AGE" {
		t.Errorf("-A header = %q", h)
	}
	if !regexp.MustCompile(`(?m)^` + ns + `\s+cm-2\s+2\s`).MatchString(all) {
		t.Errorf("-A lacks %s/cm-2:\n%s", ns, all)
	}

	errOut := k.fails("", "get", "cm", "nope", "-n", ns)
	if !strings.Contains(errOut, `configmaps "nope" not found`) {
		t.Errorf("missing object: %q", errOut)
	}
	errOut = k.fails("", "get", "cm", "-n", ns, "--field-selector", "data.k=v")
	if !strings.Contains(errOut, "field label not supported") && !strings.Contains(errOut, "BadRequest") {
		t.Errorf("unsupported field selector: %q", errOut)
	}
}

// TestTablesHaveKubectlColumns creates one object of every resource and
// checks `kubectl get` prints kube-apiserver's columns for it.
func TestTablesHaveKubectlColumns(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("tables-")
	node := "e2e-" + ns
	k.apply(fmt.Sprintf(allKindsYAML, node), "-n", ns)

	cases := []struct {
		resource string
		name     string
		wide     bool
		header   string
		row      string // regexp on the object's line
	}{
		{"pods", "p1", false, "NAME READY STATUS RESTARTS AGE", `^p1\s+0/1\s+Pending\s+0\s+\S+$`},
		{"pods", "p1", true, "NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE READINESS GATES", `^p1\s+0/1\s+Pending\s+0\s+\S+\s+<none>\s+<none>\s+<none>\s+<none>$`},
		{"services", "web", false, "NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE", `^web\s+NodePort\s+10\.\d+\.\d+\.\d+\s+<none>\s+80:3\d{4}/TCP\s+\S+$`},
		{"services", "web", true, "NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE SELECTOR", `\s+app=web$`},
		{"deployments", "d1", false, "NAME READY UP-TO-DATE AVAILABLE AGE", `^d1\s+\d+/3\s+\d+\s+\d+\s+\S+$`},
		{"deployments", "d1", true, "NAME READY UP-TO-DATE AVAILABLE AGE CONTAINERS IMAGES SELECTOR", `\s+c\s+nginx:1\.27\s+app=d1$`},
		{"replicasets", "rs1", false, "NAME DESIRED CURRENT READY AGE", `^rs1\s+2\s+\d+\s+\d+\s+\S+$`},
		{"daemonsets", "ds1", false, "NAME DESIRED CURRENT READY UP-TO-DATE AVAILABLE NODE SELECTOR AGE", `^ds1\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+disk=ssd\s+\S+$`},
		{"nodes", node, false, "NAME STATUS ROLES AGE VERSION", `^` + node + `\s+Ready\s+worker\s+\S+\s+v1\.32\.3-waggle$`},
		{"nodes", node, true, "NAME STATUS ROLES AGE VERSION INTERNAL-IP EXTERNAL-IP OS-IMAGE KERNEL-VERSION CONTAINER-RUNTIME", `\s+192\.0\.2\.7\s+<none>\s+Debian\s`},
		{"namespaces", ns, false, "NAME STATUS AGE", `^` + ns + `\s+Active\s+\S+$`},
		{"endpoints", "web", false, "NAME ENDPOINTS AGE", `^web\s+10\.244\.0\.5:8080\s+\S+$`},
		{"endpointslices", "web-1", false, "NAME ADDRESSTYPE PORTS ENDPOINTS AGE", `^web-1\s+IPv4\s+8080\s+10\.244\.0\.5\s+\S+$`},
		{"events", "", false, "LAST SEEN TYPE REASON OBJECT MESSAGE", `\s+Warning\s+BackOff\s+pod/p1\s+Back-off restarting$`},
		{"configmaps", "cm", false, "NAME DATA AGE", `^cm\s+2\s+\S+$`},
		{"secrets", "s", false, "NAME TYPE DATA AGE", `^s\s+Opaque\s+1\s+\S+$`},
		{"serviceaccounts", "robot", false, "NAME SECRETS AGE", `^robot\s+0\s+\S+$`},
		{"leases", "l1", false, "NAME HOLDER AGE", `^l1\s+me\s+\S+$`},
	}
	for _, tc := range cases {
		name := tc.resource
		if tc.wide {
			name += "-wide"
		}
		t.Run(name, func(t *testing.T) {
			k := k.with(t)
			args := []string{"get", tc.resource, "-n", ns}
			if tc.name != "" {
				args = append(args, tc.name)
			}
			if tc.wide {
				args = append(args, "-o", "wide")
			}
			out := k.run(args...)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if h := strings.Join(fields(lines[0]), " "); h != tc.header {
				t.Errorf("header = %q, want %q", h, tc.header)
			}
			re := regexp.MustCompile(tc.row)
			found := false
			for _, l := range lines[1:] {
				if re.MatchString(strings.TrimSpace(l)) {
					found = true
				}
			}
			if !found {
				t.Errorf("no row matches %s:\n%s", tc.row, out)
			}
		})
	}
	k.run("delete", "node", node, "--wait=true")
}

const nodeYAML = `apiVersion: v1
kind: Node
metadata:
  name: %s
  labels: {node-role.kubernetes.io/worker: ""}
status:
  conditions:
  - {type: Ready, status: "True", reason: KubeletReady, message: ready, lastHeartbeatTime: "2026-01-01T00:00:00Z", lastTransitionTime: "2026-01-01T00:00:00Z"}
  addresses:
  - {type: InternalIP, address: 192.0.2.7}
  nodeInfo: {kubeletVersion: v1.32.3-waggle, osImage: Debian GNU/Linux 12, kernelVersion: "6.1", containerRuntimeVersion: containerd://1.6, machineID: m, systemUUID: s, bootID: b, kubeProxyVersion: v1.32.3, operatingSystem: linux, architecture: amd64}
`

const allKindsYAML = `apiVersion: v1
kind: Pod
metadata: {name: p1, labels: {app: web}}
spec:
  containers:
  - {name: c, image: nginx:1.27}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Endpoints
metadata: {name: web}
subsets:
- addresses: [{ip: 10.244.0.5}]
  ports: [{port: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.244.0.5]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d1}
spec:
  replicas: 3
  selector: {matchLabels: {app: d1}}
  template:
    metadata: {labels: {app: d1}}
    spec:
      containers: [{name: c, image: nginx:1.27}]
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: rs1}
spec:
  replicas: 2
  selector: {matchLabels: {app: rs1}}
  template:
    metadata: {labels: {app: rs1}}
    spec:
      containers: [{name: c, image: nginx:1.27}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ds1}
spec:
  selector: {matchLabels: {app: ds1}}
  template:
    metadata: {labels: {app: ds1}}
    spec:
      nodeSelector: {disk: ssd}
      containers: [{name: c, image: nginx:1.27}]
---
` + nodeYAML + `---
apiVersion: v1
kind: Event
metadata: {name: p1.1}
involvedObject: {kind: Pod, name: p1}
reason: BackOff
message: Back-off restarting
type: Warning
count: 3
firstTimestamp: "2026-01-01T00:00:00Z"
lastTimestamp: "2026-01-01T00:01:00Z"
source: {component: kubelet}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
data: {a: "1", b: "2"}
---
apiVersion: v1
kind: Secret
metadata: {name: s}
type: Opaque
stringData: {password: hunter2}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: robot}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: l1}
spec: {holderIdentity: me, leaseDurationSeconds: 40}
`

func TestPatchLabelAnnotateScaleReplace(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("patch-")
	k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.27", "a"), "-n", ns)
	get := func(jp string) string { return k.run("get", "deploy", "web", "-n", ns, "-o", "jsonpath="+jp) }

	// Strategic merge patch: containers merge by name.
	k.run("patch", "deploy", "web", "-n", ns, "-p", `{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"busybox:1.37"}]}}}}`)
	if got := get(`{range .spec.template.spec.containers[*]}{.name}={.image};{end}`); got != "web=nginx:1.27;sidecar=busybox:1.37;" {
		t.Errorf("strategic patch: %q", got)
	}
	// JSON merge patch: lists are replaced whole.
	k.run("patch", "deploy", "web", "-n", ns, "--type=merge", "-p", `{"metadata":{"labels":{"tier":null,"merged":"yes"}}}`)
	if got := get(`{.metadata.labels}`); got != `{"app":"web","merged":"yes"}` {
		t.Errorf("merge patch labels: %q", got)
	}
	// JSON patch.
	k.run("patch", "deploy", "web", "-n", ns, "--type=json", "-p", `[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"nginx:1.29"},{"op":"add","path":"/metadata/annotations/jp","value":"1"}]`)
	if got := get(`{.spec.template.spec.containers[0].image} {.metadata.annotations.jp}`); got != "nginx:1.29 1" {
		t.Errorf("json patch: %q", got)
	}
	// A failing JSON patch test op changes nothing.
	errOut := k.fails("", "patch", "deploy", "web", "-n", ns, "--type=json", "-p", `[{"op":"test","path":"/spec/replicas","value":99},{"op":"replace","path":"/spec/replicas","value":7}]`)
	if got := get(`{.spec.replicas}`); got != "2" || errOut == "" {
		t.Errorf("failed json patch changed replicas to %s (stderr %q)", got, errOut)
	}
	// kubectl patch sends no fieldValidation: the server's default (Warn)
	// applies the patch, drops the unknown field and warns.
	out, errOut, err := k.try("", "patch", "deploy", "web", "-n", ns, "--type=merge", "-p", `{"spec":{"replicaz":3}}`)
	if err != nil || !strings.Contains(errOut, "Warning: unknown field") || !strings.Contains(errOut, "spec.replicaz") {
		t.Errorf("patch with unknown field: err %v, stdout %q, stderr %q (want a Warning)", err, out, errOut)
	}

	// label / annotate.
	k.run("label", "deploy", "web", "-n", ns, "team=blue")
	errOut = k.fails("", "label", "deploy", "web", "-n", ns, "team=red")
	if !strings.Contains(errOut, "already has a value (blue)") {
		t.Errorf("label without --overwrite: %q", errOut)
	}
	k.run("label", "deploy", "web", "-n", ns, "team=red", "--overwrite")
	k.run("label", "deploy", "web", "-n", ns, "merged-")
	k.run("annotate", "deploy", "web", "-n", ns, "note=hello world")
	if got := get(`{.metadata.labels.team} {.metadata.labels.merged} {.metadata.annotations.note}`); got != "red  hello world" {
		t.Errorf("labels/annotations: %q", got)
	}
	if out := k.run("get", "deploy", "-n", ns, "-l", "team=red", "-o", "name"); strings.TrimSpace(out) != "deployment.apps/web" {
		t.Errorf("selector after relabel: %q", out)
	}

	// scale, through the scale subresource.
	k.run("scale", "deploy", "web", "-n", ns, "--replicas=5")
	if got := get(`{.spec.replicas}`); got != "5" {
		t.Errorf("replicas after scale = %s", got)
	}
	errOut = k.fails("", "scale", "deploy", "web", "-n", ns, "--replicas=6", "--current-replicas=3")
	if got := get(`{.spec.replicas}`); got != "5" || !strings.Contains(errOut, "Expected replicas to be 3") {
		t.Errorf("conditional scale: replicas %s, stderr %q", got, errOut)
	}

	// replace with the current object, then with a stale one.
	cur := k.run("get", "deploy", "web", "-n", ns, "-o", "yaml")
	edited := strings.Replace(cur, "image: nginx:1.29", "image: nginx:1.30", 1)
	k.run("annotate", "deploy", "web", "-n", ns, "bump=1") // makes cur stale
	errOut = k.fails(edited, "replace", "-f", "-")
	if !strings.Contains(errOut, "the object has been modified") {
		t.Errorf("stale replace: %q", errOut)
	}
	fresh := strings.Replace(k.run("get", "deploy", "web", "-n", ns, "-o", "yaml"), "image: nginx:1.29", "image: nginx:1.30", 1)
	if out, errOut, err := k.try(fresh, "replace", "-f", "-"); err != nil || strings.TrimSpace(out) != "deployment.apps/web replaced" {
		t.Errorf("replace: %q %q %v", out, errOut, err)
	}
	if got := get(`{.spec.template.spec.containers[0].image}`); got != "nginx:1.30" {
		t.Errorf("image after replace = %s", got)
	}
}

func TestDescribe(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("describe-")
	k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.27", "a"), "-n", ns)
	k.run("create", "service", "clusterip", "web", "-n", ns, "--tcp=80:8080")
	k.run("run", "solo", "-n", ns, "--image=busybox:1.36", "--labels=app=solo")
	node := "describe-" + ns
	k.apply(fmt.Sprintf(nodeYAML, node))
	t.Cleanup(func() { k.try("", "delete", "node", node) })
	k.apply(fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: pinned}\nspec:\n  nodeName: %s\n  containers: [{name: c, image: i}]\n", node), "-n", ns)

	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"deployment", "web"}, []string{"Name:", "web", "Namespace:", ns, "Selector:", "app=web", "Replicas:", "2 desired", "StrategyType:", "RollingUpdate", "Image:", "nginx:1.27", "MODE:", "a"}},
		{[]string{"service", "web"}, []string{"Name:", "web", "Type:", "ClusterIP", "IP:", "Port:", "80/TCP", "TargetPort:", "8080/TCP"}},
		{[]string{"pod", "solo"}, []string{"Name:", "solo", "Labels:", "app=solo", "Status:", "Pending", "Image:", "busybox:1.36"}},
		{[]string{"namespace", ns}, []string{"Name:", ns, "Status:", "Active"}},
		{[]string{"node", node}, []string{"Name:", node, "Roles:", "worker", "Conditions:", "Ready", "InternalIP:", "192.0.2.7", "Non-terminated Pods:", "(1 in total)", "pinned"}},
	}
	for _, tc := range cases {
		t.Run(tc.args[0], func(t *testing.T) {
			k := k.with(t)
			out := k.run(append([]string{"describe", "-n", ns}, tc.args...)...)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("describe %v lacks %q:\n%s", tc.args, w, out)
				}
			}
		})
	}
}

func TestWatchSeesAddModifyDelete(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("watch-")
	k.run("create", "configmap", "before", "-n", ns, "--from-literal=a=1")

	w := k.watch(60*time.Second, "get", "configmaps", "-n", ns, "-w", "--output-watch-events", "--request-timeout=0")
	w.expect(t, 20*time.Second, "ADDED", "before")
	k.run("create", "configmap", "live", "-n", ns, "--from-literal=a=1")
	w.expect(t, 20*time.Second, "ADDED", "live")
	k.run("label", "configmap", "live", "-n", ns, "x=y")
	w.expect(t, 20*time.Second, "MODIFIED", "live")
	k.run("delete", "configmap", "live", "-n", ns)
	w.expect(t, 20*time.Second, "DELETED", "live")

	// A label-selector watch: objects move in and out as ADDED / DELETED.
	ws := k.watch(60*time.Second, "get", "configmaps", "-n", ns, "-w", "-l", "sel=yes", "--output-watch-events")
	k.run("label", "configmap", "before", "-n", ns, "sel=yes")
	ws.expect(t, 20*time.Second, "ADDED", "before")
	k.run("label", "configmap", "before", "-n", ns, "sel=no", "--overwrite")
	ws.expect(t, 20*time.Second, "DELETED", "before")

	// A watch with a timeout ends by itself.
	start := time.Now()
	out := k.run("get", "configmaps", "-n", ns, "-w", "--request-timeout=3s", "-o", "name")
	if !strings.Contains(out, "configmap/before") {
		t.Errorf("timed watch output: %q", out)
	}
	if time.Since(start) > 50*time.Second {
		t.Errorf("watch with --request-timeout=3s did not end")
	}
}

func TestDeleteWaitAndNotFound(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("delete-")
	k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.27", "a"), "-n", ns)
	k.run("create", "configmap", "a", "-n", ns)
	k.run("create", "configmap", "b", "-n", ns)
	k.run("create", "configmap", "c", "-n", ns)
	k.run("label", "configmap", "b", "c", "-n", ns, "group=bc")

	if out := k.run("delete", "configmap", "a", "-n", ns, "--wait=true"); strings.TrimSpace(out) != `configmap "a" deleted` {
		t.Errorf("delete: %q", out)
	}
	if errOut := k.fails("", "get", "configmap", "a", "-n", ns); !strings.Contains(errOut, "NotFound") {
		t.Errorf("get after delete: %q", errOut)
	}
	// deletecollection by label.
	k.run("delete", "configmaps", "-n", ns, "-l", "group=bc", "--wait=true")
	if out := k.run("get", "configmaps", "-n", ns, "-o", "name"); strings.Contains(out, "configmap/b") || strings.Contains(out, "configmap/c") {
		t.Errorf("after delete -l: %q", out)
	}
	// Background cascade (the default); foreground would wait for the
	// garbage collector of the controller-manager, which is not running.
	if out := k.run("delete", "deployment", "web", "-n", ns, "--wait=true", "--timeout=60s"); !strings.Contains(out, `"web" deleted`) {
		t.Errorf("delete deployment: %q", out)
	}
	if errOut := k.fails("", "delete", "configmap", "a", "-n", ns); !strings.Contains(errOut, "NotFound") {
		t.Errorf("deleting a missing object: %q", errOut)
	}
	if out := k.run("delete", "configmap", "a", "-n", ns, "--ignore-not-found"); strings.TrimSpace(out) != "" {
		t.Errorf("--ignore-not-found: %q", out)
	}
	// A namespace is finalized by the controller-manager's namespace
	// controller; the API server alone marks it Terminating.
	k.run("delete", "namespace", ns, "--wait=false")
	if out, errOut, err := k.try("", "get", "namespace", ns, "--no-headers"); err == nil && !strings.Contains(out, "Terminating") || err != nil && !strings.Contains(errOut, "NotFound") {
		t.Errorf("namespace after delete: %q %q", out, errOut)
	}
}

func TestExplainUsesServerOpenAPI(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	cases := []struct {
		path string
		want []string
	}{
		{"pods", []string{"KIND:       Pod", "VERSION:    v1", "spec\t<PodSpec>", "status\t<PodStatus>"}},
		{"pods.spec.containers", []string{"FIELD: containers <[]Container>", "image\t<string>", "name\t<string> -required-"}},
		{"deployment.spec.strategy.rollingUpdate.maxSurge", []string{"GROUP:      apps", "FIELD: maxSurge <IntOrString>"}},
		{"svc.spec.ports.targetPort", []string{"FIELD: targetPort <IntOrString>"}},
		{"lease.spec", []string{"GROUP:      coordination.k8s.io", "holderIdentity\t<string>"}},
		{"endpointslices", []string{"GROUP:      discovery.k8s.io", "addressType\t<string> -required-"}},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			k := k.with(t)
			out := k.run("explain", tc.path)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("explain %s lacks %q:\n%s", tc.path, w, out)
				}
			}
		})
	}
	// The OpenAPI v2 document, through kubectl's older explain.
	v2 := k.run("explain", "deploy.spec.strategy", "--output=plaintext-openapiv2")
	for _, w := range []string{"KIND:     Deployment", "VERSION:  apps/v1", "RESOURCE: strategy <Object>", "rollingUpdate\t<Object>"} {
		if !strings.Contains(v2, w) {
			t.Errorf("explain (openapi v2) lacks %q:\n%s", w, v2)
		}
	}
	if errOut := k.fails("", "explain", "pods.spec.nope"); !strings.Contains(errOut, "nope") {
		t.Errorf("explain of a missing field: %q", errOut)
	}
}

func TestDefaultValidationRefusesBadObjects(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("valid-")
	cases := []struct {
		name     string
		manifest string
		verb     []string
		want     string
		object   []string // kubectl get args that must then fail with NotFound
	}{
		{"unknown field on create", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"u1"},"datax":{"a":"b"}}`, []string{"create", "-f", "-"},
			`strict decoding error: unknown field "datax"`, []string{"configmap", "u1"}},
		{"unknown nested field on apply", "apiVersion: v1\nkind: Pod\nmetadata: {name: u2}\nspec:\n  containers:\n  - {name: c, image: i, imagePullPolic: Always}\n", []string{"apply", "-f", "-"},
			`unknown field "spec.containers[0].imagePullPolic"`, []string{"pod", "u2"}},
		{"invalid name", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"}}`, []string{"create", "-f", "-"},
			`Invalid value: "Bad_Name"`, []string{"configmap", "Bad_Name"}},
		{"invalid port", "apiVersion: v1\nkind: Service\nmetadata: {name: u5}\nspec:\n  ports: [{port: 70000}]\n", []string{"create", "-f", "-"},
			`spec.ports[0].port`, []string{"service", "u5"}},
		{"wrong type", `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"u6"},"spec":{"replicas":"three"}}`, []string{"create", "-f", "-"},
			`replicas`, []string{"deployment", "u6"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := k.with(t)
			errOut := k.fails(tc.manifest, append(tc.verb, "-n", ns)...)
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q lacks %q", errOut, tc.want)
			}
			if getErr := k.fails("", append([]string{"get", "-n", ns}, tc.object...)...); !strings.Contains(getErr, "NotFound") && !strings.Contains(getErr, "not found") {
				t.Errorf("object stored after refusal: %q", getErr)
			}
		})
	}
	// Size limits: an object over 1.5 MiB and a body over 3 MiB are
	// refused and nothing is stored.
	for name, size := range map[string]int{"big-object": 2 << 20, "big-body": 4 << 20} {
		data := filepath.Join(t.TempDir(), "data.txt")
		if err := os.WriteFile(data, []byte(strings.Repeat("x", size)), 0o600); err != nil {
			t.Fatal(err)
		}
		errOut := k.fails("", "create", "configmap", name, "-n", ns, "--from-file=data="+data)
		if !strings.Contains(errOut, "too large") {
			t.Errorf("%s: %q", name, errOut)
		}
		if getErr := k.fails("", "get", "configmap", name, "-n", ns); !strings.Contains(getErr, "NotFound") {
			t.Errorf("%s stored after refusal: %q", name, getErr)
		}
	}

	// --validate=false lets the unknown field through and drops it.
	k.run("create", "-n", ns, "--validate=false", "-f", filepath.Join(writeTemp(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"lax"},"datax":{"a":"b"}}`)))
	if out := k.run("get", "configmap", "lax", "-n", ns, "-o", "json"); strings.Contains(out, "datax") {
		t.Errorf("unknown field stored: %s", out)
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "obj.json")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServicesGetAddressesAndPorts(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("svc-")
	k.run("create", "service", "clusterip", "a", "-n", ns, "--tcp=80:8080")
	k.run("create", "service", "nodeport", "b", "-n", ns, "--tcp=443:8443")
	k.run("create", "service", "clusterip", "h", "-n", ns, "--clusterip=None")
	out := k.run("get", "svc", "-n", ns)
	a, b, h := rowOf(t, out, "a"), rowOf(t, out, "b"), rowOf(t, out, "h")
	_, svcNet, _ := net.ParseCIDR("10.96.0.0/12")
	for _, r := range [][]string{a, b} {
		if ip := net.ParseIP(r[2]); ip == nil || !svcNet.Contains(ip) {
			t.Errorf("cluster IP %q not in 10.96.0.0/12", r[2])
		}
	}
	if a[2] == b[2] {
		t.Errorf("two services share %s", a[2])
	}
	if a[4] != "80/TCP" || !regexp.MustCompile(`^443:3\d{4}/TCP$`).MatchString(b[4]) || h[2] != "None" {
		t.Errorf("rows: %q %q %q", a, b, h)
	}
	errOut := k.fails(fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: dup}\nspec:\n  clusterIP: %s\n  ports: [{port: 80}]\n", a[2]), "create", "-n", ns, "-f", "-")
	if !strings.Contains(errOut, "already allocated") && !strings.Contains(errOut, "Invalid") {
		t.Errorf("duplicate clusterIP: %q", errOut)
	}
}

func TestPodFieldSelectors(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("fsel-")
	k.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: on-n1}\nspec:\n  nodeName: n1\n  containers: [{name: c, image: i}]\n---\n"+
		"apiVersion: v1\nkind: Pod\nmetadata: {name: unscheduled}\nspec:\n  containers: [{name: c, image: i}]\n", "-n", ns)
	cases := []struct{ sel, want string }{
		{"spec.nodeName=n1", "pod/on-n1"},
		{"spec.nodeName=", "pod/unscheduled"},
		{"spec.nodeName!=n1", "pod/unscheduled"},
		{"status.phase=Pending", "pod/on-n1\npod/unscheduled"},
		{"status.phase!=Pending", ""},
		{"spec.schedulerName=default-scheduler", "pod/on-n1\npod/unscheduled"},
		{"metadata.name=on-n1,spec.nodeName=n1", "pod/on-n1"},
	}
	for _, tc := range cases {
		t.Run(tc.sel, func(t *testing.T) {
			k := k.with(t)
			if got := strings.TrimSpace(k.run("get", "pods", "-n", ns, "--field-selector", tc.sel, "-o", "name")); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRestartKeepsEverything stops a server gracefully and starts a new
// one on the same data directory: objects, uids, resourceVersions and the
// CA survive, and kubectl keeps working with the same kubeconfig.
func TestRestartKeepsEverything(t *testing.T) {
	requireE2E(t, defaultKubectl)
	dir := t.TempDir()
	s1, err := startServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	k := newKC(t, defaultKubectl, s1)
	ns := k.namespace("restart-")
	k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.27", "a"), "-n", ns)
	k.run("create", "configmap", "cm", "-n", ns, "--from-literal=a=1")
	k.run("create", "service", "nodeport", "np", "-n", ns, "--tcp=80:80")
	state := func(k *kc) string {
		return k.run("get", "deploy,cm,svc", "-n", ns, "-o",
			`jsonpath={range .items[*]}{.kind}/{.metadata.name} {.metadata.uid} {.metadata.resourceVersion} {.spec.clusterIP} {.spec.ports[0].nodePort}{"\n"}{end}`)
	}
	before := state(k)
	ca1, _ := os.ReadFile(filepath.Join(dir, "pki", "ca.crt"))
	if err := s1.stop(); err != nil {
		t.Fatalf("graceful stop: %v\n%s", err, tail(s1.logs(), 30))
	}

	s2, err := startServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.stop() })
	k2 := newKC(t, defaultKubectl, s2)
	if after := state(k2); after != before {
		t.Errorf("state changed across restart:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	ca2, _ := os.ReadFile(filepath.Join(dir, "pki", "ca.crt"))
	if len(ca1) == 0 || string(ca1) != string(ca2) {
		t.Error("CA changed across restart")
	}
	// Writes work after the restart and new services get new addresses.
	k2.apply(fmt.Sprintf(deploymentYAML, "nginx:1.28", "b"), "-n", ns)
	k2.run("create", "service", "nodeport", "np2", "-n", ns, "--tcp=80:80")
	ips := k2.run("get", "svc", "-n", ns, "-o", `jsonpath={.items[*].spec.clusterIP}`)
	if f := strings.Fields(ips); len(f) != 2 || f[0] == f[1] {
		t.Errorf("cluster IPs after restart: %q", ips)
	}
}

// TestGetAllUsesCategories: `kubectl get all` expands the "all" category
// from discovery.
func TestGetAllUsesCategories(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("all-")
	k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.27", "a"), "-n", ns)
	k.run("create", "service", "clusterip", "web", "-n", ns, "--tcp=80:80")
	k.run("run", "solo", "-n", ns, "--image=busybox:1.36")
	k.run("create", "configmap", "not-in-all", "-n", ns)
	out := k.run("get", "all", "-n", ns, "-o", "name")
	for _, want := range []string{"pod/solo", "service/web", "deployment.apps/web"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("get all lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "configmap") {
		t.Errorf("get all lists configmaps:\n%s", out)
	}
}

// TestDryRunDiffEditGenerateName: server-side dry runs store nothing,
// kubectl diff shows the change it would make (a dry-run patch), kubectl
// edit round-trips through an editor, generateName gets a suffix.
func TestDryRunDiffEditGenerateName(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("dry-")

	out := k.run("create", "configmap", "dry", "-n", ns, "--from-literal=a=1", "--dry-run=server", "-o", "jsonpath={.metadata.name} {.metadata.uid}")
	if !strings.HasPrefix(out, "dry ") || len(out) < len("dry ")+10 {
		t.Errorf("server dry-run create answered %q, want the would-be object with a uid", out)
	}
	if errOut := k.fails("", "get", "configmap", "dry", "-n", ns); !strings.Contains(errOut, "NotFound") {
		t.Errorf("dry-run create stored the object: %q", errOut)
	}

	k.apply(fmt.Sprintf(deploymentYAML, "nginx:1.27", "a"), "-n", ns)
	out, errOut, err := k.try(fmt.Sprintf(deploymentYAML, "nginx:1.28", "a"), "diff", "-n", ns, "-f", "-")
	if err == nil || !strings.Contains(out, "-        image: nginx:1.27") || !strings.Contains(out, "+        image: nginx:1.28") {
		t.Errorf("kubectl diff: err %v (want exit 1)\n%s\n%s", err, out, errOut)
	}
	if got := k.run("get", "deploy", "web", "-n", ns, "-o", "jsonpath={.spec.template.spec.containers[0].image}"); got != "nginx:1.27" {
		t.Errorf("diff changed the object: image %s", got)
	}
	k.run("scale", "deploy", "web", "-n", ns, "--replicas=9", "--dry-run=server")
	if got := k.run("get", "deploy", "web", "-n", ns, "-o", "jsonpath={.spec.replicas}"); got != "2" {
		t.Errorf("dry-run scale stored replicas=%s", got)
	}

	// kubectl edit with a non-interactive editor.
	editor := filepath.Join(t.TempDir(), "editor.sh")
	if err := os.WriteFile(editor, []byte("#!/bin/sh\nsed -i 's/image: nginx:1.27/image: nginx:1.31/' \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := k.cmd(contextWithTimeout(t, 60*time.Second), "", "edit", "deploy", "web", "-n", ns)
	c.Env = append(c.Env, "KUBE_EDITOR="+editor, "EDITOR="+editor)
	if b, err := c.CombinedOutput(); err != nil || !strings.Contains(string(b), "deployment.apps/web edited") {
		t.Errorf("kubectl edit: %v\n%s", err, b)
	}
	if got := k.run("get", "deploy", "web", "-n", ns, "-o", "jsonpath={.spec.template.spec.containers[0].image}"); got != "nginx:1.31" {
		t.Errorf("image after edit = %s", got)
	}

	out = k.run("create", "-n", ns, "-o", "name", "-f", writeTemp(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"gen-"}}`))
	if !regexp.MustCompile(`^configmap/gen-[a-z0-9]{5}\n$`).MatchString(out) {
		t.Errorf("generateName: %q", out)
	}
}
