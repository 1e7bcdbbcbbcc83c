package dataplane

import (
	"testing"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSlimObjectSharesRepeatedStrings: two objects decoded apart (their
// strings built at run time, as a decoder does) share one copy of each
// repeated string once the informers' transform has seen them.
func TestSlimObjectSharesRepeatedStrings(t *testing.T) {
	fresh := func(s string) string { return string([]byte(s)) }
	node := func() *string { s := fresh("node-a"); return &s }
	port := func() *string { s := fresh("http"); return &s }
	mk := func(name string) (*v1.Service, *discoveryv1.EndpointSlice) {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: fresh("team"), Name: fresh(name)},
			Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: fresh("http"), Port: 80, Protocol: v1.Protocol(fresh("TCP"))}}}}
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: fresh("team"), Name: fresh(name + "-1"),
			Labels: map[string]string{fresh(discoveryv1.LabelServiceName): fresh(name)}},
			Ports:     []discoveryv1.EndpointPort{{Name: port()}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, NodeName: node()}}}
		for _, o := range []any{svc, es} {
			if _, err := slimObject(o); err != nil {
				t.Fatal(err)
			}
		}
		return svc, es
	}
	s1, e1 := mk("a")
	s2, e2 := mk("b")
	same := func(what, a, b string) {
		t.Helper()
		if a != b || unsafe.StringData(a) != unsafe.StringData(b) {
			t.Errorf("%s: %q and %q are not one copy", what, a, b)
		}
	}
	same("namespaces of two Services", s1.Namespace, s2.Namespace)
	same("namespace of a Service and a slice", s1.Namespace, e1.Namespace)
	same("port names", s1.Spec.Ports[0].Name, *e2.Ports[0].Name)
	same("node names", *e1.Endpoints[0].NodeName, *e2.Endpoints[0].NodeName)
	same("a Service's name and its slice's label", s1.Name, e1.Labels[discoveryv1.LabelServiceName])
	for k1 := range e1.Labels {
		for k2 := range e2.Labels {
			same("label keys", k1, k2)
		}
	}
	if s1.Name == s2.Name {
		t.Errorf("distinct names merged")
	}
}
