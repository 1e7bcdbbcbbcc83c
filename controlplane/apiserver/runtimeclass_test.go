package apiserver_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRuntimeClassAdmission: kube-apiserver's RuntimeClass admission. A pod
// naming a RuntimeClass that does not exist (or no longer does) is 403 and
// not stored, dry run included; an existing class gives the pod its
// overhead and scheduling; an overhead that is not the class's is 403.
func TestRuntimeClassAdmission(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	pods := cs.CoreV1().Pods("default")
	withClass := func(name, class string) *corev1.Pod {
		p := pod(name, nil)
		p.Spec.RuntimeClassName = &class
		return p
	}
	refused := func(err error, msg string) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), msg)
	}

	t.Run("a missing class is refused", func(t *testing.T) {
		for _, dry := range [][]string{{metav1.DryRunAll}, nil} {
			_, err := pods.Create(ctx, withClass("missing", "nosuch"), metav1.CreateOptions{DryRun: dry})
			if !refused(err, `pod rejected: RuntimeClass "nosuch" not found`) {
				t.Errorf("dryRun %v: %v, want 403", dry, err)
			}
		}
		if _, err := pods.Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("refused pod stored: %v", err)
		}
	})

	t.Run("a deleted class is refused", func(t *testing.T) {
		rcs := cs.NodeV1().RuntimeClasses()
		if _, err := rcs.Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "delete-me"}, Handler: "runc"}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := pods.Create(ctx, withClass("before", "delete-me"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatalf("pod of an existing class: %v", err)
		}
		if err := rcs.Delete(ctx, "delete-me", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := pods.Create(ctx, withClass("after", "delete-me"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !refused(err, "not found") {
			t.Errorf("pod of a deleted class: %v, want 403", err)
		}
	})

	t.Run("overhead and scheduling come from the class", func(t *testing.T) {
		overhead := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("1Mi")}
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "fat"}, Handler: "runc",
			Overhead: &nodev1.Overhead{PodFixed: overhead},
			Scheduling: &nodev1.Scheduling{NodeSelector: map[string]string{"sandbox": "yes"},
				Tolerations: []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}}}
		if _, err := cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p, err := pods.Create(ctx, withClass("fat", "fat"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !p.Spec.Overhead.Cpu().Equal(resource.MustParse("10m")) || !p.Spec.Overhead.Memory().Equal(resource.MustParse("1Mi")) {
			t.Errorf("overhead %v, want the class's", p.Spec.Overhead)
		}
		if p.Spec.NodeSelector["sandbox"] != "yes" {
			t.Errorf("nodeSelector %v, want the class's", p.Spec.NodeSelector)
		}
		tolerated := false
		for _, tol := range p.Spec.Tolerations {
			tolerated = tolerated || (tol.Key == "sandbox" && tol.Effect == corev1.TaintEffectNoSchedule)
		}
		if !tolerated {
			t.Errorf("tolerations %v lack the class's", p.Spec.Tolerations)
		}

		other := withClass("wrong-overhead", "fat")
		other.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		if _, err := pods.Create(ctx, other, metav1.CreateOptions{}); !refused(err, "Pod's Overhead doesn't match RuntimeClass's defined Overhead") {
			t.Errorf("pod with another overhead: %v, want 403", err)
		}
		conflict := withClass("conflict", "fat")
		conflict.Spec.NodeSelector = map[string]string{"sandbox": "no"}
		if _, err := pods.Create(ctx, conflict, metav1.CreateOptions{}); !refused(err, "conflict: runtimeClass.scheduling.nodeSelector[sandbox]") {
			t.Errorf("conflicting node selector: %v, want 403", err)
		}
		plain := pod("no-class-overhead", nil)
		plain.Spec.Overhead = overhead
		if _, err := pods.Create(ctx, plain, metav1.CreateOptions{}); !refused(err, "Pod Overhead set without corresponding RuntimeClass defined Overhead") {
			t.Errorf("overhead without a class: %v, want 403", err)
		}
		for _, name := range []string{"wrong-overhead", "conflict", "no-class-overhead"} {
			if _, err := pods.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("refused pod %s stored: %v", name, err)
			}
		}
	})
}
