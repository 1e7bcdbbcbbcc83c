package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// quotaWithStatus creates a quota and fills its status as the ResourceQuota
// controller would (hard copied, used zero): admission enforces only what a
// quota's status says it tracks.
func quotaWithStatus(t *testing.T, cs kubernetes.Interface, ns, name string, hard corev1.ResourceList, scopes ...corev1.ResourceQuotaScope) {
	t.Helper()
	ctx := context.Background()
	q, err := cs.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ResourceQuotaSpec{Hard: hard, Scopes: scopes}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q.Status.Hard = hard
	q.Status.Used = corev1.ResourceList{}
	for k := range hard {
		q.Status.Used[k] = resource.MustParse("0")
	}
	if _, err := cs.CoreV1().ResourceQuotas(ns).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Admission skips the etcd round trip in namespaces its watch cache
	// holds no quota for: wait until the cache has this one, as a
	// controller-filled status would long have been.
	testutil.Eventually(t, 30*time.Second, func() error {
		l, err := cs.CoreV1().ResourceQuotas(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		for _, it := range l.Items {
			if it.Name == name && len(it.Status.Hard) > 0 {
				return nil
			}
		}
		return fmt.Errorf("quota %s not in the watch cache yet", name)
	})
}

func testNamespace(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestQuotaAdmissionConcurrentCreatesExactlyN: 20 pods created at once
// against a quota of 7 pods: exactly 7 are stored, the 13 others get
// upstream's 403, and status.used says 7.
func TestQuotaAdmissionConcurrentCreatesExactlyN(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	testNamespace(t, cs, "quota-race")
	quotaWithStatus(t, cs, "quota-race", "pods", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("7")})

	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = cs.CoreV1().Pods("quota-race").Create(ctx, pod(fmt.Sprintf("p%d", i), nil), metav1.CreateOptions{})
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case apierrors.IsForbidden(err):
			want := "exceeded quota: pods, requested: pods=1, used: pods=7, limited: pods=7"
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal %q does not say %q", err, want)
			}
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if ok != 7 {
		t.Fatalf("%d creates succeeded, want exactly 7", ok)
	}
	list, err := cs.CoreV1().Pods("quota-race").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 7 {
		t.Fatalf("stored pods: %d (%v), want 7", len(list.Items), err)
	}
	q, err := cs.CoreV1().ResourceQuotas("quota-race").Get(ctx, "pods", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if used := q.Status.Used[corev1.ResourcePods]; used.Value() != 7 {
		t.Fatalf("status.used pods = %s, want 7", used.String())
	}
}

// TestQuotaAdmissionComputeAndCounts: requests/limits are charged per pod
// and a pod without the tracked request is refused with upstream's
// message; count/<resource>.<group> limits any kind; dry runs charge
// nothing; an invalid object charges nothing.
func TestQuotaAdmissionComputeAndCounts(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	testNamespace(t, cs, "quota-compute")
	quotaWithStatus(t, cs, "quota-compute", "compute", corev1.ResourceList{
		corev1.ResourceRequestsCPU: resource.MustParse("1"), corev1.ResourceLimitsMemory: resource.MustParse("1Gi")})
	quotaWithStatus(t, cs, "quota-compute", "objects", corev1.ResourceList{"count/deployments.apps": resource.MustParse("1")})
	pods := cs.CoreV1().Pods("quota-compute")

	sized := func(name, cpu, mem string) *corev1.Pod {
		p := pod(name, nil)
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)},
		}
		return p
	}
	if _, err := pods.Create(ctx, pod("bare", nil), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "failed quota: compute: must specify limits.memory for: c; requests.cpu for: c") {
		t.Fatalf("pod without requests: %v", err)
	}
	if _, err := pods.Create(ctx, sized("dry", "800m", "512Mi"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatal(err)
	}
	bad := sized("Invalid_Name", "800m", "512Mi")
	if _, err := pods.Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("invalid pod: %v", err)
	}
	if _, err := pods.Create(ctx, sized("a", "800m", "512Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("first pod (dry run and invalid pod charged nothing): %v", err)
	}
	_, err := pods.Create(ctx, sized("b", "300m", "256Mi"), metav1.CreateOptions{})
	if want := "exceeded quota: compute, requested: requests.cpu=300m, used: requests.cpu=800m, limited: requests.cpu=1"; !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("second pod: %v, want %q", err, want)
	}

	dep := func(name string) *appsv1.Deployment {
		one := int32(1)
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{
			Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": name}}, Spec: pod("x", nil).Spec}}}
	}
	if _, err := cs.AppsV1().Deployments("quota-compute").Create(ctx, dep("d1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = cs.AppsV1().Deployments("quota-compute").Create(ctx, dep("d2"), metav1.CreateOptions{})
	if want := "exceeded quota: objects, requested: count/deployments.apps=1, used: count/deployments.apps=1, limited: count/deployments.apps=1"; !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("second deployment: %v, want %q", err, want)
	}
}

// TestQuotaAdmissionScopes: a BestEffort quota limits only pods without
// requests or limits; a NotBestEffort one only the others.
func TestQuotaAdmissionScopes(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	testNamespace(t, cs, "quota-scopes")
	quotaWithStatus(t, cs, "quota-scopes", "besteffort", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}, corev1.ResourceQuotaScopeBestEffort)
	pods := cs.CoreV1().Pods("quota-scopes")
	if _, err := pods.Create(ctx, pod("be1", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, pod("be2", nil), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("second best-effort pod: %v", err)
	}
	burstable := pod("burstable", nil)
	burstable.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
	if _, err := pods.Create(ctx, burstable, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a burstable pod is outside a BestEffort quota: %v", err)
	}
}
