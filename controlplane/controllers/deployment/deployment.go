// Package deployment is the Deployment controller. It drives a Deployment's
// ReplicaSets as Kubernetes' does, so that `kubectl rollout status`, `rollout
// history`, `rollout undo`, `rollout pause/resume` and `scale` behave the
// same: a new ReplicaSet per pod template named <deployment>-<pod-template-hash>
// (the same FNV hash Kubernetes computes), RollingUpdate bounded by maxSurge
// and maxUnavailable or Recreate, proportional scaling of all ReplicaSets
// during a rollout, revision annotations (deployment.kubernetes.io/revision
// and revision-history) so rollbacks reuse the old ReplicaSet, cleanup beyond
// revisionHistoryLimit, pause/resume, minReadySeconds, and the Progressing
// (NewReplicaSetCreated, ReplicaSetUpdated, NewReplicaSetAvailable,
// ProgressDeadlineExceeded, DeploymentPaused/Resumed) and Available
// conditions.
//
// It never touches pods: the ReplicaSet controller does.
package deployment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name.
const Name = "deployment"

// Options tune the controller (none yet; kept for the common New shape).
type Options struct{}

// Controller reconciles Deployments with their ReplicaSets.
type Controller struct {
	client  kubernetes.Interface
	log     *slog.Logger
	queue   workqueue.TypedRateLimitingInterface[string]
	dl      appslisters.DeploymentLister
	rsl     appslisters.ReplicaSetLister
	pods    corelisters.PodLister
	synced  []cache.InformerSynced
	now     func() time.Time
	rec     record.EventRecorder
	stopRec func()
}

// New wires the controller to the factory's Deployment, ReplicaSet and Pod
// informers.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	dInf := factory.Apps().V1().Deployments()
	rsInf := factory.Apps().V1().ReplicaSets()
	podInf := factory.Core().V1().Pods()
	c := &Controller{
		client: client, log: log.With("controller", Name), queue: ctrlutil.NewQueue(Name),
		dl: dInf.Lister(), rsl: rsInf.Lister(), pods: podInf.Lister(), now: time.Now,
		synced: []cache.InformerSynced{dInf.Informer().HasSynced, rsInf.Informer().HasSynced, podInf.Informer().HasSynced},
	}
	c.rec, c.stopRec = ctrlutil.NewRecorder(client, "deployment-controller")
	dInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, cur any) { c.enqueue(cur) },
		DeleteFunc: c.enqueue,
	})
	rsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { c.rsChanged(obj.(*appsv1.ReplicaSet)) },
		UpdateFunc: func(old, cur any) {
			o, n := old.(*appsv1.ReplicaSet), cur.(*appsv1.ReplicaSet)
			if ctrlutil.SameVersion(o, n) {
				return
			}
			if !apiequality.Semantic.DeepEqual(metav1.GetControllerOf(o), metav1.GetControllerOf(n)) ||
				!apiequality.Semantic.DeepEqual(o.Labels, n.Labels) {
				c.rsChanged(o)
			}
			c.rsChanged(n)
		},
		DeleteFunc: func(obj any) {
			if rs, ok := ctrlutil.Unwrap(obj).(*appsv1.ReplicaSet); ok {
				c.rsChanged(rs)
			}
		},
	})
	podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		// Recreate waits for the old pods to be gone.
		DeleteFunc: func(obj any) {
			pod, ok := ctrlutil.Unwrap(obj).(*corev1.Pod)
			if !ok {
				return
			}
			ref := metav1.GetControllerOf(pod)
			if ref == nil || ref.Kind != "ReplicaSet" {
				return
			}
			rs, err := c.rsl.ReplicaSets(pod.Namespace).Get(ref.Name)
			if err != nil || rs.UID != ref.UID {
				return
			}
			if d := c.ownerOf(rs); d != nil && d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
				c.enqueue(d)
			}
		},
	})
	return c
}

func (c *Controller) enqueue(obj any) {
	if k := ctrlutil.KeyFunc(obj); k != "" {
		c.queue.Add(k)
	}
}

func (c *Controller) ownerOf(rs *appsv1.ReplicaSet) *appsv1.Deployment {
	d, _ := ctrlutil.ResolveController(rs, "Deployment", func(ns, name string) (*appsv1.Deployment, error) { return c.dl.Deployments(ns).Get(name) })
	return d
}

func (c *Controller) rsChanged(rs *appsv1.ReplicaSet) {
	if d := c.ownerOf(rs); d != nil {
		c.enqueue(d)
		return
	}
	if metav1.GetControllerOf(rs) != nil {
		return
	}
	// An orphan: every Deployment whose selector matches may adopt it.
	ds, err := c.dl.Deployments(rs.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, d := range ds {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err == nil && !sel.Empty() && sel.Matches(labels.Set(rs.Labels)) {
			c.enqueue(d)
		}
	}
}

// Run runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.stopRec()
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced...)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	cached, err := c.dl.Deployments(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	d := cached.DeepCopy()
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() {
		// An empty selector would select every pod: refuse, as Kubernetes.
		c.log.Warn("deployment has an empty or invalid selector; not acting", "deployment", key, "err", err)
		if d.Status.ObservedGeneration < d.Generation {
			d.Status.ObservedGeneration = d.Generation
			_, err := c.client.AppsV1().Deployments(ns).UpdateStatus(ctx, d, metav1.UpdateOptions{})
			return ignoreNotFound(err)
		}
		return nil
	}
	rsList, err := c.claimReplicaSets(ctx, d, sel)
	if err != nil {
		return err
	}
	if d.DeletionTimestamp != nil {
		return c.syncStatusOnly(ctx, d, rsList)
	}
	if err := c.checkPausedConditions(ctx, d); err != nil {
		return err
	}
	if d.Spec.Paused {
		return c.syncScale(ctx, d, rsList)
	}
	scaling, err := c.isScalingEvent(ctx, d, rsList)
	if err != nil {
		return err
	}
	if scaling {
		return c.syncScale(ctx, d, rsList)
	}
	if d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		return c.rolloutRecreate(ctx, d, rsList, sel)
	}
	return c.rolloutRolling(ctx, d, rsList)
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (c *Controller) claimReplicaSets(ctx context.Context, d *appsv1.Deployment, sel labels.Selector) ([]*appsv1.ReplicaSet, error) {
	all, err := c.rsl.ReplicaSets(d.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	cl := &ctrlutil.Claimer[*appsv1.ReplicaSet]{
		Owner: d, APIVersion: "apps/v1", Kind: "Deployment", Selector: sel,
		CanAdopt: ctrlutil.RecheckOwner(d, func(ctx context.Context) (metav1.Object, error) {
			return c.client.AppsV1().Deployments(d.Namespace).Get(ctx, d.Name, metav1.GetOptions{})
		}),
		Patch: func(ctx context.Context, name string, data []byte) error {
			_, err := c.client.AppsV1().ReplicaSets(d.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
			return err
		},
		Copy: func(rs *appsv1.ReplicaSet) *appsv1.ReplicaSet { return rs.DeepCopy() },
	}
	owned, err := cl.Claim(ctx, all)
	// The sync updates these in place as it writes them: never the
	// informer's shared copies.
	for i, rs := range owned {
		owned[i] = rs.DeepCopy()
	}
	return owned, err
}

// getAllReplicaSetsAndSyncRevision returns the new ReplicaSet (created when
// create is set and missing) and the old ones, with revisions brought up to
// date.
func (c *Controller) getAllReplicaSetsAndSyncRevision(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet, create bool) (*appsv1.ReplicaSet, []*appsv1.ReplicaSet, error) {
	old := FindOldReplicaSets(d, rsList)
	newRS, err := c.getNewReplicaSet(ctx, d, rsList, old, create)
	if err != nil {
		return nil, nil, err
	}
	return newRS, old, nil
}

func (c *Controller) getNewReplicaSet(ctx context.Context, d *appsv1.Deployment, rsList, old []*appsv1.ReplicaSet, create bool) (*appsv1.ReplicaSet, error) {
	existing := FindNewReplicaSet(d, rsList)
	newRevision := strconv.FormatInt(MaxRevision(old)+1, 10)
	if existing != nil {
		rs := existing.DeepCopy()
		annotationsChanged := SetNewReplicaSetAnnotations(d, rs, newRevision, true)
		if annotationsChanged || rs.Spec.MinReadySeconds != d.Spec.MinReadySeconds {
			rs.Spec.MinReadySeconds = d.Spec.MinReadySeconds
			return c.client.AppsV1().ReplicaSets(rs.Namespace).Update(ctx, rs, metav1.UpdateOptions{})
		}
		if err := c.setDeploymentRevision(ctx, d, rs.Annotations[RevisionAnnotation]); err != nil {
			return nil, err
		}
		if _, ok := progressDeadline(d); ok && GetCondition(d.Status, appsv1.DeploymentProgressing) == nil {
			SetCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue, FoundNewRSReason,
				fmt.Sprintf("Found new replica set %q", rs.Name), c.now()))
			if err := c.updateStatus(ctx, d); err != nil {
				return nil, err
			}
		}
		return rs, nil
	}
	if !create {
		return nil, nil
	}
	tmpl := d.Spec.Template.DeepCopy()
	hash := ComputeHash(tmpl, d.Status.CollisionCount)
	tmpl.Labels = withLabel(d.Spec.Template.Labels, PodTemplateHashLabel, hash)
	selector := d.Spec.Selector.DeepCopy()
	if selector.MatchLabels == nil {
		selector.MatchLabels = map[string]string{}
	}
	selector.MatchLabels[PodTemplateHashLabel] = hash
	zero := int32(0)
	newRS := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: d.Name + "-" + hash, Namespace: d.Namespace, Labels: tmpl.Labels,
			OwnerReferences: []metav1.OwnerReference{ctrlutil.NewControllerRef(d, "apps/v1", "Deployment")},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: &zero, MinReadySeconds: d.Spec.MinReadySeconds, Selector: selector, Template: *tmpl},
	}
	n := NewRSNewReplicas(d, append(append([]*appsv1.ReplicaSet(nil), old...), newRS), newRS)
	newRS.Spec.Replicas = &n
	SetNewReplicaSetAnnotations(d, newRS, newRevision, false)
	created, err := c.client.AppsV1().ReplicaSets(d.Namespace).Create(ctx, newRS, metav1.CreateOptions{})
	alreadyExists := false
	switch {
	case apierrors.IsAlreadyExists(err):
		alreadyExists = true
		rs, gerr := c.client.AppsV1().ReplicaSets(d.Namespace).Get(ctx, newRS.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, fmt.Errorf("get existing replica set %s: %w", newRS.Name, gerr)
		}
		if ref := metav1.GetControllerOf(rs); ref != nil && ref.UID == d.UID && EqualIgnoreHash(&d.Spec.Template, &rs.Spec.Template) {
			created, err = rs, nil
			break
		}
		// A hash collision: bump collisionCount so the next hash differs.
		if d.Status.CollisionCount == nil {
			d.Status.CollisionCount = new(int32)
		}
		*d.Status.CollisionCount++
		if uerr := c.updateStatus(ctx, d); uerr != nil {
			return nil, uerr
		}
		c.log.Info("pod-template-hash collision, bumped collisionCount", "deployment", d.Namespace+"/"+d.Name, "collisionCount", *d.Status.CollisionCount)
		return nil, fmt.Errorf("replica set %s exists with another template: %w", newRS.Name, err)
	case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		return nil, err
	case err != nil:
		c.rec.Eventf(d, corev1.EventTypeWarning, FailedRSCreateReason, "Failed to create new replica set %q: %v", newRS.Name, err)
		if _, ok := progressDeadline(d); ok {
			SetCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionFalse, FailedRSCreateReason,
				fmt.Sprintf("Failed to create new replica set %q: %v", newRS.Name, err), c.now()))
			_ = c.updateStatus(ctx, d)
		}
		return nil, fmt.Errorf("create replica set %s: %w", newRS.Name, err)
	}
	if !alreadyExists {
		c.log.Info("created replica set", "deployment", d.Namespace+"/"+d.Name, "replicaset", created.Name, "replicas", n)
		if n > 0 {
			c.rec.Eventf(d, corev1.EventTypeNormal, "ScalingReplicaSet", "Scaled up replica set %s from 0 to %d", created.Name, n)
		}
	}
	if err := c.setDeploymentRevision(ctx, d, newRevision); err != nil {
		return nil, err
	}
	if _, ok := progressDeadline(d); ok && !alreadyExists {
		SetCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue, NewReplicaSetReason,
			fmt.Sprintf("Created new replica set %q", created.Name), c.now()))
		if err := c.updateStatus(ctx, d); err != nil {
			return nil, err
		}
	}
	return created, nil
}

func withLabel(m map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for a, b := range m {
		out[a] = b
	}
	out[k] = v
	return out
}

// setDeploymentRevision writes the revision annotation on the Deployment
// (a metadata change, so through the main resource, leaving d's status as
// it is in memory).
func (c *Controller) setDeploymentRevision(ctx context.Context, d *appsv1.Deployment, rev string) error {
	if rev == "" || d.Annotations[RevisionAnnotation] == rev {
		return nil
	}
	cp := d.DeepCopy()
	if cp.Annotations == nil {
		cp.Annotations = map[string]string{}
	}
	cp.Annotations[RevisionAnnotation] = rev
	updated, err := c.client.AppsV1().Deployments(d.Namespace).Update(ctx, cp, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("set revision of deployment %s/%s: %w", d.Namespace, d.Name, err)
	}
	status := d.Status
	*d = *updated
	d.Status = status
	return nil
}

func (c *Controller) updateStatus(ctx context.Context, d *appsv1.Deployment) error {
	updated, err := c.client.AppsV1().Deployments(d.Namespace).UpdateStatus(ctx, d, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update status of deployment %s/%s: %w", d.Namespace, d.Name, err)
	}
	*d = *updated
	return nil
}

func (c *Controller) isScalingEvent(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) (bool, error) {
	newRS, old, err := c.getAllReplicaSetsAndSyncRevision(ctx, d, rsList, false)
	if err != nil {
		return false, err
	}
	for _, rs := range FilterActive(append(old, newRS)) {
		if desired, ok := intAnnotation(rs, DesiredReplicasAnnotation); ok && desired != replicas(d.Spec.Replicas) {
			return true, nil
		}
	}
	return false, nil
}

func (c *Controller) checkPausedConditions(ctx context.Context, d *appsv1.Deployment) error {
	if _, ok := progressDeadline(d); !ok {
		return nil
	}
	cond := GetCondition(d.Status, appsv1.DeploymentProgressing)
	if cond != nil && cond.Reason == TimedOutReason {
		return nil
	}
	paused := cond != nil && cond.Reason == PausedDeployReason
	switch {
	case d.Spec.Paused && !paused:
		SetCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionUnknown, PausedDeployReason, "Deployment is paused", c.now()))
	case !d.Spec.Paused && paused:
		SetCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionUnknown, ResumedDeployReason, "Deployment is resumed", c.now()))
	default:
		return nil
	}
	return c.updateStatus(ctx, d)
}

// syncScale handles a paused deployment or a scaling event: it resizes the
// ReplicaSets proportionally without rolling anything out.
func (c *Controller) syncScale(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) error {
	newRS, old, err := c.getAllReplicaSetsAndSyncRevision(ctx, d, rsList, false)
	if err != nil {
		return err
	}
	if err := c.scale(ctx, d, newRS, old); err != nil {
		return err
	}
	if d.Spec.Paused {
		if err := c.cleanup(ctx, d, old); err != nil {
			return err
		}
	}
	return c.syncStatusWith(ctx, d, append(old, newRS), newRS)
}

func (c *Controller) syncStatusOnly(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) error {
	newRS, old, err := c.getAllReplicaSetsAndSyncRevision(ctx, d, rsList, false)
	if err != nil {
		return err
	}
	return c.syncStatusWith(ctx, d, append(old, newRS), newRS)
}

func (c *Controller) syncStatusWith(ctx context.Context, d *appsv1.Deployment, all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) error {
	st := c.calculateStatus(d, all, newRS)
	if apiequality.Semantic.DeepEqual(d.Status, st) {
		return nil
	}
	d.Status = st
	return ignoreNotFound(c.updateStatus(ctx, d))
}

func (c *Controller) scale(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) error {
	want := replicas(d.Spec.Replicas)
	if rs := FindActiveOrLatest(newRS, old); rs != nil {
		if rsReplicas(rs) == want {
			return nil
		}
		_, _, err := c.scaleReplicaSet(ctx, rs, want, d)
		return err
	}
	if IsSaturated(d, newRS) {
		for _, rs := range FilterActive(old) {
			if _, _, err := c.scaleReplicaSet(ctx, rs, 0, d); err != nil {
				return err
			}
		}
		return nil
	}
	if !isRolling(d) {
		return nil
	}
	all := FilterActive(append(append([]*appsv1.ReplicaSet(nil), old...), newRS))
	allowed := int32(0)
	if want > 0 {
		allowed = want + MaxSurge(d)
	}
	toAdd := allowed - sumSpec(all)
	switch {
	case toAdd > 0:
		sortBySize(all, true)
	case toAdd < 0:
		sortBySize(all, false)
	}
	added := int32(0)
	sizes := map[string]int32{}
	for _, rs := range all {
		if toAdd != 0 {
			p := proportion(rs, d, toAdd, added)
			sizes[rs.Name] = rsReplicas(rs) + p
			added += p
		} else {
			sizes[rs.Name] = rsReplicas(rs)
		}
	}
	var errs []error
	for i, rs := range all {
		if i == 0 && toAdd != 0 {
			sizes[rs.Name] = max(0, sizes[rs.Name]+toAdd-added)
		}
		if _, _, err := c.scaleReplicaSet(ctx, rs, sizes[rs.Name], d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// scaleReplicaSet sets rs's replicas and desired/max annotations.
func (c *Controller) scaleReplicaSet(ctx context.Context, rs *appsv1.ReplicaSet, n int32, d *appsv1.Deployment) (bool, *appsv1.ReplicaSet, error) {
	want := replicas(d.Spec.Replicas)
	cp := rs.DeepCopy()
	sizeChanged := rsReplicas(rs) != n
	annChanged := SetReplicasAnnotations(cp, want, want+MaxSurge(d))
	if !sizeChanged && !annChanged {
		return false, rs, nil
	}
	cp.Spec.Replicas = &n
	updated, err := c.client.AppsV1().ReplicaSets(cp.Namespace).Update(ctx, cp, metav1.UpdateOptions{})
	if err != nil {
		return false, rs, fmt.Errorf("scale replica set %s/%s to %d: %w", rs.Namespace, rs.Name, n, err)
	}
	if sizeChanged {
		op := "up"
		if n < rsReplicas(rs) {
			op = "down"
		}
		c.log.Info("scaled replica set", "deployment", d.Namespace+"/"+d.Name, "replicaset", rs.Name, "from", rsReplicas(rs), "to", n)
		c.rec.Eventf(d, corev1.EventTypeNormal, "ScalingReplicaSet", "Scaled %s replica set %s from %d to %d", op, rs.Name, rsReplicas(rs), n)
	}
	*rs = *updated
	return sizeChanged, rs, nil
}

func (c *Controller) rolloutRolling(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) error {
	newRS, old, err := c.getAllReplicaSetsAndSyncRevision(ctx, d, rsList, true)
	if err != nil {
		return err
	}
	all := append(append([]*appsv1.ReplicaSet(nil), old...), newRS)
	up, err := c.reconcileNewReplicaSet(ctx, all, newRS, d)
	if err != nil {
		return err
	}
	if up {
		return c.syncRolloutStatus(ctx, all, newRS, d)
	}
	down, err := c.reconcileOldReplicaSets(ctx, all, FilterActive(old), newRS, d)
	if err != nil {
		return err
	}
	if down {
		return c.syncRolloutStatus(ctx, all, newRS, d)
	}
	if DeploymentComplete(d, &d.Status) {
		if err := c.cleanup(ctx, d, old); err != nil {
			return err
		}
	}
	return c.syncRolloutStatus(ctx, all, newRS, d)
}

func (c *Controller) reconcileNewReplicaSet(ctx context.Context, all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet, d *appsv1.Deployment) (bool, error) {
	want := replicas(d.Spec.Replicas)
	switch {
	case rsReplicas(newRS) == want:
		return false, nil
	case rsReplicas(newRS) > want:
		scaled, _, err := c.scaleReplicaSet(ctx, newRS, want, d)
		return scaled, err
	}
	scaled, _, err := c.scaleReplicaSet(ctx, newRS, NewRSNewReplicas(d, all, newRS), d)
	return scaled, err
}

func (c *Controller) reconcileOldReplicaSets(ctx context.Context, all, old []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet, d *appsv1.Deployment) (bool, error) {
	if sumSpec(old) == 0 {
		return false, nil
	}
	minAvailable := replicas(d.Spec.Replicas) - MaxUnavailable(d)
	newUnavailable := rsReplicas(newRS) - newRS.Status.AvailableReplicas
	maxScaledDown := sumSpec(all) - minAvailable - newUnavailable
	if maxScaledDown <= 0 {
		return false, nil
	}
	// First scale down old pods that are not available: it costs nothing.
	sortByCreation(old)
	var cleaned int32
	for _, rs := range old {
		if cleaned >= maxScaledDown {
			break
		}
		r := rsReplicas(rs)
		if r == 0 || r == rs.Status.AvailableReplicas {
			continue
		}
		n := min(maxScaledDown-cleaned, r-rs.Status.AvailableReplicas)
		if _, _, err := c.scaleReplicaSet(ctx, rs, r-n, d); err != nil {
			return false, err
		}
		cleaned += n
	}
	// Then scale down available old pods while minAvailable holds.
	all = append(append([]*appsv1.ReplicaSet(nil), old...), newRS)
	available := sumStatus(all, statusAvailable)
	var scaled int32
	if available > minAvailable {
		total := available - minAvailable
		for _, rs := range old {
			if scaled >= total {
				break
			}
			r := rsReplicas(rs)
			if r == 0 {
				continue
			}
			n := min(r, total-scaled)
			if _, _, err := c.scaleReplicaSet(ctx, rs, r-n, d); err != nil {
				return false, err
			}
			scaled += n
		}
	}
	return cleaned+scaled > 0, nil
}

func (c *Controller) rolloutRecreate(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet, sel labels.Selector) error {
	newRS, old, err := c.getAllReplicaSetsAndSyncRevision(ctx, d, rsList, false)
	if err != nil {
		return err
	}
	all := append(append([]*appsv1.ReplicaSet(nil), old...), newRS)
	scaledDown := false
	for _, rs := range FilterActive(old) {
		s, _, err := c.scaleReplicaSet(ctx, rs, 0, d)
		if err != nil {
			return err
		}
		scaledDown = scaledDown || s
	}
	if scaledDown {
		return c.syncRolloutStatus(ctx, all, newRS, d)
	}
	running, err := c.oldPodsRunning(d, newRS, old, sel)
	if err != nil {
		return err
	}
	if running {
		return c.syncRolloutStatus(ctx, all, newRS, d)
	}
	if newRS == nil {
		newRS, old, err = c.getAllReplicaSetsAndSyncRevision(ctx, d, rsList, true)
		if err != nil {
			return err
		}
		all = append(append([]*appsv1.ReplicaSet(nil), old...), newRS)
	}
	up, _, err := c.scaleReplicaSet(ctx, newRS, replicas(d.Spec.Replicas), d)
	if err != nil {
		return err
	}
	if up {
		return c.syncRolloutStatus(ctx, all, newRS, d)
	}
	if DeploymentComplete(d, &d.Status) {
		if err := c.cleanup(ctx, d, old); err != nil {
			return err
		}
	}
	return c.syncRolloutStatus(ctx, all, newRS, d)
}

// oldPodsRunning reports whether any pod of an old ReplicaSet still exists
// and has not finished.
func (c *Controller) oldPodsRunning(d *appsv1.Deployment, newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet, sel labels.Selector) (bool, error) {
	if sumStatus(old, statusReplicas) > 0 {
		return true, nil
	}
	pods, err := c.pods.Pods(d.Namespace).List(sel)
	if err != nil {
		return false, err
	}
	oldUIDs := map[types.UID]bool{}
	for _, rs := range old {
		oldUIDs[rs.UID] = true
	}
	for _, p := range pods {
		ref := metav1.GetControllerOf(p)
		if ref == nil || !oldUIDs[ref.UID] || (newRS != nil && ref.UID == newRS.UID) {
			continue
		}
		if !ctrlutil.IsPodTerminal(p) {
			return true, nil
		}
	}
	return false, nil
}

// cleanup deletes old, empty ReplicaSets beyond revisionHistoryLimit,
// oldest revision first.
func (c *Controller) cleanup(ctx context.Context, d *appsv1.Deployment, old []*appsv1.ReplicaSet) error {
	limit := int32(defaultRevisionHistory)
	if d.Spec.RevisionHistoryLimit != nil {
		limit = *d.Spec.RevisionHistoryLimit
	}
	var alive []*appsv1.ReplicaSet
	for _, rs := range old {
		if rs != nil && rs.DeletionTimestamp == nil {
			alive = append(alive, rs)
		}
	}
	diff := int32(len(alive)) - limit
	if diff <= 0 {
		return nil
	}
	sortByRevision(alive)
	for i := int32(0); i < diff; i++ {
		rs := alive[i]
		if rs.Status.Replicas != 0 || rsReplicas(rs) != 0 || rs.Generation > rs.Status.ObservedGeneration {
			continue
		}
		err := c.client.AppsV1().ReplicaSets(rs.Namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &rs.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete old replica set %s/%s: %w", rs.Namespace, rs.Name, err)
		}
		c.log.Info("deleted old replica set beyond revisionHistoryLimit", "deployment", d.Namespace+"/"+d.Name, "replicaset", rs.Name)
	}
	return nil
}

func (c *Controller) calculateStatus(d *appsv1.Deployment, all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) appsv1.DeploymentStatus {
	available := sumStatus(all, statusAvailable)
	unavailable := max(0, sumSpec(all)-available)
	st := appsv1.DeploymentStatus{
		ObservedGeneration:  d.Generation,
		Replicas:            sumStatus(all, statusReplicas),
		UpdatedReplicas:     sumStatus([]*appsv1.ReplicaSet{newRS}, statusReplicas),
		ReadyReplicas:       sumStatus(all, statusReady),
		AvailableReplicas:   available,
		UnavailableReplicas: unavailable,
		CollisionCount:      d.Status.CollisionCount,
	}
	st.Conditions = append(st.Conditions, d.Status.Conditions...)
	if available >= replicas(d.Spec.Replicas)-MaxUnavailable(d) {
		SetCondition(&st, newCondition(appsv1.DeploymentAvailable, corev1.ConditionTrue, MinimumReplicasAvailable, "Deployment has minimum availability.", c.now()))
	} else {
		SetCondition(&st, newCondition(appsv1.DeploymentAvailable, corev1.ConditionFalse, MinimumReplicasUnavail, "Deployment does not have minimum availability.", c.now()))
	}
	return st
}

func rsOrDeployment(newRS *appsv1.ReplicaSet, d *appsv1.Deployment) string {
	if newRS != nil {
		return fmt.Sprintf("ReplicaSet %q", newRS.Name)
	}
	return fmt.Sprintf("Deployment %q", d.Name)
}

// syncRolloutStatus writes the status and the Progressing condition, and
// requeues the deployment for its progress deadline.
func (c *Controller) syncRolloutStatus(ctx context.Context, all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet, d *appsv1.Deployment) error {
	st := c.calculateStatus(d, all, newRS)
	deadline, hasDeadline := progressDeadline(d)
	if !hasDeadline {
		RemoveCondition(&st, appsv1.DeploymentProgressing)
	}
	cur := GetCondition(d.Status, appsv1.DeploymentProgressing)
	complete := st.Replicas == st.UpdatedReplicas && cur != nil && cur.Reason == NewRSAvailableReason
	now := c.now()
	if hasDeadline && !complete {
		switch {
		case DeploymentComplete(d, &st):
			SetCondition(&st, newCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue, NewRSAvailableReason,
				rsOrDeployment(newRS, d)+" has successfully progressed.", now))
		case DeploymentProgressing(d, &st):
			cond := newCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue, ReplicaSetUpdatedReason,
				rsOrDeployment(newRS, d)+" is progressing.", now)
			if cur != nil {
				if cur.Status == corev1.ConditionTrue {
					cond.LastTransitionTime = cur.LastTransitionTime
				}
				RemoveCondition(&st, appsv1.DeploymentProgressing)
			}
			SetCondition(&st, cond)
		case DeploymentTimedOut(d, &st, now):
			SetCondition(&st, newCondition(appsv1.DeploymentProgressing, corev1.ConditionFalse, TimedOutReason,
				rsOrDeployment(newRS, d)+" has timed out progressing.", now))
		}
	}
	if f := replicaFailure(all, newRS); f != nil {
		SetCondition(&st, *f)
	} else {
		RemoveCondition(&st, appsv1.DeploymentReplicaFailure)
	}
	if apiequality.Semantic.DeepEqual(d.Status, st) {
		c.requeueStuck(d, st, deadline, hasDeadline)
		return nil
	}
	d.Status = st
	return ignoreNotFound(c.updateStatus(ctx, d))
}

func replicaFailure(all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) *appsv1.DeploymentCondition {
	check := func(rs *appsv1.ReplicaSet) *appsv1.DeploymentCondition {
		if rs == nil {
			return nil
		}
		for _, c := range rs.Status.Conditions {
			if c.Type == appsv1.ReplicaSetReplicaFailure {
				return &appsv1.DeploymentCondition{Type: appsv1.DeploymentReplicaFailure, Status: c.Status,
					LastUpdateTime: c.LastTransitionTime, LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message}
			}
		}
		return nil
	}
	if f := check(newRS); f != nil {
		return f
	}
	for _, rs := range all {
		if f := check(rs); f != nil {
			return f
		}
	}
	return nil
}

// requeueStuck looks at the deployment again when its progress deadline
// passes, so ProgressDeadlineExceeded appears without another event.
func (c *Controller) requeueStuck(d *appsv1.Deployment, st appsv1.DeploymentStatus, deadline time.Duration, hasDeadline bool) {
	cur := GetCondition(d.Status, appsv1.DeploymentProgressing)
	if !hasDeadline || cur == nil || DeploymentComplete(d, &st) || cur.Reason == TimedOutReason {
		return
	}
	key := d.Namespace + "/" + d.Name
	after := cur.LastUpdateTime.Add(deadline).Sub(c.now())
	if after < time.Second {
		c.queue.AddRateLimited(key)
		return
	}
	c.queue.AddAfter(key, after+time.Second)
}
