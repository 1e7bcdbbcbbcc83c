package policy

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPortPrefixesCoverTheRangeExactly(t *testing.T) {
	for _, r := range [][2]int32{{80, 80}, {81, 82}, {1, 65535}, {1000, 2000}, {32768, 65535}, {0, 65535}} {
		covered := map[uint32]bool{}
		for _, p := range portPrefixes(r[0], r[1]) {
			size := uint32(1) << (16 - p[1])
			if p[0]%size != 0 {
				t.Fatalf("%v: prefix %v not aligned", r, p)
			}
			for v := p[0]; v < p[0]+size; v++ {
				if covered[v] {
					t.Fatalf("%v: port %d covered twice", r, v)
				}
				covered[v] = true
			}
		}
		if len(covered) != int(r[1]-r[0]+1) {
			t.Fatalf("%v: %d ports covered", r, len(covered))
		}
		for v := uint32(r[0]); v <= uint32(r[1]); v++ {
			if !covered[v] {
				t.Fatalf("%v: port %d not covered", r, v)
			}
		}
	}
}

func pod(ns, name string, lbls map[string]string, ip string, node string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec:       v1.PodSpec{NodeName: node},
		Status:     v1.PodStatus{Phase: v1.PodRunning, PodIP: ip},
	}
}

// A pod change recompiles only the endpoints it can affect; pods with one
// label set share one identity, and pods coming and going with an existing
// label set change no endpoint at all.
func TestCompileIsIncremental(t *testing.T) {
	c := NewCompiler("n1")
	c.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}})
	p := np("x", "from-web", sel("app", "db"), ingress)
	p.Spec.Ingress = append(p.Spec.Ingress, networkingv1IngressFrom(sel("app", "web")))
	if err := c.SetPolicy(p); err != nil {
		t.Fatal(err)
	}
	c.SetPod(pod("x", "db", map[string]string{"app": "db"}, "10.0.0.2", "n1"), 7)
	c.SetPod(pod("x", "other", map[string]string{"app": "other"}, "10.0.0.3", "n1"), 8)
	c.SetPod(pod("x", "web-1", map[string]string{"app": "web"}, "10.0.1.1", "n2"), 0)
	ch := c.Compile()
	if len(ch.Endpoints) != 2 {
		t.Fatalf("first compile changed %d endpoints, want 2", len(ch.Endpoints))
	}
	db := c.Endpoint("x", "db")
	if !db.IngressIsolated || len(db.Entries) != 1 {
		t.Fatalf("db = %+v", db)
	}
	// A second web pod: same identity, the ipcache changes, no endpoint does.
	c.SetPod(pod("x", "web-2", map[string]string{"app": "web"}, "10.0.1.2", "n2"), 0)
	ch = c.Compile()
	if len(ch.Endpoints) != 0 || ch.IPCache == nil || ch.Recompiled != 0 {
		t.Errorf("a pod of a known identity: %d endpoints changed, %d recompiled, ipcache %v", len(ch.Endpoints), ch.Recompiled, ch.IPCache != nil)
	}
	if ch.IPCache[mustAddr("10.0.1.1")] != ch.IPCache[mustAddr("10.0.1.2")] {
		t.Error("pods with one label set have different identities")
	}
	// A pod with a new label set only recompiles endpoints whose policies
	// could select it.
	c.SetPod(pod("x", "web-canary", map[string]string{"app": "web", "track": "canary"}, "10.0.1.3", "n2"), 0)
	ch = c.Compile()
	if _, ok := ch.Endpoints["x/db"]; !ok || len(ch.Endpoints) != 1 || ch.Recompiled != 1 {
		t.Errorf("a new selected identity: changed %v, recompiled %d; want only x/db", keys(ch.Endpoints), ch.Recompiled)
	}
}

func networkingv1IngressFrom(s *metav1.LabelSelector) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: s}}}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
