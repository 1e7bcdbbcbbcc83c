package garbagecollector

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
)

var cmGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func cm(name string, uid types.UID, mod func(*corev1.ConfigMap)) *corev1.ConfigMap {
	c := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid}}
	if mod != nil {
		mod(c)
	}
	return c
}

func ownedBy(owner string, uid types.UID, block bool) func(*corev1.ConfigMap) {
	return func(c *corev1.ConfigMap) {
		c.OwnerReferences = append(c.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: owner, UID: uid, BlockOwnerDeletion: &block})
	}
}

func run(t *testing.T, typed ...runtime.Object) (*dynamicfake.FakeDynamicClient, context.Context) {
	// The dynamic fake must hold unstructured objects, as the real client
	// returns them.
	var objs []runtime.Object
	for _, o := range typed {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{cmGVR: "ConfigMapList"}, objs...)
	c := New(nil, nil, ctrltest.Log(t), Options{Dynamic: dyn, Resources: []Resource{{GVR: cmGVR, Kind: "ConfigMap", Namespaced: true}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return dyn, ctx
}

func exists(ctx context.Context, dyn *dynamicfake.FakeDynamicClient, name string) (bool, []metav1.OwnerReference, []string) {
	o, err := dyn.Resource(cmGVR).Namespace("default").Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil, nil
	}
	return true, o.GetOwnerReferences(), o.GetFinalizers()
}

func TestDependentsOfAGoneOwnerAreDeleted(t *testing.T) {
	dyn, ctx := run(t,
		cm("dep", "d1", ownedBy("owner", "gone-uid", false)),
		// An owner with the right name but another UID was replaced: the
		// reference still dangles.
		cm("owner", "new-uid", nil),
		cm("kept", "k1", ownedBy("owner", "new-uid", false)),
	)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		if ok, _, _ := exists(ctx, dyn, "dep"); ok {
			return fmt.Errorf("dependent of a gone owner still there")
		}
		return nil
	})
	if ok, _, _ := exists(ctx, dyn, "kept"); !ok {
		t.Fatal("the dependent of a live owner was deleted")
	}
}

func TestDanglingReferencesAreDroppedWhenAnotherOwnerLives(t *testing.T) {
	dyn, ctx := run(t,
		cm("owner", "live", nil),
		cm("dep", "d1", func(c *corev1.ConfigMap) {
			ownedBy("owner", "live", false)(c)
			ownedBy("ghost", "gone", false)(c)
		}),
	)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		ok, refs, _ := exists(ctx, dyn, "dep")
		if !ok {
			return fmt.Errorf("dependent with a live owner deleted")
		}
		if len(refs) != 1 || refs[0].UID != "live" {
			return fmt.Errorf("owner refs %v", refs)
		}
		return nil
	})
}

func TestOrphanFinalizerReleasesDependents(t *testing.T) {
	now := metav1.Now()
	dyn, ctx := run(t,
		cm("owner", "o1", func(c *corev1.ConfigMap) {
			c.DeletionTimestamp = &now
			c.Finalizers = []string{metav1.FinalizerOrphanDependents}
		}),
		cm("dep", "d1", ownedBy("owner", "o1", true)),
	)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		ok, refs, _ := exists(ctx, dyn, "dep")
		if !ok || len(refs) != 0 {
			return fmt.Errorf("dependent exists=%v refs=%v", ok, refs)
		}
		if _, _, fins := exists(ctx, dyn, "owner"); len(fins) != 0 {
			return fmt.Errorf("owner finalizers %v", fins)
		}
		return nil
	})
}

func TestForegroundDeletionDeletesDependentsThenDropsTheFinalizer(t *testing.T) {
	now := metav1.Now()
	dyn, ctx := run(t,
		cm("owner", "o1", func(c *corev1.ConfigMap) {
			c.DeletionTimestamp = &now
			c.Finalizers = []string{metav1.FinalizerDeleteDependents}
		}),
		cm("dep1", "d1", ownedBy("owner", "o1", true)),
		cm("dep2", "d2", ownedBy("owner", "o1", false)),
	)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		for _, n := range []string{"dep1", "dep2"} {
			if ok, _, _ := exists(ctx, dyn, n); ok {
				return fmt.Errorf("%s still there", n)
			}
		}
		if _, _, fins := exists(ctx, dyn, "owner"); len(fins) != 0 {
			return fmt.Errorf("owner finalizers %v", fins)
		}
		return nil
	})
}

func TestLiveOwnersCostNoAPICalls(t *testing.T) {
	objs := []runtime.Object{cm("owner", "o1", nil)}
	for i := 0; i < 50; i++ {
		objs = append(objs, cm(fmt.Sprintf("dep%d", i), types.UID(fmt.Sprintf("d%d", i)), ownedBy("owner", "o1", false)))
	}
	dyn, ctx := run(t, objs...)
	// The marker: a dependent of an owner that never existed, created after
	// the 50, so the collector reaches it after them. Once it is gone the
	// collector has looked at every dependent of the live owner.
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cm("marker", "m1", ownedBy("ghost", "g1", false)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(cmGVR).Namespace("default").Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctrltest.Eventually(t, 30*time.Second, func() error {
		if ok, _, _ := exists(ctx, dyn, "marker"); ok {
			return fmt.Errorf("the marker (owner never existed) is still there")
		}
		return nil
	})
	for _, a := range dyn.Actions() {
		if a.GetVerb() == "list" || a.GetVerb() == "watch" {
			continue
		}
		if n, ok := a.(interface{ GetName() string }); ok && (n.GetName() == "marker" || n.GetName() == "ghost") {
			continue
		}
		if a.GetVerb() == "create" {
			continue // the marker itself
		}
		t.Fatalf("unexpected %s %s: the graph already shows every owner alive", a.GetVerb(), a.GetResource().Resource)
	}
}
