package apiserver_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
)

// runningPod creates a pod and reports it Running and Ready through
// /status, as a kubelet would.
func runningPod(t *testing.T, cs *kubernetes.Clientset, ns, name string, labels map[string]string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p := pod(name, labels)
	p.Spec.NodeName = "n1"
	p, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if p, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

func hasDisruptionTarget(p *corev1.Pod) bool {
	_, c := podutil.GetPodCondition(&p.Status, corev1.DisruptionTarget)
	return c != nil
}

func evict(cs *kubernetes.Clientset, ns, name string, opts *metav1.DeleteOptions) error {
	return cs.PolicyV1().Evictions(ns).Evict(context.Background(), &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, DeleteOptions: opts})
}

// TestEvictionHonoursDryRunAndBudgets: a dry-run eviction (the Eviction's
// deleteOptions, as kubectl drain --dry-run=server sends it, or the query)
// deletes nothing, and a PodDisruptionBudget with no disruptions left
// refuses with 429 until it allows one, which the eviction then takes.
func TestEvictionHonoursDryRunAndBudgets(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()
	pods := cs.CoreV1().Pods("default")

	t.Run("dryRun never deletes", func(t *testing.T) {
		runningPod(t, cs, "default", "dry", nil)
		if err := evict(cs, "default", "dry", &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}, GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		raw := newRaw(t, srv.Config)
		body := `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"dry"},"deleteOptions":{"gracePeriodSeconds":0}}`
		if code, st, _ := raw.do("POST", "/api/v1/namespaces/default/pods/dry/eviction?dryRun=All", "application/json", strings.NewReader(body), int64(len(body))); code != 201 {
			t.Fatalf("dry-run eviction by query: %d %+v", code, st)
		}
		p, err := pods.Get(ctx, "dry", metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Fatalf("a dry-run eviction deleted the pod: %v %v", err, p.DeletionTimestamp)
		}
		// A real one does (grace 0: gone).
		if err := evict(cs, "default", "dry", &metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		if _, err := pods.Get(ctx, "dry", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("evicted pod still there: %v", err)
		}
	})

	t.Run("a graceful eviction marks the pod DisruptionTarget", func(t *testing.T) {
		// As upstream: the condition is written before the delete, so the
		// kubelet's final status keeps it and a Job's podFailurePolicy sees
		// an eviction, not a failure. A dry run writes nothing.
		runningPod(t, cs, "default", "marked", nil)
		if err := evict(cs, "default", "marked", &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatal(err)
		}
		if p, _ := pods.Get(ctx, "marked", metav1.GetOptions{}); hasDisruptionTarget(p) {
			t.Fatalf("a dry-run eviction wrote a condition: %+v", p.Status.Conditions)
		}
		if err := evict(cs, "default", "marked", nil); err != nil {
			t.Fatal(err)
		}
		p, err := pods.Get(ctx, "marked", metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp == nil {
			t.Fatalf("after a graceful eviction: %v %+v", err, p)
		}
		if _, c := podutil.GetPodCondition(&p.Status, corev1.DisruptionTarget); c == nil || c.Status != corev1.ConditionTrue || c.Reason != "EvictionByEvictionAPI" {
			t.Errorf("conditions after the eviction: %+v", p.Status.Conditions)
		}
		if len(p.Status.Conditions) != 2 {
			t.Errorf("the other conditions were not kept: %+v", p.Status.Conditions)
		}
	})

	t.Run("a budget with no disruptions left gives 429", func(t *testing.T) {
		if _, err := cs.Discovery().ServerResourcesForGroupVersion("policy/v1"); err != nil {
			t.Skip("policy/v1 PodDisruptionBudgets are not served yet (api-kinds adds the kind): ", err)
		}
		pdbs := cs.PolicyV1().PodDisruptionBudgets("default")
		runningPod(t, cs, "default", "guarded", map[string]string{"app": "guarded"})
		one := intstr.FromInt32(1)
		pdb, err := pdbs.Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "budget"},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Not yet observed by the disruption controller: 429.
		err = evict(cs, "default", "guarded", nil)
		if !apierrors.IsTooManyRequests(err) {
			t.Fatalf("eviction under an unprocessed budget: want 429, got %v", err)
		}
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
		if pdb, err = pdbs.UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		err = evict(cs, "default", "guarded", nil)
		st, _ := err.(apierrors.APIStatus)
		if !apierrors.IsTooManyRequests(err) || st == nil || len(st.Status().Details.Causes) == 0 ||
			st.Status().Details.Causes[0].Type != policyv1.DisruptionBudgetCause || !strings.Contains(st.Status().Details.Causes[0].Message, "needs 1 healthy pods and has 1 currently") {
			t.Fatalf("eviction the budget forbids: %v", err)
		}
		if p, err := pods.Get(ctx, "guarded", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
			t.Fatalf("a refused eviction deleted the pod: %v", err)
		}
		// One disruption allowed: dry run changes nothing; then the eviction
		// takes it and the pod goes.
		pdb.Status.DisruptionsAllowed, pdb.Status.CurrentHealthy, pdb.Status.DesiredHealthy = 1, 2, 1
		if pdb, err = pdbs.UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := evict(cs, "default", "guarded", &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatal(err)
		}
		if got, _ := pdbs.Get(ctx, "budget", metav1.GetOptions{}); got.Status.DisruptionsAllowed != 1 || len(got.Status.DisruptedPods) != 0 {
			t.Fatalf("a dry-run eviction changed the budget: %+v", got.Status)
		}
		if err := evict(cs, "default", "guarded", &metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		got, _ := pdbs.Get(ctx, "budget", metav1.GetOptions{})
		if _, ok := got.Status.DisruptedPods["guarded"]; got.Status.DisruptionsAllowed != 0 || !ok {
			t.Fatalf("budget after the eviction: %+v", got.Status)
		}
		if _, err := pods.Get(ctx, "guarded", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("evicted pod still there: %v", err)
		}
	})
}
