package deployment

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
)

func ptr[T any](v T) *T { return &v }

func TestResolveFencepostsRoundsSurgeUpAndUnavailableDown(t *testing.T) {
	tests := []struct {
		name                string
		surge, unavailable  *intstr.IntOrString
		replicas            int32
		wantSurge, wantUnav int32
	}{
		{"defaults are 25% each", nil, nil, 10, 3, 2},
		{"both zero become unavailable 1", ptr(intstr.FromInt32(0)), ptr(intstr.FromInt32(0)), 5, 0, 1},
		{"absolute values", ptr(intstr.FromInt32(2)), ptr(intstr.FromInt32(1)), 5, 2, 1},
		{"percent of one replica", ptr(intstr.FromString("25%")), ptr(intstr.FromString("25%")), 1, 1, 0},
		{"100% surge", ptr(intstr.FromString("100%")), ptr(intstr.FromInt32(0)), 3, 3, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, u, err := ResolveFenceposts(tc.surge, tc.unavailable, tc.replicas)
			if err != nil || s != tc.wantSurge || u != tc.wantUnav {
				t.Fatalf("got surge=%d unavailable=%d err=%v, want %d %d", s, u, err, tc.wantSurge, tc.wantUnav)
			}
		})
	}
	if _, _, err := ResolveFenceposts(ptr(intstr.FromString("lots")), nil, 3); err == nil {
		t.Fatal("want an error for maxSurge \"lots\"")
	}
}

func rsWith(name string, spec, available int32, created int64) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(created, 0))},
		Spec:       appsv1.ReplicaSetSpec{Replicas: &spec},
		Status:     appsv1.ReplicaSetStatus{Replicas: spec, AvailableReplicas: available},
	}
}

func TestNewRSNewReplicasRespectsMaxSurge(t *testing.T) {
	d := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr(int32(4)), Strategy: appsv1.DeploymentStrategy{
		Type:          appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: ptr(intstr.FromInt32(1)), MaxUnavailable: ptr(intstr.FromInt32(0))}}}}
	tests := []struct {
		name     string
		old, new int32
		want     int32
	}{
		{"start of rollout: one surge pod", 4, 0, 1},
		{"at the surge limit: no change", 4, 1, 1},
		{"old scaled down: grow again", 3, 1, 2},
		{"never beyond spec.replicas", 0, 4, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, n := rsWith("old", tc.old, tc.old, 1), rsWith("new", tc.new, 0, 2)
			if got := NewRSNewReplicas(d, []*appsv1.ReplicaSet{o, n}, n); got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	if got := NewRSNewReplicas(d, nil, rsWith("new", 0, 0, 1)); got != 4 {
		t.Fatalf("recreate: got %d, want 4", got)
	}
}

func TestRollbackKeepsTheOldRevisionInRevisionHistory(t *testing.T) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		"kubernetes.io/change-cause": "undo", corev1.LastAppliedConfigAnnotation: "{}"}},
		Spec: appsv1.DeploymentSpec{Replicas: ptr(int32(1))}}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{RevisionAnnotation: "1"}}}
	if !SetNewReplicaSetAnnotations(d, rs, "3", true) {
		t.Fatal("want a change")
	}
	if rs.Annotations[RevisionAnnotation] != "3" || rs.Annotations[RevisionHistoryAnnotation] != "1" {
		t.Fatalf("annotations %v", rs.Annotations)
	}
	if rs.Annotations["kubernetes.io/change-cause"] != "undo" {
		t.Fatal("change-cause not copied from the deployment")
	}
	if _, ok := rs.Annotations[corev1.LastAppliedConfigAnnotation]; ok {
		t.Fatal("last-applied-configuration must not be copied")
	}
	SetNewReplicaSetAnnotations(d, rs, "5", true)
	if rs.Annotations[RevisionHistoryAnnotation] != "1,3" {
		t.Fatalf("history %q, want 1,3", rs.Annotations[RevisionHistoryAnnotation])
	}
	// An older revision never lowers it.
	if SetNewReplicaSetAnnotations(d, rs, "4", true) || rs.Annotations[RevisionAnnotation] != "5" {
		t.Fatalf("revision lowered: %v", rs.Annotations)
	}
}

func TestComputeHashDependsOnTemplateAndCollisionCount(t *testing.T) {
	tmpl := &corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx:1"}}}}
	h1 := ComputeHash(tmpl, nil)
	if h1 != ComputeHash(tmpl.DeepCopy(), nil) {
		t.Fatal("hash is not deterministic")
	}
	if h1 == ComputeHash(tmpl, ptr(int32(1))) {
		t.Fatal("collisionCount does not change the hash")
	}
	t2 := tmpl.DeepCopy()
	t2.Spec.Containers[0].Image = "nginx:2"
	if h1 == ComputeHash(t2, nil) {
		t.Fatal("image does not change the hash")
	}
}

func TestProportionalScalingSplitsByCurrentSize(t *testing.T) {
	// A rollout in progress (old 6, new 4; maxSurge 0) scaled from 10 to 20:
	// both ReplicaSets grow in proportion, as Kubernetes does.
	d := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr(int32(20)), Strategy: appsv1.DeploymentStrategy{
		Type:          appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: ptr(intstr.FromInt32(0)), MaxUnavailable: ptr(intstr.FromInt32(1))}}},
		Status: appsv1.DeploymentStatus{Replicas: 10}}
	old, nw := rsWith("old", 6, 6, 1), rsWith("new", 4, 4, 2)
	SetReplicasAnnotations(old, 10, 10)
	SetReplicasAnnotations(nw, 10, 10)
	toAdd := int32(10)
	p1 := proportion(old, d, toAdd, 0)
	p2 := proportion(nw, d, toAdd, p1)
	if p1 != 6 || p2 != 4 {
		t.Fatalf("got +%d/+%d, want +6/+4", p1, p2)
	}
}

type harness struct {
	c   *Controller
	ctx context.Context
}

func start(t *testing.T, objs ...runtime.Object) *harness {
	cs := ctrltest.NewClient(objs...)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t), Options{})
	ctx := ctrltest.Start(t, cs, f)
	go c.Run(ctx, 1)
	return &harness{c: c, ctx: ctx}
}

func (h *harness) replicaSets(t *testing.T) []appsv1.ReplicaSet {
	l, err := h.c.client.AppsV1().ReplicaSets("default").List(h.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// settled waits until the controller has synced the Deployment after
// everything written so far: it makes a spec change (as the API server
// would, the generation grows) and waits for status.observedGeneration to
// reach it. A negative check ("nothing was created") waits for this marker
// first, so it cannot pass merely because the controller was slow.
func (h *harness) settled(t *testing.T) {
	t.Helper()
	deps := h.c.client.AppsV1().Deployments("default")
	d := ctrltest.Update(t, func() (*appsv1.Deployment, error) { return deps.Get(h.ctx, "web", metav1.GetOptions{}) },
		func(d *appsv1.Deployment) {
			limit := int32(10)
			if d.Spec.RevisionHistoryLimit != nil {
				limit = *d.Spec.RevisionHistoryLimit + 1
			}
			d.Spec.RevisionHistoryLimit = &limit
			d.Generation++
		},
		func(d *appsv1.Deployment) (*appsv1.Deployment, error) {
			return deps.Update(h.ctx, d, metav1.UpdateOptions{})
		})
	ctrltest.Eventually(t, 30*time.Second, func() error {
		got, err := deps.Get(h.ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.ObservedGeneration < d.Generation {
			return fmt.Errorf("observedGeneration %d, want %d", got.Status.ObservedGeneration, d.Generation)
		}
		return nil
	})
}

// markAvailable plays the ReplicaSet controller: every ReplicaSet's pods
// are all there and available. Tests call it while polling, so a write that
// conflicts with the controller's is simply retried by the next poll.
func (h *harness) markAvailable(t *testing.T) {
	for _, rs := range h.replicaSets(t) {
		r := *rs.Spec.Replicas
		if rs.Status.Replicas == r && rs.Status.AvailableReplicas == r && rs.Status.ObservedGeneration == rs.Generation {
			continue
		}
		rs.Status = appsv1.ReplicaSetStatus{Replicas: r, ReadyReplicas: r, AvailableReplicas: r, FullyLabeledReplicas: r, ObservedGeneration: rs.Generation}
		if _, err := h.c.client.AppsV1().ReplicaSets("default").UpdateStatus(h.ctx, &rs, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

func newDeployment(replicas int32, image string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: types.UID("d-web"), Generation: 1},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
			},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: ptr(intstr.FromInt32(1)), MaxUnavailable: ptr(intstr.FromInt32(0))}},
		},
	}
}

func TestRollingUpdateReplacesTheReplicaSetWithinSurgeAndCompletes(t *testing.T) {
	d := newDeployment(3, "nginx:1")
	h := start(t, d)
	hash1 := ComputeHash(&d.Spec.Template, nil)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		h.markAvailable(t)
		rss := h.replicaSets(t)
		if len(rss) != 1 || rss[0].Name != "web-"+hash1 || *rss[0].Spec.Replicas != 3 {
			return fmt.Errorf("replica sets %d", len(rss))
		}
		rs := rss[0]
		if rs.Annotations[RevisionAnnotation] != "1" || rs.Labels[PodTemplateHashLabel] != hash1 ||
			rs.Spec.Selector.MatchLabels[PodTemplateHashLabel] != hash1 || rs.Spec.Template.Labels[PodTemplateHashLabel] != hash1 {
			return fmt.Errorf("rs %s: annotations %v labels %v", rs.Name, rs.Annotations, rs.Labels)
		}
		return nil
	})
	ctrltest.Eventually(t, 5*time.Second, func() error {
		h.markAvailable(t)
		got, _ := h.c.client.AppsV1().Deployments("default").Get(h.ctx, "web", metav1.GetOptions{})
		c := GetCondition(got.Status, appsv1.DeploymentProgressing)
		if c == nil || c.Reason != NewRSAvailableReason || got.Status.AvailableReplicas != 3 || got.Annotations[RevisionAnnotation] != "1" {
			return fmt.Errorf("status %+v annotations %v", got.Status, got.Annotations)
		}
		if a := GetCondition(got.Status, appsv1.DeploymentAvailable); a == nil || a.Status != corev1.ConditionTrue {
			return fmt.Errorf("available condition %+v", a)
		}
		return nil
	})

	// Roll out a new image: with maxSurge 1 / maxUnavailable 0 there are
	// never more than 4 pods, never fewer than 3 available.
	got, _ := h.c.client.AppsV1().Deployments("default").Get(h.ctx, "web", metav1.GetOptions{})
	got.Spec.Template.Spec.Containers[0].Image = "nginx:2"
	got.Generation = 2
	if _, err := h.c.client.AppsV1().Deployments("default").Update(h.ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	hash2 := ComputeHash(&got.Spec.Template, nil)
	ctrltest.Eventually(t, 10*time.Second, func() error {
		var total int32
		rss := h.replicaSets(t)
		for _, rs := range rss {
			total += *rs.Spec.Replicas
		}
		if total > 4 {
			t.Fatalf("%d replicas in total, beyond replicas+maxSurge", total)
		}
		h.markAvailable(t)
		for _, rs := range rss {
			if rs.Name == "web-"+hash2 && *rs.Spec.Replicas == 3 && rs.Annotations[RevisionAnnotation] == "2" {
				for _, o := range rss {
					if o.Name != rs.Name && *o.Spec.Replicas != 0 {
						return fmt.Errorf("old %s still has %d", o.Name, *o.Spec.Replicas)
					}
				}
				return nil
			}
		}
		return fmt.Errorf("new replica set not complete")
	})
	ctrltest.Eventually(t, 5*time.Second, func() error {
		h.markAvailable(t)
		got, _ := h.c.client.AppsV1().Deployments("default").Get(h.ctx, "web", metav1.GetOptions{})
		c := GetCondition(got.Status, appsv1.DeploymentProgressing)
		if c == nil || c.Reason != NewRSAvailableReason || got.Status.UpdatedReplicas != 3 || got.Status.ObservedGeneration != 2 {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
}

func TestRevisionHistoryLimitDeletesOldEmptyReplicaSets(t *testing.T) {
	d := newDeployment(1, "nginx:9")
	d.Spec.RevisionHistoryLimit = ptr(int32(1))
	var objs []runtime.Object
	objs = append(objs, d)
	for i := 1; i <= 3; i++ {
		rs := rsWith(fmt.Sprintf("web-old%d", i), 0, 0, int64(i))
		rs.Namespace = "default"
		rs.UID = types.UID(rs.Name)
		rs.Labels = map[string]string{"app": "web"}
		rs.Annotations = map[string]string{RevisionAnnotation: fmt.Sprint(i)}
		rs.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
		rs.Spec.Template = *d.Spec.Template.DeepCopy()
		rs.Spec.Template.Spec.Containers[0].Image = fmt.Sprintf("nginx:%d", i)
		objs = append(objs, rs)
	}
	h := start(t, objs...)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		h.markAvailable(t)
		var names []string
		for _, rs := range h.replicaSets(t) {
			names = append(names, rs.Name)
		}
		// The new one (revision 4) and the newest old one remain.
		if len(names) != 2 || !contains(names, "web-old3") {
			return fmt.Errorf("replica sets %v", names)
		}
		return nil
	})
	for _, rs := range h.replicaSets(t) {
		if rs.Name != "web-old3" && rs.Annotations[RevisionAnnotation] != "4" {
			t.Fatalf("new rs %s revision %q", rs.Name, rs.Annotations[RevisionAnnotation])
		}
		if metav1.GetControllerOf(&rs) == nil {
			t.Fatalf("%s not adopted", rs.Name)
		}
	}
	_ = labels.Everything()
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestPausedDeploymentGetsThePausedConditionAndDoesNotRollOut(t *testing.T) {
	d := newDeployment(2, "nginx:1")
	d.Spec.Paused = true
	h := start(t, d)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		got, _ := h.c.client.AppsV1().Deployments("default").Get(h.ctx, "web", metav1.GetOptions{})
		c := GetCondition(got.Status, appsv1.DeploymentProgressing)
		if c == nil || c.Reason != PausedDeployReason || c.Status != corev1.ConditionUnknown {
			return fmt.Errorf("conditions %+v", got.Status.Conditions)
		}
		return nil
	})
	h.settled(t)
	if n := len(h.replicaSets(t)); n != 0 {
		t.Fatalf("paused deployment created %d replica sets", n)
	}
}

func TestProgressDeadlineExceededWhenNoProgress(t *testing.T) {
	d := newDeployment(2, "nginx:1")
	d.Spec.ProgressDeadlineSeconds = ptr(int32(1))
	h := start(t, d)
	ctrltest.Eventually(t, 10*time.Second, func() error {
		got, _ := h.c.client.AppsV1().Deployments("default").Get(h.ctx, "web", metav1.GetOptions{})
		c := GetCondition(got.Status, appsv1.DeploymentProgressing)
		if c == nil || c.Reason != TimedOutReason || c.Status != corev1.ConditionFalse {
			return fmt.Errorf("conditions %+v", got.Status.Conditions)
		}
		return nil
	})
}

func TestRecreateScalesOldToZeroBeforeCreatingTheNewReplicaSet(t *testing.T) {
	d := newDeployment(2, "nginx:2")
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	old := rsWith("web-old", 2, 2, 1)
	old.Namespace, old.UID = "default", "old-uid"
	old.Labels = map[string]string{"app": "web"}
	old.Annotations = map[string]string{RevisionAnnotation: "1"}
	old.Spec.Selector = d.Spec.Selector.DeepCopy()
	old.Spec.Template = *d.Spec.Template.DeepCopy()
	old.Spec.Template.Spec.Containers[0].Image = "nginx:1"
	h := start(t, d, old)
	// Step 1: the old ReplicaSet goes to zero and no new one exists while
	// its pods may still run.
	ctrltest.Eventually(t, 5*time.Second, func() error {
		rss := h.replicaSets(t)
		if len(rss) != 1 || *rss[0].Spec.Replicas != 0 {
			return fmt.Errorf("%d replica sets", len(rss))
		}
		return nil
	})
	h.settled(t)
	if rss := h.replicaSets(t); len(rss) != 1 {
		t.Fatalf("a new replica set was created while old pods were still reported (%d)", len(rss))
	}
	// Step 2: the old pods are gone: the new ReplicaSet gets all replicas.
	ctrltest.Eventually(t, 5*time.Second, func() error {
		h.markAvailable(t)
		rss := h.replicaSets(t)
		for _, rs := range rss {
			if rs.Spec.Template.Spec.Containers[0].Image == "nginx:2" && *rs.Spec.Replicas == 2 && rs.Annotations[RevisionAnnotation] == "2" {
				return nil
			}
		}
		return fmt.Errorf("no complete new replica set among %d", len(rss))
	})
}
