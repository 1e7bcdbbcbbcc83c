package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPriorityAdmission: kube-apiserver's Priority admission. A pod's
// priorityClassName becomes spec.priority and preemptionPolicy; a pod
// without one gets the globalDefault class, or 0 when there is none; a
// missing class, or a priority the pod sets that differs from the class's,
// is 403 and nothing is stored.
func TestPriorityAdmission(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	pods := cs.CoreV1().Pods("default")
	pcs := cs.SchedulingV1().PriorityClasses()
	never := corev1.PreemptNever
	withClass := func(name, class string) *corev1.Pod {
		p := pod(name, nil)
		p.Spec.PriorityClassName = class
		return p
	}

	t.Run("no class and no default gives 0", func(t *testing.T) {
		p, err := pods.Create(ctx, pod("plain", nil), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.Priority == nil || *p.Spec.Priority != 0 || p.Spec.PriorityClassName != "" {
			t.Errorf("priority %v class %q, want 0 and none", p.Spec.Priority, p.Spec.PriorityClassName)
		}
	})

	t.Run("the built-in critical class", func(t *testing.T) {
		p, err := pods.Create(ctx, withClass("critical", "system-cluster-critical"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.Priority == nil || *p.Spec.Priority != 2000000000 {
			t.Errorf("priority %v, want 2000000000", p.Spec.Priority)
		}
	})

	t.Run("a class's value and preemption policy", func(t *testing.T) {
		if _, err := pcs.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "batch-low"}, Value: 50, PreemptionPolicy: &never}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p, err := pods.Create(ctx, withClass("low", "batch-low"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.Priority == nil || *p.Spec.Priority != 50 || p.Spec.PreemptionPolicy == nil || *p.Spec.PreemptionPolicy != never {
			t.Errorf("priority %v policy %v, want 50 and Never", p.Spec.Priority, p.Spec.PreemptionPolicy)
		}
	})

	t.Run("refusals store nothing", func(t *testing.T) {
		wrong := withClass("wrong-value", "batch-low")
		v := int32(7)
		wrong.Spec.Priority = &v
		for _, c := range []struct {
			pod  *corev1.Pod
			want string
		}{
			{withClass("no-class", "nosuch"), "no PriorityClass with name nosuch was found"},
			{wrong, "the integer value of priority (7) must not be provided in pod spec"},
		} {
			_, err := pods.Create(ctx, c.pod, metav1.CreateOptions{})
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v, want 403 %q", c.pod.Name, err, c.want)
			}
			if _, err := pods.Get(ctx, c.pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s: refused pod stored: %v", c.pod.Name, err)
			}
		}
	})

	t.Run("the global default", func(t *testing.T) {
		if _, err := pcs.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "everyone"}, Value: 1000, GlobalDefault: true}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The cache may lag the class by a moment: admission reads the
		// default from it, so wait for a pod that gets it.
		var p *corev1.Pod
		testutil.Eventually(t, 30*time.Second, func() error {
			got, err := pods.Create(ctx, pod("defaulted", nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil {
				return err
			}
			p = got
			if got.Spec.PriorityClassName != "everyone" {
				return fmt.Errorf("class %q, want the default", got.Spec.PriorityClassName)
			}
			return nil
		})
		if *p.Spec.Priority != 1000 {
			t.Errorf("priority %d, want the default class's 1000", *p.Spec.Priority)
		}
	})
}
