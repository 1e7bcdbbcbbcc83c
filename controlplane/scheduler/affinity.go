package scheduler

import (
	"maps"
	"math"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// Inter-pod affinity and anti-affinity, as upstream's InterPodAffinity
// plugin (k8s.io/kubernetes/pkg/scheduler/framework/plugins/interpodaffinity)
// with its hostname fast path: terms whose topologyKey is
// kubernetes.io/hostname are checked against the node's own pods in Filter;
// other terms are counted once per attempt per topology pair (PreFilter).

// Reasons, worded as upstream's.
const (
	reasonExistingAntiAffinity = "node(s) didn't satisfy existing pods anti-affinity rules"
	reasonPodAffinity          = "node(s) didn't match pod affinity rules"
	reasonAntiAffinity         = "node(s) didn't match pod anti-affinity rules"
)

// hardPodAffinityWeight is the weight existing pods' required affinity
// terms get in the score (upstream's default HardPodAffinityWeight).
const hardPodAffinityWeight = 1

type topologyPair struct{ key, value string }

type pairCounts map[topologyPair]int64

func (m pairCounts) update(node *v1.Node, key string, delta int64) {
	if v, ok := node.Labels[key]; ok {
		p := topologyPair{key, v}
		if m[p] += delta; m[p] == 0 {
			delete(m, p)
		}
	}
}

// affinityState is the InterPodAffinity PreFilter state of one attempt.
type affinityState struct {
	pod      *v1.Pod
	nsLabels labels.Set // of the incoming pod's namespace
	// The incoming pod's required terms, namespaceSelectors merged into
	// namespaces. hostAff is set when every affinity term is
	// hostname-scoped (checked on the node), else wideAff holds them all.
	wideAff, hostAff   []fwk.AffinityTerm
	wideAnti, hostAnti []fwk.AffinityTerm
	// Counts per topology pair: existing pods whose (non-hostname) required
	// anti-affinity matches the incoming pod; existing pods matching all of
	// wideAff; existing pods matching wideAnti.
	existingAnti, affCounts, antiCounts pairCounts
	// hostAffMatches counts pods anywhere matching all of hostAff (0: the
	// first pod of a self-affine group may go anywhere).
	hostAffMatches int64
	// existingHostAnti: some existing pod has a hostname-scoped required
	// anti-affinity term (checked on the node in Filter).
	existingHostAnti bool
}

// mergeNamespaceSelectors turns the namespaceSelector of the incoming pod's
// terms into namespace names, as upstream does, so terms match pods by
// namespace name only.
func mergeNamespaceSelectors(terms []fwk.AffinityTerm, nsl corelisters.NamespaceLister) []fwk.AffinityTerm {
	out := make([]fwk.AffinityTerm, len(terms))
	for i, t := range terms {
		// An empty selector ({}) matches every namespace and stays as is.
		if !t.NamespaceSelector.Empty() {
			if nsl != nil && !isNothing(t.NamespaceSelector) {
				ns := t.Namespaces.Clone()
				if list, err := nsl.List(t.NamespaceSelector); err == nil {
					for _, n := range list {
						ns.Insert(n.Name)
					}
				}
				t.Namespaces = ns
			}
			t.NamespaceSelector = labels.Nothing()
		}
		out[i] = t
	}
	return out
}

func isNothing(s labels.Selector) bool {
	_, ok := s.Requirements()
	return !ok
}

func podMatchesAllTerms(terms []fwk.AffinityTerm, pod *v1.Pod) bool {
	if len(terms) == 0 {
		return false
	}
	for i := range terms {
		if !terms[i].Matches(pod, nil) {
			return false
		}
	}
	return true
}

// newAffinityState is InterPodAffinity's PreFilter; nil when nothing is to
// be checked.
func newAffinityState(pod *v1.Pod, pa *podAffinity, infos []*nodeInfo, nsl corelisters.NamespaceLister, nsLabels labels.Set) *affinityState {
	s := &affinityState{pod: pod, nsLabels: nsLabels, existingAnti: pairCounts{}, affCounts: pairCounts{}, antiCounts: pairCounts{}}
	if pa != nil {
		aff := mergeNamespaceSelectors(pa.reqAff, nsl)
		anti := mergeNamespaceSelectors(pa.reqAnti, nsl)
		allHost := true
		for _, t := range aff {
			allHost = allHost && t.TopologyKey == v1.LabelHostname
		}
		if allHost {
			s.hostAff = aff
		} else {
			s.wideAff = aff
		}
		for _, t := range anti {
			if t.TopologyKey == v1.LabelHostname {
				s.hostAnti = append(s.hostAnti, t)
			} else {
				s.wideAnti = append(s.wideAnti, t)
			}
		}
	}
	scanAll := len(s.wideAff)+len(s.wideAnti)+len(s.hostAff) > 0
	for _, n := range infos {
		if n.node == nil || (!scanAll && n.antiPods == 0) {
			continue
		}
		for _, e := range n.pods {
			s.addExisting(e, n.node, 1, scanAll)
		}
	}
	if !scanAll && !s.existingHostAnti && len(s.existingAnti) == 0 && len(s.hostAnti) == 0 {
		return nil
	}
	return s
}

// addExisting counts (delta +1) or uncounts (-1) an existing pod on node.
func (s *affinityState) addExisting(e *podInfo, node *v1.Node, delta int64, incoming bool) {
	if e.aff != nil {
		for i := range e.aff.reqAnti {
			t := &e.aff.reqAnti[i]
			if t.TopologyKey == v1.LabelHostname {
				s.existingHostAnti = true
			} else if t.Matches(s.pod, s.nsLabels) {
				s.existingAnti.update(node, t.TopologyKey, delta)
			}
		}
	}
	if !incoming {
		return
	}
	if podMatchesAllTerms(s.wideAff, e.pod) {
		for _, t := range s.wideAff {
			s.affCounts.update(node, t.TopologyKey, delta)
		}
	}
	for i := range s.wideAnti {
		if s.wideAnti[i].Matches(e.pod, nil) {
			s.antiCounts.update(node, s.wideAnti[i].TopologyKey, delta)
		}
	}
	if podMatchesAllTerms(s.hostAff, e.pod) {
		s.hostAffMatches += delta
	}
}

func (s *affinityState) clone() *affinityState {
	if s == nil {
		return nil
	}
	c := *s
	c.existingAnti, c.affCounts, c.antiCounts = maps.Clone(s.existingAnti), maps.Clone(s.affCounts), maps.Clone(s.antiCounts)
	return &c
}

// filter is InterPodAffinity's Filter: the reason and whether preemption
// cannot help (a missing affinity match cannot be made by removing pods).
func (s *affinityState) filter(n *nodeInfo) (string, bool) {
	node := n.node
	// The incoming pod's required affinity.
	switch {
	case len(s.hostAff) > 0:
		ok := false
		for _, e := range n.pods {
			if podMatchesAllTerms(s.hostAff, e.pod) {
				ok = true
				break
			}
		}
		if !ok && !(s.hostAffMatches == 0 && podMatchesAllTerms(s.hostAff, s.pod)) {
			return reasonPodAffinity, true
		}
	case len(s.wideAff) > 0:
		ok := true
		for _, t := range s.wideAff {
			v, has := node.Labels[t.TopologyKey]
			if !has {
				return reasonPodAffinity, true
			}
			if s.affCounts[topologyPair{t.TopologyKey, v}] <= 0 {
				ok = false
			}
		}
		// The first pod of a group whose terms match itself may go anywhere.
		if !ok && !(len(s.affCounts) == 0 && podMatchesAllTerms(s.wideAff, s.pod)) {
			return reasonPodAffinity, true
		}
	}
	// The incoming pod's required anti-affinity.
	for _, t := range s.wideAnti {
		if v, ok := node.Labels[t.TopologyKey]; ok && s.antiCounts[topologyPair{t.TopologyKey, v}] > 0 {
			return reasonAntiAffinity, false
		}
	}
	if len(s.hostAnti) > 0 {
		for _, e := range n.pods {
			for i := range s.hostAnti {
				if s.hostAnti[i].Matches(e.pod, nil) {
					return reasonAntiAffinity, false
				}
			}
		}
	}
	// Existing pods' required anti-affinity.
	if len(s.existingAnti) > 0 {
		for k, v := range node.Labels {
			if s.existingAnti[topologyPair{k, v}] > 0 {
				return reasonExistingAntiAffinity, false
			}
		}
	}
	if s.existingHostAnti && n.antiPods > 0 {
		for _, e := range n.pods {
			if e.aff == nil {
				continue
			}
			for i := range e.aff.reqAnti {
				t := &e.aff.reqAnti[i]
				if t.TopologyKey == v1.LabelHostname && t.Matches(s.pod, s.nsLabels) {
					return reasonExistingAntiAffinity, false
				}
			}
		}
	}
	return "", false
}

// affinityScore is InterPodAffinity's PreScore: weights per topology
// value, from the incoming pod's preferred terms and from existing pods'
// terms that match the incoming pod.
type affinityScore map[string]map[string]int64

func (a affinityScore) add(node *v1.Node, key string, w int64) {
	v, ok := node.Labels[key]
	if !ok || w == 0 {
		return
	}
	m := a[key]
	if m == nil {
		m = map[string]int64{}
		a[key] = m
	}
	m[v] += w
}

func newAffinityScore(pod *v1.Pod, pa *podAffinity, infos []*nodeInfo, nsl corelisters.NamespaceLister, nsLabels labels.Set) affinityScore {
	var prefAff, prefAnti []fwk.WeightedAffinityTerm
	if pa != nil {
		prefAff, prefAnti = mergeWeighted(pa.prefAff, nsl), mergeWeighted(pa.prefAnti, nsl)
	}
	incoming := len(prefAff)+len(prefAnti) > 0
	sc := affinityScore{}
	for _, n := range infos {
		if n.node == nil || (!incoming && n.affScorePods == 0) {
			continue
		}
		for _, e := range n.pods {
			for i := range prefAff {
				if prefAff[i].Matches(e.pod, nil) {
					sc.add(n.node, prefAff[i].TopologyKey, int64(prefAff[i].Weight))
				}
			}
			for i := range prefAnti {
				if prefAnti[i].Matches(e.pod, nil) {
					sc.add(n.node, prefAnti[i].TopologyKey, -int64(prefAnti[i].Weight))
				}
			}
			if !e.aff.scoresOthers() {
				continue
			}
			for i := range e.aff.reqAff {
				if e.aff.reqAff[i].Matches(pod, nsLabels) {
					sc.add(n.node, e.aff.reqAff[i].TopologyKey, hardPodAffinityWeight)
				}
			}
			for i := range e.aff.prefAff {
				if e.aff.prefAff[i].Matches(pod, nsLabels) {
					sc.add(n.node, e.aff.prefAff[i].TopologyKey, int64(e.aff.prefAff[i].Weight))
				}
			}
			for i := range e.aff.prefAnti {
				if e.aff.prefAnti[i].Matches(pod, nsLabels) {
					sc.add(n.node, e.aff.prefAnti[i].TopologyKey, -int64(e.aff.prefAnti[i].Weight))
				}
			}
		}
	}
	if len(sc) == 0 {
		return nil
	}
	return sc
}

func mergeWeighted(terms []fwk.WeightedAffinityTerm, nsl corelisters.NamespaceLister) []fwk.WeightedAffinityTerm {
	if len(terms) == 0 {
		return nil
	}
	plain := make([]fwk.AffinityTerm, len(terms))
	for i := range terms {
		plain[i] = terms[i].AffinityTerm
	}
	plain = mergeNamespaceSelectors(plain, nsl)
	out := make([]fwk.WeightedAffinityTerm, len(terms))
	for i := range terms {
		out[i] = fwk.WeightedAffinityTerm{AffinityTerm: plain[i], Weight: terms[i].Weight}
	}
	return out
}

func scoreInterPodAffinity(st *cycleState, n *nodeInfo) int64 {
	if st.affScore == nil {
		return 0
	}
	var s int64
	for key, vals := range st.affScore {
		if v, ok := n.node.Labels[key]; ok {
			s += vals[v]
		}
	}
	return s
}

// normalizeMinMax maps the lowest raw value to 0 and the highest to
// MaxNodeScore (all equal: all 0), as upstream's InterPodAffinity.
func normalizeMinMax(s []int64) {
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for _, v := range s {
		lo, hi = min(lo, v), max(hi, v)
	}
	for i := range s {
		if hi > lo {
			s[i] = MaxNodeScore * (s[i] - lo) / (hi - lo)
		} else {
			s[i] = 0
		}
	}
}
