package replicaset

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

func newRS(name string, replicas int32) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("rs-" + name), Generation: 1},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			},
		},
	}
}

func pod(name string, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
		CreationTimestamp: metav1.NewTime(time.Unix(1000, 0))}}
	if mod != nil {
		mod(p)
	}
	return p
}

func ready(since int64) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.NodeName = "n1"
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(time.Unix(since, 0))}}
	}
}

func TestPodsToDeleteRanksLeastValuableFirst(t *testing.T) {
	tests := []struct {
		name string
		pods []*corev1.Pod
		want []string
	}{
		{"unscheduled before scheduled", []*corev1.Pod{
			pod("scheduled", func(p *corev1.Pod) { p.Spec.NodeName = "n1" }), pod("unscheduled", nil)}, []string{"unscheduled"}},
		{"pending before running", []*corev1.Pod{
			pod("running", func(p *corev1.Pod) { p.Spec.NodeName = "n"; p.Status.Phase = corev1.PodRunning }),
			pod("pending", func(p *corev1.Pod) { p.Spec.NodeName = "n"; p.Status.Phase = corev1.PodPending })}, []string{"pending"}},
		{"not ready before ready", []*corev1.Pod{
			pod("ready", ready(100)),
			pod("notready", func(p *corev1.Pod) { p.Spec.NodeName = "n1"; p.Status.Phase = corev1.PodRunning })}, []string{"notready"}},
		{"ready more recently before ready longer", []*corev1.Pod{
			pod("old", ready(100)), pod("recent", ready(200))}, []string{"recent"}},
		{"lower deletion cost first", []*corev1.Pod{
			pod("expensive", func(p *corev1.Pod) { ready(100)(p); p.Annotations = map[string]string{corev1.PodDeletionCost: "100"} }),
			pod("cheap", func(p *corev1.Pod) { ready(200)(p); p.Annotations = map[string]string{corev1.PodDeletionCost: "-5"} })}, []string{"cheap"}},
		{"doubled up on a node first", []*corev1.Pod{
			pod("alone", func(p *corev1.Pod) { ready(200)(p); p.Spec.NodeName = "n2" }),
			pod("crowded-a", func(p *corev1.Pod) { ready(100)(p); p.Spec.NodeName = "n1" }),
			pod("crowded-b", func(p *corev1.Pod) { ready(100)(p); p.Spec.NodeName = "n1" })}, []string{"crowded-b"}},
		{"more restarts first", []*corev1.Pod{
			pod("calm", ready(100)), pod("crashy", func(p *corev1.Pod) {
				ready(100)(p)
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{RestartCount: 5}}
			})}, []string{"crashy"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PodsToDelete(tc.pods, len(tc.want))
			for i := range tc.want {
				if got[i].Name != tc.want[i] {
					t.Fatalf("victim %d = %s, want %s", i, got[i].Name, tc.want[i])
				}
			}
		})
	}
}

type harness struct {
	c   *Controller
	ctx context.Context
}

func start(t *testing.T, objs ...runtime.Object) *harness {
	t.Helper()
	cs := ctrltest.NewClient(objs...)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t), Options{})
	ctx := ctrltest.Start(t, cs, f)
	go c.Run(ctx, 2)
	return &harness{c: c, ctx: ctx}
}

func (h *harness) pods(t *testing.T) []corev1.Pod {
	t.Helper()
	l, err := h.c.client.CoreV1().Pods("default").List(h.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func TestCreatesReplicasWithGenerateNameAndControllerRef(t *testing.T) {
	h := start(t, newRS("web", 3))
	ctrltest.Eventually(t, 5*time.Second, func() error {
		if n := len(h.pods(t)); n != 3 {
			return fmt.Errorf("%d pods", n)
		}
		rs, err := h.c.client.AppsV1().ReplicaSets("default").Get(h.ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if rs.Status.Replicas != 3 || rs.Status.ObservedGeneration != 1 {
			return fmt.Errorf("status %+v", rs.Status)
		}
		return nil
	})
	for _, p := range h.pods(t) {
		ref := metav1.GetControllerOf(&p)
		if p.GenerateName != "web-" || ref == nil || ref.UID != "rs-web" || ref.Kind != "ReplicaSet" || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
			t.Fatalf("pod %s: generateName %q, controller ref %+v", p.Name, p.GenerateName, ref)
		}
	}
	// Expectations hold no stale entries once everything was observed.
	if adds, dels := h.c.exp.Pending("default/web"); adds != 0 || dels != 0 {
		t.Fatalf("pending expectations adds=%d dels=%d", adds, dels)
	}
}

func TestAdoptsMatchingOrphansAndReleasesPodsThatStopMatching(t *testing.T) {
	orphan := pod("orphan", func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web"}; p.UID = "orphan" })
	rs := newRS("web", 2)
	t.Log(rs.Name)
	stranger := pod("stranger", func(p *corev1.Pod) {
		p.Labels = map[string]string{"app": "other"}
		p.UID = "stranger"
		p.OwnerReferences = []metav1.OwnerReference{ctrlutil.NewControllerRef(rs, "apps/v1", "ReplicaSet")}
	})
	h := start(t, rs, orphan, stranger)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		pods := h.pods(t)
		owned := 0
		for _, p := range pods {
			ref := metav1.GetControllerOf(&p)
			switch {
			case p.Name == "orphan" && ref == nil:
				return errors.New("orphan not adopted")
			case p.Name == "stranger" && ref != nil:
				return errors.New("non-matching pod not released")
			case ref != nil:
				owned++
			}
		}
		if owned != 2 {
			return fmt.Errorf("%d owned pods, want 2 (the adopted one + one new)", owned)
		}
		return nil
	})
}

func TestScalesDownTheNotReadyPodsFirstAndReportsReadiness(t *testing.T) {
	rs := newRS("web", 3)
	var objs []runtime.Object
	objs = append(objs, rs)
	for i, mod := range []func(*corev1.Pod){ready(100), ready(100), nil} {
		p := pod(fmt.Sprintf("p%d", i), mod)
		p.Labels = map[string]string{"app": "web"}
		p.UID = types.UID(p.Name)
		p.OwnerReferences = []metav1.OwnerReference{ctrlutil.NewControllerRef(rs, "apps/v1", "ReplicaSet")}
		objs = append(objs, p)
	}
	h := start(t, objs...)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		got, _ := h.c.client.AppsV1().ReplicaSets("default").Get(h.ctx, "web", metav1.GetOptions{})
		if got.Status.ReadyReplicas != 2 || got.Status.AvailableReplicas != 2 || got.Status.Replicas != 3 {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
	one := int32(2)
	rs = rs.DeepCopy()
	rs.Spec.Replicas = &one
	rs.Generation = 2
	if _, err := h.c.client.AppsV1().ReplicaSets("default").Update(h.ctx, rs, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctrltest.Eventually(t, 5*time.Second, func() error {
		pods := h.pods(t)
		if len(pods) != 2 {
			return fmt.Errorf("%d pods", len(pods))
		}
		for _, p := range pods {
			if p.Name == "p2" {
				return errors.New("the not-ready pod p2 survived")
			}
		}
		return nil
	})
}

func TestAvailableReplicasWaitForMinReadySeconds(t *testing.T) {
	rs := newRS("web", 1)
	// Ready since now (in whole seconds, as the API stores it): available
	// 1-2 s from now.
	rs.Spec.MinReadySeconds = 2
	p := pod("p0", func(p *corev1.Pod) {
		ready(time.Now().Unix())(p)
		p.Labels = map[string]string{"app": "web"}
		p.UID = "p0"
		p.OwnerReferences = []metav1.OwnerReference{ctrlutil.NewControllerRef(rs, "apps/v1", "ReplicaSet")}
	})
	h := start(t, rs, p)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		got, _ := h.c.client.AppsV1().ReplicaSets("default").Get(h.ctx, "web", metav1.GetOptions{})
		if got.Status.ReadyReplicas != 1 {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
	got, _ := h.c.client.AppsV1().ReplicaSets("default").Get(h.ctx, "web", metav1.GetOptions{})
	if got.Status.AvailableReplicas != 0 {
		t.Fatalf("available %d before minReadySeconds passed", got.Status.AvailableReplicas)
	}
	// Without any further event the controller looks again when the pod
	// becomes available.
	ctrltest.Eventually(t, 5*time.Second, func() error {
		got, _ := h.c.client.AppsV1().ReplicaSets("default").Get(h.ctx, "web", metav1.GetOptions{})
		if got.Status.AvailableReplicas != 1 {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
}
