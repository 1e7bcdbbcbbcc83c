package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/waggle-io/waggle/controlplane/controllers/daemonset"
)

func requiresResource(t *testing.T, c *cluster, gv, res string) {
	t.Helper()
	list, err := c.cs.Discovery().ServerResourcesForGroupVersion(gv)
	if err == nil {
		for _, r := range list.APIResources {
			if r.Name == res {
				return
			}
		}
	}
	t.Skipf("the API server does not serve %s in %s yet", res, gv)
}

// images returns pod name → first container image of the pods of a
// controller (by owner UID), skipping pods being deleted.
func (c *cluster) images(ctx context.Context, owner types.UID) (map[string]string, error) {
	l, err := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, p := range l.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == owner && p.DeletionTimestamp == nil {
			m[p.Name] = p.Spec.Containers[0].Image
		}
	}
	return m, nil
}

func (c *cluster) waitImages(ctx context.Context, owner types.UID, want map[string]string) {
	c.t.Helper()
	eventually(c.t, 60*time.Second, func() error {
		got, err := c.images(ctx, owner)
		if err != nil {
			return err
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("pods %v, want %v", got, want)
		}
		return nil
	})
}

func TestStatefulSetRollsOutAndUndoesThroughKubectlAndKeepsIdentity(t *testing.T) {
	c := newCluster(t)
	requiresResource(t, c, "apps/v1", "controllerrevisions")
	requiresResource(t, c, "apps/v1", "statefulsets")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 2, nil)
	c.startManager("cm-0", nil)

	three := int32(3)
	set := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.StatefulSetSpec{Replicas: &three, ServiceName: "web",
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx:1"}}}},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}}}}
	created, err := c.cs.AppsV1().StatefulSets("default").Create(ctx, set, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.kubectlOK("rollout", "status", "statefulset/web", "--timeout=60s")
	v1 := map[string]string{"web-0": "nginx:1", "web-1": "nginx:1", "web-2": "nginx:1"}
	c.waitImages(ctx, created.UID, v1)
	for i := 0; i < 3; i++ {
		if _, err := c.cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, fmt.Sprintf("data-web-%d", i), metav1.GetOptions{}); err != nil {
			t.Fatalf("claim data-web-%d: %v", i, err)
		}
	}

	c.kubectlOK("set", "image", "statefulset/web", "c=nginx:2")
	c.kubectlOK("rollout", "status", "statefulset/web", "--timeout=60s")
	c.waitImages(ctx, created.UID, map[string]string{"web-0": "nginx:2", "web-1": "nginx:2", "web-2": "nginx:2"})
	if out := c.kubectlOK("rollout", "history", "statefulset/web"); !strings.Contains(out, "1 ") || !strings.Contains(out, "2 ") {
		t.Fatalf("rollout history:\n%s", out)
	}
	c.kubectlOK("rollout", "undo", "statefulset/web")
	c.kubectlOK("rollout", "status", "statefulset/web", "--timeout=60s")
	c.waitImages(ctx, created.UID, v1)

	// A deleted pod comes back with the same name and claim.
	old, err := c.cs.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cs.CoreV1().Pods("default").Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		p, err := c.cs.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.UID == old.UID || !podReady(p) {
			return fmt.Errorf("web-1 not replaced and ready yet")
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "data-web-1" {
				return nil
			}
		}
		return fmt.Errorf("web-1 volumes %+v", p.Spec.Volumes)
	})

	// Scale down removes the highest ordinal; its claim is retained.
	c.kubectlOK("scale", "statefulset/web", "--replicas=2")
	c.waitImages(ctx, created.UID, map[string]string{"web-0": "nginx:1", "web-1": "nginx:1"})
	if _, err := c.cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data-web-2", metav1.GetOptions{}); err != nil {
		t.Fatalf("claim data-web-2 after scale-down (Retain): %v", err)
	}
}

func TestDaemonSetRolloutUndoThroughKubectl(t *testing.T) {
	c := newCluster(t)
	requiresResource(t, c, "apps/v1", "controllerrevisions")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 2, nil)
	c.startManager("cm-0", nil)
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "default"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "agent:1"}}}}}}
	created, err := c.cs.AppsV1().DaemonSets("default").Create(ctx, ds, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.kubectlOK("rollout", "status", "daemonset/agent", "--timeout=60s")
	c.kubectlOK("set", "image", "daemonset/agent", "a=agent:2")
	c.kubectlOK("rollout", "status", "daemonset/agent", "--timeout=60s")
	if out := c.kubectlOK("rollout", "history", "daemonset/agent"); !strings.Contains(out, "1 ") || !strings.Contains(out, "2 ") {
		t.Fatalf("rollout history:\n%s", out)
	}
	c.kubectlOK("rollout", "undo", "daemonset/agent")
	c.kubectlOK("rollout", "status", "daemonset/agent", "--timeout=60s")
	eventually(t, 60*time.Second, func() error {
		m, err := c.images(ctx, created.UID)
		if err != nil {
			return err
		}
		if len(m) != 2 {
			return fmt.Errorf("pods %v", m)
		}
		for n, img := range m {
			if img != "agent:1" {
				return fmt.Errorf("pod %s runs %s after undo", n, img)
			}
		}
		return nil
	})
}

// Upstream's ControllerRevision lifecycle spec: a ControllerRevision created
// by a user under the name the daemon set's next template will hash to, but
// holding another template, is a hash collision: the controller bumps
// collisionCount and writes the new template under another name and the
// next revision number, instead of taking the user's revision as current.
func TestDaemonSetRevisionNameTakenByAnotherTemplate(t *testing.T) {
	c := newCluster(t)
	requiresResource(t, c, "apps/v1", "controllerrevisions")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 1, nil)
	c.startManager("cm-0", nil)
	revs := c.cs.AppsV1().ControllerRevisions("default")
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "default"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "agent:1"}}}}}}
	if _, err := c.cs.AppsV1().DaemonSets("default").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.kubectlOK("rollout", "status", "daemonset/agent", "--timeout=60s")
	list := func(want int) []appsv1.ControllerRevision {
		t.Helper()
		var items []appsv1.ControllerRevision
		eventually(t, 30*time.Second, func() error {
			l, err := revs.List(ctx, metav1.ListOptions{LabelSelector: "app=agent"})
			if err != nil {
				return err
			}
			if items = l.Items; len(items) != want {
				return fmt.Errorf("%d revisions, want %d", len(items), want)
			}
			return nil
		})
		return items
	}
	initial := list(1)[0]
	live, err := c.cs.AppsV1().DaemonSets("default").Get(ctx, "agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The name the template with terminationGracePeriodSeconds 1 hashes to,
	// holding the initial template's data.
	next := live.DeepCopy()
	next.Spec.Template.Spec.TerminationGracePeriodSeconds = new(int64(1))
	takenName := "agent-" + daemonset.Hash(next)
	user := &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: takenName, Labels: initial.Labels,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(live, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}},
		Data: initial.Data, Revision: initial.Revision + 1}
	if _, err := revs.Create(ctx, user, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	list(2)
	if err := revs.Delete(ctx, initial.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	list(1)
	patch := `{"spec":{"template":{"spec":{"terminationGracePeriodSeconds":1}}}}`
	if _, err := c.cs.AppsV1().DaemonSets("default").Patch(ctx, "agent", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	items := list(2)
	var fresh *appsv1.ControllerRevision
	for i := range items {
		if items[i].Name != takenName {
			fresh = &items[i]
		}
	}
	if fresh == nil || fresh.Revision != 3 {
		t.Fatalf("revisions after the template change: %+v", items)
	}
	got, err := c.cs.AppsV1().DaemonSets("default").Get(ctx, "agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.CollisionCount == nil || *got.Status.CollisionCount != 1 {
		t.Fatalf("collisionCount %v, want 1", got.Status.CollisionCount)
	}
}
