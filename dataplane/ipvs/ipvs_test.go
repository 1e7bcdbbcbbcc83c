package ipvs_test

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

	"github.com/waggle-io/waggle/dataplane/iptables/iptablestest"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/iptables"
	"github.com/waggle-io/waggle/dataplane/ipvs"
	"github.com/waggle-io/waggle/dataplane/ipvs/ipvstest"
	"github.com/waggle-io/waggle/internal/testutil"
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
	aff.AffinityTimeout = 30 * time.Second
	return &dataplane.State{
		NodeName:     "node-a",
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Frontends: []dataplane.Frontend{
			fe(dataplane.ClusterIP, "10.96.0.10:53", dataplane.UDP, "kube-system/dns", "10.244.0.2:5353", "10.244.1.2:5353"),
			fe(dataplane.ClusterIP, "10.96.0.11:80", dataplane.TCP, "default/idle"),
			aff,
			fe(dataplane.NodePort, "192.168.1.10:30080", dataplane.TCP, "shop/web", "10.244.0.7:8080"),
			fe(dataplane.ExternalIP, "203.0.113.9:80", dataplane.TCP, "shop/web", "10.244.0.7:8080"),
		},
	}
}

type fakes struct {
	h  *ipvstest.FakeHandle
	l  *ipvstest.FakeLink
	r  *iptablestest.FakeRunner
	b  *ipvs.Backend
	at time.Time
}

func newFakes(t *testing.T, sched string) *fakes {
	t.Helper()
	f := &fakes{h: ipvstest.NewFakeHandle(), l: ipvstest.NewFakeLink(), r: iptablestest.NewFakeRunner(), at: time.Unix(1000, 0)}
	b, err := ipvs.New(ipvs.Config{Scheduler: sched, Handle: f.h, Link: f.l, Runner: f.r, Now: func() time.Time { return f.at }})
	if err != nil {
		t.Fatal(err)
	}
	f.b = b
	return f
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

func TestSyncGolden(t *testing.T) {
	f := newFakes(t, "")
	if err := f.b.Sync(context.Background(), sampleState()); err != nil {
		t.Fatal(err)
	}
	d, err := ipvs.Dump(f.h, f.l)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "ipvs-state.golden", d)
	golden(t, "ipvs-iptables.golden", f.r.Dump(iptables.IPv4))
}

func TestRepeatedSyncChangesNothing(t *testing.T) {
	f := newFakes(t, "")
	ctx := context.Background()
	if err := f.b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	calls := f.h.Calls
	before, _ := ipvs.Dump(f.h, f.l)
	if err := f.b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	after, _ := ipvs.Dump(f.h, f.l)
	if f.h.Calls != calls || after != before {
		t.Errorf("second sync made %d IPVS calls and changed:\n%s\nvs\n%s", f.h.Calls-calls, before, after)
	}
}

func TestSchedulerFlag(t *testing.T) {
	f := newFakes(t, "lc")
	if err := f.b.Sync(context.Background(), sampleState()); err != nil {
		t.Fatal(err)
	}
	vss, _ := f.h.Services()
	for _, vs := range vss {
		if vs.Scheduler != "lc" {
			t.Errorf("%s has scheduler %s, want lc", vs.Key(), vs.Scheduler)
		}
	}
	if _, err := ipvs.New(ipvs.Config{Scheduler: "fastest", Handle: f.h, Link: f.l, Runner: f.r}); !errors.Is(err, ipvs.ErrBadScheduler) {
		t.Errorf("unknown scheduler: err = %v", err)
	}
}

func TestNodePortAddressesAreNotBound(t *testing.T) {
	f := newFakes(t, "")
	if err := f.b.Sync(context.Background(), sampleState()); err != nil {
		t.Fatal(err)
	}
	addrs, _ := f.l.Addrs(ipvs.DummyInterface)
	for _, a := range addrs {
		if a == netip.MustParseAddr("192.168.1.10") {
			t.Error("the node IP of a NodePort was bound to the dummy interface")
		}
	}
	if len(addrs) != 4 {
		t.Errorf("bound %v, want the 3 cluster IPs and the external IP", addrs)
	}
}

func TestGracefulTermination(t *testing.T) {
	f := newFakes(t, "")
	ctx := context.Background()
	st := sampleState()
	if err := f.b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	key := st.Frontends[2].FrontendKey // sticky TCP, two endpoints
	// Two clients hold connections: each lands on a different real server.
	for _, c := range []string{"10.0.0.1", "10.0.0.2"} {
		if _, err := f.h.Connect(key, netip.MustParseAddr(c)); err != nil {
			t.Fatal(err)
		}
	}
	st.Frontends[2].Endpoints = st.Frontends[2].Endpoints[:1] // 10.244.1.5 goes away
	if err := f.b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	rss, _ := f.h.Destinations(ipvs.VirtualServer{Addr: key.Addr, Port: key.Port, Protocol: key.Protocol})
	if len(rss) != 2 || rss[1].Weight != 0 {
		t.Fatalf("removed real server with connections should stay at weight 0: %+v", rss)
	}
	for i := range 20 {
		got, err := f.h.Connect(key, netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}))
		if err != nil || got != ap("10.244.0.5:8443") {
			t.Fatalf("new connection went to %s (%v) while draining", got, err)
		}
	}
	if d := f.b.Draining(); len(d) != 1 {
		t.Errorf("draining = %v", d)
	}
	f.h.CloseAll()
	if err := f.b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	rss, _ = f.h.Destinations(ipvs.VirtualServer{Addr: key.Addr, Port: key.Port, Protocol: key.Protocol})
	if len(rss) != 1 {
		t.Errorf("drained real server not removed: %+v", rss)
	}
}

func TestGracePeriodBoundsDraining(t *testing.T) {
	f := newFakes(t, "")
	ctx := context.Background()
	st := sampleState()
	if err := f.b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	key := st.Frontends[3].FrontendKey // NodePort, one endpoint
	f.h.Connect(key, netip.MustParseAddr("10.0.0.1"))
	st.Frontends[3].Endpoints = nil
	f.b.Sync(ctx, st)
	f.at = f.at.Add(16 * time.Minute)
	f.b.Sync(ctx, st)
	rss, _ := f.h.Destinations(ipvs.VirtualServer{Addr: key.Addr, Port: key.Port, Protocol: key.Protocol})
	if len(rss) != 0 {
		t.Errorf("real server kept past the grace period: %+v", rss)
	}
}

func TestUDPRealServersAreRemovedAtOnce(t *testing.T) {
	f := newFakes(t, "")
	ctx := context.Background()
	st := sampleState()
	f.b.Sync(ctx, st)
	key := st.Frontends[0].FrontendKey
	f.h.Connect(key, netip.MustParseAddr("10.0.0.1"))
	f.h.Connect(key, netip.MustParseAddr("10.0.0.2"))
	st.Frontends[0].Endpoints = st.Frontends[0].Endpoints[:1]
	if err := f.b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	rss, _ := f.h.Destinations(ipvs.VirtualServer{Addr: key.Addr, Port: key.Port, Protocol: key.Protocol})
	if len(rss) != 1 {
		t.Errorf("UDP real server kept: %+v", rss)
	}
}

func TestServiceDeletionAndCleanup(t *testing.T) {
	f := newFakes(t, "")
	ctx := context.Background()
	// Someone else's virtual server, not on our interface: left alone.
	foreign := ipvs.VirtualServer{Addr: netip.MustParseAddr("172.16.0.1"), Port: 80, Protocol: dataplane.TCP, Scheduler: "rr"}
	f.h.AddService(foreign)
	if err := f.b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Sync(ctx, &dataplane.State{NodeName: "node-a"}); err != nil {
		t.Fatal(err)
	}
	vss, _ := f.h.Services()
	if len(vss) != 1 || vss[0] != foreign {
		t.Errorf("after deleting every service: %+v", vss)
	}
	if addrs, _ := f.l.Addrs(ipvs.DummyInterface); len(addrs) != 0 {
		t.Errorf("addresses still bound: %v", addrs)
	}
	f.b.Sync(ctx, sampleState())
	if err := f.b.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	vss, _ = f.h.Services()
	if len(vss) != 1 || f.l.Exists(ipvs.DummyInterface) || strings.Contains(f.r.Dump(iptables.IPv4)+f.r.Dump(iptables.IPv6), "WAGGLE") {
		t.Errorf("cleanup left: %+v, link %v\n%s", vss, f.l.Exists(ipvs.DummyInterface), f.r.Dump(iptables.IPv4))
	}
	if err := f.b.Cleanup(ctx); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

func TestNoEndpointsIsRejected(t *testing.T) {
	f := newFakes(t, "")
	if err := f.b.Sync(context.Background(), sampleState()); err != nil {
		t.Fatal(err)
	}
	v, err := f.r.Connect(iptables.IPv4, "tcp", netip.MustParseAddr("10.0.0.1"), ap("10.96.0.11:80"))
	if err != nil || !v.Rejected {
		t.Errorf("service without endpoints: %+v %v", v, err)
	}
}

// TestSupportedOnThisKernel checks that a kernel without IPVS gives a clear
// ErrNotSupported (and one with IPVS none).
func TestSupportedOnThisKernel(t *testing.T) {
	err := ipvs.Supported()
	if _, statErr := os.Stat("/proc/net/ip_vs"); statErr == nil {
		if err != nil {
			t.Fatalf("IPVS present but ipvs.Supported() = %v", err)
		}
		return
	}
	if err == nil {
		t.Skip("ip_vs loaded by the probe")
	}
	if !errors.Is(err, dataplane.ErrNotSupported) || !strings.Contains(err.Error(), "--mode=") {
		t.Errorf("Supported() = %v, want ErrNotSupported naming another mode", err)
	}
}

// TestRealKernel programs real IPVS in a fresh netns where the kernel has it.
func TestRealKernel(t *testing.T) {
	testutil.RequiresKernelFeature(t, testutil.IPVS)
	n := testutil.NewNetNS(t)
	path := "/run/netns/" + n.Name
	b, err := ipvs.New(ipvs.Config{NetNSPath: path})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { b.Cleanup(ctx) })
	if err := b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	d, err := b.Dump()
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "ipvs-state.golden", d)
	if err := b.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRestartRemovesStaleNodePortServers: a virtual server on a NodePort
// address left by an earlier proxy is removed by a new one.
func TestRestartRemovesStaleNodePortServers(t *testing.T) {
	f := newFakes(t, "")
	ctx := context.Background()
	stale := ipvs.VirtualServer{Addr: netip.MustParseAddr("192.168.1.10"), Port: 30999, Protocol: dataplane.TCP, Scheduler: "rr"}
	f.h.AddService(stale)
	if err := f.b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	vss, _ := f.h.Services()
	for _, vs := range vss {
		if vs == stale {
			t.Error("stale NodePort virtual server kept")
		}
	}
}
