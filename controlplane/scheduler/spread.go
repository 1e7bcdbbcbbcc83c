package scheduler

import (
	"maps"
	"math"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
)

// PodTopologySpread, as upstream's plugin
// (k8s.io/kubernetes/pkg/scheduler/framework/plugins/podtopologyspread):
// DoNotSchedule constraints filter, ScheduleAnyway ones (or the cluster
// defaults for a pod with none) score. Matching pods are counted once per
// attempt per topology domain.

const (
	reasonSpread          = "node(s) didn't match pod topology spread constraints"
	reasonSpreadNoLabel   = reasonSpread + " (missing required label)"
	defaultZoneMaxSkew    = 5
	defaultHostnameMaxSkw = 3
)

// defaultSpreadConstraints are upstream's system defaults, applied (for
// scoring only) to a pod without constraints of its own.
var defaultSpreadConstraints = []v1.TopologySpreadConstraint{
	{TopologyKey: v1.LabelTopologyZone, MaxSkew: defaultZoneMaxSkew, WhenUnsatisfiable: v1.ScheduleAnyway},
	{TopologyKey: v1.LabelHostname, MaxSkew: defaultHostnameMaxSkw, WhenUnsatisfiable: v1.ScheduleAnyway},
}

type spreadConstraint struct {
	maxSkew, minDomains        int32
	key                        string
	selector                   labels.Selector
	honorAffinity, honorTaints bool
}

// buildConstraints parses the constraints with the given whenUnsatisfiable;
// selector, when set, replaces each constraint's own (the defaults').
func buildConstraints(pod *v1.Pod, in []v1.TopologySpreadConstraint, when v1.UnsatisfiableConstraintAction, selector labels.Selector) []spreadConstraint {
	var out []spreadConstraint
	for _, c := range in {
		if c.WhenUnsatisfiable != when {
			continue
		}
		sel := selector
		if sel == nil {
			s, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
			if err != nil {
				continue
			}
			for _, k := range c.MatchLabelKeys {
				if v, ok := pod.Labels[k]; ok {
					if r, err := labels.NewRequirement(k, selection.In, []string{v}); err == nil {
						s = s.Add(*r)
					}
				}
			}
			sel = s
		}
		sc := spreadConstraint{maxSkew: c.MaxSkew, minDomains: 1, key: c.TopologyKey, selector: sel,
			honorAffinity: true, honorTaints: false}
		if c.MinDomains != nil {
			sc.minDomains = *c.MinDomains
		}
		if c.NodeAffinityPolicy != nil {
			sc.honorAffinity = *c.NodeAffinityPolicy == v1.NodeInclusionPolicyHonor
		}
		if c.NodeTaintsPolicy != nil {
			sc.honorTaints = *c.NodeTaintsPolicy == v1.NodeInclusionPolicyHonor
		}
		out = append(out, sc)
	}
	return out
}

// includes reports whether node counts for c (its nodeAffinityPolicy and
// nodeTaintsPolicy).
func (c *spreadConstraint) includes(st *cycleState, node *v1.Node) bool {
	if c.honorAffinity {
		if ok, err := st.required.Match(node); err != nil || !ok {
			return false
		}
	}
	if c.honorTaints {
		if _, bad := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, st.pod.Spec.Tolerations, func(t *v1.Taint) bool {
			return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
		}, false); bad {
			return false
		}
	}
	return true
}

func hasAllKeys(node *v1.Node, cs []spreadConstraint) bool {
	for i := range cs {
		if _, ok := node.Labels[cs[i].key]; !ok {
			return false
		}
	}
	return true
}

func countMatching(n *nodeInfo, ns string, sel labels.Selector) int64 {
	var c int64
	for _, e := range n.pods {
		if e.pod.Namespace == ns && e.pod.DeletionTimestamp == nil && sel.Matches(labels.Set(e.pod.Labels)) {
			c++
		}
	}
	return c
}

// spreadState is PodTopologySpread's PreFilter (filter) or PreScore
// (score) state: per constraint, matching pods per topology value of the
// nodes that count.
type spreadState struct {
	cs     []spreadConstraint
	counts []map[string]int64
	mins   []int64   // filter: the lowest count per constraint
	weight []float64 // score: log(domains+2) per constraint
}

func newSpreadState(st *cycleState, cs []spreadConstraint, infos []*nodeInfo) *spreadState {
	if len(cs) == 0 {
		return nil
	}
	s := &spreadState{cs: cs, counts: make([]map[string]int64, len(cs))}
	for i := range s.counts {
		s.counts[i] = map[string]int64{}
	}
	for _, n := range infos {
		if n.node == nil || !hasAllKeys(n.node, cs) {
			continue
		}
		for i := range cs {
			c := &cs[i]
			if !c.includes(st, n.node) {
				continue
			}
			s.counts[i][n.node.Labels[c.key]] += countMatching(n, st.pod.Namespace, c.selector)
		}
	}
	return s
}

func (s *spreadState) computeMins() {
	s.mins = make([]int64, len(s.cs))
	for i, m := range s.counts {
		lo := int64(math.MaxInt64)
		for _, v := range m {
			lo = min(lo, v)
		}
		if len(m) == 0 || int32(len(m)) < s.cs[i].minDomains {
			lo = 0
		}
		s.mins[i] = lo
	}
}

func (s *spreadState) clone() *spreadState {
	if s == nil {
		return nil
	}
	c := &spreadState{cs: s.cs, counts: make([]map[string]int64, len(s.counts)), mins: s.mins, weight: s.weight}
	for i, m := range s.counts {
		c.counts[i] = maps.Clone(m)
	}
	return c
}

// update counts (delta +1) or uncounts (-1) pod e on node, for preemption's
// what-if evaluations; the minimums are recomputed.
func (s *spreadState) update(st *cycleState, e *podInfo, node *v1.Node, delta int64) {
	if s == nil || e.pod.Namespace != st.pod.Namespace || e.pod.DeletionTimestamp != nil || !hasAllKeys(node, s.cs) {
		return
	}
	changed := false
	for i := range s.cs {
		c := &s.cs[i]
		if c.includes(st, node) && c.selector.Matches(labels.Set(e.pod.Labels)) {
			s.counts[i][node.Labels[c.key]] += delta
			changed = true
		}
	}
	if changed && s.mins != nil {
		s.computeMins()
	}
}

func (s *spreadState) filter(st *cycleState, n *nodeInfo) (string, bool) {
	podLabels := labels.Set(st.pod.Labels)
	for i := range s.cs {
		c := &s.cs[i]
		v, ok := n.node.Labels[c.key]
		if !ok {
			return reasonSpreadNoLabel, true
		}
		var self int64
		if c.selector.Matches(podLabels) {
			self = 1
		}
		if s.counts[i][v]+self-s.mins[i] > int64(c.maxSkew) {
			return reasonSpread, false
		}
	}
	return "", false
}

// scoreSpread is PodTopologySpread's Score: the weighted matching pods in
// the node's domains (fewer is better), -1 for a node lacking a key.
func scoreSpread(st *cycleState, n *nodeInfo) int64 {
	s := st.spreadScore
	if s == nil {
		return 0
	}
	if !hasAllKeys(n.node, s.cs) {
		return -1
	}
	var score float64
	for i := range s.cs {
		c := &s.cs[i]
		cnt := s.counts[i][n.node.Labels[c.key]]
		score += float64(cnt)*s.weight[i] + float64(c.maxSkew-1)
	}
	return int64(math.Round(score))
}

// normalizeSpread is upstream's PodTopologySpread NormalizeScore: the
// lowest raw score gets the most, ignored nodes (-1) get 0.
func normalizeSpread(s []int64) {
	lo, hi := int64(math.MaxInt64), int64(0)
	for _, v := range s {
		if v < 0 {
			continue
		}
		lo, hi = min(lo, v), max(hi, v)
	}
	for i, v := range s {
		switch {
		case v < 0:
			s[i] = 0
		case hi == 0:
			s[i] = MaxNodeScore
		default:
			s[i] = MaxNodeScore * (hi + lo - v) / hi
		}
	}
}
