package iptables_test

import (
	"context"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/dataplane/iptables"
	"github.com/waggle-io/waggle/dataplane/iptables/iptablestest"

	"github.com/waggle-io/waggle/dataplane"
)

var update = flag.Bool("update", false, "rewrite golden files")

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func fe(kind dataplane.FrontendKind, key string, proto dataplane.Protocol, svc string, eps ...string) dataplane.Frontend {
	k := ap(key)
	ns, name, _ := strings.Cut(svc, "/")
	f := dataplane.Frontend{
		FrontendKey: dataplane.FrontendKey{Addr: k.Addr(), Port: k.Port(), Protocol: proto},
		Kind:        kind,
		Service:     dataplane.ServicePortName{Namespace: ns, Name: name, Port: "p"},
	}
	for _, e := range eps {
		a := ap(e)
		f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: a.Addr(), Port: a.Port()})
	}
	return f
}

func sampleState() *dataplane.State {
	aff := fe(dataplane.ClusterIP, "10.96.0.20:443", dataplane.TCP, "default/sticky", "10.244.0.5:8443", "10.244.1.5:8443")
	aff.AffinityTimeout = 3 * time.Hour
	local := fe(dataplane.ExternalIP, "203.0.113.9:80", dataplane.TCP, "shop/web", "10.244.0.7:8080")
	local.LocalOnly = true
	st := &dataplane.State{
		NodeName:     "node-a",
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")},
		Frontends: []dataplane.Frontend{
			fe(dataplane.ClusterIP, "10.96.0.10:53", dataplane.UDP, "kube-system/dns", "10.244.0.2:5353", "10.244.1.2:5353", "10.244.2.2:5353"),
			fe(dataplane.ClusterIP, "10.96.0.11:80", dataplane.TCP, "default/idle"),
			aff,
			fe(dataplane.NodePort, "192.168.1.10:30080", dataplane.TCP, "shop/web", "10.244.0.7:8080", "10.244.1.7:8080"),
			local,
			fe(dataplane.ClusterIP, "[fd00:96::10]:80", dataplane.TCP, "default/v6", "[fd00:244::3]:8080"),
		},
	}
	return st
}

func newFake(t *testing.T, fr *iptablestest.FakeRunner) *iptables.Backend {
	t.Helper()
	b, err := iptables.New(iptables.Config{Runner: fr})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if got != string(want) {
		t.Errorf("differs from %s (run with -update if intended):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func TestRenderGolden(t *testing.T) {
	st := sampleState()
	golden(t, "restore-ipv4.golden", string(iptables.Render(st, iptables.IPv4, iptables.RenderOptions{}).RestoreInput()))
	golden(t, "restore-ipv6.golden", string(iptables.Render(st, iptables.IPv6, iptables.RenderOptions{}).RestoreInput()))
}

func TestSyncFakeSaveGolden(t *testing.T) {
	fr := iptablestest.NewFakeRunner()
	b := newFake(t, fr)
	if err := b.Sync(context.Background(), sampleState()); err != nil {
		t.Fatal(err)
	}
	golden(t, "fake-save-ipv4.golden", fr.Dump(iptables.IPv4))
}

func TestProbabilityHasKubeProxyPrecision(t *testing.T) {
	for n, want := range map[int]string{1: "1.0000000000", 2: "0.5000000000", 3: "0.3333333333", 7: "0.1428571429"} {
		if got := iptables.Probability(n); got != want {
			t.Errorf("probability(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestChainNamesFitIptablesLimit(t *testing.T) {
	for _, name := range iptables.Render(sampleState(), iptables.IPv4, iptables.RenderOptions{}).ChainNames() {
		if len(name) > 28 {
			t.Errorf("chain %s is %d characters, iptables allows 28", name, len(name))
		}
	}
}

func TestRepeatedSyncIsPartialAndChangesNothing(t *testing.T) {
	fr := iptablestest.NewFakeRunner()
	b := newFake(t, fr)
	ctx := context.Background()
	st := sampleState()
	if err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	before := fr.Dump(iptables.IPv4) + fr.Dump(iptables.IPv6)
	if err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	if after := fr.Dump(iptables.IPv4) + fr.Dump(iptables.IPv6); after != before {
		t.Fatalf("second sync changed the tables:\n%s\nvs\n%s", before, after)
	}
	r := fr.Restores()
	last := r[len(r)-1]
	if strings.Contains(last, ":"+iptables.SvcPrefix) || strings.Contains(last, ":"+iptables.SepPrefix) {
		t.Errorf("repeated sync rewrote per-service chains:\n%s", last)
	}
}

func TestPartialSyncRewritesOnlyChangedService(t *testing.T) {
	fr := iptablestest.NewFakeRunner()
	b := newFake(t, fr)
	ctx := context.Background()
	st := sampleState()
	if err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	st.Frontends[0].Endpoints = st.Frontends[0].Endpoints[:2] // dns scales down
	if err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	r := fr.Restores()
	last := r[len(r)-2] // iptables.IPv4 restore (iptables.IPv6 follows)
	dnsChain := iptables.SvcPrefix + iptables.Hash(dataplane.ClusterIP, st.Frontends[0].FrontendKey.String())
	stickyChain := iptables.SvcPrefix + iptables.Hash(dataplane.ClusterIP, st.Frontends[2].FrontendKey.String())
	removed := iptables.SepPrefix + iptables.Hash(dataplane.ClusterIP, st.Frontends[0].FrontendKey.String(), "10.244.2.2:5353")
	if !strings.Contains(last, ":"+dnsChain) {
		t.Errorf("changed service chain %s not rewritten:\n%s", dnsChain, last)
	}
	if strings.Contains(last, ":"+stickyChain) {
		t.Errorf("unchanged service chain %s rewritten:\n%s", stickyChain, last)
	}
	if !strings.Contains(last, "-X "+removed) {
		t.Errorf("removed endpoint chain %s not deleted:\n%s", removed, last)
	}
	if strings.Contains(fr.Dump(iptables.IPv4), "10.244.2.2") {
		t.Error("removed endpoint still in the tables")
	}
}

func TestFullSyncRemovesStrayChains(t *testing.T) {
	fr := iptablestest.NewFakeRunner()
	b := newFake(t, fr)
	ctx := context.Background()
	if err := b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	// Drift: someone left a Waggle chain behind (an older proxy, a crash).
	if err := fr.Restore(ctx, iptables.IPv4, []byte("*nat\n:WAGGLE-SVC-STRAY000000000 - [0:0]\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	b.RequestFullSync()
	if err := b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fr.Dump(iptables.IPv4), "STRAY") {
		t.Error("full sync left a stray WAGGLE- chain")
	}
}

func TestSyncCoexistsWithOtherRules(t *testing.T) {
	fr := iptablestest.NewFakeRunner()
	ctx := context.Background()
	foreign := "*nat\n:DOCKER - [0:0]\n-A DOCKER -d 172.17.0.2/32 -p tcp -m tcp --dport 80 -j ACCEPT\n-A OUTPUT -j DOCKER\nCOMMIT\n*filter\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n"
	if err := fr.Restore(ctx, iptables.IPv4, []byte(foreign)); err != nil {
		t.Fatal(err)
	}
	b := newFake(t, fr)
	if err := b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	if err := b.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	dump := fr.Dump(iptables.IPv4)
	for _, want := range []string{"-A DOCKER -d 172.17.0.2/32", "-A OUTPUT -j DOCKER", "--dport 22 -j ACCEPT"} {
		if !strings.Contains(dump, want) {
			t.Errorf("foreign rule %q lost:\n%s", want, dump)
		}
	}
	if strings.Contains(dump+fr.Dump(iptables.IPv6), "WAGGLE") {
		t.Errorf("cleanup left Waggle rules:\n%s", dump)
	}
	if err := b.Cleanup(ctx); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

func TestFailedRestoreForcesFullSyncNext(t *testing.T) {
	fr := iptablestest.NewFakeRunner()
	b := newFake(t, fr)
	ctx := context.Background()
	if err := b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	fr.FailRestore = errors.New("injected")
	if err := b.Sync(ctx, sampleState()); err == nil {
		t.Fatal("sync succeeded although iptables-restore failed")
	}
	fr.FailRestore = nil
	if err := b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	r := fr.Restores()
	if !strings.Contains(r[len(r)-2], ":"+iptables.SvcPrefix) {
		t.Error("sync after a failure was not a full sync")
	}
}

func TestSyncRefusesInvalidStateAndKeepsRules(t *testing.T) {
	fr := iptablestest.NewFakeRunner()
	b := newFake(t, fr)
	ctx := context.Background()
	if err := b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	before := fr.Dump(iptables.IPv4)
	bad := sampleState()
	bad.Frontends[0], bad.Frontends[1] = bad.Frontends[1], bad.Frontends[0]
	if err := b.Sync(ctx, bad); err == nil {
		t.Fatal("unsorted state accepted")
	}
	if fr.Dump(iptables.IPv4) != before {
		t.Error("a refused state changed the rules")
	}
}

func TestTraceThroughRules(t *testing.T) {
	fr := iptablestest.NewFakeRunner(netip.MustParseAddr("192.168.1.10"))
	b := newFake(t, fr)
	if err := b.Sync(context.Background(), sampleState()); err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddr("192.168.1.10")
	tests := []struct {
		name     string
		proto    string
		src      netip.Addr
		dst      string
		want     []string // any of
		rejected bool
		masq     bool
	}{
		{"clusterIP UDP reaches an endpoint", "udp", client, "10.96.0.10:53", []string{"10.244.0.2:5353", "10.244.1.2:5353", "10.244.2.2:5353"}, false, true},
		{"pod source to clusterIP is not masqueraded", "udp", netip.MustParseAddr("10.244.3.3"), "10.96.0.10:53", []string{"10.244.0.2:5353", "10.244.1.2:5353", "10.244.2.2:5353"}, false, false},
		{"service without endpoints is rejected", "tcp", client, "10.96.0.11:80", nil, true, false},
		{"nodePort on the node IP reaches an endpoint", "tcp", client, "192.168.1.10:30080", []string{"10.244.0.7:8080", "10.244.1.7:8080"}, false, true},
		{"external IP with Local policy is not masqueraded", "tcp", netip.MustParseAddr("10.244.3.3"), "203.0.113.9:80", []string{"10.244.0.7:8080"}, false, false},
		{"other traffic passes untouched", "tcp", client, "1.1.1.1:80", []string{"1.1.1.1:80"}, false, false},
		{"wrong protocol passes untouched", "tcp", client, "10.96.0.10:53", []string{"10.96.0.10:53"}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := fr.Connect(iptables.IPv4, tt.proto, tt.src, ap(tt.dst))
			if err != nil {
				t.Fatal(err)
			}
			if v.Rejected != tt.rejected || v.Masqueraded != tt.masq {
				t.Fatalf("verdict %+v, want rejected=%v masqueraded=%v", v, tt.rejected, tt.masq)
			}
			if !tt.rejected {
				ok := false
				for _, w := range tt.want {
					ok = ok || v.Dst == ap(w)
				}
				if !ok {
					t.Errorf("destination %s, want one of %v", v.Dst, tt.want)
				}
			}
		})
	}
}

func TestAffinitySticksAndExpires(t *testing.T) {
	now := time.Unix(1000, 0)
	fr := iptablestest.NewFakeRunner()
	fr.Now = func() time.Time { return now }
	b := newFake(t, fr)
	if err := b.Sync(context.Background(), sampleState()); err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddr("10.244.9.9")
	first, err := fr.Connect(iptables.IPv4, "tcp", client, ap("10.96.0.20:443"))
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		v, _ := fr.Connect(iptables.IPv4, "tcp", client, ap("10.96.0.20:443"))
		if v.Dst != first.Dst {
			t.Fatalf("affinity broken: %s then %s", first.Dst, v.Dst)
		}
	}
	now = now.Add(3*time.Hour + time.Second)
	seen := map[netip.AddrPort]bool{}
	for range 200 {
		now = now.Add(3*time.Hour + time.Second) // every connect after expiry
		v, _ := fr.Connect(iptables.IPv4, "tcp", client, ap("10.96.0.20:443"))
		seen[v.Dst] = true
	}
	if len(seen) != 2 {
		t.Errorf("after expiry connections went to %v, want both endpoints", seen)
	}
}

func TestRemovedUDPEndpointFlowsAreCleared(t *testing.T) {
	fr := iptablestest.NewFakeRunner()
	b := newFake(t, fr)
	ctx := context.Background()
	st := sampleState()
	if err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	if d := fr.ConntrackDeletes(); len(d) != 0 {
		t.Fatalf("first sync cleared %v", d)
	}
	st.Frontends[0].Endpoints = st.Frontends[0].Endpoints[:2] // 10.244.2.2 leaves dns
	st.Frontends[3].Endpoints = st.Frontends[3].Endpoints[:1] // TCP: nothing to clear
	if err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	if d := fr.ConntrackDeletes(); strings.Join(d, ";") != "IPv4 10.96.0.10:53 via 10.244.2.2" {
		t.Errorf("conntrack deletes: %v", d)
	}
}

func TestChunkedSyncEqualsOneTransaction(t *testing.T) {
	ctx := context.Background()
	st := bigState(60, 10)
	dump := func(chunk int) (string, int) {
		fr := iptablestest.NewFakeRunner()
		b, err := iptables.New(iptables.Config{Runner: fr, ChunkChains: chunk})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Sync(ctx, st); err != nil {
			t.Fatal(err)
		}
		// A partial sync that changes a third of the services.
		st2 := bigState(60, 10)
		for i := 0; i < 60; i += 3 {
			st2.Frontends[i].Endpoints = st2.Frontends[i].Endpoints[1:]
		}
		if err := b.Sync(ctx, st2); err != nil {
			t.Fatal(err)
		}
		return fr.Dump(iptables.IPv4), len(fr.Restores())
	}
	one, n1 := dump(-1)
	chunked, n2 := dump(100)
	if one != chunked {
		t.Error("chunked restores left other tables than one restore")
	}
	if n2 <= n1 {
		t.Errorf("%d restores with chunks of 100 chains, %d without: nothing was chunked", n2, n1)
	}
}

func TestCompactLayoutTraces(t *testing.T) {
	fr := iptablestest.NewFakeRunner(netip.MustParseAddr("192.168.1.10"))
	b, err := iptables.New(iptables.Config{Runner: fr, CompactAbove: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(context.Background(), sampleState()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fr.Dump(iptables.IPv4), ":"+iptables.SepPrefix) {
		t.Error("compact layout made endpoint chains")
	}
	golden(t, "fake-save-compact-ipv4.golden", fr.Dump(iptables.IPv4))
	client := netip.MustParseAddr("10.9.9.9")
	first, err := fr.Connect(iptables.IPv4, "tcp", client, ap("10.96.0.20:443"))
	if err != nil || (first.Dst != ap("10.244.0.5:8443") && first.Dst != ap("10.244.1.5:8443")) {
		t.Fatalf("affinity service: %+v %v", first, err)
	}
	for range 20 {
		if v, _ := fr.Connect(iptables.IPv4, "tcp", client, ap("10.96.0.20:443")); v.Dst != first.Dst {
			t.Fatalf("compact affinity broken: %s then %s", first.Dst, v.Dst)
		}
	}
	if v, _ := fr.Connect(iptables.IPv4, "tcp", client, ap("10.96.0.11:80")); !v.Rejected {
		t.Error("service without endpoints not rejected")
	}
}

// checkingRunner traces every frontend after each restore.
type checkingRunner struct {
	*iptablestest.FakeRunner
	check func(step int)
	steps int
}

func (c *checkingRunner) Restore(ctx context.Context, fam iptables.Family, data []byte) error {
	if err := c.FakeRunner.Restore(ctx, fam, data); err != nil {
		return err
	}
	c.steps++
	c.check(c.steps)
	return nil
}

// TestChunkedSyncIsMakeBeforeBreak: during a chunked sync that changes many
// services, after every single restore each frontend present before and
// after the sync still reaches one of its old or new endpoints.
func TestChunkedSyncIsMakeBeforeBreak(t *testing.T) {
	ctx := context.Background()
	before := bigState(40, 5)
	after := bigState(40, 5)
	for i := range after.Frontends {
		// Every other service moves to new endpoints; the rest stay.
		if i%2 == 0 {
			for j := range after.Frontends[i].Endpoints {
				after.Frontends[i].Endpoints[j].Port = 9090
			}
		}
	}
	after.Frontends = after.Frontends[:30] // and ten services go away
	allowed := map[dataplane.FrontendKey]map[netip.AddrPort]bool{}
	for _, st := range []*dataplane.State{before, after} {
		for _, f := range st.Frontends {
			if allowed[f.FrontendKey] == nil {
				allowed[f.FrontendKey] = map[netip.AddrPort]bool{}
			}
			for _, e := range f.Endpoints {
				allowed[f.FrontendKey][e.AddrPort()] = true
			}
		}
	}
	cr := &checkingRunner{FakeRunner: iptablestest.NewFakeRunner()}
	b, err := iptables.New(iptables.Config{Runner: cr, ChunkChains: 20})
	if err != nil {
		t.Fatal(err)
	}
	cr.check = func(int) {}
	if err := b.Sync(ctx, before); err != nil {
		t.Fatal(err)
	}
	start := cr.steps
	cr.check = func(step int) {
		for _, f := range after.Frontends {
			v, err := cr.Connect(iptables.IPv4, "tcp", netip.MustParseAddr("192.0.2.1"), netip.AddrPortFrom(f.Addr, f.Port))
			if err != nil || v.Rejected || !allowed[f.FrontendKey][v.Dst] {
				t.Fatalf("after restore %d, %s went to %s (rejected %v, %v)", step, f.FrontendKey, v.Dst, v.Rejected, err)
			}
		}
	}
	if err := b.Sync(ctx, after); err != nil {
		t.Fatal(err)
	}
	if cr.steps-start < 3 {
		t.Fatalf("only %d restores: the sync was not chunked", cr.steps-start)
	}
}

// loadBalancerSourceRanges through the rules: an allowed source is DNATed,
// any other is dropped; the NodePort of the same Service is not limited.
func TestLoadBalancerSourceRangesTrace(t *testing.T) {
	fr := iptablestest.NewFakeRunner(netip.MustParseAddr("192.168.1.10"))
	b := newFake(t, fr)
	eps := []dataplane.Endpoint{{Addr: netip.MustParseAddr("10.244.1.7"), Port: 8080}}
	svc := dataplane.ServicePortName{Namespace: "default", Name: "lb"}
	st := &dataplane.State{Frontends: []dataplane.Frontend{
		{FrontendKey: dataplane.FrontendKey{Addr: netip.MustParseAddr("192.168.1.10"), Port: 30080, Protocol: dataplane.TCP}, Kind: dataplane.NodePort, Service: svc, Endpoints: eps},
		{FrontendKey: dataplane.FrontendKey{Addr: netip.MustParseAddr("198.51.100.20"), Port: 80, Protocol: dataplane.TCP}, Kind: dataplane.LoadBalancer, Service: svc, Endpoints: eps,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}},
	}}
	if err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		src, dst string
		dropped  bool
	}{{"203.0.113.7", "198.51.100.20:80", false}, {"192.0.2.1", "198.51.100.20:80", true}, {"192.0.2.1", "192.168.1.10:30080", false}} {
		v, err := fr.Connect(iptables.IPv4, "tcp", netip.MustParseAddr(tt.src), ap(tt.dst))
		if err != nil {
			t.Fatal(err)
		}
		if v.Dropped != tt.dropped || v.Rejected || (!tt.dropped && v.Dst != ap("10.244.1.7:8080")) {
			t.Errorf("%s -> %s: verdict %+v, want dropped=%v", tt.src, tt.dst, v, tt.dropped)
		}
	}
}
