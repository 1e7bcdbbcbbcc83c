package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

const echoHeadless = `
apiVersion: v1
kind: Service
metadata: {name: echo-headless, namespace: default}
spec:
  clusterIP: None
  selector: {app: echo}
  ports:
  - {name: tcp, port: 9000, targetPort: tcp}
`

// testClusterDNS checks, from a pod on every node through the real kubectl,
// what the cluster DNS gives a pod: its resolv.conf, a Service's name (short
// and fully qualified) resolving to the ClusterIP, a headless Service's name
// to its ready pods' addresses, SRV of a named port, and the
// kubernetes Service's environment variables.
func testClusterDNS(t *testing.T, e *env, nodes []string, vip string) {
	e.apply(t, echoHeadless)
	want := strings.Fields(e.kubectl(t, "get", "pods", "-l", "app=echo", "-o", "jsonpath={.items[*].status.podIP}"))
	sort.Strings(want)
	for _, n := range nodes {
		pod := "client-" + n
		rc := e.kubectl(t, "exec", pod, "--", "/waggle-echo", "cat", "/etc/resolv.conf")
		if !strings.Contains(rc, "nameserver 10.96.0.10\n") || !strings.Contains(rc, "search default.svc.cluster.local svc.cluster.local cluster.local") ||
			!strings.Contains(rc, "options ndots:5") {
			t.Errorf("%s resolv.conf:\n%s", pod, rc)
		}
		for _, name := range []string{"echo", "echo.default", "echo.default.svc.cluster.local"} {
			if out := strings.TrimSpace(e.kubectl(t, "exec", pod, "--", "/waggle-echo", "nslookup", name)); out != vip {
				t.Errorf("%s: %s resolves to %q, want %s", pod, name, out, vip)
			}
		}
		eventually(t, 30*time.Second, pod+": the headless Service resolves to every ready echo pod", func() error {
			out, err := e.kubectlErr("exec", pod, "--", "/waggle-echo", "nslookup", "echo-headless.default.svc.cluster.local")
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			if got := strings.Fields(out); strings.Join(got, " ") != strings.Join(want, " ") {
				return fmt.Errorf("got %v, want %v", got, want)
			}
			return nil
		})
		srv := e.kubectl(t, "exec", pod, "--", "/waggle-echo", "nslookup", "_tcp._tcp.echo.default.svc.cluster.local", "SRV")
		if strings.TrimSpace(srv) != "echo.default.svc.cluster.local. 80" {
			t.Errorf("%s: SRV of the tcp port: %q", pod, srv)
		}
		if out, err := e.kubectlErr("exec", pod, "--", "/waggle-echo", "dial", "-n", "3", "tcp", "echo:80"); err != nil {
			t.Errorf("%s: dial echo:80 by name: %v\n%s", pod, err, out)
		}
		envs := e.kubectl(t, "exec", pod, "--", "/waggle-echo", "env")
		if !strings.Contains(envs, "KUBERNETES_SERVICE_HOST=10.96.0.1\n") || !strings.Contains(envs, "ECHO_SERVICE_HOST="+vip+"\n") {
			t.Errorf("%s: Service variables missing:\n%s", pod, envs)
		}
	}
}
