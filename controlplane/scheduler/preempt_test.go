package scheduler

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	policylisters "k8s.io/client-go/listers/policy/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

func priority(p int32) podOpt { return func(pod *v1.Pod) { pod.Spec.Priority = ptr.To(p) } }
func podLabels(kv ...string) podOpt {
	return func(p *v1.Pod) {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		for i := 0; i < len(kv); i += 2 {
			p.Labels[kv[i]] = kv[i+1]
		}
	}
}

func pdbLister(t *testing.T, pdbs ...*policyv1.PodDisruptionBudget) policylisters.PodDisruptionBudgetLister {
	idx := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
	for _, p := range pdbs {
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	return policylisters.NewPodDisruptionBudgetLister(idx)
}

func names(pods []*v1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// preemptOn runs one decision that must fail and returns what preemption
// decided.
func preemptOn(t *testing.T, s *Scheduler, pod *v1.Pod) (preemptionResult, string) {
	t.Helper()
	d, err := s.decide(t.Context(), pod)
	if err == nil {
		t.Fatalf("pod fits on %s without preemption", d.node)
	}
	return d.preemption, d.message
}

func TestPreemptionChoosesVictimsAsUpstream(t *testing.T) {
	small := func(name, node string, prio int32, opts ...podOpt) *v1.Pod {
		return newPod(name, append([]podOpt{onNode(node), requests("1", "1Gi"), priority(prio)}, opts...)...)
	}
	budget := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0},
	}
	tests := []struct {
		name        string
		nodes       []*v1.Node
		existing    []*v1.Pod
		pdbs        []*policyv1.PodDisruptionBudget
		pod         *v1.Pod
		wantNode    string
		wantVictims []string
		wantMessage string // when no node is chosen
	}{
		{"lowest priority pods go first, the rest are reprieved",
			[]*v1.Node{newNode("a")},
			[]*v1.Pod{small("p1", "a", 1), small("p2", "a", 2), small("p3", "a", 3)},
			nil, newPod("hi", requests("2", "1Gi"), priority(10)), "a", []string{"p1"}, ""},
		{"as many victims as needed, least important first",
			[]*v1.Node{newNode("a")},
			[]*v1.Pod{small("p1", "a", 1), small("p2", "a", 2), small("p3", "a", 3)},
			nil, newPod("hi", requests("3", "1Gi"), priority(10)), "a", []string{"p1", "p2"}, ""},
		{"pods of equal or higher priority are never victims",
			[]*v1.Node{newNode("a")},
			[]*v1.Pod{small("p1", "a", 10), small("p2", "a", 20), small("p3", "a", 5)},
			nil, newPod("hi", requests("3", "1Gi"), priority(10)), "", nil,
			"preemption: 0/1 nodes are available: 1 Insufficient cpu."},
		{"a node without lower-priority pods has no victims",
			[]*v1.Node{newNode("a")},
			[]*v1.Pod{newPod("big", onNode("a"), requests("4", "1Gi"), priority(10))},
			nil, newPod("hi", requests("1", "1Gi"), priority(10)), "", nil,
			"preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."},
		{"the node with the fewest PDB violations wins",
			[]*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{small("db-0", "a", 1, podLabels("app", "db")), small("fill-a", "a", 20, requests("3", "1Gi")),
				small("web-0", "b", 1, podLabels("app", "web")), small("fill-b", "b", 20, requests("3", "1Gi"))},
			[]*policyv1.PodDisruptionBudget{budget},
			newPod("hi", requests("1", "1Gi"), priority(10)), "b", []string{"web-0"}, ""},
		{"a PDB is violated when nothing else helps",
			[]*v1.Node{newNode("a")},
			[]*v1.Pod{small("db-0", "a", 1, podLabels("app", "db")), small("fill-a", "a", 20, requests("3", "1Gi"))},
			[]*policyv1.PodDisruptionBudget{budget},
			newPod("hi", requests("1", "1Gi"), priority(10)), "a", []string{"db-0"}, ""},
		{"the node whose most important victim has the lowest priority wins",
			[]*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{small("a1", "a", 5, requests("4", "1Gi")), small("b1", "b", 3, requests("4", "1Gi"))},
			nil, newPod("hi", requests("1", "1Gi"), priority(10)), "b", []string{"b1"}, ""},
		{"then the smallest sum of priorities",
			[]*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{small("a1", "a", 3, requests("2", "1Gi")), small("a2", "a", 3, requests("2", "1Gi")),
				small("b1", "b", 3, requests("2", "1Gi")), small("b2", "b", 1, requests("2", "1Gi"))},
			nil, newPod("hi", requests("4", "1Gi"), priority(10)), "b", []string{"b1", "b2"}, ""},
		{"then the fewest victims",
			[]*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{small("a1", "a", 3, requests("2", "1Gi")), small("a2", "a", 3, requests("2", "1Gi")),
				small("b1", "b", 3, requests("4", "1Gi"))},
			nil, newPod("hi", requests("3", "1Gi"), priority(10)), "b", []string{"b1"}, ""},
		{"nodes preemption cannot help are skipped",
			[]*v1.Node{newNode("a", withTaint("gpu", "yes", v1.TaintEffectNoSchedule)), newNode("b")},
			[]*v1.Pod{small("a1", "a", 1, requests("4", "1Gi")), small("b1", "b", 1, requests("4", "1Gi"))},
			nil, newPod("hi", requests("1", "1Gi"), priority(10)), "b", []string{"b1"}, ""},
		{"preemptionPolicy Never does not preempt",
			[]*v1.Node{newNode("a")},
			[]*v1.Pod{small("a1", "a", 1, requests("4", "1Gi"))},
			nil, newPod("hi", requests("1", "1Gi"), priority(10), func(p *v1.Pod) { p.Spec.PreemptionPolicy = ptr.To(v1.PreemptNever) }), "", nil,
			"preemption: not eligible due to preemptionPolicy=Never."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Scheduler{cache: cacheWith(tt.nodes, tt.existing), opts: Options{Parallelism: 2}, pdbs: pdbLister(t, tt.pdbs...)}
			res, msg := preemptOn(t, s, tt.pod)
			if res.node != tt.wantNode || !slices.Equal(names(res.victims), tt.wantVictims) {
				t.Fatalf("preemption chose node %q victims %v, want %q %v (%s)", res.node, names(res.victims), tt.wantNode, tt.wantVictims, msg)
			}
			if tt.wantMessage != "" && !strings.HasSuffix(msg, " "+tt.wantMessage) {
				t.Fatalf("message %q, want it to end with %q", msg, tt.wantMessage)
			}
		})
	}
}

func TestNominatedPodKeepsTheRoomFreedForIt(t *testing.T) {
	nodes := []*v1.Node{newNode("a", withAllocatable("2", "8Gi", "110"))}
	s := &Scheduler{cache: cacheWith(nodes, nil), opts: Options{Parallelism: 2}}
	hi := newPod("hi", requests("2", "1Gi"), priority(10))
	s.cache.Nominate(hi, "a")
	if d, err := s.decide(t.Context(), newPod("lo", requests("1", "1Gi"), priority(1))); err == nil {
		t.Fatalf("a lower-priority pod took %s, nominated to a higher-priority one", d.node)
	} else if !strings.Contains(d.message, "1 Insufficient cpu") {
		t.Fatalf("message %q", d.message)
	}
	// A pod of higher priority than the nominated one does not wait for it.
	if d, err := s.decide(t.Context(), newPod("top", requests("1", "1Gi"), priority(100))); err != nil || d.node != "a" {
		t.Fatalf("top: %v %q", err, d.message)
	}
	// The nominated pod itself fits there.
	if d, err := s.decide(t.Context(), hi); err != nil || d.node != "a" {
		t.Fatalf("nominated pod: %v %q", err, d.message)
	}
}

func TestPreemptionMakesRoomForAntiAffinity(t *testing.T) {
	// The only node holds a low-priority pod the incoming pod refuses to
	// share a node with: removing it cures the anti-affinity.
	nodes := []*v1.Node{newNode("a")}
	s := &Scheduler{cache: cacheWith(nodes, []*v1.Pod{newPod("web-0", onNode("a"), podLabels("app", "web"), priority(1))}), opts: Options{Parallelism: 2}}
	pod := newPod("hi", priority(10), podAntiAffinity(v1.LabelHostname, "app", "web"))
	res, msg := preemptOn(t, s, pod)
	if res.node != "a" || !slices.Equal(names(res.victims), []string{"web-0"}) {
		t.Fatalf("preemption chose %q %v (%s)", res.node, names(res.victims), msg)
	}
}
