package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// testInClusterClientGo checks, from a pod on every node, what client-go's
// in-cluster configuration relies on: the projected kube-api-access volume
// (token, ca.crt, namespace, swapped in through ..data) and the kubernetes
// Service; the pod's ServiceAccount (default) is refused with 403 until a
// RoleBinding grants it, then lists its namespace's pods with its token.
func testInClusterClientGo(t *testing.T, e *env, nodes []string) {
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount"
	for _, n := range nodes {
		pod := "client-" + n
		ls := e.kubectl(t, "exec", pod, "--", "/waggle-echo", "ls", sa)
		for _, f := range []string{"..data", "ca.crt", "namespace", "token"} {
			if !strings.Contains(ls, f+"\n") {
				t.Errorf("%s: %s lacks %s:\n%s", pod, sa, f, ls)
			}
		}
		if ns := e.kubectl(t, "exec", pod, "--", "/waggle-echo", "cat", sa+"/namespace"); ns != "default" {
			t.Errorf("%s: namespace file %q", pod, ns)
		}
		out, err := e.kubectlErr("exec", pod, "--", "/waggle-echo", "list-pods")
		if err == nil || !strings.Contains(out, "status 403") {
			t.Errorf("%s: list-pods without a RoleBinding: want a 403, got %v:\n%s", pod, err, out)
		}
	}
	e.kubectl(t, "create", "rolebinding", "tokens-e2e-view", "--clusterrole=view", "--serviceaccount=default:default", "-n", "default")
	t.Cleanup(func() { e.kubectlErr("delete", "rolebinding", "tokens-e2e-view", "-n", "default") })
	for _, n := range nodes {
		pod := "client-" + n
		eventually(t, 30*time.Second, pod+" lists pods with its token", func() error {
			out, err := e.kubectlErr("exec", pod, "--", "/waggle-echo", "list-pods")
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			if !strings.Contains(out, pod+"\n") {
				return fmt.Errorf("its own pod not listed:\n%s", out)
			}
			return nil
		})
	}
}
