package scheduler

import (
	"fmt"
	"math"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/helper"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"
)

// cycleState is what one scheduling attempt computes once from the pod and
// every filter and score reads.
type cycleState struct {
	pod       *v1.Pod
	key       string
	info      *podInfo
	required  nodeaffinity.RequiredNodeAffinity
	preferred *nodeaffinity.PreferredSchedulingTerms
	volumes   *volumeState // nil: the pod has no claims
	// PreFilter and PreScore states computed once per attempt over all
	// nodes (nil: nothing to check or score).
	aff         *affinityState
	spread      *spreadState
	affScore    affinityScore
	spreadScore *spreadState
}

// clone copies the states a what-if evaluation changes (preemption removing
// victims, nominated pods added).
func (st *cycleState) clone() *cycleState {
	c := *st
	c.aff = st.aff.clone()
	c.spread = st.spread.clone()
	return &c
}

// addPod updates the PreFilter states as if e were added to (delta 1) or
// removed from (-1) node, as upstream's PreFilterExtensions.
func (st *cycleState) addPod(e *podInfo, node *v1.Node, delta int64) {
	if st.aff != nil {
		st.aff.addExisting(e, node, delta, true)
	}
	st.spread.update(st, e, node, delta)
}

// volumeState is the VolumeBinding plugin's cycle state: the pod's claims
// and, per feasible node, what the binder found for them.
type volumeState struct {
	binder volumebinding.SchedulerVolumeBinder
	log    klog.Logger
	claims *volumebinding.PodVolumeClaims
	found  sync.Map // node name -> *volumebinding.PodVolumes
}

// hasClaims reports whether the pod has a persistentVolumeClaim (or
// generic ephemeral) volume.
func hasClaims(pod *v1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			return true
		}
	}
	return false
}

// filterVolumeBinding is upstream's VolumeBinding Filter: bound claims'
// volumes must admit the node (node affinity), unbound ones must find a
// volume there or be provisionable there; the reasons are upstream's
// ("node(s) had volume node affinity conflict", "node(s) didn't find
// available persistent volumes to bind").
func filterVolumeBinding(st *cycleState, n *nodeInfo) []string {
	vs := st.volumes
	if vs == nil || n.node == nil {
		return nil
	}
	pv, reasons, err := vs.binder.FindPodVolumes(vs.log, st.pod, vs.claims, n.node)
	if err != nil {
		return []string{err.Error()}
	}
	if len(reasons) > 0 {
		out := make([]string, len(reasons))
		for i, r := range reasons {
			out[i] = string(r)
		}
		return out
	}
	vs.found.Store(n.node.Name, pv)
	return nil
}

func newCycleState(pod *v1.Pod) (*cycleState, error) {
	st := &cycleState{pod: pod, key: podKey(pod), info: newPodInfo(pod), required: nodeaffinity.GetRequiredNodeAffinity(pod)}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0 {
		terms, err := nodeaffinity.NewPreferredSchedulingTerms(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
		if err != nil {
			return nil, fmt.Errorf("preferred node affinity: %w", err)
		}
		st.preferred = terms
	}
	return st, nil
}

// filter is one predicate: "" when the node fits, else the reason it does
// not, worded as Kubernetes words it (so "0/3 nodes are available: 2
// Insufficient cpu" reads the same).
type filter struct {
	name string
	fn   func(st *cycleState, n *nodeInfo) []string
}

// filters run in this order; a node's first failing filter is reported, as
// Kubernetes does.
var filters = []filter{
	{"NodeUnschedulable", filterNodeUnschedulable},
	{"NodeName", filterNodeName},
	{"TaintToleration", filterTaintToleration},
	{"NodeAffinity", filterNodeAffinity},
	{"NodePorts", filterNodePorts},
	{"NodeResourcesFit", filterNodeResourcesFit},
	{"VolumeBinding", filterVolumeBinding},
	{"PodTopologySpread", filterPodTopologySpread},
	{"InterPodAffinity", filterInterPodAffinity},
}

func filterPodTopologySpread(st *cycleState, n *nodeInfo) []string {
	if st.spread == nil {
		return nil
	}
	if r, _ := st.spread.filter(st, n); r != "" {
		return []string{r}
	}
	return nil
}

func filterInterPodAffinity(st *cycleState, n *nodeInfo) []string {
	if st.aff == nil {
		return nil
	}
	if r, _ := st.aff.filter(n); r != "" {
		return []string{r}
	}
	return nil
}

// resolvable reports whether removing pods from a node may cure a filter's
// reason (upstream's Unschedulable, as opposed to
// UnschedulableAndUnresolvable): preemption only considers nodes whose
// every reason is resolvable.
func resolvable(reason string) bool {
	switch reason {
	case reasonTooManyPods, reasonPorts, reasonAntiAffinity, reasonExistingAntiAffinity, reasonSpread:
		return true
	}
	return strings.HasPrefix(reason, "Insufficient ")
}

const (
	reasonUnschedulable = "node(s) were unschedulable"
	reasonNodeName      = "node(s) didn't match the requested node name"
	reasonAffinity      = "node(s) didn't match Pod's node affinity/selector"
	reasonPorts         = "node(s) didn't have free ports for the requested pod ports"
	reasonTooManyPods   = "Too many pods"
)

func filterNodeUnschedulable(st *cycleState, n *nodeInfo) []string {
	if !n.node.Spec.Unschedulable {
		return nil
	}
	taint := &v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule}
	if corev1helpers.TolerationsTolerateTaint(klog.Background(), st.pod.Spec.Tolerations, taint, false) {
		return nil
	}
	return []string{reasonUnschedulable}
}

func filterNodeName(st *cycleState, n *nodeInfo) []string {
	if st.pod.Spec.NodeName != "" && st.pod.Spec.NodeName != n.node.Name {
		return []string{reasonNodeName}
	}
	return nil
}

func filterTaintToleration(st *cycleState, n *nodeInfo) []string {
	taint, bad := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), n.node.Spec.Taints, st.pod.Spec.Tolerations, func(t *v1.Taint) bool {
		return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
	}, false)
	if !bad {
		return nil
	}
	return []string{fmt.Sprintf("node(s) had untolerated taint {%s: %s}", taint.Key, taint.Value)}
}

func filterNodeAffinity(st *cycleState, n *nodeInfo) []string {
	// RequiredNodeAffinity covers spec.nodeSelector and the required terms.
	ok, err := st.required.Match(n.node)
	if err != nil || !ok {
		return []string{reasonAffinity}
	}
	return nil
}

func filterNodePorts(st *cycleState, n *nodeInfo) []string {
	for _, hp := range st.info.ports {
		if n.portInUse(hp) {
			return []string{reasonPorts}
		}
	}
	return nil
}

func filterNodeResourcesFit(st *cycleState, n *nodeInfo) []string {
	var out []string
	req, alloc, used := st.info.requests, n.allocatable, n.requested
	if used.Pods+1 > alloc.Pods {
		out = append(out, reasonTooManyPods)
	}
	if req.MilliCPU > 0 && used.MilliCPU+req.MilliCPU > alloc.MilliCPU {
		out = append(out, "Insufficient cpu")
	}
	if req.Memory > 0 && used.Memory+req.Memory > alloc.Memory {
		out = append(out, "Insufficient memory")
	}
	if req.EphemeralStorage > 0 && used.EphemeralStorage+req.EphemeralStorage > alloc.EphemeralStorage {
		out = append(out, "Insufficient ephemeral-storage")
	}
	for name, q := range req.Scalar {
		if q > 0 && used.Scalar[name]+q > alloc.Scalar[name] {
			out = append(out, "Insufficient "+string(name))
		}
	}
	return out
}

// runFilters returns the reasons n does not fit, or nil.
func runFilters(st *cycleState, n *nodeInfo) []string {
	for _, f := range filters {
		if r := f.fn(st, n); len(r) > 0 {
			return r
		}
	}
	return nil
}

// MaxNodeScore is the score of the best node in each scoring plugin.
const MaxNodeScore = 100

// score is one priority: raw per-node values, normalized over the feasible
// nodes to 0..MaxNodeScore when normalize is set, then multiplied by weight.
type score struct {
	name      string
	weight    int64
	fn        func(st *cycleState, n *nodeInfo) int64
	normalize func(scores []int64)
}

// scores, with Kubernetes' default weights.
var scores = []score{
	{"NodeResourcesLeastAllocated", 1, scoreLeastAllocated, nil},
	{"NodeResourcesBalancedAllocation", 1, scoreBalancedAllocation, nil},
	{"NodeAffinity", 2, scorePreferredAffinity, normalizeHighestBest},
	{"TaintToleration", 3, scorePreferNoScheduleTaints, normalizeFewestBest},
	{"OwnerSpread", 2, scoreOwnerSpread, normalizeFewestBest},
	{"InterPodAffinity", 2, scoreInterPodAffinity, normalizeMinMax},
	{"PodTopologySpread", 2, scoreSpread, normalizeSpread},
}

// fraction returns requested/allocatable for one resource, capped to 1.
func fraction(requested, allocatable int64) float64 {
	if allocatable <= 0 {
		return 1
	}
	f := float64(requested) / float64(allocatable)
	return min(f, 1)
}

// scoreLeastAllocated favours nodes with the most free CPU and memory after
// placing the pod: mean of (allocatable-requested)/allocatable × 100.
func scoreLeastAllocated(st *cycleState, n *nodeInfo) int64 {
	cpu := fraction(n.nonZero.MilliCPU+st.info.nonZero.MilliCPU, n.allocatable.MilliCPU)
	mem := fraction(n.nonZero.Memory+st.info.nonZero.Memory, n.allocatable.Memory)
	return int64(((1-cpu)+(1-mem))/2*MaxNodeScore + 0.5)
}

// scoreBalancedAllocation favours nodes whose CPU and memory use stay
// balanced after placing the pod: (1 - standard deviation) × 100.
func scoreBalancedAllocation(st *cycleState, n *nodeInfo) int64 {
	cpu := fraction(n.requested.MilliCPU+st.info.requests.MilliCPU, n.allocatable.MilliCPU)
	mem := fraction(n.requested.Memory+st.info.requests.Memory, n.allocatable.Memory)
	std := math.Abs(cpu-mem) / 2
	return int64((1 - std) * MaxNodeScore)
}

// scorePreferredAffinity sums the weights of the preferred node affinity
// terms the node matches.
func scorePreferredAffinity(st *cycleState, n *nodeInfo) int64 {
	if st.preferred == nil {
		return 0
	}
	return st.preferred.Score(n.node)
}

// scorePreferNoScheduleTaints counts the PreferNoSchedule taints the pod
// does not tolerate (fewer is better).
func scorePreferNoScheduleTaints(st *cycleState, n *nodeInfo) int64 {
	var c int64
	for i := range n.node.Spec.Taints {
		t := &n.node.Spec.Taints[i]
		if t.Effect != v1.TaintEffectPreferNoSchedule {
			continue
		}
		tolerated := false
		for j := range st.pod.Spec.Tolerations {
			tol := &st.pod.Spec.Tolerations[j]
			if (tol.Effect == "" || tol.Effect == v1.TaintEffectPreferNoSchedule) && tol.ToleratesTaint(klog.Background(), t, false) {
				tolerated = true
				break
			}
		}
		if !tolerated {
			c++
		}
	}
	return c
}

// scoreOwnerSpread counts the pods of the pod's controller already on the
// node (fewer is better), so one owner's replicas spread across nodes.
func scoreOwnerSpread(st *cycleState, n *nodeInfo) int64 {
	if st.info.owner == "" {
		return 0
	}
	return int64(n.owners[st.info.owner])
}

// normalizeHighestBest scales so the highest raw value becomes MaxNodeScore.
func normalizeHighestBest(s []int64) {
	var hi int64
	for _, v := range s {
		hi = max(hi, v)
	}
	if hi == 0 {
		return
	}
	for i := range s {
		s[i] = s[i] * MaxNodeScore / hi
	}
}

// normalizeFewestBest maps the lowest raw count to MaxNodeScore and the
// highest to 0 (all equal: all MaxNodeScore).
func normalizeFewestBest(s []int64) {
	var hi int64
	for _, v := range s {
		hi = max(hi, v)
	}
	for i := range s {
		if hi == 0 {
			s[i] = MaxNodeScore
		} else {
			s[i] = (hi - s[i]) * MaxNodeScore / hi
		}
	}
}

// prefilter computes, once per attempt and over all nodes, the states of
// InterPodAffinity and PodTopologySpread (upstream's PreFilter and
// PreScore). It runs under the cache's read lock.
func (s *Scheduler) prefilter(st *cycleState, infos []*nodeInfo) {
	pod := st.pod
	var nsLabels labels.Set
	if s.namespaces != nil {
		if ns, err := s.namespaces.Get(pod.Namespace); err == nil {
			nsLabels = ns.Labels
		}
	}
	st.aff = newAffinityState(pod, st.info.aff, infos, s.namespaces, nsLabels)
	st.affScore = newAffinityScore(pod, st.info.aff, infos, s.namespaces, nsLabels)
	if cs := buildConstraints(pod, pod.Spec.TopologySpreadConstraints, v1.DoNotSchedule, nil); len(cs) > 0 {
		st.spread = newSpreadState(st, cs, infos)
		st.spread.computeMins()
	}
	var soft []spreadConstraint
	if len(pod.Spec.TopologySpreadConstraints) > 0 {
		soft = buildConstraints(pod, pod.Spec.TopologySpreadConstraints, v1.ScheduleAnyway, nil)
	} else if s.services != nil {
		// The cluster's default constraints, with the selector of the
		// pod's Services and controller, as upstream's.
		if sel := helper.DefaultSelector(pod, s.services, s.rcs, s.rss, s.sss); !sel.Empty() {
			soft = buildConstraints(pod, defaultSpreadConstraints, v1.ScheduleAnyway, sel)
		}
	}
	if st.spreadScore = newSpreadState(st, soft, infos); st.spreadScore != nil {
		st.spreadScore.weight = make([]float64, len(soft))
		for i := range soft {
			st.spreadScore.weight[i] = math.Log(float64(len(st.spreadScore.counts[i]) + 2))
		}
	}
}
