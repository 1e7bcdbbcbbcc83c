package policy

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// FuzzCompilePolicy feeds policies with arbitrary ports, ranges, CIDRs,
// protocols and selector keys through the compiler: it must not panic,
// and every entry it writes must be a valid LPM key.
func FuzzCompilePolicy(f *testing.F) {
	f.Add("TCP", int32(80), int32(90), "web", "10.0.0.0/8", "10.1.0.0/16", "app", true)
	f.Add("UDP", int32(0), int32(0), "", "::/0", "fd00::/64", "", false)
	f.Add("SCTP", int32(65535), int32(1), "x", "bogus", "1.2.3.4/33", "a b", true)
	f.Fuzz(func(t *testing.T, proto string, port, end int32, named, cidr, except, key string, egress bool) {
		c := NewCompiler("n")
		c.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}})
		c.SetPod(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p", Labels: map[string]string{"app": "a"}},
			Spec:   v1.PodSpec{NodeName: "n", Containers: []v1.Container{{Ports: []v1.ContainerPort{{Name: named, ContainerPort: port}}}}},
			Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.0.0.5"}}, 3)
		pr := v1.Protocol(proto)
		var pp networkingv1.NetworkPolicyPort
		pp.Protocol = &pr
		if named != "" {
			s := intstr.FromString(named)
			pp.Port = &s
		} else if port != 0 {
			p := intstr.FromInt32(port)
			pp.Port = &p
			pp.EndPort = &end
		}
		peers := []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: []string{except}}},
			{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{key: "a"}}}}
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "f"}}
		if egress {
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: peers, Ports: []networkingv1.NetworkPolicyPort{pp}}}
		} else {
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: peers, Ports: []networkingv1.NetworkPolicyPort{pp}}}
		}
		if err := c.SetPolicy(np); err != nil {
			return // refused input is fine; a panic is not
		}
		for _, st := range c.Compile().Endpoints {
			for k := range st.Entries {
				if k.PortBits > 16 || (k.Proto == 0 && (k.Port != 0 || k.PortBits != 0)) || k.Prefixlen() > 128 {
					t.Fatalf("invalid key %+v", k)
				}
			}
		}
		for p := range c.cidrIDs {
			if !p.IsValid() || p != canonPrefix(p) || (p.Addr().Is4() && p.Bits() > 32) {
				t.Fatalf("invalid prefix %v", p)
			}
			_ = netip.Prefix(p)
		}
	})
}
