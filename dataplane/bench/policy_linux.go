package bench

import (
	"context"
	"encoding/json"
	"fmt"
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
	"k8s.io/client-go/kubernetes/fake"

	"github.com/waggle-io/waggle/cni"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane/policy"
)

type policyTopo struct {
	node    string
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

func newPolicyTopo() (*policyTopo, error) {
	sfx := randSuffix()
	t := &policyTopo{node: "npbn" + sfx, pods: map[string]netip.Addr{}, netns: map[string]string{}, ifindex: map[string]uint32{}}
	if err := sh("ip", "netns", "add", t.node); err != nil {
		return nil, err
	}
	t.closers = append(t.closers, func() { sh("ip", "netns", "del", t.node) })
	in := func(netns string, args ...string) error {
		return sh(append([]string{"ip", "netns", "exec", netns}, args...)...)
	}
	for _, c := range [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "link", "add", "npbr0", "type", "bridge"},
		{"ip", "addr", "add", "10.78.0.1/24", "dev", "npbr0"}, {"ip", "link", "set", "npbr0", "up"}} {
		if err := in(t.node, c...); err != nil {
			t.close()
			return nil, err
		}
	}
	names := []string{"client0", "server0", "client", "server-attached", "server-one", "server-many", "server-lat"}
	for i, name := range names {
		pns := fmt.Sprintf("npbp%d%s", i, sfx)
		ip := netip.AddrFrom4([4]byte{10, 78, 0, byte(10 + i)})
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
			{"ip", "netns", "exec", pns, "ip", "route", "add", "default", "via", "10.78.0.1"},
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

func benchPod(ns, name string, lbls map[string]string, ip netip.Addr, node string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls}, Spec: v1.PodSpec{NodeName: node},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: ip.String(), PodIPs: []v1.PodIP{{IP: ip.String()}}}}
}

func allowFrom(ns, name string, subject map[string]string, from map[string]string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: subject},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: from}}}}}}}
}

// RunPolicy runs `waggle bench policy`: TCP_CRR and TCP_RR pod to pod over
// one node's bridge, interleaved per round, with no policy programs, with
// the programs but no policy, with one policy, and with cfg.Policies
// policies and cfg.Pods pods' identities; then the time from a policy
// write to its enforcement.
func RunPolicy(ctx context.Context, cfg PolicyConfig) (*PolicyReport, error) {
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	t, err := newPolicyTopo()
	if err != nil {
		return nil, fmt.Errorf("set up namespaces: %w", err)
	}
	defer t.close()
	if err := os.MkdirAll(policy.DefaultPinRoot, 0o700); err != nil {
		return nil, err
	}
	pinParent, err := os.MkdirTemp(policy.DefaultPinRoot, "npbench-")
	if err != nil {
		return nil, err
	}
	t.pin = filepath.Join(pinParent, "policy")
	dp, err := policy.NewBPF(policy.BPFConfig{PinDir: t.pin, NetNS: "/run/netns/" + t.node})
	if err != nil {
		os.Remove(pinParent)
		return nil, err
	}
	defer func() { dp.Close(); policy.Cleanup(t.pin); os.Remove(pinParent) }()

	client := fake.NewClientset()
	type syncEv struct {
		at time.Time
		n  uint64
	}
	var mu sync.Mutex
	var syncs []syncEv
	synced := sync.NewCond(&mu)
	agent, err := policy.NewAgent(policy.AgentConfig{NodeName: "bench-node", Datapath: dp, Links: policy.NetlinkLinks{NetNS: "/run/netns/" + t.node}, Client: client})
	if err != nil {
		return nil, err
	}
	agent.OnSync = func(n uint64, ch policy.Changes, err error) {
		mu.Lock()
		syncs = append(syncs, syncEv{time.Now(), n})
		synced.Broadcast()
		mu.Unlock()
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- agent.Run(actx) }()
	defer func() { cancel(); <-done }()

	bg := context.Background()
	for _, n := range []string{"bench", "tenants"} {
		client.CoreV1().Namespaces().Create(bg, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/metadata.name": n}}}, metav1.CreateOptions{})
	}
	// The node's pods. client0/server0 carry no programs: they are left out
	// of the API (unknown pods get none).
	for _, name := range []string{"client", "server-attached", "server-one", "server-many", "server-lat"} {
		lbl := map[string]string{"app": name}
		if name == "client" {
			lbl["role"] = "client"
		}
		client.CoreV1().Pods("bench").Create(bg, benchPod("bench", name, lbl, t.pods[name], "bench-node"), metav1.CreateOptions{})
	}
	// cfg.Pods pods elsewhere, in label sets of 5 (cfg.Pods/5 identities).
	for i := 0; i < cfg.Pods; i++ {
		ip := netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		client.CoreV1().Pods("tenants").Create(bg, benchPod("tenants", fmt.Sprintf("p%d", i), map[string]string{"app": fmt.Sprintf("tenant-%d", i/5)}, ip, "elsewhere"), metav1.CreateOptions{})
	}
	client.NetworkingV1().NetworkPolicies("bench").Create(bg, allowFrom("bench", "one", map[string]string{"app": "server-one"}, map[string]string{"role": "client"}), metav1.CreateOptions{})
	for i := 0; i < cfg.Policies; i++ {
		from := map[string]string{"app": fmt.Sprintf("tenant-%d", i%max(1, cfg.Pods/5))}
		if i == cfg.Policies-1 {
			from = map[string]string{"role": "client"}
		}
		client.NetworkingV1().NetworkPolicies("bench").Create(bg, allowFrom("bench", fmt.Sprintf("many-%d", i), map[string]string{"app": "server-many"}, from), metav1.CreateOptions{})
	}
	// Wait until the many-server has its last policy's entry.
	waitProgrammed := func(what string, ok func() bool) error {
		deadline := time.Now().Add(2 * time.Minute)
		for !ok() {
			if time.Now().After(deadline) {
				return fmt.Errorf("timed out waiting for %s", what)
			}
			mu.Lock()
			n := len(syncs)
			for len(syncs) == n && time.Now().Before(deadline) {
				timer := time.AfterFunc(100*time.Millisecond, func() { mu.Lock(); synced.Broadcast(); mu.Unlock() })
				synced.Wait()
				timer.Stop()
			}
			mu.Unlock()
		}
		return nil
	}
	view, err := policy.OpenView(t.pin)
	if err != nil {
		return nil, err
	}
	defer view.Close()
	view.NetNS = "/run/netns/" + t.node
	entriesOf := func(name string) int {
		rules, _, _ := view.Rules(t.ifindex[name])
		return len(rules)
	}
	wantMany := min(cfg.Policies, cfg.Pods/5+1)
	if err := waitProgrammed("the policies", func() bool {
		return entriesOf("server-many") >= wantMany && entriesOf("server-one") >= 1
	}); err != nil {
		return nil, err
	}
	eps, _ := view.Endpoints()
	rep := &PolicyReport{Started: time.Now().UTC(), Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Clients: cfg.Clients, Rounds: cfg.Rounds,
		Duration: cfg.Duration.String(), Policies: cfg.Policies, Pods: cfg.Pods, Identities: cfg.Pods/5 + 5, Entries: entriesOf("server-many")}
	rep.Notes = append(rep.Notes, fmt.Sprintf("%d endpoints on the node; the %s server is selected by all %d policies (%d entries)", len(eps), PolicyPathMany, cfg.Policies, rep.Entries),
		"TCP_CRR closes with SO_LINGER 0 (RST, no TIME_WAIT); the policy conntrack is an LRU, so CRR flows are created and aged out, never deleted",
		"iptables/nftables fallback: not implemented yet, so no column")

	// Sanity: every path connects.
	paths := []struct{ name, from, to string }{
		{PolicyPathNone, "client0", "server0"}, {PolicyPathAttached, "client", "server-attached"},
		{PolicyPathOne, "client", "server-one"}, {PolicyPathMany, "client", "server-many"},
	}
	mcfg := Config{Clients: cfg.Clients, Warmup: cfg.Warmup, Duration: cfg.Duration}
	for _, test := range []string{"TCP_CRR", "TCP_RR"} {
		row := Row{Services: 0, Test: test, Paths: map[string]*Stat{}}
		for _, p := range paths {
			row.Paths[p.name] = &Stat{}
		}
		// An unrecorded warm-up pass, then interleaved rounds.
		for round := -1; round < cfg.Rounds; round++ {
			for _, p := range paths {
				target := netip.AddrPortFrom(t.pods[p.to], bePort).String()
				rate, errs := measure(ctx, "/run/netns/"+t.netns[p.from], test, func(int) string { return target }, mcfg)
				if round >= 0 {
					s := row.Paths[p.name]
					s.Rounds = append(s.Rounds, rate)
					s.Errors += errs
				}
			}
		}
		base := row.Paths[PolicyPathNone]
		base.summarize()
		for _, p := range paths {
			s := row.Paths[p.name]
			s.summarize()
			if base.Median > 0 {
				s.Ratio = s.Median / base.Median
			}
		}
		rep.Rows = append(rep.Rows, row)
	}

	// Policy write to enforcement: create / delete a deny-all on server-lat
	// while the rest stands; each sample from the Create (or Delete) call to
	// the end of the agent sync that programmed it.
	var lat []float64
	lp := func() *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: "lat"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server-lat"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	}
	isolated := func() bool {
		e, err := view.FindEndpoint("bench/server-lat")
		return err == nil && e.IngressIsolated
	}
	for i := 0; i < cfg.LatencySamples; i++ {
		start := time.Now()
		want := i%2 == 0
		if want {
			client.NetworkingV1().NetworkPolicies("bench").Create(bg, lp(), metav1.CreateOptions{})
		} else {
			client.NetworkingV1().NetworkPolicies("bench").Delete(bg, "lat", metav1.DeleteOptions{})
		}
		if err := waitProgrammed("the latency policy", func() bool { return isolated() == want }); err != nil {
			return nil, err
		}
		// The state is checked after every sync, so the last sync that ended
		// before it was seen is the one that programmed it.
		mu.Lock()
		seen := time.Now()
		end := seen
		for i := len(syncs) - 1; i >= 0; i-- {
			if !syncs[i].at.After(seen) {
				if syncs[i].at.After(start) {
					end = syncs[i].at
				}
				break
			}
		}
		mu.Unlock()
		lat = append(lat, float64(end.Sub(start))/1e6)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		rep.WriteToEnforcedP50ms = lat[len(lat)/2]
		rep.WriteToEnforcedP99ms = lat[min(len(lat)-1, len(lat)*99/100)]
		rep.WriteToEnforcedMaxms = lat[len(lat)-1]
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
	fmt.Fprintf(w, "waggle bench policy — kernel %s, %d CPUs, %d clients, 1-byte echo, pod to pod over one node's bridge, %d rounds × %s (interleaved), median [min–max] per second\n",
		r.Kernel, r.CPUs, r.Clients, r.Rounds, r.Duration)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  · %s\n", n)
	}
	paths := []string{PolicyPathNone, PolicyPathAttached, PolicyPathOne, PolicyPathMany}
	fmt.Fprintf(w, "\n| test | %s | %s | %s | %d policies, %d pods |\n|---|---|---|---|---|\n", paths[0], paths[1], paths[2], r.Policies, r.Pods)
	for _, row := range r.Rows {
		fmt.Fprintf(w, "| %s |", row.Test)
		for i, p := range paths {
			s := row.Paths[p]
			errs := ""
			if s.Errors > 0 {
				errs = fmt.Sprintf(" (%d errors)", s.Errors)
			}
			if i == 0 {
				fmt.Fprintf(w, " %s [%s–%s]%s |", human(s.Median), human(s.Min), human(s.Max), errs)
			} else {
				fmt.Fprintf(w, " %s (%.2f×) [%s–%s]%s |", human(s.Median), s.Ratio, human(s.Min), human(s.Max), errs)
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\npolicy write (API client Create/Delete, informer, compile, maps) to enforced, %d policies and %d pods present: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
		r.Policies, r.Pods, r.WriteToEnforcedP50ms, r.WriteToEnforcedP99ms, r.WriteToEnforcedMaxms)
}

func kernelRelease() string {
	var un unix.Utsname
	if unix.Uname(&un) != nil {
		return "?"
	}
	return unix.ByteSliceToString(un.Release[:])
}
