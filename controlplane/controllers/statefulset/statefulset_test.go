package statefulset

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
)

func newSet(name string, replicas int32, mod func(*appsv1.StatefulSet)) *appsv1.StatefulSet {
	s := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: "uid-" + "set", Generation: 1},
		Spec: appsv1.StatefulSetSpec{
			Replicas: &replicas, ServiceName: "svc",
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx:1"}}},
			},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}},
		},
	}
	if mod != nil {
		mod(s)
	}
	return s
}

type env struct {
	t  *testing.T
	cs *ctrltest.Client
}

func start(t *testing.T, objs ...runtime.Object) *env {
	cs := ctrltest.NewClient(objs...)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t))
	ctx := ctrltest.Start(t, cs, f)
	go c.Run(ctx, 1)
	return &env{t: t, cs: cs}
}

func (e *env) pods() []corev1.Pod {
	l, _ := e.cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items
}

func (e *env) names() []string {
	var out []string
	for _, p := range e.pods() {
		out = append(out, p.Name)
	}
	return out
}

func (e *env) markReady(name string) {
	e.t.Helper()
	pods := e.cs.CoreV1().Pods("default")
	ctrltest.Update(e.t, func() (*corev1.Pod, error) { return pods.Get(context.Background(), name, metav1.GetOptions{}) },
		func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		},
		func(p *corev1.Pod) (*corev1.Pod, error) {
			return pods.UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		})
}

// update changes the StatefulSet name with mutate, retrying on conflicts
// with the controller's status writes.
func (e *env) update(name string, mutate func(*appsv1.StatefulSet)) {
	e.t.Helper()
	sets := e.cs.AppsV1().StatefulSets("default")
	ctrltest.Update(e.t, func() (*appsv1.StatefulSet, error) { return sets.Get(context.Background(), name, metav1.GetOptions{}) },
		mutate, func(s *appsv1.StatefulSet) (*appsv1.StatefulSet, error) {
			return sets.Update(context.Background(), s, metav1.UpdateOptions{})
		})
}

func (e *env) waitNames(want ...string) {
	e.t.Helper()
	ctrltest.Eventually(e.t, 45*time.Second, func() error {
		if got := e.names(); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("pods %v, want %v", got, want)
		}
		return nil
	})
}

func TestOrderedReadyCreatesOneOrdinalAtATimeWithItsClaim(t *testing.T) {
	e := start(t, newSet("web", 3, nil))
	e.waitNames("web-0")
	p := e.pods()[0]
	if p.Spec.Hostname != "web-0" || p.Spec.Subdomain != "svc" || p.Labels[PodNameLabel] != "web-0" || p.Labels[PodIndexLabel] != "0" {
		t.Fatalf("identity of web-0: hostname %q subdomain %q labels %v", p.Spec.Hostname, p.Spec.Subdomain, p.Labels)
	}
	if len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "data-web-0" {
		t.Fatalf("volumes %+v", p.Spec.Volumes)
	}
	if _, err := e.cs.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "data-web-0", metav1.GetOptions{}); err != nil {
		t.Fatalf("claim: %v", err)
	}
	rev := p.Labels[appsv1.ControllerRevisionHashLabelKey]
	if _, err := e.cs.AppsV1().ControllerRevisions("default").Get(context.Background(), rev, metav1.GetOptions{}); err != nil {
		t.Fatalf("revision %q: %v", rev, err)
	}
	e.markReady("web-0")
	e.waitNames("web-0", "web-1")
	e.markReady("web-1")
	e.waitNames("web-0", "web-1", "web-2")
	e.markReady("web-2")
	ctrltest.Eventually(t, 45*time.Second, func() error {
		s, _ := e.cs.AppsV1().StatefulSets("default").Get(context.Background(), "web", metav1.GetOptions{})
		if s.Status.ReadyReplicas != 3 || s.Status.CurrentRevision != rev || s.Status.UpdateRevision != rev || s.Status.UpdatedReplicas != 3 {
			return fmt.Errorf("status %+v", s.Status)
		}
		return nil
	})

	// A template change rolls from the highest ordinal down.
	e.update("web", func(s *appsv1.StatefulSet) { s.Spec.Template.Spec.Containers[0].Image = "nginx:2" })
	var newRev string
	ctrltest.Eventually(t, 45*time.Second, func() error {
		for _, p := range e.pods() {
			if p.Name == "web-2" && p.Spec.Containers[0].Image == "nginx:2" {
				newRev = p.Labels[appsv1.ControllerRevisionHashLabelKey]
				return nil
			}
		}
		return fmt.Errorf("web-2 not updated yet")
	})
	for _, p := range e.pods() {
		if p.Name != "web-2" && p.Spec.Containers[0].Image != "nginx:1" {
			t.Fatalf("%s updated before web-2 was ready", p.Name)
		}
	}
	e.markReady("web-2")
	ctrltest.Eventually(t, 45*time.Second, func() error {
		for _, p := range e.pods() {
			if p.Name == "web-1" && p.Labels[appsv1.ControllerRevisionHashLabelKey] == newRev {
				return nil
			}
		}
		return fmt.Errorf("web-1 not updated")
	})
	if newRev == rev {
		t.Fatal("the new template has the old revision")
	}
}

func TestParallelScaleDownAndPartition(t *testing.T) {
	e := start(t, newSet("db", 3, func(s *appsv1.StatefulSet) {
		s.Spec.PodManagementPolicy = appsv1.ParallelPodManagement
		s.Spec.VolumeClaimTemplates = nil
	}))
	e.waitNames("db-0", "db-1", "db-2") // all at once, none ready
	for _, n := range []string{"db-0", "db-1", "db-2"} {
		e.markReady(n)
	}
	e.update("db", func(s *appsv1.StatefulSet) {
		s.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{Partition: ptr.To[int32](2)}
		s.Spec.Template.Spec.Containers[0].Image = "nginx:2"
	})
	ctrltest.Eventually(t, 45*time.Second, func() error {
		for _, p := range e.pods() {
			if p.Name == "db-2" && p.Spec.Containers[0].Image == "nginx:2" {
				return nil
			}
		}
		return fmt.Errorf("db-2 not updated")
	})
	e.markReady("db-2")
	ctrltest.Eventually(t, 45*time.Second, func() error {
		st, _ := e.cs.AppsV1().StatefulSets("default").Get(context.Background(), "db", metav1.GetOptions{})
		if st.Status.UpdatedReplicas != 1 || st.Status.CurrentReplicas != 2 || st.Status.ReadyReplicas != 3 {
			return fmt.Errorf("status %+v", st.Status)
		}
		return nil
	})
	for _, p := range e.pods() {
		if p.Name != "db-2" && p.Spec.Containers[0].Image != "nginx:1" {
			t.Fatalf("%s below the partition was updated", p.Name)
		}
	}
	e.update("db", func(s *appsv1.StatefulSet) { s.Spec.Replicas = ptr.To[int32](1) })
	e.waitNames("db-0")
}
