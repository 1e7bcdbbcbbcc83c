package namespace

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
)

var cmGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func TestCatalogResourcesAreNamespacedAndDeletable(t *testing.T) {
	rs := CatalogResources()
	has := func(res string) bool {
		return slices.ContainsFunc(rs, func(r Resource) bool { return r.GVR.Resource == res })
	}
	for _, want := range []string{"pods", "configmaps", "services", "deployments", "replicasets", "endpointslices", "serviceaccounts", "leases"} {
		if !has(want) {
			t.Errorf("catalog resources lack %s", want)
		}
	}
	for _, cluster := range []string{"nodes", "namespaces"} {
		if has(cluster) {
			t.Errorf("cluster-scoped %s listed as namespaced content", cluster)
		}
	}
}

type env struct {
	cs  *fake.Clientset
	dyn *dynamicfake.FakeDynamicClient
}

func start(t *testing.T, ns *corev1.Namespace, content ...runtime.Object) env {
	t.Helper()
	cs := fake.NewClientset(ns)
	watches := testutil.TrackWatches(cs)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme.Scheme,
		map[schema.GroupVersionResource]string{podsGVR: "PodList", cmGVR: "ConfigMapList"}, content...)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler), Options{
		Dynamic:       dyn,
		Resources:     []Resource{{GVR: podsGVR}, {GVR: cmGVR}},
		RecheckPeriod: 50 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })
	watches.WaitOpen(t, 1, 10*time.Second) // namespaces
	return env{cs, dyn}
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
	cond := func(typ corev1.NamespaceConditionType) *corev1.NamespaceCondition {
		ns, err := e.cs.CoreV1().Namespaces().Get(context.Background(), "slow", metav1.GetOptions{})
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
