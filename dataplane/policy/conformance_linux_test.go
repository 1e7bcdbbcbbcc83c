package policy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

type check struct {
	from, to string // pod keys; from "" is the node
	proto    string
	port     int
	want     bool
}

func (e *env) expect(t *testing.T, checks []check) {
	t.Helper()
	for _, c := range checks {
		var from *tpod
		if c.from != "" {
			from = e.pods[c.from]
		}
		proto := c.proto
		if proto == "" {
			proto = "tcp"
		}
		port := c.port
		if port == 0 {
			port = 80
		}
		if got := e.reach(from, e.pods[c.to], proto, port); got != c.want {
			t.Errorf("%s -> %s %s/%d: reachable=%v, want %v%s", or(c.from, "node"), c.to, proto, port, got, c.want, e.state())
		}
	}
}

func or(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

// TestConformance is the policy conformance table on the real kernel: pods
// in network namespaces on a bridge, the tcx programs on their veths (ebpf)
// or the iptables rules and ipsets of the node namespace (iptables).
func TestConformance(t *testing.T) { eachDatapath(t, testConformance) }

func testConformance(t *testing.T, e *env) {
	cases := []struct {
		name   string
		policy func() []*networkingv1.NetworkPolicy
		checks []check
	}{
		{
			name:   "no policy: everything reaches everything",
			checks: []check{{"x/a", "x/b", "", 0, true}, {"y/c", "x/b", "udp", 80, true}, {"x/b", "y/c", "", 81, true}},
		},
		{
			name: "default-deny ingress isolates the namespace's pods, not their egress; the node still reaches them",
			policy: func() []*networkingv1.NetworkPolicy {
				return []*networkingv1.NetworkPolicy{np("x", "deny-in", sel(), ingress)}
			},
			checks: []check{
				{"x/a", "x/b", "", 0, false}, {"y/c", "x/b", "udp", 80, false}, {"x/b", "y/c", "", 0, true},
				{"", "x/b", "", 0, true},
			},
		},
		{
			name: "default-deny egress: nothing leaves, replies to allowed ingress still do",
			policy: func() []*networkingv1.NetworkPolicy {
				return []*networkingv1.NetworkPolicy{np("x", "deny-out", sel(), egress)}
			},
			checks: []check{
				{"x/b", "y/c", "", 0, false}, {"x/b", "x/a", "udp", 80, false},
				{"y/c", "x/b", "", 0, true}, {"y/c", "x/b", "udp", 80, true},
				{"x/b", "node", "", 80, true},
			},
		},
		{
			name: "allow from a namespace",
			policy: func() []*networkingv1.NetworkPolicy {
				p := np("x", "from-y", sel("app", "b"), ingress)
				p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("ns", "y")}}}}
				return []*networkingv1.NetworkPolicy{p}
			},
			checks: []check{{"y/c", "x/b", "", 0, true}, {"y/d", "x/b", "", 0, true}, {"x/a", "x/b", "", 0, false}, {"z/e", "x/b", "", 0, false}},
		},
		{
			name: "allow from a pod in another namespace (namespaceSelector and podSelector together)",
			policy: func() []*networkingv1.NetworkPolicy {
				p := np("x", "from-y-c", sel("app", "b"), ingress)
				p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("ns", "y"), PodSelector: sel("app", "c")}}}}
				return []*networkingv1.NetworkPolicy{p}
			},
			checks: []check{{"y/c", "x/b", "", 0, true}, {"y/d", "x/b", "", 0, false}, {"x/a", "x/b", "", 0, false}},
		},
		{
			name: "podSelector alone means the policy's namespace",
			policy: func() []*networkingv1.NetworkPolicy {
				p := np("x", "from-a", sel("app", "b"), ingress)
				p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "a")}}}}
				return []*networkingv1.NetworkPolicy{p}
			},
			checks: []check{{"x/a", "x/b", "", 0, true}, {"z/a", "x/b", "", 0, false}},
		},
		{
			name: "egress to an ipBlock with except",
			policy: func() []*networkingv1.NetworkPolicy {
				p := np("x", "to-block", sel("app", "a"), egress)
				p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.77.0.0/24", Except: []string{"10.77.0.13/32"}}}}}}
				return []*networkingv1.NetworkPolicy{p}
			},
			// x/a is .11, x/b .12, y/c .13, y/d .14
			checks: []check{{"x/a", "x/b", "", 0, true}, {"x/a", "y/c", "", 0, false}, {"x/a", "y/d", "udp", 80, true}},
		},
		{
			name: "ingress from an ipBlock with except",
			policy: func() []*networkingv1.NetworkPolicy {
				p := np("x", "from-block", sel("app", "b"), ingress)
				p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.77.0.8/29", Except: []string{"10.77.0.11/32"}}}}}}
				return []*networkingv1.NetworkPolicy{p}
			},
			checks: []check{{"x/a", "x/b", "", 0, false}, {"y/c", "x/b", "", 0, true}, {"y/d", "x/b", "", 0, true}, {"z/e", "x/b", "", 0, true}},
		},
		{
			name: "named port resolved on the destination pod",
			policy: func() []*networkingv1.NetworkPolicy {
				p := np("x", "named", sel("app", "b"), ingress)
				proto := v1.ProtocolTCP
				port := intstr.FromString("web")
				p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &proto, Port: &port}}}}
				return []*networkingv1.NetworkPolicy{p}
			},
			checks: []check{{"x/a", "x/b", "", 81, true}, {"x/a", "x/b", "", 80, false}, {"x/a", "x/b", "udp", 80, false}},
		},
		{
			name: "egress named port resolved per destination pod",
			policy: func() []*networkingv1.NetworkPolicy {
				p := np("y", "named-out", sel("app", "c"), egress)
				port := intstr.FromString("web")
				p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &port}}}}
				return []*networkingv1.NetworkPolicy{p}
			},
			// x/b names 81 "web", z/e names 82 "web".
			checks: []check{{"y/c", "x/b", "", 81, true}, {"y/c", "x/b", "", 82, false}, {"y/c", "z/e", "", 82, true}, {"y/c", "z/e", "", 81, false}},
		},
		{
			name: "endPort range",
			policy: func() []*networkingv1.NetworkPolicy {
				p := np("x", "range", sel("app", "b"), ingress)
				pp := tcpPort(81)
				end := int32(82)
				pp.EndPort = &end
				p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{pp}}}
				return []*networkingv1.NetworkPolicy{p}
			},
			checks: []check{{"x/a", "x/b", "", 80, false}, {"x/a", "x/b", "", 81, true}, {"x/a", "x/b", "", 82, true}},
		},
		{
			name: "protocol only: UDP on every port, not TCP",
			policy: func() []*networkingv1.NetworkPolicy {
				p := np("x", "udp", sel("app", "b"), ingress)
				proto := v1.ProtocolUDP
				p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &proto}}}}
				return []*networkingv1.NetworkPolicy{p}
			},
			checks: []check{{"x/a", "x/b", "udp", 80, true}, {"x/a", "x/b", "", 80, false}},
		},
		{
			name: "policies add up: a deny-all plus an allow",
			policy: func() []*networkingv1.NetworkPolicy {
				deny := np("x", "deny", sel(), ingress, egress)
				allow := np("x", "allow-a", sel("app", "b"), ingress)
				allow.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "a")}}, Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)}}}
				out := np("x", "a-out", sel("app", "a"), egress)
				out.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "b")}}}}
				return []*networkingv1.NetworkPolicy{deny, allow, out}
			},
			checks: []check{{"x/a", "x/b", "", 80, true}, {"x/a", "x/b", "", 81, false}, {"y/c", "x/b", "", 80, false}, {"x/b", "x/a", "", 80, false}},
		},
	}
	e.addPod("x", "a", map[string]string{"app": "a"})
	e.addPod("x", "b", map[string]string{"app": "b"}, v1.ContainerPort{Name: "web", ContainerPort: 81})
	e.addPod("y", "c", map[string]string{"app": "c"})
	e.addPod("y", "d", map[string]string{"app": "d"})
	e.addPod("z", "e", map[string]string{"app": "e"}, v1.ContainerPort{Name: "web", ContainerPort: 82})
	e.addPod("z", "a", map[string]string{"app": "a"})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var pols []*networkingv1.NetworkPolicy
			if tc.policy != nil {
				pols = tc.policy()
			}
			for _, p := range pols {
				e.setPolicy(p)
			}
			e.expect(t, tc.checks)
			for _, p := range pols {
				e.deletePolicy(p.Namespace, p.Name)
			}
		})
	}
}

// TestPolicyUnderAnOpenConnection: Waggle re-checks an established flow
// against a changed policy (upstream leaves it to the implementation): a
// policy that no longer allows the flow cuts it; one that still allows it
// (or its removal) leaves it running.
func TestPolicyUnderAnOpenConnection(t *testing.T) { eachDatapath(t, testPolicyUnderAnOpenConnection) }

func testPolicyUnderAnOpenConnection(t *testing.T, e *env) {
	a := e.addPod("x", "a", map[string]string{"app": "a"})
	b := e.addPod("x", "b", map[string]string{"app": "b"})
	c := e.addPod("x", "c", map[string]string{"app": "c"})
	open := func(from, to *tpod) net.Conn {
		conn := e.dialFrom(from.netns, "tcp", fmt.Sprintf("%s:80", to.ip))
		if conn == nil {
			t.Fatalf("%s -> %s denied before any policy", from.name, to.name)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	fromA, fromC := open(a, b), open(c, b)
	if !e.roundTrip(fromA) || !e.roundTrip(fromC) {
		t.Fatal("open connections carry no data before any policy")
	}
	allowA := np("x", "allow-a", sel("app", "b"), ingress)
	allowA.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "a")}}}}
	e.setPolicy(allowA)
	if !e.roundTrip(fromA) {
		t.Error("a's established connection was cut by a policy that allows it")
	}
	if e.roundTrip(fromC) {
		t.Error("c's established connection still runs under a policy that denies it")
	}
	e.deletePolicy("x", "allow-a")
	if !e.roundTrip(fromA) {
		t.Error("a's connection was cut when the policy was removed")
	}
	if !e.reach(c, b, "tcp", 80) {
		t.Error("c cannot connect again after the policy was removed")
	}
	// Replies of a connection b opened stay allowed when b becomes isolated
	// for ingress (the flow started as b's egress).
	fromB := open(b, e.addPod("y", "d", map[string]string{"app": "d"}))
	e.setPolicy(np("x", "deny-in", sel(), ingress))
	if !e.roundTrip(fromB) {
		t.Error("replies to b's own connection were dropped by an ingress policy")
	}
	if e.reach(a, b, "tcp", 80) {
		t.Error("deny-in did not isolate b")
	}
}

// TestPodsCreatedAfterThePolicy: the policy applies to pods that appear
// later, as subjects and as peers, and to relabelled pods.
func TestPodsCreatedAfterThePolicy(t *testing.T) { eachDatapath(t, testPodsCreatedAfterThePolicy) }

func testPodsCreatedAfterThePolicy(t *testing.T, e *env) {
	p := np("x", "from-client", sel("app", "server"), ingress)
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("role", "client")}}}}
	e.setPolicy(p)
	server := e.addPod("x", "server", map[string]string{"app": "server"})
	client := e.addPod("x", "client", map[string]string{"role": "client"})
	other := e.addPod("x", "other", map[string]string{"role": "other"})
	if !e.reach(client, server, "tcp", 80) {
		t.Error("a client created after the policy is denied")
	}
	if e.reach(other, server, "tcp", 80) {
		t.Error("a non-client created after the policy is allowed")
	}
	// Relabel other as a client: same policy, new identity.
	other.obj.Labels = map[string]string{"role": "client"}
	e.c.SetPod(other.obj, other.ifindex)
	e.sync()
	if !e.reach(other, server, "tcp", 80) {
		t.Error("a pod relabelled as a client is denied")
	}
	// A second server created later is isolated at once.
	server2 := e.addPod("x", "server2", map[string]string{"app": "server"})
	if e.reach(e.addPod("y", "stranger", map[string]string{"role": "client"}), server2, "tcp", 80) {
		t.Error("a client of another namespace reaches a server created after the policy")
	}
	// The pod is deleted: its endpoint and links (or chains) go.
	e.c.DeletePod("x", "server2")
	e.sync()
	if e.bpf != nil {
		var v polBPFPolEndpoint
		if err := e.bpf.objs.WagglePolEndpoints.Lookup(server2.ifindex, &v); err == nil {
			t.Error("a deleted pod's endpoint is still in the map")
		}
	} else if out := e.node.Run(t, "iptables-save", "-t", "filter"); strings.Contains(out, chainName(DirIngress, server2.ifindex)+" ") {
		t.Errorf("a deleted pod's chain is still there:\n%s", out)
	}
}

// TestSCTPIsRefusedClearly: an SCTP port is reported and allows nothing.
func TestSCTPIsRefusedClearly(t *testing.T) {
	c := NewCompiler("n")
	p := np("x", "sctp", sel(), ingress)
	proto := v1.ProtocolSCTP
	port := intstr.FromInt32(9)
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &proto, Port: &port}}}}
	if err := c.SetPolicy(p); err != nil {
		t.Fatal(err)
	}
	ch := c.Compile()
	if len(ch.Warnings) != 1 || !strings.Contains(ch.Warnings[0], "SCTP is not supported") {
		t.Errorf("warnings = %q, want one about SCTP", ch.Warnings)
	}
}

// TestViewExplainsAndMonitors: what `waggle bpf policy/explain/monitor`
// read from the pinned maps: the endpoints and their counters, the rule
// that allows a connection, the reason one is denied, and drop events.
func TestViewExplainsAndMonitors(t *testing.T) {
	e := newEnv(t)
	a := e.addPod("x", "a", map[string]string{"app": "a"})
	b := e.addPod("x", "b", map[string]string{"app": "b"})
	c := e.addPod("y", "c", map[string]string{"app": "c"})
	p := np("x", "allow-a", sel("app", "b"), ingress)
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "a")}}, Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)}}}
	e.setPolicy(p)
	v, err := OpenView(e.bpf.cfg.PinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.NetNS = "/run/netns/" + e.node.Name

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan Event, 16)
	go v.Monitor(ctx, "drop", func(ev Event) { events <- ev })

	if !e.reach(a, b, "tcp", 80) || e.reach(c, b, "tcp", 80) {
		t.Fatal("policy not enforced as expected")
	}
	select {
	case ev := <-events:
		if ev.Endpoint != "x/b" || ev.Verdict != "drop" || ev.Peer != c.ip || ev.LocalPort != 80 || ev.Direction != "ingress" {
			t.Errorf("drop event = %+v", ev)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no drop event")
	}

	vs, err := v.Explain(a.ip, b.ip, 80, protoTCP)
	if err != nil {
		t.Fatal(err)
	}
	var atB *Verdict
	for i := range vs {
		if vs[i].Endpoint == "x/b" {
			atB = &vs[i]
		}
	}
	if atB == nil || !atB.Allowed || atB.Policy != "x/allow-a" || atB.Rule != 0 {
		t.Errorf("explain a -> b:80 = %+v", vs)
	}
	vs, _ = v.Explain(c.ip, b.ip, 80, protoTCP)
	for _, vd := range vs {
		if vd.Endpoint == "x/b" && (vd.Allowed || !strings.Contains(vd.Reason, "default deny")) {
			t.Errorf("explain c -> b:80 at b = %+v, want a default deny", vd)
		}
	}
	eps, err := v.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range eps {
		if ep.Pod == "x/b" && (!ep.IngressIsolated || ep.IngressAllowed == 0 || ep.IngressDenied == 0) {
			t.Errorf("endpoint x/b = %+v, want isolated with flows allowed and packets denied", ep)
		}
	}
	rules, counters, err := v.Rules(b.ifindex)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 1 || rules[0].Policy != "x/allow-a" || rules[0].Ports != "80" || rules[0].Hits == 0 || !strings.Contains(rules[0].Peer, "app=a") {
		t.Errorf("rules of x/b = %+v", rules)
	}
	if len(counters) != 1 || counters[0].Hits == 0 {
		t.Errorf("counters of x/b = %+v", counters)
	}
	if got, err := v.FindEndpoint(b.ip.String()); err != nil || got.Pod != "x/b" {
		t.Errorf("FindEndpoint(%s) = %+v, %v", b.ip, got, err)
	}
}

// TestRestartKeepsEnforcing: the agent's process goes (file descriptors
// closed) and a new one opens the pinned maps: enforcement never stopped,
// the new datapath restores what is written, and re-programming the same
// compiled state changes nothing.
func TestRestartKeepsEnforcing(t *testing.T) {
	e := newEnv(t)
	a := e.addPod("x", "a", map[string]string{"app": "a"})
	b := e.addPod("x", "b", map[string]string{"app": "b"})
	e.setPolicy(np("x", "deny", sel("app", "b"), ingress))
	if e.reach(a, b, "tcp", 80) {
		t.Fatal("deny not enforced")
	}
	// The new process opens the pinned maps before the old one's file
	// descriptors are gone; then the old ones close.
	dp, err := NewBPF(BPFConfig{PinDir: e.bpf.cfg.PinDir, NetNS: e.bpf.cfg.NetNS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	e.bpf.Close()
	e.dp, e.bpf = dp, dp
	if e.reach(a, b, "tcp", 80) {
		t.Error("enforcement stopped with the agent's file descriptors")
	}
	if got := len(dp.cur[b.ifindex]); got != 0 {
		t.Errorf("restored %d entries for b, want 0 (deny-all)", got)
	}
	var before polBPFPolEndpoint
	dp.objs.WagglePolEndpoints.Lookup(b.ifindex, &before)
	// A fresh compiler with the same inputs programs the same state.
	c := NewCompiler("node-a")
	c.SetHostIPs([]netip.Addr{netip.MustParseAddr("10.77.0.1")})
	for _, n := range []string{"x", "y", "z"} {
		c.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/metadata.name": n, "ns": n}}})
	}
	for _, p := range []*tpod{a, b} {
		c.SetPod(p.obj, p.ifindex)
	}
	if err := c.SetPolicy(np("x", "deny", sel("app", "b"), ingress)); err != nil {
		t.Fatal(err)
	}
	e.c = c
	e.sync()
	var after polBPFPolEndpoint
	dp.objs.WagglePolEndpoints.Lookup(b.ifindex, &after)
	if after.Rev != before.Rev || after.Flags != before.Flags {
		t.Errorf("re-programming the same state changed the endpoint: %+v -> %+v", before, after)
	}
	if e.reach(a, b, "tcp", 80) || !e.reach(b, a, "tcp", 80) {
		t.Error("after the restart the policy is not what it was")
	}
}

// TestIPv6: the same programs enforce IPv6 flows (neighbour discovery
// always passes; peers resolve through the same identities).
func TestIPv6(t *testing.T) { eachDatapath(t, testIPv6) }

func testIPv6(t *testing.T, e *env) {
	// The kernel routes a nodad IPv6 address locally only after `ip addr
	// add` returns (testutil.NetNS.WaitLocalAddrs): each probe below is a
	// single dial, and a denied one must not be denied by that gap.
	e.node.Run(t, "ip", "addr", "add", "fd77::1/64", "dev", e.bridge, "nodad")
	e.node.WaitLocalAddrs(t, netip.MustParseAddr("fd77::1"))
	e.c.SetHostIPs([]netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("fd77::1")})
	var pods []*tpod
	for i, name := range []string{"a", "b", "c"} {
		p := e.addPod("x", name, map[string]string{"app": name})
		v6 := netip.MustParseAddr(fmt.Sprintf("fd77::%d", 20+i))
		p.netns.Run(t, "ip", "addr", "add", v6.String()+"/64", "dev", "eth0", "nodad")
		p.netns.WaitLocalAddrs(t, v6)
		serveTCP(t, p.netns, netip.AddrPortFrom(v6, 80).String())
		p.obj.Status.PodIPs = append(p.obj.Status.PodIPs, v1.PodIP{IP: v6.String()})
		e.c.SetPod(p.obj, p.ifindex)
		p.ip = v6 // probes go over IPv6 from here on
		pods = append(pods, p)
	}
	e.sync()
	p := np("x", "from-a", sel("app", "b"), ingress)
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "a")}}}}
	e.setPolicy(p)
	if !e.reach(pods[0], pods[1], "tcp", 80) {
		t.Error("a -> b over IPv6 denied, want allowed")
	}
	if e.reach(pods[2], pods[1], "tcp", 80) {
		t.Error("c -> b over IPv6 allowed, want denied")
	}
}

// TestIPTablesRestart: a new agent's iptables datapath finds the rules and
// sets the last one left, enforcement never stops, and its first commit
// removes the chains of a pod deleted while no agent ran.
func TestIPTablesRestart(t *testing.T) {
	e := newEnvOf(t, ModeIPTables)
	a := e.addPod("x", "a", map[string]string{"app": "a"})
	b := e.addPod("x", "b", map[string]string{"app": "b"})
	c := e.addPod("x", "c", map[string]string{"app": "c"})
	allow := np("x", "from-a", sel(), ingress)
	allow.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "a")}}}}
	e.setPolicy(allow)
	if !e.reach(a, b, "tcp", 80) || e.reach(c, b, "tcp", 80) {
		t.Fatal("policy not enforced before the restart")
	}
	e.ipt.Close()
	ipt, err := NewIPTables(IPTablesConfig{NetNS: "/run/netns/" + e.node.Name})
	if err != nil {
		t.Fatal(err)
	}
	e.ipt, e.dp = ipt, ipt
	t.Cleanup(func() { ipt.Close() })
	if len(ipt.sets) == 0 {
		t.Error("the restarted datapath found no sets")
	}
	if !e.reach(a, b, "tcp", 80) || e.reach(c, b, "tcp", 80) {
		t.Error("enforcement changed with the agent gone")
	}
	// c was deleted while no agent ran.
	cc := NewCompiler("node-a")
	cc.SetHostIPs([]netip.Addr{netip.MustParseAddr("10.77.0.1")})
	cc.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x", "ns": "x"}}})
	for _, p := range []*tpod{a, b} {
		cc.SetPod(p.obj, p.ifindex)
	}
	if err := cc.SetPolicy(allow); err != nil {
		t.Fatal(err)
	}
	e.c = cc
	e.sync()
	if out := e.node.Run(t, "iptables-save", "-t", "filter"); strings.Contains(out, chainName(DirIngress, c.ifindex)+" ") {
		t.Errorf("the chain of a pod deleted while no agent ran is still there:\n%s", out)
	}
	if !e.reach(a, b, "tcp", 80) || e.reach(b, a, "tcp", 80) {
		t.Error("after the restart the policy is not what it was")
	}
}
