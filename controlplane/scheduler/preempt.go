package scheduler

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
	"k8s.io/kubernetes/pkg/scheduler/util"
)

// Preemption, as upstream's DefaultPreemption PostFilter
// (k8s.io/kubernetes/pkg/scheduler/framework/preemption and
// plugins/defaultpreemption): when a pod fits nowhere, the nodes where
// removing pods of lower priority could make it fit are tried; on each, all
// such pods are removed, then reprieved one by one, most important first
// (those whose PodDisruptionBudget would be violated before the others),
// as long as the pod still fits. Among the nodes that work, the one with the
// fewest PDB violations, then the lowest highest victim priority, the
// smallest priority sum, the fewest victims, the latest start of its most
// important victims, is chosen. The pod is nominated to it; the victims get
// the DisruptionTarget condition and are deleted gracefully.

const (
	// Upstream's DefaultPreemption defaults.
	minCandidateNodesPercentage = 10
	minCandidateNodesAbsolute   = 100

	reasonNotHelpful = "Preemption is not helpful for scheduling"
	reasonNoVictims  = "No preemption victims found for incoming pod"
)

// preemptionResult is what a preemption decided: the node the pod is
// nominated to and the pods to delete, or why there is none.
type preemptionResult struct {
	node    string
	victims []*v1.Pod
	// lowerNominated are pods of lower priority nominated to node: their
	// nomination is cleared.
	lowerNominated []*v1.Pod
	message        string // "preemption: ..." when node is ""
}

// candidate is a node where preemption works and its victims, most
// important first.
type candidate struct {
	node          string
	victims       []*v1.Pod
	pdbViolations int
}

// numCandidates is how many candidate nodes the dry run looks for,
// upstream's rule: 10% of the nodes, at least 100, at most all.
func numCandidates(nodes int) int {
	n := max(nodes*minCandidateNodesPercentage/100, minCandidateNodesAbsolute)
	return min(n, nodes)
}

func allResolvable(reasons []string) bool {
	for _, r := range reasons {
		if !resolvable(r) {
			return false
		}
	}
	return len(reasons) > 0
}

func preemptionMessage(total int, counts map[string]int) string {
	parts := make([]string, 0, len(counts))
	for r, c := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", c, r))
	}
	sort.Strings(parts)
	return fmt.Sprintf("preemption: 0/%d nodes are available: %s.", total, strings.Join(parts, ", "))
}

// preemptLocked runs under the cache's read lock after no node fit: infos
// are the nodes, reasons[p] why node (start+p) mod n failed.
func (s *Scheduler) preemptLocked(st *cycleState, names []string, infos []*nodeInfo, start int, reasons [][]string) preemptionResult {
	pod := st.pod
	if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == v1.PreemptNever {
		return preemptionResult{message: "preemption: not eligible due to preemptionPolicy=Never."}
	}
	n := len(infos)
	// A pod already nominated to a node where its victims are still
	// terminating waits for them rather than preempting again.
	if nom := pod.Status.NominatedNodeName; nom != "" {
		if i, found := slices.BinarySearch(names, nom); found && allResolvable(reasons[(i-start+n)%n]) {
			for _, e := range infos[i].pods {
				if e.priority < st.info.priority && preemption.PodTerminatingByPreemption(e.pod) {
					return preemptionResult{message: "preemption: not eligible due to a terminating pod on the nominated node."}
				}
			}
		}
	}
	counts := map[string]int{}
	var potential []int
	for p := range n {
		if allResolvable(reasons[p]) {
			potential = append(potential, (start+p)%n)
		} else {
			counts[reasonNotHelpful]++
		}
	}
	if len(potential) == 0 {
		return preemptionResult{message: preemptionMessage(n, counts)}
	}
	pdbs := s.listPDBs()
	want := numCandidates(len(potential))
	offset := rand.IntN(len(potential))
	var cands []candidate
	nonViolating := 0
	for k := range potential {
		ni := infos[potential[(offset+k)%len(potential)]]
		c, why := s.selectVictimsOnNode(st, ni, pdbs)
		if why != nil {
			for _, r := range why {
				counts[r]++
			}
			continue
		}
		if len(c.victims) == 0 { // fits once nominated pods are accounted for
			return preemptionResult{node: c.node}
		}
		cands = append(cands, c)
		if c.pdbViolations == 0 {
			nonViolating++
		}
		if nonViolating > 0 && len(cands) >= want {
			break
		}
	}
	if len(cands) == 0 {
		return preemptionResult{message: preemptionMessage(n, counts)}
	}
	best := pickOneNodeForPreemption(cands)
	res := preemptionResult{node: best.node, victims: best.victims}
	if i, found := slices.BinarySearch(names, best.node); found {
		for _, e := range infos[i].nominated {
			if e.priority < st.info.priority && podKey(e.pod) != st.key {
				res.lowerNominated = append(res.lowerNominated, e.pod)
			}
		}
	}
	return res
}

// selectVictimsOnNode is upstream's SelectVictimsOnNode: the fewest, least
// important pods of lower priority to remove from ni for the pod to fit,
// or the reasons it cannot.
func (s *Scheduler) selectVictimsOnNode(st *cycleState, ni *nodeInfo, pdbs []*policyv1.PodDisruptionBudget) (candidate, []string) {
	var potential []preemption.Victim
	byPod := map[*v1.Pod]*podInfo{}
	for _, e := range ni.pods {
		if e.priority >= st.info.priority {
			continue
		}
		fpi, err := framework.NewPodInfo(e.pod)
		if err != nil {
			continue
		}
		potential = append(potential, preemption.NewPodVictim(fpi, nil, nil))
		byPod[e.pod] = e
	}
	if len(potential) == 0 {
		return candidate{}, []string{reasonNoVictims}
	}
	node, state := ni.clone(), st.clone()
	remove := func(e *podInfo) {
		node.removePod(podKey(e.pod))
		state.addPod(e, ni.node, -1)
	}
	add := func(e *podInfo) {
		node.addPod(podKey(e.pod), e)
		state.addPod(e, ni.node, 1)
	}
	for _, v := range potential {
		remove(byPod[v.Pods()[0].GetPod()])
	}
	if r := runFiltersNominated(state, node); r != nil {
		return candidate{}, r
	}
	sort.Slice(potential, func(i, j int) bool { return preemption.MoreImportantVictim(potential[i], potential[j]) })
	violating, nonViolating := preemption.FilterVictimsWithPDBViolation(potential, pdbs)
	c := candidate{node: ni.node.Name}
	var victims []preemption.Victim
	reprieve := func(v preemption.Victim) bool {
		e := byPod[v.Pods()[0].GetPod()]
		add(e)
		if runFiltersNominated(state, node) == nil {
			return true
		}
		remove(e)
		victims = append(victims, v)
		return false
	}
	for _, v := range violating {
		if !reprieve(v.Victim) {
			c.pdbViolations += v.ViolateCount
		}
	}
	for _, v := range nonViolating {
		reprieve(v)
	}
	sort.SliceStable(victims, func(i, j int) bool { return preemption.MoreImportantVictim(victims[i], victims[j]) })
	for _, v := range victims {
		c.victims = append(c.victims, v.Pods()[0].GetPod())
	}
	return c, nil
}

// pickOneNodeForPreemption is upstream's: each criterion in turn keeps the
// best nodes, until one is left (else the first).
func pickOneNodeForPreemption(cands []candidate) candidate {
	if len(cands) == 1 {
		return cands[0]
	}
	criteria := []func(c *candidate) int64{
		// Fewest PodDisruptionBudget violations.
		func(c *candidate) int64 { return -int64(c.pdbViolations) },
		// The lowest priority of the most important victim.
		func(c *candidate) int64 { return -int64(podPriority(c.victims[0])) },
		// The smallest sum of priorities (shifted to be non-negative).
		func(c *candidate) int64 {
			var sum int64
			for _, p := range c.victims {
				sum += int64(podPriority(p)) + int64(math.MaxInt32) + 1
			}
			return -sum
		},
		// The fewest victims.
		func(c *candidate) int64 { return -int64(len(c.victims)) },
		// The latest start time of the highest-priority victims.
		func(c *candidate) int64 {
			t := util.GetEarliestPodStartTime(&extenderv1.Victims{Pods: c.victims})
			if t == nil {
				return math.MinInt64
			}
			return t.UnixNano()
		},
	}
	left := make([]*candidate, len(cands))
	for i := range cands {
		left[i] = &cands[i]
	}
	for _, f := range criteria {
		var keep []*candidate
		best := int64(math.MinInt64)
		for _, c := range left {
			switch v := f(c); {
			case v > best:
				best, keep = v, []*candidate{c}
			case v == best:
				keep = append(keep, c)
			}
		}
		if len(keep) == 1 {
			return *keep[0]
		}
		left = keep
	}
	return *left[0]
}

func (s *Scheduler) listPDBs() []*policyv1.PodDisruptionBudget {
	if s.pdbs == nil {
		return nil
	}
	l, err := s.pdbs.List(labels.Everything())
	if err != nil {
		return nil
	}
	return l
}

// runFiltersNominated runs the filters as upstream's
// RunFilterPluginsWithNominatedPods: with the pods of equal or higher
// priority nominated to the node added (the room preemption freed is
// theirs), and without them (anti-affinity-like filters may only pass
// without).
func runFiltersNominated(st *cycleState, n *nodeInfo) []string {
	if len(n.nominated) > 0 {
		var c *nodeInfo
		var cst *cycleState
		for k, e := range n.nominated {
			if k == st.key || e.priority < st.info.priority {
				continue
			}
			if c == nil {
				c, cst = n.clone(), st.clone()
			}
			c.addPod(k, e)
			cst.addPod(e, n.node, 1)
		}
		if c != nil {
			if r := runFilters(cst, c); r != nil {
				return r
			}
		}
	}
	return runFilters(st, n)
}

// preemptVictims marks each victim with the DisruptionTarget condition
// (reason PreemptionByScheduler) and deletes it gracefully, and clears the
// nomination of lower-priority pods nominated to the node, as upstream's
// prepareCandidate.
func (s *Scheduler) preemptVictims(ctx context.Context, preemptor *v1.Pod, res preemptionResult) {
	for _, victim := range res.victims {
		if err := s.disrupt(ctx, preemptor, victim); err != nil && ctx.Err() == nil {
			s.log.Warn("preempt victim", "victim", podKey(victim), "preemptor", podKey(preemptor), "err", err)
			continue
		}
		s.recorder.Eventf(victim, v1.EventTypeNormal, "Preempted", "Preempted by pod %s on node %s", preemptor.UID, res.node)
	}
	for _, p := range res.lowerNominated {
		s.cache.Nominate(p, "")
		if err := s.setNominatedNode(ctx, p, ""); err != nil && ctx.Err() == nil {
			s.log.Warn("clear nominatedNodeName", "pod", podKey(p), "err", err)
		}
	}
}

func (s *Scheduler) disrupt(ctx context.Context, preemptor, victim *v1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pods := s.cs.CoreV1().Pods(victim.Namespace)
	cond := v1.PodCondition{
		Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler,
		Message:            fmt.Sprintf("%s: preempting to accommodate a higher priority pod", preemptor.Spec.SchedulerName),
		LastTransitionTime: metav1.Now(),
	}
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := pods.Get(ctx, victim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != victim.UID {
			return apierrors.NewNotFound(v1.Resource("pods"), victim.Name)
		}
		replaced := false
		for i := range cur.Status.Conditions {
			if cur.Status.Conditions[i].Type == v1.DisruptionTarget {
				cur.Status.Conditions[i], replaced = cond, true
			}
		}
		if !replaced {
			cur.Status.Conditions = append(cur.Status.Conditions, cond)
		}
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil // gone already
	}
	if err != nil {
		return fmt.Errorf("add DisruptionTarget condition: %w", err)
	}
	uid := victim.UID
	err = pods.Delete(ctx, victim.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}

// setNominatedNode writes status.nominatedNodeName.
func (s *Scheduler) setNominatedNode(ctx context.Context, pod *v1.Pod, node string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pods := s.cs.CoreV1().Pods(pod.Namespace)
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID || cur.Status.NominatedNodeName == node {
			return nil
		}
		cur.Status.NominatedNodeName = node
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func podPriority(p *v1.Pod) int32 { return corev1helpers.PodPriority(p) }
