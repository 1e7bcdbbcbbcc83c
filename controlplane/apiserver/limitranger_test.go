package apiserver_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

// TestLimitRangerDefaultsAndBounds: a pod without resources gets the
// LimitRange's defaults (and upstream's annotation saying so); a container
// or pod outside min/max/maxLimitRequestRatio and a PVC outside its storage
// bounds get upstream's 403 and nothing is stored.
func TestLimitRangerDefaultsAndBounds(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	testNamespace(t, cs, "limits")
	if _, err := cs.CoreV1().LimitRanges("limits").Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "lr"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{
			{Type: corev1.LimitTypeContainer, Default: rl("cpu", "500m", "memory", "256Mi"), DefaultRequest: rl("cpu", "100m", "memory", "128Mi"),
				Max: rl("cpu", "1"), Min: rl("cpu", "50m"), MaxLimitRequestRatio: rl("cpu", "5")},
			{Type: corev1.LimitTypePod, Max: rl("memory", "1Gi")},
			{Type: corev1.LimitTypePersistentVolumeClaim, Min: rl("storage", "1Gi"), Max: rl("storage", "5Gi")},
		}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := cs.CoreV1().Pods("limits")

	p, err := pods.Create(ctx, pod("defaulted", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res := p.Spec.Containers[0].Resources
	if res.Requests.Cpu().String() != "100m" || res.Limits.Cpu().String() != "500m" || res.Requests.Memory().String() != "128Mi" || res.Limits.Memory().String() != "256Mi" {
		t.Fatalf("defaults not applied: %+v", res)
	}
	if a := p.Annotations["kubernetes.io/limit-ranger"]; a != "LimitRanger plugin set: cpu, memory request for container c; cpu, memory limit for container c" {
		t.Fatalf("annotation %q", a)
	}

	sized := func(name string, req, lim corev1.ResourceList, n int) *corev1.Pod {
		p := pod(name, nil)
		p.Spec.Containers = nil
		for i := range n {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: string(rune('a' + i)), Image: "busybox",
				Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}})
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"over-max", sized("over-max", rl("cpu", "500m"), rl("cpu", "2"), 1), "maximum cpu usage per Container is 1, but limit is 2"},
		{"under-min", sized("under-min", rl("cpu", "10m"), rl("cpu", "40m"), 1), "minimum cpu usage per Container is 50m, but request is 10m"},
		{"ratio", sized("ratio", rl("cpu", "100m"), rl("cpu", "800m"), 1), "cpu max limit to request ratio per Container is 5, but provided ratio is 8.000000"},
		{"pod-max", sized("pod-max", rl("memory", "100Mi"), rl("memory", "600Mi"), 2), "maximum memory usage per Pod is 1Gi, but limit is 1200Mi"},
	} {
		_, err := pods.Create(ctx, tc.pod, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want 403 %q", tc.name, err, tc.want)
		}
		if _, err := pods.Get(ctx, tc.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s was stored (get: %v)", tc.name, err)
		}
	}

	pvc := func(name, size string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: rl("storage", size)}}}
	}
	claims := cs.CoreV1().PersistentVolumeClaims("limits")
	if _, err := claims.Create(ctx, pvc("big", "10Gi"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "maximum storage usage per PersistentVolumeClaim is 5Gi, but request is 10Gi") {
		t.Errorf("big claim: %v", err)
	}
	if _, err := claims.Create(ctx, pvc("fits", "2Gi"), metav1.CreateOptions{}); err != nil {
		t.Errorf("a claim within bounds: %v", err)
	}
}
