package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestDisruptionBudgetStatusFollowsHealthyPods(t *testing.T) {
	c := newCluster(t)
	requiresResource(t, c, "policy/v1", "poddisruptionbudgets")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	k := c.startKubelets(ctx, 2, nil)
	c.startManager("cm-0", nil)
	c.kubectlOK("create", "deployment", "web", "--image=nginx:1", "--replicas=3")
	c.kubectlOK("rollout", "status", "deployment/web", "--timeout=60s")
	two := intstr.FromInt32(2)
	half := intstr.FromString("50%")
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	for _, pdb := range []*policyv1.PodDisruptionBudget{
		{ObjectMeta: metav1.ObjectMeta{Name: "min2"}, Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &two, Selector: sel}},
		{ObjectMeta: metav1.ObjectMeta{Name: "half"}, Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &half, Selector: sel}},
	} {
		if _, err := c.cs.PolicyV1().PodDisruptionBudgets("default").Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	want := func(name string, healthy, desired, expected, allowed int32, reason string) {
		t.Helper()
		eventually(t, 60*time.Second, func() error {
			p, err := c.cs.PolicyV1().PodDisruptionBudgets("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			st := p.Status
			if st.CurrentHealthy != healthy || st.DesiredHealthy != desired || st.ExpectedPods != expected || st.DisruptionsAllowed != allowed || st.ObservedGeneration != p.Generation {
				return fmt.Errorf("%s: status %+v", name, st)
			}
			for _, cnd := range st.Conditions {
				if cnd.Type == policyv1.DisruptionAllowedCondition && cnd.Reason == reason {
					return nil
				}
			}
			return fmt.Errorf("%s: conditions %+v, want reason %s", name, st.Conditions, reason)
		})
	}
	want("min2", 3, 2, 3, 1, policyv1.SufficientPodsReason)
	want("half", 3, 1, 3, 2, policyv1.SufficientPodsReason) // 50% of 3 rounds up to 2 unavailable
	// Two pods turn unready: nothing may be disrupted under min2.
	pods, _ := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	unready := map[string]bool{}
	for _, p := range pods.Items {
		if len(unready) < 2 && strings.HasPrefix(p.Name, "web-") {
			unready[p.Name] = true
		}
	}
	k.setReady(func(p *corev1.Pod) bool { return !unready[p.Name] })
	for _, p := range pods.Items {
		if !unready[p.Name] {
			continue
		}
		q := p.DeepCopy()
		q.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now()}}
		if _, err := c.cs.CoreV1().Pods("default").UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	want("min2", 1, 2, 3, 0, policyv1.InsufficientPodsReason)
	want("half", 1, 1, 3, 0, policyv1.InsufficientPodsReason)
}
