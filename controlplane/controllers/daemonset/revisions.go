package daemonset

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
	"github.com/waggle-io/waggle/controlplane/controllers/internal/history"
)

// syncRevisions keeps the daemon set's ControllerRevisions as Kubernetes
// does, so `kubectl rollout history/undo daemonset` work: the revision of
// the current template is <ds>-<controller-revision-hash>, labelled with that
// hash, holding the template patch, and numbered above every other; an old
// template that comes back (undo) gets its revision renumbered; revisions no
// pod uses beyond revisionHistoryLimit (10) are deleted. A name taken by a
// different template bumps status.collisionCount, which changes the hash.
func (c *Controller) syncRevisions(ctx context.Context, ds *appsv1.DaemonSet, sel labels.Selector, hash string, podHashes map[string]bool) error {
	list, err := c.revs.ControllerRevisions(ds.Namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	cl := &ctrlutil.Claimer[*appsv1.ControllerRevision]{
		Owner: ds, APIVersion: "apps/v1", Kind: "DaemonSet", Selector: sel,
		Patch: func(ctx context.Context, name string, data []byte) error {
			_, err := c.client.AppsV1().ControllerRevisions(ds.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
			return err
		},
		Copy: func(r *appsv1.ControllerRevision) *appsv1.ControllerRevision { return r.DeepCopy() },
	}
	revs, err := cl.Claim(ctx, list)
	if err != nil {
		return err
	}
	history.Sort(revs)
	data, err := history.TemplatePatch(ds)
	if err != nil {
		return err
	}
	name := history.Name(ds.Name, hash)
	next := history.NextRevision(revs)
	want := &appsv1.ControllerRevision{Data: runtime.RawExtension{Raw: data}}
	// The current revision is the one holding this template, whatever its
	// name: a revision named as this template's hash but holding another
	// template (anyone may create ControllerRevisions) is a hash collision,
	// resolved below by bumping collisionCount, as Kubernetes does.
	var cur *appsv1.ControllerRevision
	for _, r := range revs {
		if history.Equal(r, want) {
			cur = r
		}
	}
	switch {
	case cur != nil && cur == revs[len(revs)-1]:
	case cur != nil:
		if _, err := history.Bump(ctx, c.client, cur, next); err != nil {
			return err
		}
	default:
		lbls := map[string]string{}
		for k, v := range ds.Spec.Template.Labels {
			lbls[k] = v
		}
		lbls[appsv1.DefaultDaemonSetUniqueLabelKey] = hash
		rev := &appsv1.ControllerRevision{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ds.Namespace, Labels: lbls,
				OwnerReferences: []metav1.OwnerReference{ctrlutil.NewControllerRef(ds, "apps/v1", "DaemonSet")}},
			Data: runtime.RawExtension{Raw: data}, Revision: next,
		}
		_, err := c.client.AppsV1().ControllerRevisions(ds.Namespace).Create(ctx, rev, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			existing, gerr := c.client.AppsV1().ControllerRevisions(ds.Namespace).Get(ctx, name, metav1.GetOptions{})
			if gerr != nil {
				return fmt.Errorf("get controllerrevision %s: %w", name, gerr)
			}
			if ref := metav1.GetControllerOf(existing); ref != nil && ref.UID == ds.UID && history.Equal(existing, rev) {
				// Ours, written by an earlier sync the cache has not caught up with.
				return nil
			}
			// Someone else's revision, or another template, has the name.
			cc := int32(0)
			if ds.Status.CollisionCount != nil {
				cc = *ds.Status.CollisionCount
			}
			cc++
			cp := ds.DeepCopy()
			cp.Status.CollisionCount = &cc
			if _, err := c.client.AppsV1().DaemonSets(ds.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("bump collisionCount of daemonset %s: %w", ds.Name, err)
			}
			return fmt.Errorf("controllerrevision %s exists with another template: collisionCount is now %d", name, cc)
		}
		if err != nil {
			return fmt.Errorf("create controllerrevision %s: %w", name, err)
		}
	}
	live := map[string]bool{name: true}
	if cur != nil {
		live[cur.Name] = true
	}
	for _, r := range revs {
		if podHashes[r.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]] {
			live[r.Name] = true
		}
	}
	limit := 10
	if ds.Spec.RevisionHistoryLimit != nil {
		limit = int(*ds.Spec.RevisionHistoryLimit)
	}
	return history.Truncate(ctx, c.client, revs, live, limit)
}
