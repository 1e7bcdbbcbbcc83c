package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// statefulApp is the README quickstart's StatefulSet: one replica whose claim
// comes from the default StorageClass (the built-in local-path provisioner,
// WaitForFirstConsumer), behind a headless Service.
const statefulApp = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: None
  selector: {app: web}
  ports:
  - {name: tcp, port: 9000}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web, namespace: default}
spec:
  serviceName: web
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: ` + echoImage + `
        imagePullPolicy: Never
        ports:
        - {name: tcp, containerPort: 9000}
        volumeMounts:
        - {name: data, mountPath: /data}
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 16Mi}}
`

// testStatefulSetVolume checks what the README quickstart promises: a
// StatefulSet's claim is provisioned on first use, and what its pod wrote
// is there again for the pod that replaces it (same name, same claim, same
// node, since a local volume pins the pod).
func testStatefulSetVolume(t *testing.T, e *env) {
	e.apply(t, statefulApp)
	t.Cleanup(func() {
		e.kubectlErr("delete", "statefulset/web", "service/web", "--wait=true", "--timeout=1m")
		e.kubectlErr("delete", "pvc", "data-web-0", "--wait=true", "--timeout=1m")
	})
	e.kubectl(t, "rollout", "status", "statefulset/web", "--timeout=3m")
	pvc := strings.Fields(e.kubectl(t, "get", "pvc", "data-web-0", "-o", "jsonpath={.status.phase} {.spec.volumeName} {.spec.storageClassName}"))
	if len(pvc) != 3 || pvc[0] != "Bound" {
		t.Fatalf("claim data-web-0: %v, want Bound to a provisioned volume", pvc)
	}
	t.Logf("claim data-web-0 bound to %s (class %s)", pvc[1], pvc[2])

	first := strings.Fields(e.kubectl(t, "get", "pod", "web-0", "-o", "jsonpath={.metadata.uid} {.spec.nodeName}"))
	e.kubectl(t, "exec", "web-0", "--", "/waggle-echo", "write", "/data/greeting", "written-by", first[0])
	e.kubectl(t, "delete", "pod", "web-0", "--wait=true", "--timeout=1m")
	eventually(t, 2*time.Minute, "web-0 replaced and Ready", func() error {
		out, err := e.kubectlErr("get", "pod", "web-0", "-o", "jsonpath={.metadata.uid} {.spec.nodeName} {.status.conditions[?(@.type==\"Ready\")].status}")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		f := strings.Fields(out)
		if len(f) != 3 || f[0] == first[0] || f[2] != "True" {
			return fmt.Errorf("web-0: %q (first pod uid %s)", out, first[0])
		}
		if f[1] != first[1] {
			return fmt.Errorf("the new web-0 runs on %s, its local volume is on %s", f[1], first[1])
		}
		return nil
	})
	if got := strings.TrimSpace(e.kubectl(t, "exec", "web-0", "--", "/waggle-echo", "cat", "/data/greeting")); got != "written-by "+first[0] {
		t.Fatalf("the replacement pod reads %q from its claim, want what the first pod wrote (%q)", got, "written-by "+first[0])
	}
	if vol := strings.TrimSpace(e.kubectl(t, "get", "pvc", "data-web-0", "-o", "jsonpath={.spec.volumeName}")); vol != pvc[1] {
		t.Fatalf("claim now bound to %s, was %s", vol, pvc[1])
	}

	// Deleting the claim deletes the volume (reclaim Delete) and, through
	// the provisioner's helper pod on the node, its directory. The lab's
	// nodes share the host's filesystem, so the test looks at it directly.
	dir := strings.TrimSpace(e.kubectl(t, "get", "pv", pvc[1], "-o", "jsonpath={.spec.hostPath.path}"))
	if _, err := os.Stat(filepath.Join(dir, "greeting")); err != nil {
		t.Fatalf("the volume's directory on the node: %v", err)
	}
	e.kubectl(t, "delete", "statefulset/web", "--wait=true", "--timeout=1m")
	e.kubectl(t, "delete", "pvc", "data-web-0", "--wait=true", "--timeout=1m")
	took := eventually(t, 90*time.Second, "volume "+pvc[1]+" and its directory removed", func() error {
		if out, err := e.kubectlErr("get", "pv", pvc[1]); err == nil {
			return fmt.Errorf("volume still there: %s", out)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			return fmt.Errorf("%s still on the node (%v)", dir, err)
		}
		return nil
	})
	t.Logf("claim deleted: volume and directory gone in %v", took.Round(time.Millisecond))
}

// testLoadBalancer exposes the echo Deployment as a LoadBalancer Service and
// reaches it on the address the controller-manager's pool gave it: from a
// process on a node (socket load balancer) and from the host on the lab
// bridge, outside every node, where a node answers ARP for the address
// (L2 announcement) and forwards to backends on both nodes.
func testLoadBalancer(t *testing.T, e *env, nodes []string) {
	e.apply(t, `
apiVersion: v1
kind: Service
metadata: {name: echo-lb, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: echo}
  ports:
  - {name: tcp, port: 80, targetPort: tcp}
`)
	t.Cleanup(func() { e.kubectlErr("delete", "service/echo-lb", "--wait=true", "--timeout=1m") })
	var ip string
	eventually(t, 30*time.Second, "echo-lb gets an address", func() error {
		ip = strings.TrimSpace(e.kubectl(t, "get", "service", "echo-lb", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"))
		if ip == "" {
			return fmt.Errorf("status.loadBalancer.ingress is empty")
		}
		return nil
	})
	t.Logf("echo-lb: %s", ip)
	addr := ip + ":80"
	eventually(t, 30*time.Second, "LoadBalancer "+addr+" answers from node "+nodes[1], func() error {
		out, err := e.nodeExec(nodes[1], e.echoBin(), "dial", "-n", "10", "tcp", addr)
		if err != nil {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		if len(answering(out)) == 0 {
			return fmt.Errorf("no backend answered: %s", out)
		}
		return nil
	})
	eventually(t, 30*time.Second, "LoadBalancer "+addr+" answers the lab's client with all 3 backends", func() error {
		return e.clientReaches(addr, 3)
	})
}
