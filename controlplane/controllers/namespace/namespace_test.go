package namespace

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
)

var (
	cmGVR     = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	widgetGVR = schema.GroupVersionResource{Group: "example.waggle.io", Version: "v1", Resource: "widgets"}
)

type env struct {
	cs  *fake.Clientset
	dyn *dynamicfake.FakeDynamicClient
}

func start(t *testing.T, ns *corev1.Namespace, content ...runtime.Object) env {
	t.Helper()
	return startWith(t, Options{Resources: []Resource{{GVR: podsGVR}, {GVR: cmGVR}}}, ns, content...)
}

// startWith runs the controller with opts (Dynamic and RecheckPeriod set
// here) on a fake cluster holding ns and content.
func startWith(t *testing.T, opts Options, ns *corev1.Namespace, content ...runtime.Object) env {
	t.Helper()
	cs := fake.NewClientset(ns)
	watches := testutil.TrackWatches(cs)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme.Scheme,
		map[schema.GroupVersionResource]string{podsGVR: "PodList", cmGVR: "ConfigMapList", widgetGVR: "WidgetList"}, content...)
	f := informers.NewSharedInformerFactory(cs, 0)
	dyn.PrependReactor("delete-collection", "*", deleteCollection(dyn.Tracker()))
	opts.Dynamic, opts.RecheckPeriod = dyn, 50*time.Millisecond
	c := New(cs, f, slog.New(slog.DiscardHandler), opts)
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })
	watches.WaitOpen(t, 1, 10*time.Second) // namespaces
	return env{cs, dyn}
}

// deleteCollection gives the fake dynamic client the deletecollection it
// lacks (it answers it without deleting anything).
func deleteCollection(tracker k8stesting.ObjectTracker) k8stesting.ReactionFunc {
	kinds := map[schema.GroupVersionResource]string{podsGVR: "Pod", cmGVR: "ConfigMap", widgetGVR: "Widget"}
	return func(a k8stesting.Action) (bool, runtime.Object, error) {
		gvr := a.GetResource()
		list, err := tracker.List(gvr, gvr.GroupVersion().WithKind(kinds[gvr]), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return true, nil, err
		}
		for _, item := range items {
			m, err := meta.Accessor(item)
			if err != nil {
				return true, nil, err
			}
			if err := tracker.Delete(gvr, a.GetNamespace(), m.GetName()); err != nil {
				return true, nil, err
			}
		}
		return true, nil, nil
	}
}

func (e env) count(t *testing.T, gvr schema.GroupVersionResource, ns string) int {
	t.Helper()
	l, err := e.dyn.Resource(gvr).Namespace(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

// podLists counts the LISTs of pods in ns the controller has made.
func (e env) podLists(ns string) int {
	n := 0
	for _, a := range e.dyn.Actions() {
		if a.GetVerb() == "list" && a.GetResource() == podsGVR && a.GetNamespace() == ns {
			n++
		}
	}
	return n
}

// condition returns namespace name's condition typ, nil if it has none.
func (e env) condition(t *testing.T, name string, typ corev1.NamespaceConditionType) *corev1.NamespaceCondition {
	t.Helper()
	ns, err := e.cs.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ns.Status.Conditions {
		if ns.Status.Conditions[i].Type == typ {
			return &ns.Status.Conditions[i]
		}
	}
	return nil
}

func (e env) finalized(t *testing.T, name string) bool {
	t.Helper()
	ns, err := e.cs.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return !slices.Contains(ns.Spec.Finalizers, corev1.FinalizerKubernetes)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, what, cond)
}

func deletedNS(name string) *corev1.Namespace {
	now := metav1.Now()
	return &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name, DeletionTimestamp: &now},
		Spec:       corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{corev1.FinalizerKubernetes}},
		Status:     corev1.NamespaceStatus{Phase: corev1.NamespaceActive},
	}
}

func pod(ns, name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + name)}}
}

func configMap(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-cm-" + ns + name)}}
}

func TestDeletedNamespaceIsEmptiedThenFinalized(t *testing.T) {
	e := start(t, deletedNS("doomed"),
		pod("doomed", "a"), pod("doomed", "b"), configMap("doomed", "c"),
		pod("other", "keep"), configMap("other", "keep"))
	waitFor(t, "finalized", func() bool { return e.finalized(t, "doomed") })
	if n := e.count(t, podsGVR, "doomed") + e.count(t, cmGVR, "doomed"); n != 0 {
		t.Fatalf("%d objects left in the finalized namespace", n)
	}
	if e.count(t, podsGVR, "other") != 1 || e.count(t, cmGVR, "other") != 1 {
		t.Fatal("objects of another namespace were deleted")
	}
	ns, _ := e.cs.CoreV1().Namespaces().Get(context.Background(), "doomed", metav1.GetOptions{})
	if ns.Status.Phase != corev1.NamespaceTerminating {
		t.Fatalf("phase = %s, want Terminating", ns.Status.Phase)
	}
}

// TestNamespaceDeletesPodsFirst: while a pod is still terminating the
// other content stays (upstream's OrderedNamespaceDeletion) and the
// namespace's conditions say what remains; once the pod is gone the rest
// is deleted and the namespace finalized.
func TestNamespaceDeletesPodsFirst(t *testing.T) {
	going := pod("slow", "graceful")
	now := metav1.Now()
	going.DeletionTimestamp = &now // a kubelet is still stopping it
	going.Finalizers = []string{"example.com/hold"}
	e := start(t, deletedNS("slow"), going, configMap("slow", "c"))
	cond := func(typ corev1.NamespaceConditionType) *corev1.NamespaceCondition { return e.condition(t, "slow", typ) }
	waitFor(t, "conditions say the pod remains", func() bool {
		c := cond(corev1.NamespaceContentRemaining)
		return c != nil && c.Status == corev1.ConditionTrue
	})
	if c := cond(corev1.NamespaceDeletionContentFailure); c == nil || c.Status != corev1.ConditionFalse {
		t.Errorf("NamespaceDeletionContentFailure: %+v, want False", c)
	}
	if c := cond(corev1.NamespaceFinalizersRemaining); c == nil || c.Status != corev1.ConditionTrue || !strings.Contains(c.Message, "example.com/hold in 1 resource instances") {
		t.Errorf("NamespaceFinalizersRemaining: %+v", c)
	}
	// Two more LISTs of the namespace's pods: a whole recheck has seen the
	// terminating pod since, and the config map must still be there.
	seen := e.podLists("slow")
	waitFor(t, "the namespace rechecked", func() bool { return e.podLists("slow") >= seen+2 })
	if e.count(t, cmGVR, "slow") != 1 {
		t.Fatal("config map deleted while a pod was still terminating")
	}
	if e.finalized(t, "slow") {
		t.Fatal("namespace finalized while a pod was still terminating")
	}
	if err := e.dyn.Resource(podsGVR).Namespace("slow").Delete(context.Background(), "graceful", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "finalized once the pod is gone", func() bool { return e.finalized(t, "slow") })
	if n := e.count(t, cmGVR, "slow"); n != 0 {
		t.Fatalf("%d config maps left in the finalized namespace", n)
	}
	if c := cond(corev1.NamespaceContentRemaining); c == nil || c.Status != corev1.ConditionFalse {
		t.Errorf("NamespaceContentRemaining after: %+v, want False", c)
	}
}

func TestActiveNamespaceIsLeftAlone(t *testing.T) {
	e := start(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "live"},
		Spec: corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{corev1.FinalizerKubernetes}}}, pod("live", "a"))
	// A namespace deleted after "live" was listed is finalized only after
	// the controller has handled "live".
	if _, err := e.cs.CoreV1().Namespaces().Create(context.Background(), deletedNS("marker"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a namespace deleted later finalized", func() bool { return e.finalized(t, "marker") })
	if e.count(t, podsGVR, "live") != 1 || e.finalized(t, "live") {
		t.Fatal("controller touched a namespace that is not being deleted")
	}
}

// fakeDiscovery serves lists and, while failing is set, also fails the
// discovery of one group version, as client-go does when an aggregated API
// is down: the rest is returned with a *discovery.ErrGroupDiscoveryFailed.
type fakeDiscovery struct {
	mu      sync.Mutex
	lists   []*metav1.APIResourceList
	failing bool
}

func (f *fakeDiscovery) ServerPreferredNamespacedResourcesWithContext(context.Context) ([]*metav1.APIResourceList, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing {
		return f.lists, &discovery.ErrGroupDiscoveryFailed{Groups: map[schema.GroupVersion]error{
			{Group: "metrics.example.io", Version: "v1beta1"}: errors.New("the server is currently unable to handle the request"),
		}}
	}
	return f.lists, nil
}

func (f *fakeDiscovery) setFailing(v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing = v
}

func widget(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.waggle.io/v1", "kind": "Widget",
		"metadata": map[string]any{"namespace": ns, "name": name, "uid": "uid-w-" + ns + name},
	}}
}

// TestDiscoveryFailureIsRecordedAndHoldsTheNamespace: with Resources nil the
// controller empties what discovery finds (a custom resource included, not
// a subresource nor a resource without list/delete); while some groups fail
// discovery it still deletes what it found, records
// NamespaceDeletionDiscoveryFailure as upstream, and does not finalize the
// namespace (objects of the failing group could be left behind) until a
// discovery succeeds.
func TestDiscoveryFailureIsRecordedAndHoldsTheNamespace(t *testing.T) {
	disco := &fakeDiscovery{failing: true, lists: []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "pods", Namespaced: true, Verbs: metav1.Verbs{"create", "delete", "deletecollection", "get", "list", "watch"}},
			{Name: "pods/status", Namespaced: true, Verbs: metav1.Verbs{"get", "patch", "update"}},
			{Name: "configmaps", Namespaced: true, Verbs: metav1.Verbs{"create", "delete", "get", "list"}},
			{Name: "bindings", Namespaced: true, Verbs: metav1.Verbs{"create"}},
		}},
		{GroupVersion: "example.waggle.io/v1", APIResources: []metav1.APIResource{
			{Name: "widgets", Namespaced: true, Verbs: metav1.Verbs{"delete", "deletecollection", "get", "list"}},
		}},
	}}
	e := startWith(t, Options{Discovery: disco}, deletedNS("partial"),
		pod("partial", "a"), configMap("partial", "c"), widget("partial", "w"), widget("other", "keep"))
	cond := func(typ corev1.NamespaceConditionType) *corev1.NamespaceCondition {
		return e.condition(t, "partial", typ)
	}
	waitFor(t, "the discovery failure recorded", func() bool {
		c := cond(corev1.NamespaceDeletionDiscoveryFailure)
		return c != nil && c.Status == corev1.ConditionTrue
	})
	c := cond(corev1.NamespaceDeletionDiscoveryFailure)
	if c.Reason != "DiscoveryFailed" || !strings.HasPrefix(c.Message, "Discovery failed for some groups, 1 failing: ") ||
		!strings.Contains(c.Message, "metrics.example.io/v1beta1: the server is currently unable to handle the request") {
		t.Errorf("NamespaceDeletionDiscoveryFailure = %+v", c)
	}
	// What was discovered is deleted all the same (pods first, then the
	// rest), but the namespace is kept.
	waitFor(t, "the discovered content deleted", func() bool {
		return e.count(t, podsGVR, "partial")+e.count(t, cmGVR, "partial")+e.count(t, widgetGVR, "partial") == 0
	})
	if e.finalized(t, "partial") {
		t.Fatal("namespace finalized while discovery fails")
	}
	if e.count(t, widgetGVR, "other") != 1 {
		t.Fatal("a custom resource of another namespace was deleted")
	}
	collections := map[string]bool{}
	for _, a := range e.dyn.Actions() {
		if r := a.GetResource().Resource; r == "bindings" || strings.Contains(r, "/") || a.GetSubresource() != "" {
			t.Errorf("controller acted on %s %s/%s, which cannot be listed and deleted", a.GetVerb(), r, a.GetSubresource())
		}
		if a.GetVerb() == "delete-collection" {
			collections[a.GetResource().Resource] = true
		}
	}
	if want := map[string]bool{"pods": true, "widgets": true}; !maps.Equal(collections, want) {
		t.Errorf("deletecollection of %v, want of the resources that serve it: %v", collections, want)
	}

	disco.setFailing(false)
	waitFor(t, "finalized once discovery succeeds", func() bool { return e.finalized(t, "partial") })
	if c := cond(corev1.NamespaceDeletionDiscoveryFailure); c == nil || c.Status != corev1.ConditionFalse || c.Reason != "ResourcesDiscovered" {
		t.Errorf("NamespaceDeletionDiscoveryFailure after: %+v, want False ResourcesDiscovered", c)
	}
}
