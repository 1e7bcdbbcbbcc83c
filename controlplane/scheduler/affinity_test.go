package scheduler

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

func term(topologyKey string, kv ...string) v1.PodAffinityTerm {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return v1.PodAffinityTerm{TopologyKey: topologyKey, LabelSelector: &metav1.LabelSelector{MatchLabels: m}}
}

func withPodAffinity(fn func(a *v1.Affinity)) podOpt {
	return func(p *v1.Pod) {
		if p.Spec.Affinity == nil {
			p.Spec.Affinity = &v1.Affinity{}
		}
		if p.Spec.Affinity.PodAffinity == nil {
			p.Spec.Affinity.PodAffinity = &v1.PodAffinity{}
		}
		if p.Spec.Affinity.PodAntiAffinity == nil {
			p.Spec.Affinity.PodAntiAffinity = &v1.PodAntiAffinity{}
		}
		fn(p.Spec.Affinity)
	}
}

func requiredPodAffinity(topologyKey string, kv ...string) podOpt {
	return withPodAffinity(func(a *v1.Affinity) {
		a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution, term(topologyKey, kv...))
	})
}
func podAntiAffinity(topologyKey string, kv ...string) podOpt {
	return withPodAffinity(func(a *v1.Affinity) {
		a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, term(topologyKey, kv...))
	})
}
func preferredPodAffinity(weight int32, anti bool, topologyKey string, kv ...string) podOpt {
	return withPodAffinity(func(a *v1.Affinity) {
		w := v1.WeightedPodAffinityTerm{Weight: weight, PodAffinityTerm: term(topologyKey, kv...)}
		if anti {
			a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution, w)
		} else {
			a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution, w)
		}
	})
}
func inNamespace(ns string) podOpt { return func(p *v1.Pod) { p.Namespace = ns } }

func spread(key string, maxSkew int32, when v1.UnsatisfiableConstraintAction, kv ...string) podOpt {
	return func(p *v1.Pod) {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		p.Spec.TopologySpreadConstraints = append(p.Spec.TopologySpreadConstraints, v1.TopologySpreadConstraint{
			MaxSkew: maxSkew, TopologyKey: key, WhenUnsatisfiable: when, LabelSelector: &metav1.LabelSelector{MatchLabels: m},
		})
	}
}

func zoned(name, zone string) *v1.Node { return newNode(name, withLabels(v1.LabelTopologyZone, zone)) }

func namespaceLister(t *testing.T, nss ...*v1.Namespace) corelisters.NamespaceLister {
	idx := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	for _, ns := range nss {
		if err := idx.Add(ns); err != nil {
			t.Fatal(err)
		}
	}
	return corelisters.NewNamespaceLister(idx)
}

func serviceLister(t *testing.T, svcs ...*v1.Service) corelisters.ServiceLister {
	idx := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
	for _, s := range svcs {
		if err := idx.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	return corelisters.NewServiceLister(idx)
}

// TestInterPodAffinityAndTopologySpread checks where a pod goes (or the
// message when it fits nowhere) for each rule of the two plugins.
func TestInterPodAffinityAndTopologySpread(t *testing.T) {
	web := func(name, node string, opts ...podOpt) *v1.Pod {
		return newPod(name, append([]podOpt{onNode(node), podLabels("app", "web")}, opts...)...)
	}
	tests := []struct {
		name     string
		nodes    []*v1.Node
		existing []*v1.Pod
		pod      *v1.Pod
		want     string // node, or the whole unschedulable message
	}{
		// Required affinity.
		{"affinity: to the node of the matching pod",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z1"), zoned("c", "z2")}, []*v1.Pod{web("w", "b")},
			newPod("p", requiredPodAffinity(v1.LabelHostname, "app", "web")), "b"},
		{"affinity: to the zone of the matching pod",
			[]*v1.Node{zoned("a", "z1"), zoned("c", "z2")}, []*v1.Pod{web("w", "c")},
			newPod("p", requiredPodAffinity(v1.LabelTopologyZone, "app", "web")), "c"},
		{"affinity: nothing matches",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z2")}, []*v1.Pod{web("w", "a")},
			newPod("p", requiredPodAffinity(v1.LabelTopologyZone, "app", "db")),
			"0/2 nodes are available: 2 node(s) didn't match pod affinity rules. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."},
		{"affinity: the first pod of a self-affine group goes anywhere",
			[]*v1.Node{zoned("a", "z1")}, nil,
			newPod("p", podLabels("app", "db"), requiredPodAffinity(v1.LabelTopologyZone, "app", "db")), "a"},
		{"affinity: a node without the topology label is refused",
			[]*v1.Node{newNode("a"), zoned("b", "z1")}, []*v1.Pod{web("w", "a"), web("w2", "b")},
			newPod("p", requiredPodAffinity(v1.LabelTopologyZone, "app", "web")), "b"},
		// Required anti-affinity.
		{"anti-affinity: away from the node of the matching pod",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z1")}, []*v1.Pod{web("w", "a")},
			newPod("p", podAntiAffinity(v1.LabelHostname, "app", "web")), "b"},
		{"anti-affinity: away from the zone of the matching pod",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z1"), zoned("c", "z2")}, []*v1.Pod{web("w", "a")},
			newPod("p", podAntiAffinity(v1.LabelTopologyZone, "app", "web")), "c"},
		{"anti-affinity: every zone holds one",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z2")}, []*v1.Pod{web("w", "a"), web("w2", "b")},
			newPod("p", podAntiAffinity(v1.LabelTopologyZone, "app", "web")),
			"0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."},
		{"anti-affinity of an existing pod refuses the incoming one (hostname)",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z1")}, []*v1.Pod{newPod("db", onNode("a"), podAntiAffinity(v1.LabelHostname, "app", "web"))},
			newPod("p", podLabels("app", "web")), "b"},
		{"anti-affinity of an existing pod refuses the incoming one (zone)",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z1")}, []*v1.Pod{newPod("db", onNode("a"), podAntiAffinity(v1.LabelTopologyZone, "app", "web"))},
			newPod("p", podLabels("app", "web")),
			"0/2 nodes are available: 2 node(s) didn't satisfy existing pods anti-affinity rules. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."},
		{"anti-affinity only looks in the pod's namespace by default",
			[]*v1.Node{zoned("a", "z1")}, []*v1.Pod{web("w", "a", inNamespace("other"))},
			newPod("p", podAntiAffinity(v1.LabelHostname, "app", "web")), "a"},
		{"namespaceSelector reaches the namespaces it selects",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z1")}, []*v1.Pod{web("w", "a", inNamespace("team-x"))},
			newPod("p", podAntiAffinity(v1.LabelHostname, "app", "web"), withPodAffinity(func(a *v1.Affinity) {
				a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}
			})), "b"},
		// Preferred terms.
		{"preferred affinity: toward the matching pod",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z2")}, []*v1.Pod{web("w", "b")},
			newPod("p", preferredPodAffinity(100, false, v1.LabelTopologyZone, "app", "web")), "b"},
		{"preferred anti-affinity: away from the matching pod",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z2")}, []*v1.Pod{web("w", "a")},
			newPod("p", preferredPodAffinity(100, true, v1.LabelTopologyZone, "app", "web")), "b"},
		{"an existing pod's preferred affinity draws the incoming pod",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z2")}, []*v1.Pod{newPod("db", onNode("b"), preferredPodAffinity(100, false, v1.LabelTopologyZone, "app", "web"))},
			newPod("p", podLabels("app", "web")), "b"},
		// PodTopologySpread.
		{"spread: DoNotSchedule sends the pod to the emptier zone",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z2")}, []*v1.Pod{web("w1", "a"), web("w2", "a")},
			newPod("p", podLabels("app", "web"), spread(v1.LabelTopologyZone, 1, v1.DoNotSchedule, "app", "web")), "b"},
		{"spread: a node without the key is refused",
			[]*v1.Node{newNode("a"), zoned("b", "z2")}, []*v1.Pod{web("w1", "b")},
			newPod("p", podLabels("app", "web"), spread(v1.LabelTopologyZone, 1, v1.DoNotSchedule, "app", "web")), "b"},
		{"spread: skew too big everywhere",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z2")}, []*v1.Pod{web("w1", "a"), web("w2", "a")},
			newPod("p", podLabels("app", "web"), nodeSelector(v1.LabelTopologyZone, "z1"), spread(v1.LabelTopologyZone, 1, v1.DoNotSchedule, "app", "web"), func(p *v1.Pod) {
				p.Spec.TopologySpreadConstraints[0].NodeAffinityPolicy = ptr.To(v1.NodeInclusionPolicyIgnore)
			}),
			"0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) didn't match pod topology spread constraints. preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."},
		{"spread: minDomains counts missing domains as empty",
			[]*v1.Node{zoned("a", "z1")}, []*v1.Pod{web("w1", "a")},
			newPod("p", podLabels("app", "web"), spread(v1.LabelTopologyZone, 1, v1.DoNotSchedule, "app", "web"), func(p *v1.Pod) {
				p.Spec.TopologySpreadConstraints[0].MinDomains = ptr.To(int32(3))
			}),
			"0/1 nodes are available: 1 node(s) didn't match pod topology spread constraints. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."},
		{"spread: ScheduleAnyway prefers the emptier zone",
			[]*v1.Node{zoned("a", "z1"), zoned("b", "z2")}, []*v1.Pod{web("w1", "a"), web("w2", "a")},
			newPod("p", podLabels("app", "web"), spread(v1.LabelTopologyZone, 1, v1.ScheduleAnyway, "app", "web")), "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Scheduler{cache: cacheWith(tt.nodes, tt.existing), opts: Options{Parallelism: 2},
				namespaces: namespaceLister(t, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-x", Labels: map[string]string{"team": "x"}}})}
			d, err := s.decide(t.Context(), tt.pod)
			got := d.node
			if err != nil {
				got = d.message
			}
			if got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDefaultSpreadConstraintsSpreadAServicesPods(t *testing.T) {
	nodes := []*v1.Node{zoned("a", "z1"), zoned("b", "z2")}
	existing := []*v1.Pod{
		newPod("w1", onNode("a"), podLabels("app", "web")), newPod("w2", onNode("a"), podLabels("app", "web")),
		newPod("o1", onNode("b"), podLabels("app", "other")), newPod("o2", onNode("b"), podLabels("app", "other")),
	}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}, Spec: v1.ServiceSpec{Selector: map[string]string{"app": "web"}}}
	for _, tc := range []struct {
		name string
		svcs []*v1.Service
		want string
	}{
		// Without a Service the nodes tie and the first is taken.
		{"no Service: a tie", nil, "a"},
		{"the Service's pods spread", []*v1.Service{svc}, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Scheduler{cache: cacheWith(nodes, existing), opts: Options{Parallelism: 2}, services: serviceLister(t, tc.svcs...)}
			d, err := s.decide(t.Context(), newPod("p", podLabels("app", "web")))
			if err != nil || d.node != tc.want {
				t.Fatalf("got %q (%v %s), want %q", d.node, err, d.message, tc.want)
			}
		})
	}
}
