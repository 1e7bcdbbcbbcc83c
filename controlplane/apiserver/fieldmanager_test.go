package apiserver

import (
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func fmBenchPod() *corev1.Pod {
	p := &corev1.Pod{
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
		for i := 0; i < b.N; i++ {
			_ = fm.UpdateNoErrors(res.New(), fmBenchPod(), "bench")
		}
	})
	live := fm.UpdateNoErrors(res.New(), fmBenchPod(), "bench")
	b.Run("update", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			next := live.DeepCopyObject().(*corev1.Pod)
			next.Labels["rev"] = "x"
			_ = fm.UpdateNoErrors(live, next, "other")
		}
	})
}
