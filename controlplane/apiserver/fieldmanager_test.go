package apiserver

import (
	"syscall"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// reportCPU reports the process's CPU time (user and system, the garbage
// collector's included) per operation beside the wall time, which on a
// shared machine measures mostly the other tenants: call it before the
// loop and the function it returns after.
func reportCPU(b *testing.B) func() {
	start := processCPU(b)
	b.ResetTimer()
	return func() {
		b.StopTimer()
		b.ReportMetric(float64((processCPU(b)-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func fmBenchPod() *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, // as the server decodes it
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", Labels: map[string]string{"app": "bench", "tier": "web", "pod-template-hash": "5d4f8b9c7"},
			Annotations: map[string]string{"example.com/owner": "benchmark"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "web", Image: "registry.example.com/web:1.2.3",
			Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Env:            []corev1.EnvVar{{Name: "MODE", Value: "production"}, {Name: "LOG", Value: "info"}},
			Resources:      corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}},
		}}},
	}
	defaultPod(p)
	return p
}

// BenchmarkFieldManager is what keeping managedFields costs one pod write
// (the structured-merge-diff conversion of old and new object): a create,
// and an update that changes a label.
//
//	go test -run '^$' -bench BenchmarkFieldManager -benchtime 2000x ./controlplane/apiserver/
func BenchmarkFieldManager(b *testing.B) {
	res, ok := catalog.Lookup(corev1.SchemeGroupVersion.WithResource("pods"))
	if !ok {
		b.Fatal("pods not in the catalog")
	}
	st := strategyFor(res)
	fms, err := fieldManagers(res, st, builtinTypeConverter(), nil)
	if err != nil {
		b.Fatal(err)
	}
	fm := fms[""]
	b.Run("create", func(b *testing.B) {
		defer reportCPU(b)()
		for i := 0; i < b.N; i++ {
			_ = fm.UpdateNoErrors(emptyLive(res), fmBenchPod(), "bench")
		}
	})
	live := fm.UpdateNoErrors(emptyLive(res), fmBenchPod(), "bench")
	b.Run("update", func(b *testing.B) {
		defer reportCPU(b)()
		for i := 0; i < b.N; i++ {
			next := live.DeepCopyObject().(*corev1.Pod)
			next.Labels["rev"] = "x"
			_ = fm.UpdateNoErrors(live, next, "other")
		}
	})
}

// The field manager gets the objects already in the kind's version as they
// are instead of deep copies: what it records must be what it records over
// the copying scheme (kube-apiserver's behaviour), entry by entry, for a
// create and an update, and it must leave the live object untouched.
func TestFieldManagerWithoutCopiesRecordsTheSame(t *testing.T) {
	res, ok := catalog.Lookup(corev1.SchemeGroupVersion.WithResource("pods"))
	if !ok {
		t.Fatal("pods not in the catalog")
	}
	st := strategyFor(res)
	fms, err := fieldManagers(res, st, builtinTypeConverter(), nil)
	if err != nil {
		t.Fatal(err)
	}
	copying, err := managedfields.NewDefaultFieldManager(builtinTypeConverter(), catalog.Scheme, defaulter(st.defaults), catalog.Scheme,
		res.GroupVersionKind(), res.GroupVersion(), "", map[fieldpath.APIVersion]fieldpath.Filter{
			"v1": fieldpath.NewExcludeSetFilter(fieldpath.NewSet(fieldpath.MakePathOrDie("status"))),
		})
	if err != nil {
		t.Fatal(err)
	}
	same := func(step string, got, want runtime.Object) {
		t.Helper()
		g, w := objectMeta(got).GetManagedFields(), objectMeta(want).GetManagedFields()
		if len(g) == 0 || len(g) != len(w) {
			t.Fatalf("%s: %d entries, want %d (and some)", step, len(g), len(w))
		}
		for i := range g {
			if g[i].Manager != w[i].Manager || g[i].Operation != w[i].Operation || g[i].APIVersion != w[i].APIVersion ||
				g[i].Subresource != w[i].Subresource || string(g[i].FieldsV1.Raw) != string(w[i].FieldsV1.Raw) {
				t.Errorf("%s: entry %d\n got %s %s %s %s\nwant %s %s %s %s", step, i,
					g[i].Manager, g[i].Operation, g[i].APIVersion, g[i].FieldsV1.Raw, w[i].Manager, w[i].Operation, w[i].APIVersion, w[i].FieldsV1.Raw)
			}
		}
	}
	live := emptyLive(res)
	created := fms[""].UpdateNoErrors(live, fmBenchPod(), "creator")
	if !apiequality.Semantic.DeepEqual(live, emptyLive(res)) {
		t.Errorf("the create's live object changed: %+v", live)
	}
	same("create", created, copying.UpdateNoErrors(emptyLive(res), fmBenchPod(), "creator"))

	before := created.DeepCopyObject()
	next := created.DeepCopyObject().(*corev1.Pod)
	next.Labels["rev"] = "x"
	next.Spec.Containers[0].Image = "registry.example.com/web:1.2.4"
	updated := fms[""].UpdateNoErrors(created, next, "updater")
	if !apiequality.Semantic.DeepEqual(created, before) {
		t.Error("the update's live object changed")
	}
	next2 := before.DeepCopyObject().(*corev1.Pod)
	next2.Labels["rev"] = "x"
	next2.Spec.Containers[0].Image = "registry.example.com/web:1.2.4"
	same("update", updated, copying.UpdateNoErrors(before, next2, "updater"))
}
