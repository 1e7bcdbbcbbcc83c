package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/waggle-io/waggle/cni"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/dataplane/policy"
	"github.com/waggle-io/waggle/internal/ops"
)

type policyTopo struct {
	node    string
	subnet  byte // pods in 10.<subnet>.0.0/24
	pods    map[string]netip.Addr
	netns   map[string]string
	ifindex map[string]uint32
	closers []func()
	pin     string
}

func (t *policyTopo) close() {
	for i := len(t.closers) - 1; i >= 0; i-- {
		t.closers[i]()
	}
}

func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newPolicyTopo(subnet byte) (*policyTopo, error) {
	sfx := randSuffix()
	t := &policyTopo{node: "npbn" + sfx, subnet: subnet, pods: map[string]netip.Addr{}, netns: map[string]string{}, ifindex: map[string]uint32{}}
	if err := sh("ip", "netns", "add", t.node); err != nil {
		return nil, err
	}
	t.closers = append(t.closers, func() { sh("ip", "netns", "del", t.node) })
	in := func(netns string, args ...string) error {
		return sh(append([]string{"ip", "netns", "exec", netns}, args...)...)
	}
	gw := netip.AddrFrom4([4]byte{10, subnet, 0, 1})
	for _, c := range [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "link", "add", "npbr0", "type", "bridge"},
		{"ip", "addr", "add", gw.String() + "/24", "dev", "npbr0"}, {"ip", "link", "set", "npbr0", "up"}} {
		if err := in(t.node, c...); err != nil {
			t.close()
			return nil, err
		}
	}
	names := []string{"client0", "server0", "client", "server-attached", "server-one", "server-many", "server-lat"}
	for i, name := range names {
		pns := fmt.Sprintf("npbp%d%s", i, sfx)
		ip := netip.AddrFrom4([4]byte{10, subnet, 0, byte(10 + i)})
		veth := fmt.Sprintf("npbv%d%s", i, sfx)
		if err := sh("ip", "netns", "add", pns); err != nil {
			t.close()
			return nil, err
		}
		t.closers = append(t.closers, func() { sh("ip", "netns", "del", pns) })
		for _, c := range [][]string{
			{"ip", "netns", "exec", t.node, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pns},
			{"ip", "netns", "exec", t.node, "ip", "link", "set", veth, "master", "npbr0", "up"},
			{"ip", "netns", "exec", t.node, "ip", "link", "set", veth, "alias", cni.HostVethAlias([]netip.Addr{ip})},
			{"ip", "netns", "exec", pns, "ip", "link", "set", "lo", "up"},
			{"ip", "netns", "exec", pns, "ip", "addr", "add", ip.String() + "/24", "dev", "eth0"},
			{"ip", "netns", "exec", pns, "ip", "link", "set", "eth0", "up"},
			{"ip", "netns", "exec", pns, "ip", "route", "add", "default", "via", gw.String()},
		} {
			if err := sh(c...); err != nil {
				t.close()
				return nil, err
			}
		}
		var idx int
		if err := ns.WithNetNSPath("/run/netns/"+t.node, func(ns.NetNS) error {
			ifc, err := net.InterfaceByName(veth)
			if err == nil {
				idx = ifc.Index
			}
			return err
		}); err != nil {
			t.close()
			return nil, err
		}
		t.pods[name], t.netns[name], t.ifindex[name] = ip, pns, uint32(idx)
		if strings.HasPrefix(name, "server") {
			var ln net.Listener
			if err := ns.WithNetNSPath("/run/netns/"+pns, func(ns.NetNS) error {
				var err error
				ln, err = net.Listen("tcp", netip.AddrPortFrom(ip, bePort).String())
				return err
			}); err != nil {
				t.close()
				return nil, err
			}
			t.closers = append(t.closers, func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						b := make([]byte, 64)
						for {
							n, err := c.Read(b)
							if err != nil {
								return
							}
							if _, err := c.Write(b[:n]); err != nil {
								return
							}
						}
					}()
				}
			}()
		}
	}
	return t, nil
}

func benchPod(ns, name string, lbls map[string]string, node string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "c", Image: "bench"}}}}
}

func allowFrom(ns, name string, subject map[string]string, from map[string]string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: subject},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: from}}}}}}}
}

// startAPIServer runs a Waggle API server (embedded etcd, without fsync:
// a benchmark's data need not survive) in dir and returns an admin client.
func startAPIServer(ctx context.Context, dir string) (*kubernetes.Clientset, func(), error) {
	log, err := ops.NewLogger("apiserver", "error")
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	srv, err := apiserver.New(ctx, apiserver.Config{DataDir: dir, Listener: ln, Log: log, EtcdUnsafeNoFsync: true,
		BookmarkInterval: time.Second, ShutdownTimeout: 5 * time.Second,
		// No controller-manager makes `default` ServiceAccounts here.
		DisableAdmissionPlugins: []string{"ServiceAccount"}})
	if err != nil {
		cancel()
		ln.Close()
		return nil, nil, fmt.Errorf("start API server: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	stop := func() { cancel(); <-done }
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		stop()
		return nil, nil, err
	}
	rc.QPS, rc.Burst = -1, 0
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		stop()
		return nil, nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get(rc.Host + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			stop()
			return nil, nil, fmt.Errorf("API server not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return cs, stop, nil
}

// createPods creates pods and sets their status (Running, the address)
// through the API, with a few writers in parallel.
func createPods(ctx context.Context, cs kubernetes.Interface, pods []*v1.Pod, ips []netip.Addr) error {
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				p, err := cs.CoreV1().Pods(pods[i].Namespace).Create(ctx, pods[i], metav1.CreateOptions{})
				if err == nil {
					p.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: ips[i].String(), PodIPs: []v1.PodIP{{IP: ips[i].String()}}}
					_, err = cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
				}
				if err != nil {
					select {
					case errc <- fmt.Errorf("pod %s/%s: %w", pods[i].Namespace, pods[i].Name, err):
					default:
					}
				}
			}
		}()
	}
	for i := range pods {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// policyNode is one node of the benchmark: its namespaces, a datapath,
// an agent fed by the API server, and how to see what it programmed.
type policyNode struct {
	kind, name, ns string
	t              *policyTopo
	mu             sync.Mutex
	syncs          []time.Time
	synced         *sync.Cond
	// rules counts the allowing entries (eBPF) or rules (iptables) of a
	// pod; isolated reports whether the pod is isolated for ingress.
	rules    func(pod string) int
	isolated func(pod string) bool
}

// iptablesSave is the node namespace's filter table.
func (n *policyNode) iptablesSave() string {
	out, _ := exec.Command("ip", "netns", "exec", n.t.node, "iptables-save", "-t", "filter").Output()
	return string(out)
}

func startPolicyNode(ctx context.Context, kind string, subnet byte, cs kubernetes.Interface, closers *[]func()) (*policyNode, error) {
	t, err := newPolicyTopo(subnet)
	if err != nil {
		return nil, fmt.Errorf("set up namespaces: %w", err)
	}
	*closers = append(*closers, t.close)
	n := &policyNode{kind: kind, name: "bench-" + kind, ns: "bench-" + kind, t: t}
	n.synced = sync.NewCond(&n.mu)
	nsPath := "/run/netns/" + t.node
	var dp policy.Datapath
	switch kind {
	case "ebpf":
		if err := os.MkdirAll(policy.DefaultPinRoot, 0o700); err != nil {
			return nil, err
		}
		pinParent, err := os.MkdirTemp(policy.DefaultPinRoot, "npbench-")
		if err != nil {
			return nil, err
		}
		t.pin = filepath.Join(pinParent, "policy")
		b, err := policy.NewBPF(policy.BPFConfig{PinDir: t.pin, NetNS: nsPath})
		if err != nil {
			os.Remove(pinParent)
			return nil, err
		}
		*closers = append(*closers, func() { b.Close(); policy.Cleanup(t.pin); os.Remove(pinParent) })
		view, err := policy.OpenView(t.pin)
		if err != nil {
			return nil, err
		}
		view.NetNS = nsPath
		*closers = append(*closers, func() { view.Close() })
		n.rules = func(pod string) int {
			rules, _, _ := view.Rules(t.ifindex[pod])
			return len(rules)
		}
		n.isolated = func(pod string) bool {
			e, err := view.FindEndpoint(n.ns + "/" + pod)
			return err == nil && e.IngressIsolated
		}
		dp = b
	case "iptables":
		ipt, err := policy.NewIPTables(policy.IPTablesConfig{NetNS: nsPath})
		if err != nil {
			return nil, err
		}
		*closers = append(*closers, func() { ipt.Close(); policy.CleanupIPTables(nsPath) })
		n.rules = func(pod string) int {
			prefix := fmt.Sprintf("-A WAGGLE-POL-I-%d ", t.ifindex[pod])
			c := 0
			for _, l := range strings.Split(n.iptablesSave(), "\n") {
				if strings.HasPrefix(l, prefix) && strings.HasSuffix(l, "-j RETURN") {
					c++
				}
			}
			return c
		}
		n.isolated = func(pod string) bool {
			return strings.Contains(n.iptablesSave(), fmt.Sprintf("-j WAGGLE-POL-I-%d\n", t.ifindex[pod]))
		}
		dp = ipt
	}
	agent, err := policy.NewAgent(policy.AgentConfig{NodeName: n.name, Datapath: dp, Links: policy.NetlinkLinks{NetNS: nsPath}, Client: cs,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	agent.OnSync = func(uint64, policy.Changes, error) {
		n.mu.Lock()
		n.syncs = append(n.syncs, time.Now())
		n.synced.Broadcast()
		n.mu.Unlock()
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(actx) }()
	*closers = append(*closers, func() { cancel(); <-done })
	return n, nil
}

// waitProgrammed waits, sync by sync, until ok.
func (n *policyNode) waitProgrammed(what string, ok func() bool) error {
	deadline := time.Now().Add(3 * time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: timed out waiting for %s", n.kind, what)
		}
		n.mu.Lock()
		c := len(n.syncs)
		for len(n.syncs) == c && time.Now().Before(deadline) {
			timer := time.AfterFunc(100*time.Millisecond, func() { n.mu.Lock(); n.synced.Broadcast(); n.mu.Unlock() })
			n.synced.Wait()
			timer.Stop()
		}
		n.mu.Unlock()
	}
	return nil
}

// RunPolicy runs `waggle bench policy`: TCP_CRR and TCP_RR pod to pod over
// a node's bridge, interleaved per round, with no policy programs, and per
// datapath (eBPF, iptables: each its own node namespace and agent, both fed
// by one API server) with the programs but no policy, with one policy, and
// with cfg.Policies policies and cfg.Pods pods' identities; then the time
// from a policy write through the API server to its enforcement.
func RunPolicy(ctx context.Context, cfg PolicyConfig) (*PolicyReport, error) {
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	dir, err := os.MkdirTemp("", "npbench-api-")
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { os.RemoveAll(dir) })
	cs, stop, err := startAPIServer(ctx, dir)
	if err != nil {
		return nil, err
	}
	closers = append(closers, stop)
	bg := ctx
	nsNames := []string{"tenants"}
	for _, kind := range PolicyDatapaths {
		nsNames = append(nsNames, "bench-"+kind)
	}
	for _, n := range nsNames {
		if _, err := cs.CoreV1().Namespaces().Create(bg, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	nodes := map[string]*policyNode{}
	for i, kind := range PolicyDatapaths {
		n, err := startPolicyNode(ctx, kind, byte(78+i), cs, &closers)
		if err != nil {
			return nil, fmt.Errorf("%s node: %w", kind, err)
		}
		nodes[kind] = n
	}
	// cfg.Pods pods elsewhere, in label sets of 5 (cfg.Pods/5 identities),
	// and each node's pods. client0/server0 carry no programs: they are
	// left out of the API (unknown pods get none).
	var pods []*v1.Pod
	var ips []netip.Addr
	for i := 0; i < cfg.Pods; i++ {
		pods = append(pods, benchPod("tenants", fmt.Sprintf("p%d", i), map[string]string{"app": fmt.Sprintf("tenant-%d", i/5)}, "elsewhere"))
		ips = append(ips, netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}))
	}
	for _, kind := range PolicyDatapaths {
		n := nodes[kind]
		for _, name := range []string{"client", "server-attached", "server-one", "server-many", "server-lat"} {
			lbl := map[string]string{"app": name}
			if name == "client" {
				lbl["role"] = "client"
			}
			pods = append(pods, benchPod(n.ns, name, lbl, n.name))
			ips = append(ips, n.t.pods[name])
		}
	}
	setupStart := time.Now()
	if err := createPods(bg, cs, pods, ips); err != nil {
		return nil, err
	}
	for _, kind := range PolicyDatapaths {
		ns := nodes[kind].ns
		if _, err := cs.NetworkingV1().NetworkPolicies(ns).Create(bg, allowFrom(ns, "one", map[string]string{"app": "server-one"}, map[string]string{"role": "client"}), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		for i := 0; i < cfg.Policies; i++ {
			from := map[string]string{"app": fmt.Sprintf("tenant-%d", i%max(1, cfg.Pods/5))}
			if i == cfg.Policies-1 {
				from = map[string]string{"role": "client"}
			}
			if _, err := cs.NetworkingV1().NetworkPolicies(ns).Create(bg, allowFrom(ns, fmt.Sprintf("many-%d", i), map[string]string{"app": "server-many"}, from), metav1.CreateOptions{}); err != nil {
				return nil, err
			}
		}
	}
	wantMany := min(cfg.Policies, cfg.Pods/5+1)
	rep := &PolicyReport{Started: time.Now().UTC(), Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Clients: cfg.Clients, Rounds: cfg.Rounds,
		Duration: cfg.Duration.String(), Policies: cfg.Policies, Pods: cfg.Pods, Identities: cfg.Pods/5 + 5,
		Entries: map[string]int{}, WriteToEnforced: map[string]LatencyMS{}}
	for _, kind := range PolicyDatapaths {
		n := nodes[kind]
		if err := n.waitProgrammed("the policies", func() bool {
			return n.rules("server-many") >= wantMany && n.rules("server-one") >= 1
		}); err != nil {
			return nil, err
		}
		rep.Entries[kind] = n.rules("server-many")
	}
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("one API server (embedded etcd); per datapath a node namespace and an agent; %d pods and %d policies written in %.1f s",
			len(pods), len(PolicyDatapaths)*(cfg.Policies+1), time.Since(setupStart).Seconds()),
		fmt.Sprintf("the %s server is selected by all %d policies: %d eBPF entries, %d iptables rules (the client's policy is the last one written: iptables walks every rule before it)",
			PolicyPathMany, cfg.Policies, rep.Entries["ebpf"], rep.Entries["iptables"]),
		"TCP_CRR closes with SO_LINGER 0 (RST, no TIME_WAIT); the eBPF policy conntrack is an LRU, iptables uses the kernel's conntrack (ESTABLISHED skips the rules)",
		"no-programs: client0 -> server0 on the eBPF node, pods no agent knows")

	type path struct{ key, node, from, to string }
	paths := []path{{PolicyPathNone, "ebpf", "client0", "server0"}}
	for _, kind := range PolicyDatapaths {
		paths = append(paths, path{kind + "/" + PolicyPathAttached, kind, "client", "server-attached"},
			path{kind + "/" + PolicyPathOne, kind, "client", "server-one"}, path{kind + "/" + PolicyPathMany, kind, "client", "server-many"})
	}
	mcfg := Config{Clients: cfg.Clients, Warmup: cfg.Warmup, Duration: cfg.Duration}
	for _, test := range []string{"TCP_CRR", "TCP_RR"} {
		row := Row{Services: 0, Test: test, Paths: map[string]*Stat{}}
		for _, p := range paths {
			row.Paths[p.key] = &Stat{}
		}
		// An unrecorded warm-up pass, then interleaved rounds.
		for round := -1; round < cfg.Rounds; round++ {
			for _, p := range paths {
				t := nodes[p.node].t
				target := netip.AddrPortFrom(t.pods[p.to], bePort).String()
				rate, errs := measure(ctx, "/run/netns/"+t.netns[p.from], test, func(int) string { return target }, mcfg)
				if round >= 0 {
					s := row.Paths[p.key]
					s.Rounds = append(s.Rounds, rate)
					s.Errors += errs
				}
			}
		}
		base := row.Paths[PolicyPathNone]
		base.summarize()
		for _, p := range paths {
			s := row.Paths[p.key]
			s.summarize()
			if base.Median > 0 {
				s.Ratio = s.Median / base.Median
			}
		}
		rep.Rows = append(rep.Rows, row)
	}

	// Policy write to enforcement: create / delete a deny-all on server-lat
	// while the rest stands, the datapaths taking turns; each sample from
	// the Create (or Delete) call to the end of the agent sync that
	// programmed it.
	lat := map[string][]float64{}
	for i := 0; i < cfg.LatencySamples; i++ {
		for _, kind := range PolicyDatapaths {
			n := nodes[kind]
			start := time.Now()
			want := i%2 == 0
			var err error
			if want {
				_, err = cs.NetworkingV1().NetworkPolicies(n.ns).Create(bg, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: n.ns, Name: "lat"},
					Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server-lat"}},
						PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}, metav1.CreateOptions{})
			} else {
				err = cs.NetworkingV1().NetworkPolicies(n.ns).Delete(bg, "lat", metav1.DeleteOptions{})
			}
			if err != nil {
				return nil, err
			}
			if err := n.waitProgrammed("the latency policy", func() bool { return n.isolated("server-lat") == want }); err != nil {
				return nil, err
			}
			// The state is checked after every sync, so the last sync that
			// ended before it was seen is the one that programmed it.
			n.mu.Lock()
			seen := time.Now()
			end := seen
			for j := len(n.syncs) - 1; j >= 0; j-- {
				if !n.syncs[j].After(seen) {
					if n.syncs[j].After(start) {
						end = n.syncs[j]
					}
					break
				}
			}
			n.mu.Unlock()
			lat[kind] = append(lat[kind], float64(end.Sub(start))/1e6)
		}
	}
	for kind, l := range lat {
		slices.Sort(l)
		rep.WriteToEnforced[kind] = LatencyMS{P50: l[len(l)/2], P99: l[min(len(l)-1, len(l)*99/100)], Max: l[len(l)-1]}
	}
	rep.print(cfg)
	if cfg.Output != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(cfg.Output, append(b, '\n'), 0o644); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func (r *PolicyReport) print(cfg PolicyConfig) {
	w := cfg.Out
	fmt.Fprintf(w, "waggle bench policy — kernel %s, %d CPUs, %d clients, 1-byte echo, pod to pod over one node's bridge, %d rounds × %s (interleaved), median [min–max] per second, ratio to no-programs\n",
		r.Kernel, r.CPUs, r.Clients, r.Rounds, r.Duration)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  · %s\n", n)
	}
	paths := []string{PolicyPathAttached, PolicyPathOne, PolicyPathMany}
	fmt.Fprintf(w, "\n| test | datapath | %s | %s | %s | %d policies, %d pods |\n|---|---|---|---|---|---|\n", PolicyPathNone, paths[0], paths[1], r.Policies, r.Pods)
	cell := func(s *Stat, ratio bool) string {
		if s == nil {
			return "–"
		}
		errs := ""
		if s.Errors > 0 {
			errs = fmt.Sprintf(" (%d errors)", s.Errors)
		}
		if !ratio {
			return fmt.Sprintf("%s [%s–%s]%s", human(s.Median), human(s.Min), human(s.Max), errs)
		}
		return fmt.Sprintf("%s (%.2f×) [%s–%s]%s", human(s.Median), s.Ratio, human(s.Min), human(s.Max), errs)
	}
	for _, row := range r.Rows {
		for i, kind := range PolicyDatapaths {
			base := ""
			if i == 0 {
				base = cell(row.Paths[PolicyPathNone], false)
			}
			fmt.Fprintf(w, "| %s | %s | %s |", row.Test, kind, base)
			for _, p := range paths {
				fmt.Fprintf(w, " %s |", cell(row.Paths[kind+"/"+p], true))
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "\npolicy write (Create/Delete through the API server, informer, compile, kernel state) to enforced, %d policies and %d pods present, %d samples each:\n",
		r.Policies, r.Pods, cfg.LatencySamples)
	for _, kind := range PolicyDatapaths {
		l := r.WriteToEnforced[kind]
		fmt.Fprintf(w, "  %-8s p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", kind, l.P50, l.P99, l.Max)
	}
}

func kernelRelease() string {
	var un unix.Utsname
	if unix.Uname(&un) != nil {
		return "?"
	}
	return unix.ByteSliceToString(un.Release[:])
}
