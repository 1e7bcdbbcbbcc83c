package scheduler

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// priorityClass names the PriorityClass prio-<v> the test creates.
func priorityClass(v int32) podOpt {
	return func(p *v1.Pod) { p.Spec.PriorityClassName = fmt.Sprintf("prio-%d", v) }
}

func disruptionTarget(p *v1.Pod) *v1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == v1.DisruptionTarget {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// TestRealAPIServerPreemption: a pod of high priority that fits nowhere is
// nominated to the node where the fewest, least important pods make room;
// they get DisruptionTarget (PreemptionByScheduler) and are deleted
// gracefully (they stay terminating: no kubelet here), a pod protected by
// a PodDisruptionBudget is spared while another victim suffices, and the
// preemptor is bound once the victims are gone.
func TestRealAPIServerPreemption(t *testing.T) {
	c := startReal(t)
	ctx := context.Background()
	c.create(t, newNode("pa", withAllocatable("4", "8Gi", "110")), newNode("pb", withAllocatable("4", "8Gi", "110")))
	c.waitNodes(t, 2)
	if _, err := c.cs.PolicyV1().PodDisruptionBudgets("default").Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(10)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods get their priority from a PriorityClass: the API server's
	// Priority admission refuses a spec.priority set directly.
	for _, v := range []int32{1, 2, 50, 100} {
		if _, err := c.cs.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("prio-%d", v)}, Value: v,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// pa: db (priority 1, budgeted) + keep (priority 100); pb: lo-1
	// (priority 1) + lo-2 (priority 2) + keep-b (priority 100).
	existing := []*v1.Pod{
		newPod("db", onNode("pa"), requests("2", "1Gi"), priorityClass(1), podLabels("app", "db")),
		newPod("keep", onNode("pa"), requests("2", "1Gi"), priorityClass(100)),
		newPod("lo-1", onNode("pb"), requests("1", "1Gi"), priorityClass(1)),
		newPod("lo-2", onNode("pb"), requests("1", "1Gi"), priorityClass(2)),
		newPod("keep-b", onNode("pb"), requests("2", "1Gi"), priorityClass(100)),
	}
	for _, p := range existing {
		c.create(t, p)
	}
	eventually(t, "the scheduler sees the bound pods", func() bool {
		c.s.cache.mu.RLock()
		defer c.s.cache.mu.RUnlock()
		return len(c.s.cache.pods) == len(existing)
	})
	c.create(t, newPod("hi", requests("2", "1Gi"), priorityClass(50)))
	eventually(t, "hi nominated to pb", func() bool { return c.get(t, "hi").Status.NominatedNodeName == "pb" })
	for _, name := range []string{"lo-1", "lo-2"} {
		eventually(t, name+" preempted", func() bool {
			p := c.get(t, name)
			dt := disruptionTarget(p)
			return p.DeletionTimestamp != nil && dt != nil && dt.Status == v1.ConditionTrue && dt.Reason == v1.PodReasonPreemptionByScheduler
		})
	}
	for _, name := range []string{"db", "keep", "keep-b"} {
		if p := c.get(t, name); p.DeletionTimestamp != nil || disruptionTarget(p) != nil {
			t.Fatalf("%s was preempted", name)
		}
	}
	if p := c.get(t, "hi"); p.Spec.NodeName != "" {
		t.Fatalf("hi bound to %s while its victims still terminate", p.Spec.NodeName)
	}
	// The kubelet would finish the victims; do it for them.
	zero := int64(0)
	for _, name := range []string{"lo-1", "lo-2"} {
		if err := c.cs.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "hi bound to pb", func() bool { return c.get(t, "hi").Spec.NodeName == "pb" })
}
