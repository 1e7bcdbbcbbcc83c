package nodeipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

func TestCIDRSetHandsOutEachSubnetOnce(t *testing.T) {
	s, err := NewCIDRSet(netip.MustParsePrefix("10.244.0.0/22"), 24)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 4 {
		p, err := s.Allocate()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p.String())
	}
	want := []string{"10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("allocated %v, want %v", got, want)
	}
	if _, err := s.Allocate(); !errors.Is(err, ErrCIDRSetFull) {
		t.Fatalf("fifth allocation: %v, want ErrCIDRSetFull", err)
	}
	if err := s.Release(netip.MustParsePrefix("10.244.2.0/24")); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Allocate(); err != nil || p.String() != "10.244.2.0/24" {
		t.Fatalf("after release: %v %v", p, err)
	}
}

func TestCIDRSetOccupyAndRange(t *testing.T) {
	s, _ := NewCIDRSet(netip.MustParsePrefix("10.0.0.0/16"), 24)
	tests := []struct {
		name    string
		cidr    string
		free    bool
		wantErr error
	}{
		{"a node subnet is free", "10.0.5.0/24", true, nil},
		{"the same subnet again is not", "10.0.5.0/24", false, nil},
		{"outside the cluster CIDR", "10.1.0.0/24", false, ErrOutOfRange},
		{"wrong size", "10.0.6.0/25", false, ErrOutOfRange},
		{"not aligned", "10.0.6.1/24", false, ErrOutOfRange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			free, err := s.Occupy(netip.MustParsePrefix(tt.cidr))
			if !errors.Is(err, tt.wantErr) || free != tt.free {
				t.Fatalf("Occupy = %v, %v; want %v, %v", free, err, tt.free, tt.wantErr)
			}
		})
	}
	// Allocation skips occupied subnets.
	for range 300 {
		p, err := s.Allocate()
		if err != nil {
			if errors.Is(err, ErrCIDRSetFull) {
				break
			}
			t.Fatal(err)
		}
		if p.String() == "10.0.5.0/24" {
			t.Fatal("allocated an occupied subnet")
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		ok   bool
		cidr string // first allocation when ok
	}{
		{"IPv4 default /24", Options{ClusterCIDR: "10.244.0.0/16"}, true, "10.244.0.0/24"},
		{"IPv4 /26", Options{ClusterCIDR: "10.244.0.0/16", NodeCIDRMaskSize: 26}, true, "10.244.0.0/26"},
		{"IPv6 default /64", Options{ClusterCIDR: "fd00:10:244::/56"}, true, "fd00:10:244::/64"},
		{"unmasked host bits are masked", Options{ClusterCIDR: "10.244.3.7/16"}, true, "10.244.0.0/24"},
		{"dual-stack", Options{ClusterCIDR: "10.244.0.0/16,fd00:10:244::/56", NodeCIDRMaskSize: 24, NodeCIDRMaskSizeIPv6: 64}, true, "10.244.0.0/24,fd00:10:244::/64"},
		{"dual-stack, IPv6 first, default masks", Options{ClusterCIDR: "fd00::/48, 10.0.0.0/16"}, true, "fd00::/64,10.0.0.0/24"},
		{"two IPv4 CIDRs", Options{ClusterCIDR: "10.0.0.0/16,10.1.0.0/16"}, false, ""},
		{"three CIDRs", Options{ClusterCIDR: "10.0.0.0/16,fd00::/48,10.1.0.0/16"}, false, ""},
		{"empty", Options{}, false, ""},
		{"garbage", Options{ClusterCIDR: "ten"}, false, ""},
		{"mask shorter than cluster", Options{ClusterCIDR: "10.0.0.0/16", NodeCIDRMaskSize: 8}, false, ""},
		{"mask longer than an address", Options{ClusterCIDR: "10.0.0.0/16", NodeCIDRMaskSize: 33}, false, ""},
		{"too many subnets", Options{ClusterCIDR: "10.0.0.0/8", NodeCIDRMaskSize: 28}, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate = %v, want ok %v", err, tt.ok)
			}
			if !tt.ok {
				if !errors.Is(err, ErrInvalidCIDR) {
					t.Fatalf("error %v is not ErrInvalidCIDR", err)
				}
				return
			}
			sets, _ := tt.opts.cidrSets()
			var got []string
			for _, s := range sets {
				p, err := s.Allocate()
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, p.String())
			}
			if strings.Join(got, ",") != tt.cidr {
				t.Fatalf("first allocation %v, want %s", got, tt.cidr)
			}
		})
	}
}

func FuzzOptionsValidate(f *testing.F) {
	f.Add("10.244.0.0/16", 24)
	f.Add("fd00::/48", 64)
	f.Add("0.0.0.0/0", 16)
	f.Add("::/0", 128)
	f.Fuzz(func(t *testing.T, cidr string, mask int) {
		o := Options{ClusterCIDR: cidr, NodeCIDRMaskSize: mask}
		if o.Validate() != nil {
			return
		}
		sets, _ := o.cidrSets()
		for _, s := range sets {
			p, err := s.Allocate()
			if err != nil {
				t.Fatalf("valid options %+v cannot allocate: %v", o, err)
			}
			if !s.cluster.Contains(p.Addr()) || s.Release(p) != nil {
				t.Fatalf("allocated %s outside %s", p, s.cluster)
			}
		}
	})
}

func node(name, cidr string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: cidr}}
}

func startController(t *testing.T, opts Options, nodes ...*corev1.Node) *fake.Clientset {
	t.Helper()
	cs := fake.NewClientset()
	for _, n := range nodes {
		if _, err := cs.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	watches := testutil.TrackWatches(cs)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler), opts)
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx, 3); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })
	watches.WaitOpen(t, 1, 10*time.Second) // nodes
	return cs
}

func podCIDRs(t *testing.T, cs *fake.Clientset) map[string]string {
	t.Helper()
	l, err := cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, n := range l.Items {
		m[n.Name] = n.Spec.PodCIDR
	}
	return m
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, what, cond)
}

func TestEveryNodeGetsADistinctCIDRRebuiltFromExistingNodes(t *testing.T) {
	// Two nodes already hold the first subnets: the controller must not hand
	// them out again after a restart.
	cs := startController(t, Options{ClusterCIDR: "10.244.0.0/20"},
		node("old-a", "10.244.0.0/24"), node("old-b", "10.244.1.0/24"), node("new-0", ""))
	for i := 1; i < 10; i++ {
		if _, err := cs.CoreV1().Nodes().Create(context.Background(), node(fmt.Sprintf("new-%d", i), ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var got map[string]string
	waitFor(t, "every node has a podCIDR", func() bool {
		got = podCIDRs(t, cs)
		for _, c := range got {
			if c == "" {
				return false
			}
		}
		return len(got) == 12
	})
	seen := map[string]string{}
	for n, c := range got {
		if other, dup := seen[c]; dup {
			t.Fatalf("%s handed to both %s and %s", c, n, other)
		}
		seen[c] = n
	}
	if got["old-a"] != "10.244.0.0/24" || got["old-b"] != "10.244.1.0/24" {
		t.Fatalf("existing CIDRs changed: %v", got)
	}
	n, _ := cs.CoreV1().Nodes().Get(context.Background(), "new-0", metav1.GetOptions{})
	if len(n.Spec.PodCIDRs) != 1 || n.Spec.PodCIDRs[0] != n.Spec.PodCIDR {
		t.Fatalf("podCIDRs %v does not mirror podCIDR %s", n.Spec.PodCIDRs, n.Spec.PodCIDR)
	}
}

func TestDeletedNodeReleasesItsCIDR(t *testing.T) {
	// A /23 in /24s: two subnets. Deleting one node lets a third node in.
	cs := startController(t, Options{ClusterCIDR: "10.0.0.0/23"}, node("a", ""), node("b", ""))
	waitFor(t, "both nodes allocated", func() bool { m := podCIDRs(t, cs); return m["a"] != "" && m["b"] != "" })
	freed := podCIDRs(t, cs)["a"]
	if _, err := cs.CoreV1().Nodes().Create(context.Background(), node("c", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "CIDRNotAvailable event for node c", func() bool {
		evs, _ := cs.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
		for _, e := range evs.Items {
			if e.Reason == "CIDRNotAvailable" && e.InvolvedObject.Name == "c" {
				return true
			}
		}
		return false
	})
	if c := podCIDRs(t, cs)["c"]; c != "" {
		t.Fatalf("node c got %s although the cluster CIDR is full", c)
	}
	if err := cs.CoreV1().Nodes().Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c gets the released CIDR", func() bool { return podCIDRs(t, cs)["c"] == freed })
}

func TestDualStackNodesGetOneCIDRPerFamily(t *testing.T) {
	cs := startController(t, Options{ClusterCIDR: "10.244.0.0/16,fd00:10:244::/56"},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "old"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24", "fd00:10:244::/64"}}},
		node("new", ""))
	waitFor(t, "new node allocated", func() bool { return podCIDRs(t, cs)["new"] != "" })
	n, err := cs.CoreV1().Nodes().Get(context.Background(), "new", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.244.1.0/24", "fd00:10:244:1::/64"}; fmt.Sprint(n.Spec.PodCIDRs) != fmt.Sprint(want) || n.Spec.PodCIDR != want[0] {
		t.Fatalf("podCIDR %s podCIDRs %v, want %v (the existing node's pair kept)", n.Spec.PodCIDR, n.Spec.PodCIDRs, want)
	}
}
