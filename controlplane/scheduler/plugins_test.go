package scheduler

import (
	"fmt"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

type nodeOpt func(*v1.Node)

func newNode(name string, opts ...nodeOpt) *v1.Node {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceCPU:    resource.MustParse("4"),
			v1.ResourceMemory: resource.MustParse("8Gi"),
			v1.ResourcePods:   resource.MustParse("110"),
		}},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

func withLabels(kv ...string) nodeOpt {
	return func(n *v1.Node) {
		for i := 0; i < len(kv); i += 2 {
			n.Labels[kv[i]] = kv[i+1]
		}
	}
}
func withTaint(key, value string, effect v1.TaintEffect) nodeOpt {
	return func(n *v1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: key, Value: value, Effect: effect})
	}
}
func withAllocatable(cpu, mem, pods string) nodeOpt {
	return func(n *v1.Node) {
		n.Status.Allocatable = v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(mem), v1.ResourcePods: resource.MustParse(pods)}
	}
}
func cordoned() nodeOpt { return func(n *v1.Node) { n.Spec.Unschedulable = true } }

type podOpt func(*v1.Pod)

func newPod(name string, opts ...podOpt) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       v1.PodSpec{SchedulerName: DefaultSchedulerName, Containers: []v1.Container{{Name: "c", Image: "busybox"}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func requests(cpu, mem string) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(mem)}
	}
}
func hostPortOpt(port int32, ip string) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, v1.ContainerPort{ContainerPort: 80, HostPort: port, HostIP: ip})
	}
}
func nodeSelector(kv ...string) podOpt {
	return func(p *v1.Pod) {
		p.Spec.NodeSelector = map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			p.Spec.NodeSelector[kv[i]] = kv[i+1]
		}
	}
}
func requiredAffinity(key string, op v1.NodeSelectorOperator, values ...string) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
			NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}}}},
		}}}
	}
}
func preferredAffinity(weight int32, key, value string) podOpt {
	return func(p *v1.Pod) {
		if p.Spec.Affinity == nil {
			p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{}}
		}
		na := p.Spec.Affinity.NodeAffinity
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution, v1.PreferredSchedulingTerm{
			Weight: weight, Preference: v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{{Key: key, Operator: v1.NodeSelectorOpIn, Values: []string{value}}}},
		})
	}
}
func toleration(key, value string, effect v1.TaintEffect) podOpt {
	return func(p *v1.Pod) {
		op := v1.TolerationOpEqual
		if value == "" {
			op = v1.TolerationOpExists
		}
		p.Spec.Tolerations = append(p.Spec.Tolerations, v1.Toleration{Key: key, Operator: op, Value: value, Effect: effect})
	}
}
func ownedBy(uid string) podOpt {
	return func(p *v1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: types.UID(uid), Controller: ptr.To(true)}}
	}
}
func onNode(node string) podOpt { return func(p *v1.Pod) { p.Spec.NodeName = node } }

// cacheWith builds a cache of nodes and bound pods.
func cacheWith(nodes []*v1.Node, pods []*v1.Pod) *cache {
	c := newCache()
	for _, n := range nodes {
		c.AddNode(n)
	}
	for _, p := range pods {
		c.AddPod(p)
	}
	return c
}

func TestFiltersRejectNodesForTheRightReason(t *testing.T) {
	tests := []struct {
		name     string
		node     *v1.Node
		existing []*v1.Pod
		pod      *v1.Pod
		want     []string // nil: fits
	}{
		{"plain pod fits a plain node", newNode("n"), nil, newPod("p"), nil},
		{"cordoned node refuses", newNode("n", cordoned()), nil, newPod("p"), []string{reasonUnschedulable}},
		{"cordoned node takes a pod tolerating unschedulable", newNode("n", cordoned()), nil,
			newPod("p", toleration(v1.TaintNodeUnschedulable, "", v1.TaintEffectNoSchedule)), nil},
		{"NoSchedule taint refuses", newNode("n", withTaint("gpu", "yes", v1.TaintEffectNoSchedule)), nil, newPod("p"),
			[]string{"node(s) had untolerated taint {gpu: yes}"}},
		{"NoExecute taint refuses", newNode("n", withTaint(v1.TaintNodeUnreachable, "", v1.TaintEffectNoExecute)), nil, newPod("p"),
			[]string{"node(s) had untolerated taint {node.kubernetes.io/unreachable: }"}},
		{"tolerated taint fits", newNode("n", withTaint("gpu", "yes", v1.TaintEffectNoSchedule)), nil,
			newPod("p", toleration("gpu", "yes", v1.TaintEffectNoSchedule)), nil},
		{"toleration with the wrong value refuses", newNode("n", withTaint("gpu", "yes", v1.TaintEffectNoSchedule)), nil,
			newPod("p", toleration("gpu", "no", v1.TaintEffectNoSchedule)), []string{"node(s) had untolerated taint {gpu: yes}"}},
		{"PreferNoSchedule taint does not filter", newNode("n", withTaint("soft", "x", v1.TaintEffectPreferNoSchedule)), nil, newPod("p"), nil},
		{"nodeSelector match fits", newNode("n", withLabels("disk", "ssd")), nil, newPod("p", nodeSelector("disk", "ssd")), nil},
		{"nodeSelector mismatch refuses", newNode("n", withLabels("disk", "hdd")), nil, newPod("p", nodeSelector("disk", "ssd")), []string{reasonAffinity}},
		{"required affinity In fits", newNode("n", withLabels("zone", "a")), nil, newPod("p", requiredAffinity("zone", v1.NodeSelectorOpIn, "a", "b")), nil},
		{"required affinity NotIn refuses", newNode("n", withLabels("zone", "a")), nil, newPod("p", requiredAffinity("zone", v1.NodeSelectorOpNotIn, "a")), []string{reasonAffinity}},
		{"required affinity Gt refuses smaller", newNode("n", withLabels("cores", "4")), nil, newPod("p", requiredAffinity("cores", v1.NodeSelectorOpGt, "8")), []string{reasonAffinity}},
		{"required affinity DoesNotExist fits", newNode("n"), nil, newPod("p", requiredAffinity("gpu", v1.NodeSelectorOpDoesNotExist)), nil},
		{"nodeName of another node refuses", newNode("n"), nil, newPod("p", onNode("m")), []string{reasonNodeName}},
		{"free host port fits", newNode("n"), []*v1.Pod{newPod("a", onNode("n"), hostPortOpt(8080, ""))}, newPod("p", hostPortOpt(8081, "")), nil},
		{"used host port refuses", newNode("n"), []*v1.Pod{newPod("a", onNode("n"), hostPortOpt(8080, ""))}, newPod("p", hostPortOpt(8080, "")), []string{reasonPorts}},
		{"same port on distinct host IPs fits", newNode("n"), []*v1.Pod{newPod("a", onNode("n"), hostPortOpt(8080, "10.0.0.1"))}, newPod("p", hostPortOpt(8080, "10.0.0.2")), nil},
		{"wildcard host IP conflicts with a specific one", newNode("n"), []*v1.Pod{newPod("a", onNode("n"), hostPortOpt(8080, "10.0.0.1"))}, newPod("p", hostPortOpt(8080, "")), []string{reasonPorts}},
		{"requests within allocatable fit", newNode("n"), []*v1.Pod{newPod("a", onNode("n"), requests("3", "1Gi"))}, newPod("p", requests("1", "1Gi")), nil},
		{"cpu over allocatable with bound pods refuses", newNode("n"), []*v1.Pod{newPod("a", onNode("n"), requests("3", "1Gi"))}, newPod("p", requests("1500m", "1Gi")), []string{"Insufficient cpu"}},
		{"memory and cpu both short", newNode("n", withAllocatable("1", "1Gi", "10")), nil, newPod("p", requests("2", "2Gi")), []string{"Insufficient cpu", "Insufficient memory"}},
		{"pod count at allocatable refuses", newNode("n", withAllocatable("4", "8Gi", "1")), []*v1.Pod{newPod("a", onNode("n"))}, newPod("p"), []string{reasonTooManyPods}},
		{"first failing filter is the one reported", newNode("n", cordoned(), withLabels("disk", "hdd")), nil, newPod("p", nodeSelector("disk", "ssd")), []string{reasonUnschedulable}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cacheWith([]*v1.Node{tt.node}, tt.existing)
			st, err := newCycleState(tt.pod)
			if err != nil {
				t.Fatal(err)
			}
			got := runFilters(st, c.nodes[tt.node.Name])
			if !slices.Equal(got, tt.want) {
				t.Fatalf("runFilters = %q, want %q", got, tt.want)
			}
		})
	}
}

// decideOn runs one decision over nodes and pods, with a fresh round-robin.
func decideOn(t *testing.T, nodes []*v1.Node, existing []*v1.Pod, pod *v1.Pod) decision {
	t.Helper()
	s := &Scheduler{cache: cacheWith(nodes, existing), opts: Options{Parallelism: 4}}
	d, err := s.decide(t.Context(), pod)
	if err != nil {
		t.Fatalf("decide: %v (%s)", err, d.message)
	}
	return d
}

func TestScoresPickTheExpectedNode(t *testing.T) {
	tests := []struct {
		name     string
		nodes    []*v1.Node
		existing []*v1.Pod
		pod      *v1.Pod
		want     string
	}{
		{"least allocated prefers the emptier node",
			[]*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{newPod("x", onNode("a"), requests("2", "4Gi"))},
			newPod("p", requests("500m", "512Mi")), "b"},
		{"least allocated counts allocatable, not just requests",
			[]*v1.Node{newNode("small", withAllocatable("2", "4Gi", "110")), newNode("big", withAllocatable("16", "64Gi", "110"))},
			nil, newPod("p", requests("1", "1Gi")), "big"},
		{"balanced allocation prefers the node the pod balances",
			// a: cpu-heavy already; b: memory-heavy already. A cpu-light,
			// memory-heavy pod balances a. Free capacity is equal.
			[]*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{newPod("x", onNode("a"), requests("2", "1Gi")), newPod("y", onNode("b"), requests("500m", "5Gi"))},
			newPod("p", requests("100m", "3Gi")), "a"},
		{"preferred affinity wins over equal nodes",
			[]*v1.Node{newNode("a"), newNode("b", withLabels("disk", "ssd"))},
			nil, newPod("p", preferredAffinity(50, "disk", "ssd")), "b"},
		{"heavier preferred term wins",
			[]*v1.Node{newNode("a", withLabels("zone", "z1")), newNode("b", withLabels("disk", "ssd"))},
			nil, newPod("p", preferredAffinity(10, "zone", "z1"), preferredAffinity(80, "disk", "ssd")), "b"},
		{"PreferNoSchedule taint is avoided",
			[]*v1.Node{newNode("a", withTaint("soft", "x", v1.TaintEffectPreferNoSchedule)), newNode("b")},
			nil, newPod("p"), "b"},
		{"tolerated PreferNoSchedule taint is not avoided",
			[]*v1.Node{newNode("a", withTaint("soft", "x", v1.TaintEffectPreferNoSchedule)), newNode("b", withTaint("other", "y", v1.TaintEffectPreferNoSchedule))},
			nil, newPod("p", toleration("soft", "x", v1.TaintEffectPreferNoSchedule)), "a"},
		{"owner's pods spread to the node without one",
			[]*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{newPod("r1", onNode("a"), ownedBy("rs-1"), requests("10m", "10Mi")), newPod("other", onNode("b"), ownedBy("rs-2"), requests("10m", "10Mi"))},
			newPod("r2", ownedBy("rs-1"), requests("10m", "10Mi")), "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := decideOn(t, tt.nodes, tt.existing, tt.pod); d.node != tt.want {
				t.Fatalf("picked %s, want %s", d.node, tt.want)
			}
		})
	}
}

func TestTiesGoRoundRobin(t *testing.T) {
	var nodes []*v1.Node
	for i := range 4 {
		nodes = append(nodes, newNode(fmt.Sprintf("n%d", i)))
	}
	s := &Scheduler{cache: cacheWith(nodes, nil), opts: Options{Parallelism: 2}}
	seen := map[string]int{}
	for i := range 8 {
		// Zero-request pods leave the nodes equal: only round-robin differs.
		pod := newPod(fmt.Sprintf("p%d", i), func(p *v1.Pod) { p.Spec.Containers[0].Resources.Requests = nil })
		d, err := s.decide(t.Context(), pod)
		if err != nil {
			t.Fatal(err)
		}
		seen[d.node]++
	}
	for _, n := range nodes {
		if seen[n.Name] != 2 {
			t.Fatalf("round-robin placed %v, want 2 per node", seen)
		}
	}
}

func TestUnschedulableMessageCountsReasonsPerNodeGroup(t *testing.T) {
	nodes := []*v1.Node{
		newNode("a", withAllocatable("1", "8Gi", "110")),
		newNode("b", withAllocatable("1", "8Gi", "110")),
		newNode("c", withTaint("gpu", "yes", v1.TaintEffectNoSchedule)),
		newNode("d", cordoned()),
	}
	s := &Scheduler{cache: cacheWith(nodes, nil), opts: Options{Parallelism: 2}}
	d, err := s.decide(t.Context(), newPod("p", requests("2", "1Gi")))
	if err == nil {
		t.Fatalf("decide picked %s, want unschedulable", d.node)
	}
	want := "0/4 nodes are available: 1 node(s) had untolerated taint {gpu: yes}, 1 node(s) were unschedulable, 2 Insufficient cpu." +
		" preemption: 0/4 nodes are available: 2 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling."
	if d.message != want {
		t.Fatalf("message:\n got %q\nwant %q", d.message, want)
	}
	s = &Scheduler{cache: newCache(), opts: Options{Parallelism: 2}}
	if d, err := s.decide(t.Context(), newPod("p")); err == nil || d.message != "no nodes available to schedule pods" {
		t.Fatalf("no nodes: %v %q", err, d.message)
	}
}

func TestNormalizers(t *testing.T) {
	tests := []struct {
		name string
		fn   func([]int64)
		in   []int64
		want []int64
	}{
		{"highest best scales to 100", normalizeHighestBest, []int64{0, 25, 50}, []int64{0, 50, 100}},
		{"highest best leaves zeros", normalizeHighestBest, []int64{0, 0}, []int64{0, 0}},
		{"fewest best inverts", normalizeFewestBest, []int64{0, 1, 2}, []int64{100, 50, 0}},
		{"fewest best all equal is all best", normalizeFewestBest, []int64{0, 0}, []int64{100, 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := slices.Clone(tt.in)
			tt.fn(got)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNumFeasibleNodesToFindFollowsKubernetes(t *testing.T) {
	tests := []struct{ nodes, pct, want int }{
		{50, 0, 50},       // small clusters: every node
		{100, 0, 100},     // 50 - 0 = 50% of 100 = 50, raised to 100
		{1000, 0, 420},    // 50 - 8 = 42%
		{5000, 0, 500},    // 50 - 40 = 10%
		{10000, 0, 500},   // floor of 5%
		{1000, 100, 1000}, // everything
		{1000, 20, 200},
		{1000, 1, 100}, // never fewer than 100
	}
	for _, tt := range tests {
		if got := numFeasibleNodesToFind(tt.nodes, tt.pct); got != tt.want {
			t.Errorf("numFeasibleNodesToFind(%d, %d) = %d, want %d", tt.nodes, tt.pct, got, tt.want)
		}
	}
}

func TestLargeClusterDecisionsRotateOverEveryNode(t *testing.T) {
	var nodes []*v1.Node
	for i := range 1000 {
		nodes = append(nodes, newNode(fmt.Sprintf("n%04d", i)))
	}
	s := &Scheduler{cache: cacheWith(nodes, nil), opts: Options{Parallelism: 2}}
	evaluatedFrom := map[int]bool{}
	for i := range 10 {
		evaluatedFrom[s.nextStart] = true
		d, err := s.decide(t.Context(), newPod(fmt.Sprintf("p%d", i)))
		if err != nil || d.feasible != 420 {
			t.Fatalf("decision %d: %v, %d feasible nodes evaluated, want 420", i, err, d.feasible)
		}
	}
	if len(evaluatedFrom) != 10 {
		t.Fatalf("decisions started from %d distinct nodes, want 10 (rotation)", len(evaluatedFrom))
	}
	// A pod that fits nowhere is checked against every node.
	d, err := s.decide(t.Context(), newPod("huge", requests("64", "1Gi")))
	if err == nil || d.message != "0/1000 nodes are available: 1000 Insufficient cpu. preemption: 0/1000 nodes are available: 1000 No preemption victims found for incoming pod." {
		t.Fatalf("unschedulable in a large cluster: %v %q", err, d.message)
	}
}
