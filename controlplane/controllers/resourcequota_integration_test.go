package controllers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/controllers/resourcequota"
	"github.com/waggle-io/waggle/internal/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// usedIs waits until quota ns/name's status has hard == spec.hard and the
// used figures want (resource → quantity).
func usedIs(t *testing.T, cs kubernetes.Interface, ns, name string, want map[corev1.ResourceName]string) {
	t.Helper()
	eventually(t, 45*time.Second, func() error {
		q, err := cs.CoreV1().ResourceQuotas(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for k, v := range q.Spec.Hard {
			if h, ok := q.Status.Hard[k]; !ok || h.Cmp(v) != 0 {
				return fmt.Errorf("status.hard %v, want spec.hard %v", q.Status.Hard, q.Spec.Hard)
			}
		}
		for k, v := range want {
			got, ok := q.Status.Used[k]
			if !ok || got.Cmp(resource.MustParse(v)) != 0 {
				return fmt.Errorf("status.used %v, want %s=%s", q.Status.Used, k, v)
			}
		}
		return nil
	})
}

// TestResourceQuotaControllerTracksUsage: the controller (running as the
// controller-manager's own identity, so with its RBAC) fills status from
// what exists, follows creates (through admission), deletions, pods
// finishing and spec changes; admission then refuses beyond the quota with
// upstream's message, and 20 racing creates get exactly the headroom.
func TestResourceQuotaControllerTracksUsage(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := "quota"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mkPod := func(name, cpu string) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		if cpu != "" {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
		}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		return err
	}
	// Objects from before the quota and the controller.
	for i, cpu := range []string{"200m", ""} {
		if err := mkPod(fmt.Sprintf("old-%d", i), cpu); err != nil {
			t.Fatal(err)
		}
	}
	one := int32(1)
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: appsv1.DeploymentSpec{
		Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "d"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "d"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			corev1.ResourcePods: resource.MustParse("3"), "count/deployments.apps": resource.MustParse("5"),
			corev1.ResourceServices: resource.MustParse("10"),
		}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "burstable"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceRequestsCPU: resource.MustParse("1"), corev1.ResourcePods: resource.MustParse("10")},
			Scopes: []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeNotBestEffort}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cfg := DefaultConfig()
	cfg.RestConfig = srv.UserConfig(t, "system:kube-controller-manager")
	cfg.SecureServing.SecurePort = 0
	cfg.Controllers = []string{resourcequota.Name}
	cfg.LeaderElection = defaultLease("cm-quota")
	cfg.Log = testLogger(t, "cm-quota")
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(mctx, cfg) }()
	t.Cleanup(func() { cancel(); <-done })

	usedIs(t, cs, ns, "q", map[corev1.ResourceName]string{corev1.ResourcePods: "2", "count/deployments.apps": "1", corev1.ResourceServices: "0"})
	usedIs(t, cs, ns, "burstable", map[corev1.ResourceName]string{corev1.ResourceRequestsCPU: "200m", corev1.ResourcePods: "1"})

	// Admission charges at once; the third pod fits, the fourth does not.
	if err := mkPod("new-0", "300m"); err != nil {
		t.Fatal(err)
	}
	err = mkPod("new-1", "")
	if want := "exceeded quota: q, requested: pods=1, used: pods=3, limited: pods=3"; !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("fourth pod: %v, want 403 %q", err, want)
	}
	usedIs(t, cs, ns, "burstable", map[corev1.ResourceName]string{corev1.ResourceRequestsCPU: "500m", corev1.ResourcePods: "2"})

	// A deletion and a pod finishing give their share back.
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "old-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	usedIs(t, cs, ns, "q", map[corev1.ResourceName]string{corev1.ResourcePods: "2"})
	p, err := cs.CoreV1().Pods(ns).Get(ctx, "old-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodSucceeded
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	usedIs(t, cs, ns, "q", map[corev1.ResourceName]string{corev1.ResourcePods: "1"})
	usedIs(t, cs, ns, "burstable", map[corev1.ResourceName]string{corev1.ResourceRequestsCPU: "300m", corev1.ResourcePods: "1"})

	// A spec change: the new hard limit shows in status; 20 racing creates
	// get exactly the 5 pods of headroom.
	q, err := cs.CoreV1().ResourceQuotas(ns).Get(ctx, "q", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q.Spec.Hard[corev1.ResourcePods] = resource.MustParse("6")
	if _, err := cs.CoreV1().ResourceQuotas(ns).Update(ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	usedIs(t, cs, ns, "q", map[corev1.ResourceName]string{corev1.ResourcePods: "1"})
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = mkPod(fmt.Sprintf("race-%d", i), "") }()
	}
	wg.Wait()
	admitted := 0
	for _, err := range errs {
		switch {
		case err == nil:
			admitted++
		case !apierrors.IsForbidden(err):
			t.Errorf("racing create: %v", err)
		}
	}
	if admitted != 5 {
		t.Fatalf("%d of 20 racing creates admitted, want exactly 5", admitted)
	}
	usedIs(t, cs, ns, "q", map[corev1.ResourceName]string{corev1.ResourcePods: "6"})
}
