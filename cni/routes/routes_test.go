package routes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

func threeNodes() []Node {
	return []Node{
		{Name: "n1", PodCIDRs: []netip.Prefix{pfx("10.244.1.0/24")}, InternalIPs: []netip.Addr{ip("192.168.0.1")}},
		{Name: "n2", PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24")}, InternalIPs: []netip.Addr{ip("192.168.0.2")}},
		{Name: "n3", PodCIDRs: []netip.Prefix{pfx("10.244.3.0/24"), pfx("fd00:244:3::/64")}, InternalIPs: []netip.Addr{ip("192.168.0.3"), ip("fd00::3")}},
	}
}

func newController(t *testing.T, mode Mode, dp Dataplane) *Controller {
	t.Helper()
	c, err := New(Config{NodeName: "n1", Mode: mode, Dataplane: dp})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestHostGWRoutesEveryOtherNodeAndIsIdempotent(t *testing.T) {
	dp := &fakeDP{}
	c := newController(t, ModeHostGW, dp)
	if err := c.Sync(threeNodes()); err != nil {
		t.Fatal(err)
	}
	got, writes := dp.snapshot()
	want := []Route{
		{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.0.2")},
		{Dst: pfx("10.244.3.0/24"), Gw: ip("192.168.0.3")},
		{Dst: pfx("fd00:244:3::/64"), Gw: ip("fd00::3")},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("routes = %v, want %v", got, want)
	}
	if err := c.Sync(threeNodes()); err != nil {
		t.Fatal(err)
	}
	if _, again := dp.snapshot(); again != writes {
		t.Fatalf("second Sync with the same nodes wrote %d times", again-writes)
	}
}

func TestSyncFollowsNodeChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func([]Node) []Node
		want   []Route
	}{
		{"node removed", func(n []Node) []Node { return n[:2] }, []Route{{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.0.2")}}},
		{"node IP changed", func(n []Node) []Node {
			n[1].InternalIPs = []netip.Addr{ip("192.168.0.22")}
			return n[:2]
		}, []Route{{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.0.22")}}},
		{"pod CIDR changed", func(n []Node) []Node {
			n[1].PodCIDRs = []netip.Prefix{pfx("10.244.20.0/24")}
			return n[:2]
		}, []Route{{Dst: pfx("10.244.20.0/24"), Gw: ip("192.168.0.2")}}},
		{"pod CIDR not allocated yet", func(n []Node) []Node {
			n[1].PodCIDRs = nil
			return n[:2]
		}, nil},
		{"no InternalIP of the family", func(n []Node) []Node {
			n[2].InternalIPs = n[2].InternalIPs[:1]
			return n
		}, []Route{{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.0.2")}, {Dst: pfx("10.244.3.0/24"), Gw: ip("192.168.0.3")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp := &fakeDP{}
			c := newController(t, ModeHostGW, dp)
			if err := c.Sync(threeNodes()); err != nil {
				t.Fatal(err)
			}
			if err := c.Sync(tc.change(threeNodes())); err != nil {
				t.Fatal(err)
			}
			if got, _ := dp.snapshot(); !slices.Equal(got, tc.want) {
				t.Fatalf("routes = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestVXLANProgramsDeviceNeighboursFDBAndOnlinkRoutes(t *testing.T) {
	dp := &fakeDP{}
	c := newController(t, ModeVXLAN, dp)
	nodes := threeNodes()[:2]
	if err := c.Sync(nodes); err != nil {
		t.Fatal(err)
	}
	if dp.vxlan == nil || dp.vxlan.Local != ip("192.168.0.1") || dp.vxlan.VNI != DefaultVNI ||
		dp.vxlan.MAC.String() != "0e:57:c0:a8:00:01" || !slices.Equal(dp.vxlan.Addrs, []netip.Prefix{pfx("10.244.1.0/32")}) {
		t.Fatalf("vxlan device = %+v", dp.vxlan)
	}
	wantN := []Neighbor{{IP: ip("10.244.2.0"), MAC: "0e:57:c0:a8:00:02"}}
	wantF := []FDBEntry{{MAC: "0e:57:c0:a8:00:02", Dst: ip("192.168.0.2")}}
	wantR := []Route{{Dst: pfx("10.244.2.0/24"), Gw: ip("10.244.2.0"), Dev: DefaultVXLANDevice, OnLink: true}}
	routes, writes := dp.snapshot()
	if !slices.Equal(dp.neigh, wantN) || !slices.Equal(dp.fdb, wantF) || !slices.Equal(routes, wantR) {
		t.Fatalf("neigh %v fdb %v routes %v", dp.neigh, dp.fdb, routes)
	}
	if err := c.Sync(nodes); err != nil {
		t.Fatal(err)
	}
	if _, again := dp.snapshot(); again != writes {
		t.Fatalf("second Sync wrote %d times", again-writes)
	}
	// The remote node goes: its entries go too.
	if err := c.Sync(nodes[:1]); err != nil {
		t.Fatal(err)
	}
	if routes, _ := dp.snapshot(); len(routes) != 0 || len(dp.neigh) != 0 || len(dp.fdb) != 0 {
		t.Fatalf("stale entries: routes %v neigh %v fdb %v", routes, dp.neigh, dp.fdb)
	}
	// Switching to host-gw removes the device.
	hg := newController(t, ModeHostGW, dp)
	if err := hg.Sync(threeNodes()); err != nil {
		t.Fatal(err)
	}
	if dp.vxlan != nil {
		t.Fatal("host-gw mode kept the vxlan device")
	}
}

func TestVXLANWithoutThisNodeProgramsNothing(t *testing.T) {
	dp := &fakeDP{}
	c := newController(t, ModeVXLAN, dp)
	if err := c.Sync(threeNodes()[1:]); err != nil {
		t.Fatal(err)
	}
	if routes, _ := dp.snapshot(); dp.vxlan != nil || len(routes) != 0 {
		t.Fatalf("device %v routes %v without this node's own Node", dp.vxlan, routes)
	}
}

func TestSyncGoesOnPastAFailingRouteAndReportsIt(t *testing.T) {
	boom := errors.New("injected")
	dp := &fakeDP{fail: func(op string, arg any) error {
		if r, ok := arg.(Route); ok && op == "ReplaceRoute" && r.Dst == pfx("10.244.2.0/24") {
			return boom
		}
		return nil
	}}
	c := newController(t, ModeHostGW, dp)
	err := c.Sync(threeNodes())
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "10.244.2.0/24") {
		t.Fatalf("Sync err = %v, want the injected failure naming the route", err)
	}
	if got, _ := dp.snapshot(); len(got) != 2 {
		t.Fatalf("routes = %v, want the two that did not fail", got)
	}
	dp.fail = nil
	if err := c.Sync(threeNodes()); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got, _ := dp.snapshot(); len(got) != 3 {
		t.Fatalf("after the retry routes = %v", got)
	}
}

func TestCleanupRemovesEverythingOwned(t *testing.T) {
	dp := &fakeDP{}
	c := newController(t, ModeVXLAN, dp)
	c.Sync(threeNodes())
	if err := c.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if routes, _ := dp.snapshot(); len(routes) != 0 || dp.vxlan != nil {
		t.Fatalf("after Cleanup: routes %v device %v", routes, dp.vxlan)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no node name":  {Mode: ModeHostGW},
		"unknown mode":  {NodeName: "n", Mode: "bgp"},
		"long device":   {NodeName: "n", Mode: ModeVXLAN, VXLANDevice: "a-very-long-device-name"},
		"VNI too large": {NodeName: "n", Mode: ModeVXLAN, VNI: 1 << 24},
		"negative VNI":  {NodeName: "n", Mode: ModeVXLAN, VNI: -1},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New err = %v, want ErrInvalidConfig", name, err)
		}
	}
}

func apiNode(name, podCIDR, ip string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}},
	}
}

func TestNodeFromAPIKeepsPodCIDRsAndInternalIPs(t *testing.T) {
	n := apiNode("a", "10.244.5.0/24", "192.168.1.5")
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.1"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "not-an-ip"})
	got := NodeFromAPI(n)
	if got.Name != "a" || !slices.Equal(got.PodCIDRs, []netip.Prefix{pfx("10.244.5.0/24")}) || !slices.Equal(got.InternalIPs, []netip.Addr{ip("192.168.1.5")}) {
		t.Fatalf("NodeFromAPI = %+v", got)
	}
	legacy := apiNode("b", "10.244.6.0/24", "192.168.1.6")
	legacy.Spec.PodCIDRs = nil
	if got := NodeFromAPI(legacy); len(got.PodCIDRs) != 1 {
		t.Fatalf("spec.podCIDR alone not read: %+v", got)
	}
}

func waitRoutes(t *testing.T, dp *fakeDP, want []Route) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		if got, _ := dp.snapshot(); !slices.Equal(got, want) {
			return fmt.Errorf("routes = %v, want %v", got, want)
		}
		return nil
	})
}

func TestRunFollowsNodesThroughTheInformer(t *testing.T) {
	client := fake.NewSimpleClientset(apiNode("n1", "10.244.1.0/24", "192.168.0.1"), apiNode("n2", "10.244.2.0/24", "192.168.0.2"))
	dp := &fakeDP{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, client, Config{NodeName: "n1", Dataplane: dp}) }()
	waitRoutes(t, dp, []Route{{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.0.2")}})

	if _, err := client.CoreV1().Nodes().Create(ctx, apiNode("n3", "10.244.3.0/24", "192.168.0.3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, dp, []Route{{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.0.2")}, {Dst: pfx("10.244.3.0/24"), Gw: ip("192.168.0.3")}})

	n2 := apiNode("n2", "10.244.2.0/24", "192.168.0.22")
	if _, err := client.CoreV1().Nodes().Update(ctx, n2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "n3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, dp, []Route{{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.0.22")}})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if got, _ := dp.snapshot(); len(got) != 1 {
		t.Fatalf("Run removed routes on exit: %v", got)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	err := Run(context.Background(), fake.NewSimpleClientset(), Config{})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Run err = %v", err)
	}
}

func FuzzNodeFromAPIAndCompute(f *testing.F) {
	f.Add("10.244.1.0/24", "192.168.0.1", "fd00::/64", "fd00::1", true)
	f.Add("10.244.1.5/24", "not-an-ip", "", "::ffff:10.0.0.1", false)
	f.Add("bad", "", "0.0.0.0/0", "10.0.0.1", true)
	f.Fuzz(func(t *testing.T, cidr, addr, cidr6, addr6 string, vxlan bool) {
		n := apiNode("remote", cidr, addr)
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, cidr6)
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: addr6})
		remote := NodeFromAPI(n)
		for _, p := range remote.PodCIDRs {
			if p.Masked() != p {
				t.Fatalf("non-canonical pod CIDR %s", p)
			}
		}
		mode := ModeHostGW
		if vxlan {
			mode = ModeVXLAN
		}
		c, err := New(Config{NodeName: "self", Mode: mode, Dataplane: &fakeDP{}})
		if err != nil {
			t.Fatal(err)
		}
		self := Node{Name: "self", PodCIDRs: []netip.Prefix{pfx("10.244.0.0/24")}, InternalIPs: []netip.Addr{ip("192.168.0.9")}}
		d, _ := c.Compute([]Node{self, remote})
		for _, r := range d.Routes {
			if !slices.Contains(remote.PodCIDRs, r.Dst) {
				t.Fatalf("route %v is not to the remote node's pod CIDRs %v", r, remote.PodCIDRs)
			}
			if !r.Dst.IsValid() || !r.Gw.IsValid() {
				t.Fatalf("invalid route %v", r)
			}
		}
		_ = c.Sync([]Node{self, remote})
	})
}
