package dataplane

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// FuzzCompute feeds Compute Services, EndpointSlices and Nodes whose
// addresses, ports and protocols come from the fuzzer (API objects are
// outside input: the apiserver validates them, but the proxy must not trust
// that) and checks it never panics and always returns a State that passes
// Validate.
func FuzzCompute(f *testing.F) {
	f.Add("10.96.0.10", "fd00::10", "203.0.113.1", "198.51.100.1", "192.168.1.1", "10.0.0.1", "TCP", "http", "http", int32(80), int32(30080), int32(8080), "ClientIP", "Local")
	f.Add("None", "", "", "", "", "", "UDP", "", "", int32(53), int32(0), int32(5353), "", "")
	f.Add("::ffff:10.0.0.1", "10.0.0.2", "bad", "1.2.3.4", "::1", "fe80::1", "SCTP", "a", "b", int32(-1), int32(70000), int32(0), "None", "Cluster")
	f.Fuzz(func(t *testing.T, cip1, cip2, ext, lb, nodeIP, epIP, proto, portName, slicePortName string, port, np, target int32, affinity, policy string) {
		s := &v1.Service{}
		s.Namespace, s.Name = "ns", "svc"
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ClusterIP = cip1
		s.Spec.ClusterIPs = []string{cip1, cip2}
		s.Spec.ExternalIPs = []string{ext}
		s.Spec.SessionAffinity = v1.ServiceAffinity(affinity)
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicy(policy)
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicy(policy))
		s.Spec.Ports = []v1.ServicePort{{Name: portName, Port: port, NodePort: np, Protocol: v1.Protocol(proto)}}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: lb}}
		es := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4}
		es.Namespace, es.Name = "ns", "svc-1"
		es.Labels = map[string]string{discoveryv1.LabelServiceName: "svc"}
		es.Ports = []discoveryv1.EndpointPort{{Name: ptr.To(slicePortName), Port: ptr.To(target), Protocol: ptr.To(v1.Protocol(proto))}}
		es.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{epIP, nodeIP}, NodeName: ptr.To("n")}}
		es6 := es.DeepCopy()
		es6.Name, es6.AddressType = "svc-2", discoveryv1.AddressTypeIPv6
		n := &v1.Node{}
		n.Name = "n"
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: nodeIP}}
		st := Compute("n", []*v1.Service{s, s.DeepCopy()}, []*discoveryv1.EndpointSlice{es, es6}, []*v1.Node{n}, ComputeOptions{})
		if err := st.Validate(); err != nil {
			t.Fatalf("invalid state: %v\n%s", err, st.Dump())
		}
		for _, f := range st.Frontends {
			if f.Addr.Zone() != "" || f.Addr.IsUnspecified() || f.Addr.Is4In6() {
				t.Fatalf("frontend address %s passed through", f.Addr)
			}
			for _, e := range f.Endpoints {
				if e.Addr.Zone() != "" || e.Addr.IsUnspecified() || e.Addr.Is4In6() {
					t.Fatalf("endpoint address %s passed through", e.Addr)
				}
			}
		}
	})
}
