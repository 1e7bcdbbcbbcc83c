package daemonset

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
)

func TestRevisionsFollowTheTemplateAndAnUndoRenumbersTheOldOne(t *testing.T) {
	ds := daemonSet()
	cs := ctrltest.NewClient(ds)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t), Options{Revisions: true})
	ctx := ctrltest.Start(t, cs, f)
	go c.Run(ctx, 1)
	revs := func() map[string]int64 {
		l, _ := cs.AppsV1().ControllerRevisions(ds.Namespace).List(context.Background(), metav1.ListOptions{})
		m := map[string]int64{}
		for _, r := range l.Items {
			m[r.Name] = r.Revision
		}
		return m
	}
	wait := func(want map[string]int64) {
		t.Helper()
		ctrltest.Eventually(t, 45*time.Second, func() error {
			if got := revs(); fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("revisions %v, want %v", got, want)
			}
			return nil
		})
	}
	first := ds.Name + "-" + Hash(ds)
	wait(map[string]int64{first: 1})
	r, _ := cs.AppsV1().ControllerRevisions(ds.Namespace).Get(context.Background(), first, metav1.GetOptions{})
	if r.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] != Hash(ds) || metav1.GetControllerOf(r).Kind != "DaemonSet" {
		t.Fatalf("revision meta %+v", r.ObjectMeta)
	}
	update := func(image string) *appsv1.DaemonSet {
		sets := cs.AppsV1().DaemonSets(ds.Namespace)
		return ctrltest.Update(t, func() (*appsv1.DaemonSet, error) { return sets.Get(context.Background(), ds.Name, metav1.GetOptions{}) },
			func(d *appsv1.DaemonSet) { d.Spec.Template.Spec.Containers[0].Image = image },
			func(d *appsv1.DaemonSet) (*appsv1.DaemonSet, error) {
				return sets.Update(context.Background(), d, metav1.UpdateOptions{})
			})
	}
	orig := ds.Spec.Template.Spec.Containers[0].Image
	second := ds.Name + "-" + Hash(update("other:2"))
	wait(map[string]int64{first: 1, second: 2})
	update(orig) // rollout undo: the first template is the newest again
	wait(map[string]int64{first: 3, second: 2})
}
