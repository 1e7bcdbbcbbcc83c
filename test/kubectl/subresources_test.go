package kubectl

import (
	"strings"
	"testing"
)

// TestDebugAndComponentStatusesWithKubectl: `kubectl debug` adds an
// ephemeral container through pods/ephemeralcontainers (the pod's other
// fields untouched), and `kubectl get componentstatuses` prints kubectl's
// columns with etcd healthy.
func TestDebugAndComponentStatusesWithKubectl(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("debug-")
	k.run("run", "target", "-n", ns, "--image=busybox:1.36", "--restart=Never", "--", "sleep", "3600")
	out := k.run("debug", "target", "-n", ns, "--image=busybox:1.36", "--target=target", "--container=dbg", "--", "sh")
	if !strings.Contains(out, "dbg") && out != "" {
		t.Logf("kubectl debug: %s", out)
	}
	got := k.run("get", "pod", "target", "-n", ns, "-o", `jsonpath={.spec.ephemeralContainers[0].name} {.spec.ephemeralContainers[0].targetContainerName} {.spec.containers[0].image}`)
	if got != "dbg target busybox:1.36" {
		t.Errorf("after kubectl debug: %q", got)
	}
	table := k.run("get", "componentstatuses")
	if h := strings.Join(fields(header(table)), " "); h != "NAME STATUS MESSAGE ERROR" {
		t.Errorf("componentstatuses header %q\n%s", h, table)
	}
	if !strings.Contains(table, "etcd-0") || !strings.Contains(table, "Healthy") {
		t.Errorf("componentstatuses:\n%s", table)
	}
}
