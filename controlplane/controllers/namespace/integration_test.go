package namespace

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

// startCluster starts an API server and the controller as the
// controller-manager runs it (the namespaced resources found by discovery
// on each namespace deleted).
func startCluster(t *testing.T) (*rest.Config, kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler), Options{Dynamic: dyn,
		Discovery: discovery.ToDiscoveryInterfaceWithContext(cs.Discovery()), RecheckPeriod: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })
	return rc, cs, dyn
}

func TestRealAPIServerNamespaceDeletion(t *testing.T) {
	_, cs, _ := startCluster(t)
	ctx := context.Background()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}))
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, metav1.CreateOptions{}))
	for _, ns := range []string{"team", "other"} {
		must(cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}}, metav1.CreateOptions{}))
		must(cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}}, metav1.CreateOptions{}))
		must(cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}, Selector: map[string]string{"app": "x"}}}, metav1.CreateOptions{}))
		labels := map[string]string{"app": "x"}
		one := int32(1)
		must(cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d"},
			Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}, metav1.CreateOptions{}))
		// A pod on a node: its deletion is graceful, finished by the kubelet.
		must(cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "running"},
			Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{}))
	}

	if err := cs.CoreV1().Namespaces().Delete(ctx, "team", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		testutil.WaitFor(t, 30*time.Second, what, cond)
	}
	gone := func(err error) bool {
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return apierrors.IsNotFound(err)
	}
	// Pods go first: the pod on a node terminates (gracefully, finished by
	// its kubelet) while the rest of the content stays.
	wait("the pod terminating", func() bool {
		p, err := cs.CoreV1().Pods("team").Get(ctx, "running", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.DeletionTimestamp != nil
	})
	wait("conditions recorded", func() bool {
		ns, err := cs.CoreV1().Namespaces().Get(ctx, "team", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range ns.Status.Conditions {
			if c.Type == corev1.NamespaceContentRemaining && c.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	})
	if _, err := cs.CoreV1().ConfigMaps("team").Get(ctx, "cfg", metav1.GetOptions{}); err != nil {
		t.Fatalf("config map while a pod terminates: %v, want it kept", err)
	}
	ns, err := cs.CoreV1().Namespaces().Get(ctx, "team", metav1.GetOptions{})
	if err != nil || ns.Status.Phase != corev1.NamespaceTerminating {
		t.Fatalf("namespace while a pod terminates: %v, phase %v", err, ns.Status.Phase)
	}
	if _, err := cs.CoreV1().ConfigMaps("team").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("create in a Terminating namespace: %v, want Forbidden", err)
	}

	// The kubelet finishes the pod: the namespace is finalized and goes.
	zero := int64(0)
	if err := cs.CoreV1().Pods("team").Delete(ctx, "running", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	wait("content deleted once the pod is gone", func() bool {
		_, e1 := cs.CoreV1().ConfigMaps("team").Get(ctx, "cfg", metav1.GetOptions{})
		_, e2 := cs.AppsV1().Deployments("team").Get(ctx, "d", metav1.GetOptions{})
		_, e3 := cs.CoreV1().Services("team").Get(ctx, "svc", metav1.GetOptions{})
		_, e4 := cs.CoreV1().Secrets("team").Get(ctx, "s", metav1.GetOptions{})
		return gone(e1) && gone(e2) && gone(e3) && gone(e4)
	})
	wait("namespace gone", func() bool {
		_, err := cs.CoreV1().Namespaces().Get(ctx, "team", metav1.GetOptions{})
		return gone(err)
	})
	for _, check := range []func() error{
		func() error {
			_, err := cs.CoreV1().ConfigMaps("other").Get(ctx, "cfg", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := cs.AppsV1().Deployments("other").Get(ctx, "d", metav1.GetOptions{})
			return err
		},
		func() error { _, err := cs.CoreV1().Pods("other").Get(ctx, "running", metav1.GetOptions{}); return err },
	} {
		if err := check(); err != nil {
			t.Fatalf("object in another namespace: %v", err)
		}
	}
}

// gadgetGVR is a namespaced custom resource the tests define.
var gadgetGVR = schema.GroupVersionResource{Group: "nscrd.waggle.io", Version: "v1", Resource: "gadgets"}

// TestRealAPIServerNamespaceDeletionRemovesCustomResources: a deleted
// namespace's custom resources are deleted with it (found by discovery),
// those of other namespaces kept.
func TestRealAPIServerNamespaceDeletionRemovesCustomResources(t *testing.T) {
	rc, cs, dyn := startCluster(t)
	ctx := context.Background()
	apiservertest.CreateNamespacedCRD(t, rc, gadgetGVR, "Gadget")
	for _, ns := range []string{"crd-team", "crd-other"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		g := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "nscrd.waggle.io/v1", "kind": "Gadget",
			"metadata": map[string]any{"name": "g"}}}
		if _, err := dyn.Resource(gadgetGVR).Namespace(ns).Create(ctx, g, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	if err := cs.CoreV1().Namespaces().Delete(ctx, "crd-team", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		ns, err := cs.CoreV1().Namespaces().Get(ctx, "crd-team", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("namespace still there: phase %s, conditions %+v", ns.Status.Phase, ns.Status.Conditions)
	})
	// Listed across namespaces: what etcd still holds, whatever the
	// namespace's fate.
	all, err := dyn.Resource(gadgetGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, g := range all.Items {
		left = append(left, g.GetNamespace()+"/"+g.GetName())
	}
	if !slices.Equal(left, []string{"crd-other/g"}) {
		t.Fatalf("gadgets after the namespace went: %v, want only crd-other/g", left)
	}
}
