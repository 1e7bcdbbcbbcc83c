package e2e

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// echoDualStack is two echo pods, one on each node, behind a RequireDualStack
// Service whose primary family is IPv6 and a PreferDualStack NodePort one
// that keeps the cluster's primary (IPv4) first.
const echoDualStack = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo-ds, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo-ds}}
  template:
    metadata: {labels: {app: echo-ds}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: echo-ds}}}
      containers:
      - name: echo
        image: ` + echoImage + `
        imagePullPolicy: Never
        env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        ports:
        - {name: tcp, containerPort: 9000}
        - {name: udp, containerPort: 9000, protocol: UDP}
        readinessProbe:
          tcpSocket: {port: 9000}
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {name: echo-ds, namespace: default}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  selector: {app: echo-ds}
  ports:
  - {name: tcp, port: 80, targetPort: tcp}
  - {name: udp, port: 53, targetPort: udp, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: echo-ds-prefer, namespace: default}
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  selector: {app: echo-ds}
  ports:
  - {name: tcp, port: 80, targetPort: tcp}
`

// testDualStack checks the lab's IPv6 half end to end: nodes with an
// InternalIP and a pod CIDR of each family, pods with an address of each,
// pod to pod across nodes over IPv6, dual-stack ClusterIP Services answering
// on their IPv6 address from pods on every node through the eBPF socket
// load balancer (backends on the other node included), a NodePort on each
// node's IPv6 address from the lab's external client, and AAAA records.
func testDualStack(t *testing.T, e *env, nodes []string) {
	if !e.cfg.DualStack() {
		t.Fatal("the e2e lab is not dual-stack")
	}
	type nodeInfo struct{ ips, cidrs []netip.Prefix }
	info := map[string]nodeInfo{}
	for _, n := range nodes {
		out := e.kubectl(t, "get", "node", n, "-o", `jsonpath={range .status.addresses[?(@.type=="InternalIP")]}{.address} {end}|{.spec.podCIDRs[*]}`)
		ips, cidrs, _ := strings.Cut(out, "|")
		var ni nodeInfo
		for _, a := range strings.Fields(ips) {
			ni.ips = append(ni.ips, netip.PrefixFrom(netip.MustParseAddr(a), 128))
		}
		for _, c := range strings.Fields(cidrs) {
			ni.cidrs = append(ni.cidrs, netip.MustParsePrefix(c))
		}
		if len(ni.ips) != 2 || !ni.ips[0].Addr().Is4() || !ni.ips[1].Addr().Is6() || !e.cfg.Subnet6.Contains(ni.ips[1].Addr()) {
			t.Fatalf("node %s: InternalIPs %v, want its IPv4 then its IPv6 lab address (in %s)", n, ni.ips, e.cfg.Subnet6)
		}
		if len(ni.cidrs) != 2 || !ni.cidrs[0].Addr().Is4() || ni.cidrs[1].Bits() != 64 || !e.cfg.ClusterCIDR6.Contains(ni.cidrs[1].Addr()) {
			t.Fatalf("node %s: podCIDRs %v, want an IPv4 one and a /64 of %s", n, ni.cidrs, e.cfg.ClusterCIDR6)
		}
		info[n] = ni
	}

	e.apply(t, echoDualStack)
	t.Cleanup(func() {
		out, err := exec.Command("kubectl", "--kubeconfig", e.kubeconfig, "delete", "--wait", "--timeout=2m",
			"deployment/echo-ds", "service/echo-ds", "service/echo-ds-prefer").CombinedOutput()
		if err != nil {
			t.Errorf("delete the dual-stack app: %v\n%s", err, out)
		}
	})
	e.kubectl(t, "rollout", "status", "deployment/echo-ds", "--timeout=3m")

	// Every pod (the echo pods and the clients) has an address of each
	// family, primary (IPv4) first, each in its node's pod CIDR of that
	// family; the echo pods' IPv6 addresses by node.
	echo6, client6 := map[string]string{}, map[string]string{}
	out := e.kubectl(t, "get", "pods", "-l", "app in (echo-ds,client)", "-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIPs[*].ip}{"\n"}{end}`)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			t.Fatalf("pod %q: want an IPv4 and an IPv6 podIP", line)
		}
		ni := info[f[1]]
		v4, v6 := netip.MustParseAddr(f[2]), netip.MustParseAddr(f[3])
		if !ni.cidrs[0].Contains(v4) || !ni.cidrs[1].Contains(v6) {
			t.Errorf("pod %s on %s: podIPs %s %s, want one in each of the node's podCIDRs %v", f[0], f[1], v4, v6, ni.cidrs)
		}
		if strings.HasPrefix(f[0], "echo-ds-") {
			echo6[f[1]] = v6.String()
		} else {
			client6[f[1]] = v6.String()
		}
	}
	if len(echo6) != len(nodes) {
		t.Fatalf("want an echo-ds pod on each node, have %v", echo6)
	}

	t.Run("PodToPodAcrossNodesOverIPv6", func(t *testing.T) {
		for i, n := range nodes {
			other := nodes[(i+1)%len(nodes)]
			target := netip.AddrPortFrom(netip.MustParseAddr(echo6[other]), 9000).String()
			out := e.kubectl(t, "exec", "client-"+n, "--", "/waggle-echo", "dial", "-n", "3", "tcp", target)
			// The echo pod sees the client's own IPv6 address: routed, not
			// masqueraded, between pods.
			answers := 0
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "pod=echo-ds-") && strings.Contains(l, " client=["+client6[n]+"]:") {
					answers++
				}
			}
			if answers != 3 {
				t.Errorf("%s to the pod on %s at %s: want 3 answers to %s:\n%s", n, other, target, client6[n], out)
			}
		}
	})

	svc := func(name string) []string {
		return strings.Fields(e.kubectl(t, "get", "service", name, "-o", `jsonpath={.spec.clusterIPs[*]}`))
	}
	ds, prefer := svc("echo-ds"), svc("echo-ds-prefer")
	for _, c := range []struct {
		name string
		ips  []string
		v6   int // index of the IPv6 clusterIP
	}{{"echo-ds", ds, 0}, {"echo-ds-prefer", prefer, 1}} {
		if len(c.ips) != 2 || !e.cfg.ServiceCIDR6.Contains(netip.MustParseAddr(c.ips[c.v6])) || !e.cfg.ServiceCIDR.Contains(netip.MustParseAddr(c.ips[1-c.v6])) {
			t.Fatalf("service %s: clusterIPs %v, want IPv6 (from %s) at %d and IPv4 beside it", c.name, c.ips, e.cfg.ServiceCIDR6, c.v6)
		}
	}

	t.Run("IPv6ClusterIPFromPodsOnEveryNodeThroughTheSocketLB", func(t *testing.T) {
		for _, n := range nodes {
			// The node's eBPF load balancer holds the IPv6 frontends, and no
			// ip6tables rule does the work instead.
			for _, fe := range []string{"[" + ds[0] + "]:80/TCP", "[" + ds[0] + "]:53/UDP", "[" + prefer[1] + "]:80/TCP"} {
				eventually(t, 30*time.Second, n+": eBPF frontend "+fe, func() error {
					out, err := exec.Command(e.bin, "bpf", "lb", "get", fe, "--node", n).CombinedOutput()
					if err != nil || !strings.Contains(string(out), "Backend slots:     2") {
						return fmt.Errorf("waggle bpf lb get %s: %v\n%s", fe, err, out)
					}
					return nil
				})
			}
			if out, _ := e.nodeExec(n, "ip6tables-save", "-t", "nat"); strings.Contains(out, ds[0]) {
				t.Errorf("%s: ip6tables NAT rules for %s in eBPF mode:\n%s", n, ds[0], out)
			}
			for _, target := range []struct{ proto, addr string }{
				{"tcp", "[" + ds[0] + "]:80"}, {"udp", "[" + ds[0] + "]:53"}, {"tcp", "[" + prefer[1] + "]:80"},
			} {
				// Both backends answer, so the one on the other node does.
				eventually(t, 30*time.Second, fmt.Sprintf("from %s over %s to %s, both backends answer", n, target.proto, target.addr), func() error {
					out, err := e.kubectlErr("exec", "client-"+n, "--", "/waggle-echo", "dial", "-n", "20", target.proto, target.addr)
					if err != nil {
						return fmt.Errorf("%v:\n%s", err, out)
					}
					if b := answering(out); len(b) != 2 {
						return fmt.Errorf("%d distinct backends answered:\n%s", len(b), out)
					}
					return nil
				})
			}
		}
	})

	t.Run("NodePortOnEveryNodesIPv6AddressFromOutside", func(t *testing.T) {
		port := strings.TrimSpace(e.kubectl(t, "get", "service", "echo-ds-prefer", "-o", "jsonpath={.spec.ports[0].nodePort}"))
		for _, n := range nodes {
			addr := "[" + info[n].ips[1].Addr().String() + "]:" + port
			// externalTrafficPolicy Cluster: both backends, the other
			// node's through this one.
			eventually(t, 30*time.Second, "from the client to "+n+"'s NodePort "+addr+", both backends answer", func() error {
				return e.clientReaches(addr, 2)
			})
		}
	})

	t.Run("DNSAnswersAAAAForTheDualStackService", func(t *testing.T) {
		for name, ips := range map[string][]string{"echo-ds": ds, "echo-ds-prefer": prefer} {
			want := slices.Sorted(slices.Values(ips))
			for _, n := range nodes {
				out := e.kubectl(t, "exec", "client-"+n, "--", "/waggle-echo", "nslookup", name+".default.svc.cluster.local")
				if got := strings.Fields(out); !slices.Equal(got, want) {
					t.Errorf("%s: %s resolves to %v, want its A and AAAA %v", n, name, got, want)
				}
			}
		}
	})
}
