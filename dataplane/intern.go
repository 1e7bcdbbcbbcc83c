package dataplane

import (
	"unique"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// internStrings makes the strings that repeat across the Services and
// EndpointSlices the informers cache — namespaces, names shared by a
// Service and its slices, label keys and values, port names, node names,
// zones — share one copy each (unique.Make: a canonical string, freed when
// no object uses it any more). Each decoded object otherwise carries its
// own copy of every one of them; the frontends the tracker computes point
// into the same strings.
func internStrings(obj any) {
	switch o := obj.(type) {
	case *v1.Service:
		internMeta(&o.ObjectMeta)
		for i := range o.Spec.Ports {
			p := &o.Spec.Ports[i]
			p.Name = intern(p.Name)
			p.Protocol = v1.Protocol(intern(string(p.Protocol)))
		}
	case *discoveryv1.EndpointSlice:
		internMeta(&o.ObjectMeta)
		for i := range o.Ports {
			internPtr(o.Ports[i].Name)
		}
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			internPtr(e.NodeName)
			internPtr(e.Zone)
		}
	}
}

func internMeta(m *metav1.ObjectMeta) {
	m.Namespace = intern(m.Namespace)
	m.Name = intern(m.Name)
	// A map key cannot be swapped in place: the labels go to a new map of
	// the same size (the decoded one is garbage at once).
	if len(m.Labels) > 0 {
		l := make(map[string]string, len(m.Labels))
		for k, v := range m.Labels {
			l[intern(k)] = intern(v)
		}
		m.Labels = l
	}
	for i := range m.OwnerReferences {
		r := &m.OwnerReferences[i]
		r.APIVersion, r.Kind, r.Name = intern(r.APIVersion), intern(r.Kind), intern(r.Name)
	}
}

func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

func internPtr(p *string) {
	if p != nil {
		*p = intern(*p)
	}
}
