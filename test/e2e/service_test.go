package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/waggle-io/waggle/lab"
)

// echoApp is a Deployment of the echo image behind a ClusterIP Service (TCP
// and UDP) and a NodePort Service. The preStop pause lets the proxies drop a
// terminating pod before it stops serving; the short tolerations let a dead
// node's pods move quickly.
const echoApp = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: echo}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      terminationGracePeriodSeconds: 10
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
      containers:
      - name: echo
        image: ` + echoImage + `
        imagePullPolicy: Never
        env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        ports:
        - {name: http, containerPort: 8080}
        - {name: tcp, containerPort: 9000}
        - {name: udp, containerPort: 9000, protocol: UDP}
        readinessProbe:
          tcpSocket: {port: 9000}
          periodSeconds: 1
        lifecycle:
          preStop:
            exec: {command: ["/waggle-echo", "sleep", "3"]}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec:
  selector: {app: echo}
  ports:
  - {name: tcp, port: 80, targetPort: tcp}
  - {name: udp, port: 53, targetPort: udp, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: echo-np, namespace: default}
spec:
  type: NodePort
  selector: {app: echo}
  ports:
  - {name: tcp, port: 80, targetPort: tcp, nodePort: 30080}
`

// clientPod is a pod pinned to node whose echo binary dials Services.
func clientPod(node string) string {
	return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: client-%[1]s, namespace: default, labels: {app: client}}
spec:
  nodeName: %[1]s
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: %[2]s
    imagePullPolicy: Never
`, node, echoImage)
}

// TestLab brings a two-node dual-stack lab up once and checks, in order, what a user of
// a Deployment behind a Service relies on; the lab's teardown then checks
// that nothing is left behind.
func TestLab(t *testing.T) {
	e := startLab(t)
	nodes := []string{e.cfg.NodeName(1), e.cfg.NodeName(2)}

	t.Run("NodesAreReadyWithPodCIDRs", func(t *testing.T) {
		out := e.kubectl(t, "get", "nodes", "-o", "jsonpath={range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}")
		for _, n := range nodes {
			if !strings.Contains(out, n+" 10.244.") {
				t.Errorf("node %s has no podCIDR: %q", n, out)
			}
		}
		if strings.Count(out, " True") != len(nodes) {
			t.Errorf("want %d Ready nodes:\n%s", len(nodes), out)
		}
	})

	e.apply(t, echoApp)
	for _, n := range nodes {
		e.apply(t, clientPod(n))
	}
	e.kubectl(t, "rollout", "status", "deployment/echo", "--timeout=3m")
	e.kubectl(t, "wait", "--for=condition=Ready", "pod", "-l", "app=client", "--timeout=3m")
	vip := strings.TrimSpace(e.kubectl(t, "get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}"))

	t.Run("ClusterIPFromPodsOnEveryNodeTCPAndUDP", func(t *testing.T) {
		for _, n := range nodes {
			for _, proto := range []struct{ name, port string }{{"tcp", "80"}, {"udp", "53"}} {
				// The proxies may still be catching up with the last pod
				// that became ready: every attempt must succeed, and the
				// spread must reach all three backends soon.
				eventually(t, 30*time.Second, fmt.Sprintf("from %s over %s, all 3 backends answer", n, proto.name), func() error {
					out, err := e.kubectlErr("exec", "client-"+n, "--", "/waggle-echo", "dial", "-n", "30", proto.name, vip+":"+proto.port)
					if err != nil {
						return fmt.Errorf("%v:\n%s", err, out)
					}
					if b := answering(out); len(b) != 3 {
						return fmt.Errorf("%d distinct backends answered:\n%s", len(b), out)
					}
					return nil
				})
			}
		}
	})

	t.Run("ClusterDNSFromPodsOnEveryNode", func(t *testing.T) { testClusterDNS(t, e, nodes, vip) })
	t.Run("DualStack", func(t *testing.T) { testDualStack(t, e, nodes) })
	t.Run("CrashLoopingPodsEvents", func(t *testing.T) { testCrashLoopEvents(t, e) })
	t.Run("KubectlTop", func(t *testing.T) { testKubectlTop(t, e, nodes) })
	t.Run("HPAScaleUp", func(t *testing.T) { testHPAScaleUp(t, e) })
	t.Run("PortForward", func(t *testing.T) { testPortForward(t, e) })
	t.Run("Attach", func(t *testing.T) { testAttach(t, e) })
	t.Run("StaticPodAndItsMirror", func(t *testing.T) { testStaticPod(t, e, nodes[0]) })
	t.Run("HostNetworkPodOnItsNode", func(t *testing.T) { testHostNetworkPod(t, e, nodes) })
	t.Run("IPAMStatePerNode", func(t *testing.T) { testIPAMPerNode(t, e, nodes) })
	t.Run("InClusterClientGoWithTheServiceAccountToken", func(t *testing.T) { testInClusterClientGo(t, e, nodes) })

	t.Run("NodePortFromANode", func(t *testing.T) {
		for i, n := range nodes {
			addr := fmt.Sprintf("%s:30080", e.cfg.NodeAddr(i+1).Addr())
			eventually(t, 30*time.Second, "NodePort "+addr+" answers from node "+n, func() error {
				out, err := e.nodeExec(n, e.echoBin(), "dial", "-n", "10", "tcp", addr)
				if err != nil {
					return fmt.Errorf("%v:\n%s", err, out)
				}
				if len(answering(out)) == 0 {
					return fmt.Errorf("no backend answered: %s", out)
				}
				return nil
			})
		}
	})

	// From the lab's client namespace, on the lab bridge outside every
	// node (an external machine): each node's NodePort reaches all three
	// backends, on that node and on the other (eBPF north-south on eth0:
	// DNAT, or SNAT to the node for a remote backend; iptables mode: its
	// NAT rules).
	t.Run("NodePortFromOutsideTheNodes", func(t *testing.T) {
		for i := range nodes {
			addr := fmt.Sprintf("%s:30080", e.cfg.NodeAddr(i+1).Addr())
			eventually(t, 30*time.Second, "NodePort "+addr+" answers the client with all 3 backends", func() error {
				return e.clientReaches(addr, 3)
			})
		}
	})

	t.Run("LoadBalancerFromANodeAndFromOutside", func(t *testing.T) { testLoadBalancer(t, e, nodes) })
	t.Run("StatefulSetClaimOutlivesItsPod", func(t *testing.T) { testStatefulSetVolume(t, e) })

	t.Run("ScalingChangesTheBackends", func(t *testing.T) {
		for _, replicas := range []int{5, 1, 3} {
			e.kubectl(t, "scale", "deployment/echo", fmt.Sprintf("--replicas=%d", replicas))
			took := eventually(t, 2*time.Minute, fmt.Sprintf("%d backends answer", replicas), func() error {
				want := readyPods(t, e)
				if len(want) != replicas {
					return fmt.Errorf("%d ready pods", len(want))
				}
				out, err := e.kubectlErr("exec", "client-"+nodes[0], "--", "/waggle-echo", "dial", "-n", "40", "tcp", vip+":80")
				if err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				if got := answering(out); strings.Join(got, ",") != strings.Join(want, ",") {
					return fmt.Errorf("answered by %v, ready pods %v", got, want)
				}
				return nil
			})
			t.Logf("scaled to %d: the backends followed in %v (including pod start)", replicas, took.Round(time.Millisecond))
		}
	})

	t.Run("RollingUpdateWithoutAFailedRequest", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		loop := exec.CommandContext(ctx, "kubectl", "--kubeconfig", e.kubeconfig, "exec", "client-"+nodes[0], "--",
			"/waggle-echo", "dial", "-q", "-for", "45s", "-every", "50ms", "tcp", vip+":80")
		out := newMarkedOutput("first reply:")
		loop.Stdout, loop.Stderr = out, out
		if err := loop.Start(); err != nil {
			t.Fatal(err)
		}
		out.wait(t, time.Minute) // the loop is answered before the rollout starts
		e.kubectl(t, "rollout", "restart", "deployment/echo")
		e.kubectl(t, "rollout", "status", "deployment/echo", "--timeout=2m")
		if err := loop.Wait(); err != nil {
			t.Fatalf("requests failed during the rolling update: %v\n%s", err, out.String())
		}
		t.Logf("client loop: %s", strings.TrimSpace(out.String()))
	})

	t.Run("ProxyRestartKeepsALongLivedConnection", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		hold := exec.CommandContext(ctx, "kubectl", "--kubeconfig", e.kubeconfig, "exec", "client-"+nodes[0], "--",
			"/waggle-echo", "dial", "-hold", "12s", "tcp", vip+":80")
		out := newMarkedOutput("connected:")
		hold.Stdout, hold.Stderr = out, out
		if err := hold.Start(); err != nil {
			t.Fatal(err)
		}
		out.wait(t, time.Minute) // the connection is up before the proxy restarts
		if err := lab.Restart(e.dataDir, nodes[0], "proxy"); err != nil {
			t.Fatal(err)
		}
		// New connects work while and after the proxy restarts.
		if o, err := e.kubectlErr("exec", "client-"+nodes[0], "--", "/waggle-echo", "dial", "-n", "20", "-every", "100ms", "tcp", vip+":80"); err != nil {
			t.Errorf("new connections across the proxy restart: %v\n%s", err, o)
		}
		if err := hold.Wait(); err != nil {
			t.Fatalf("the long-lived connection broke across the proxy restart: %v\n%s", err, out.String())
		}
	})

	t.Run("DeadKubeletsPodsMoveAndTheServiceKeepsAnswering", func(t *testing.T) {
		dead := nodes[1]
		if err := lab.Stop(e.dataDir, dead, "kubelet"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := lab.Restart(e.dataDir, dead, "kubelet"); err != nil {
				t.Errorf("restart kubelet: %v", err)
			}
		})
		eventually(t, time.Minute, dead+" NotReady", func() error {
			st := strings.TrimSpace(e.kubectl(t, "get", "node", dead, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"))
			if st == "True" {
				return fmt.Errorf("Ready=%s", st)
			}
			return nil
		})
		eventually(t, 2*time.Minute, "3 ready echo pods, none on "+dead, func() error {
			out := e.kubectl(t, "get", "pods", "-l", "app=echo", "-o", "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.metadata.deletionTimestamp} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}")
			ready := 0
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(l)
				if len(f) == 3 && f[2] == "True" && f[1] != dead {
					ready++
				}
			}
			if ready != 3 {
				return fmt.Errorf("%d ready pods off %s:\n%s", ready, dead, out)
			}
			return nil
		})
		eventually(t, 30*time.Second, "every connect to the Service succeeds", func() error {
			out, err := e.kubectlErr("exec", "client-"+nodes[0], "--", "/waggle-echo", "dial", "-n", "20", "tcp", vip+":80")
			if err != nil {
				return fmt.Errorf("%v:\n%s", err, out)
			}
			return nil
		})
	})

	// After the dead kubelet (it waits for both nodes to be Ready again):
	// it takes a node off the lab network and back.
	t.Run("FromAnExternalClient", func(t *testing.T) { testExternalClient(t, e, nodes) })

	// Last: it adds a node the other subtests do not expect.
	t.Run("NodeJoinsWithABootstrapToken", func(t *testing.T) { testNodeJoins(t, e, vip) })
}

// testNodeJoins adds a node as a new machine joins (`waggle lab join` runs
// `waggle join` with a bootstrap token in a fresh node namespace): it gets
// its own certificate through an automatically approved CSR, becomes
// Ready, runs a pod, and its proxy and cluster DNS server, running as the
// node, serve that pod the Service.
func testNodeJoins(t *testing.T, e *env, vip string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.bin, "lab", "join", "--data-dir", e.dataDir).CombinedOutput()
	if err != nil {
		t.Fatalf("lab join: %v\n%s", err, out)
	}
	joined := e.cfg.NodeName(labNodes + 1)
	// What a user copies to the next machine.
	cmd := strings.Fields(run(t, e.bin, "token", "create", "--print-join-command", "--kubeconfig", e.kubeconfig))
	if len(cmd) != 8 || strings.Join(cmd[:3], " ") != "waggle join --server" || cmd[3] != e.cfg.APIServer() ||
		cmd[4] != "--token" || cmd[6] != "--discovery-token-ca-cert-hash" || !strings.HasPrefix(cmd[7], "sha256:") {
		t.Errorf("token create --print-join-command printed %q", cmd)
	}
	csrs := e.kubectl(t, "get", "csr", "-o", "jsonpath={range .items[*]}{.spec.signerName} {.spec.username} {.status.conditions[*].type} {.status.certificate}{\"\\n\"}{end}")
	issued := false
	for _, l := range strings.Split(csrs, "\n") {
		f := strings.Fields(l)
		if len(f) == 4 && f[0] == "kubernetes.io/kube-apiserver-client-kubelet" && strings.HasPrefix(f[1], "system:bootstrap:") && f[2] == "Approved" {
			issued = true
		}
	}
	if !issued {
		t.Errorf("no approved and issued kubelet client CSR from a bootstrap token:\n%s", csrs)
	}
	e.apply(t, clientPod(joined))
	e.kubectl(t, "wait", "--for=condition=Ready", "pod", "client-"+joined, "--timeout=3m")
	// In the dual-stack lab, a joined node is dual-stack too: waggle join
	// passes its --node-ip IPv4,IPv6 and --cluster-cidr to its kubelet.
	ips := e.kubectl(t, "get", "node", joined, "-o", `jsonpath={range .status.addresses[?(@.type=="InternalIP")]}{.address},{end}`)
	if want := e.cfg.NodeIPs(labNodes+1) + ","; ips != want {
		t.Errorf("joined node's InternalIPs %q, want %q", ips, want)
	}
	if podIPs := strings.Fields(e.kubectl(t, "get", "pod", "client-"+joined, "-o", "jsonpath={.status.podIPs[*].ip}")); e.cfg.DualStack() && len(podIPs) != 2 {
		t.Errorf("pod on the joined node: podIPs %v, want one of each family", podIPs)
	}
	eventually(t, 30*time.Second, "every connect from the joined node to the Service succeeds", func() error {
		out, err := e.kubectlErr("exec", "client-"+joined, "--", "/waggle-echo", "dial", "-n", "20", "tcp", vip+":80")
		if err != nil {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		return nil
	})
	if out := strings.TrimSpace(e.kubectl(t, "exec", "client-"+joined, "--", "/waggle-echo", "nslookup", "echo")); out != vip {
		t.Errorf("from the joined node, echo resolves to %q, want %s", out, vip)
	}
}

// echoBin is the waggle-echo binary built for the image, used as a client
// from a node.
func (e *env) echoBin() string { return strings.TrimSuffix(e.bin, "waggle") + "waggle-echo" }

// answering returns the sorted distinct pod names in dial output lines
// ("pod=NAME client=ADDR").
func answering(out string) []string {
	set := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "pod="); ok {
			set[strings.Fields(rest)[0]] = true
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// readyPods returns the sorted names of the echo pods that are Ready and not
// terminating.
func readyPods(t *testing.T, e *env) []string {
	out := e.kubectl(t, "get", "pods", "-l", "app=echo", "-o", "jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}")
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[1] == "True" {
			names = append(names, f[0])
		}
	}
	sort.Strings(names)
	return names
}

// markedOutput collects a command's output and signals when a marker line
// appears in it, so a test can wait for "the client is running" instead of
// sleeping.
type markedOutput struct {
	mu     sync.Mutex
	buf    strings.Builder
	marker string
	seen   chan struct{}
}

func newMarkedOutput(marker string) *markedOutput {
	return &markedOutput{marker: marker, seen: make(chan struct{})}
}

func (o *markedOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	select {
	case <-o.seen:
	default:
		if strings.Contains(o.buf.String(), o.marker) {
			close(o.seen)
		}
	}
	return len(p), nil
}

func (o *markedOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

func (o *markedOutput) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-o.seen:
	case <-time.After(timeout):
		t.Fatalf("no %q within %v; output so far:\n%s", o.marker, timeout, o.String())
	}
}
