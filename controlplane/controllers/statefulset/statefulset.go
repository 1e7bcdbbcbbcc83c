// Package statefulset is the StatefulSet controller: it gives each replica
// a stable identity as Kubernetes' does — pods named <set>-<ordinal>
// (from spec.ordinals.start) with hostname and subdomain (serviceName), the
// statefulset.kubernetes.io/pod-name and apps.kubernetes.io/pod-index
// labels; a PersistentVolumeClaim <template>-<set>-<ordinal> per
// volumeClaimTemplate, created before its pod and kept (or, by
// persistentVolumeClaimRetentionPolicy, owned by the set or the condemned pod
// so the garbage collector deletes it); OrderedReady (one ordinal at a time,
// each Running and Ready first, scale-down highest first) and Parallel pod
// management; ControllerRevisions for every template (controller-revision-hash
// on pods, currentRevision/updateRevision in status, revisionHistoryLimit),
// so `kubectl rollout history/undo/status statefulset` work; RollingUpdate
// from the highest ordinal down to the partition, maxUnavailable at a time,
// and OnDelete.
//
// It does not bind volumes (the PV controller does) or run pods.
package statefulset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
	"github.com/waggle-io/waggle/controlplane/controllers/internal/history"
)

// Name is the controller's name (queue and metrics label, --controllers).
const Name = "statefulset"

// Labels Kubernetes puts on StatefulSet pods.
const (
	PodNameLabel  = appsv1.StatefulSetPodNameLabel // statefulset.kubernetes.io/pod-name
	PodIndexLabel = appsv1.PodIndexLabel           // apps.kubernetes.io/pod-index
)

// Controller reconciles StatefulSets.
type Controller struct {
	client  kubernetes.Interface
	log     *slog.Logger
	queue   workqueue.TypedRateLimitingInterface[string]
	sets    appslisters.StatefulSetLister
	pods    corelisters.PodLister
	revs    appslisters.ControllerRevisionLister
	pvcs    corelisters.PersistentVolumeClaimLister
	synced  []cache.InformerSynced
	now     func() time.Time
	rec     record.EventRecorder
	stopRec func()
}

// New wires the controller to the factory's StatefulSet, Pod,
// ControllerRevision and PersistentVolumeClaim informers.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger) *Controller {
	setInf := factory.Apps().V1().StatefulSets()
	podInf := factory.Core().V1().Pods()
	revInf := factory.Apps().V1().ControllerRevisions()
	pvcInf := factory.Core().V1().PersistentVolumeClaims()
	c := &Controller{
		client: client, log: log.With("controller", Name), queue: ctrlutil.NewQueue(Name),
		sets: setInf.Lister(), pods: podInf.Lister(), revs: revInf.Lister(), pvcs: pvcInf.Lister(),
		synced: []cache.InformerSynced{setInf.Informer().HasSynced, podInf.Informer().HasSynced,
			revInf.Informer().HasSynced, pvcInf.Informer().HasSynced},
		now: time.Now,
	}
	c.rec, c.stopRec = ctrlutil.NewRecorder(client, "statefulset-controller")
	setInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue, UpdateFunc: func(_, cur any) { c.enqueue(cur) }, DeleteFunc: c.enqueue,
	})
	byOwner := func(obj any) {
		o, ok := ctrlutil.Unwrap(obj).(metav1.Object)
		if !ok {
			return
		}
		if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "StatefulSet" {
			c.queue.Add(o.GetNamespace() + "/" + ref.Name)
			return
		}
		if p, ok := o.(*corev1.Pod); ok {
			c.enqueueMatching(p)
		}
	}
	podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: byOwner,
		UpdateFunc: func(old, cur any) {
			op, np := old.(*corev1.Pod), cur.(*corev1.Pod)
			if ctrlutil.SameVersion(op, np) {
				return
			}
			byOwner(cur)
			if ref := metav1.GetControllerOf(np); ref != nil && ref.Kind == "StatefulSet" && !ctrlutil.IsPodReady(op) && ctrlutil.IsPodReady(np) {
				if set, err := c.sets.StatefulSets(np.Namespace).Get(ref.Name); err == nil && set.Spec.MinReadySeconds > 0 {
					c.queue.AddAfter(np.Namespace+"/"+ref.Name, time.Duration(set.Spec.MinReadySeconds)*time.Second+time.Second)
				}
			}
		},
		DeleteFunc: byOwner,
	})
	revInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: byOwner})
	return c
}

func (c *Controller) enqueue(obj any) {
	if k := ctrlutil.KeyFunc(obj); k != "" {
		c.queue.Add(k)
	}
}

func (c *Controller) enqueueMatching(p *corev1.Pod) {
	list, err := c.sets.StatefulSets(p.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, s := range list {
		sel, err := metav1.LabelSelectorAsSelector(s.Spec.Selector)
		if err == nil && !sel.Empty() && sel.Matches(labels.Set(p.Labels)) {
			c.queue.Add(p.Namespace + "/" + s.Name)
		}
	}
}

// Run runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.stopRec()
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced...)
}

// ordinalOf parses <set>-<ordinal>; -1 when the pod is not a member.
func ordinalOf(set *appsv1.StatefulSet, name string) int {
	rest, ok := strings.CutPrefix(name, set.Name+"-")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || strconv.Itoa(n) != rest {
		return -1
	}
	return n
}

func replicasOf(set *appsv1.StatefulSet) int {
	if set.Spec.Replicas == nil {
		return 1
	}
	return int(*set.Spec.Replicas)
}

func startOrdinal(set *appsv1.StatefulSet) int {
	if set.Spec.Ordinals != nil {
		return int(set.Spec.Ordinals.Start)
	}
	return 0
}

func parallel(set *appsv1.StatefulSet) bool {
	return set.Spec.PodManagementPolicy == appsv1.ParallelPodManagement
}

// ClaimName is the PVC of volumeClaimTemplate tmpl for ordinal.
func ClaimName(set *appsv1.StatefulSet, tmpl string, ordinal int) string {
	return fmt.Sprintf("%s-%s-%d", tmpl, set.Name, ordinal)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	cached, err := c.sets.StatefulSets(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	set := cached.DeepCopy()
	sel, err := metav1.LabelSelectorAsSelector(set.Spec.Selector)
	if err != nil {
		c.log.Warn("invalid selector", "statefulset", key, "err", err)
		return nil
	}
	all, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	var members []*corev1.Pod
	for _, p := range all {
		if ordinalOf(set, p.Name) >= 0 {
			members = append(members, p)
		}
	}
	cl := &ctrlutil.Claimer[*corev1.Pod]{
		Owner: set, APIVersion: "apps/v1", Kind: "StatefulSet", Selector: sel,
		CanAdopt: ctrlutil.RecheckOwner(set, func(ctx context.Context) (metav1.Object, error) {
			return c.client.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
		}),
		Patch: func(ctx context.Context, name string, data []byte) error {
			_, err := c.client.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
			return err
		},
		Copy: func(p *corev1.Pod) *corev1.Pod { return p.DeepCopy() },
	}
	pods, claimErr := cl.Claim(ctx, members)

	revs, err := c.ownedRevisions(ctx, set, sel)
	if err != nil {
		return errors.Join(claimErr, err)
	}
	cur, upd, collisions, err := c.revisions(ctx, set, revs)
	if err != nil {
		return errors.Join(claimErr, err)
	}
	var manageErr error
	if set.DeletionTimestamp == nil {
		manageErr = c.manage(ctx, set, cur, upd, pods)
	}
	// Recompute status from the cache: what was written now shows up on
	// the next sync.
	st := c.status(set, cur, upd, collisions, pods)
	if !apiequality.Semantic.DeepEqual(cached.Status, st) {
		set.Status = st
		if _, err := c.client.AppsV1().StatefulSets(ns).UpdateStatus(ctx, set, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return errors.Join(claimErr, manageErr, fmt.Errorf("update status of statefulset %s: %w", key, err))
		}
	}
	live := map[string]bool{st.CurrentRevision: true, st.UpdateRevision: true}
	for _, p := range pods {
		live[p.Labels[appsv1.ControllerRevisionHashLabelKey]] = true
	}
	limit := 10
	if set.Spec.RevisionHistoryLimit != nil {
		limit = int(*set.Spec.RevisionHistoryLimit)
	}
	histErr := history.Truncate(ctx, c.client, revs, live, limit)
	if manageErr == nil && set.Spec.MinReadySeconds > 0 && st.AvailableReplicas < st.ReadyReplicas {
		c.queue.AddAfter(key, time.Duration(set.Spec.MinReadySeconds)*time.Second)
	}
	return errors.Join(claimErr, manageErr, histErr)
}

// ownedRevisions returns the set's revisions, adopting orphans that match
// its selector.
func (c *Controller) ownedRevisions(ctx context.Context, set *appsv1.StatefulSet, sel labels.Selector) ([]*appsv1.ControllerRevision, error) {
	list, err := c.revs.ControllerRevisions(set.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	cl := &ctrlutil.Claimer[*appsv1.ControllerRevision]{
		Owner: set, APIVersion: "apps/v1", Kind: "StatefulSet", Selector: sel,
		Patch: func(ctx context.Context, name string, data []byte) error {
			_, err := c.client.AppsV1().ControllerRevisions(set.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
			return err
		},
		Copy: func(r *appsv1.ControllerRevision) *appsv1.ControllerRevision { return r.DeepCopy() },
	}
	revs, err := cl.Claim(ctx, list)
	history.Sort(revs)
	return revs, err
}

// revisions finds or creates the update revision (the set's template now)
// and the current one (status.currentRevision, else the update revision).
func (c *Controller) revisions(ctx context.Context, set *appsv1.StatefulSet, revs []*appsv1.ControllerRevision) (cur, upd *appsv1.ControllerRevision, collisions int32, err error) {
	if set.Status.CollisionCount != nil {
		collisions = *set.Status.CollisionCount
	}
	data, err := history.TemplatePatch(set)
	if err != nil {
		return nil, nil, 0, err
	}
	want := history.New(set, "apps/v1", "StatefulSet", set.Spec.Template.Labels, data, history.NextRevision(revs), &collisions)
	var equal []*appsv1.ControllerRevision
	for _, r := range revs {
		if history.Equal(r, want) {
			equal = append(equal, r)
		}
	}
	switch {
	case len(equal) > 0 && equal[len(equal)-1] == revs[len(revs)-1]:
		upd = revs[len(revs)-1] // unchanged template
	case len(equal) > 0:
		// An older template came back (rollout undo): it becomes the newest.
		if upd, err = history.Bump(ctx, c.client, equal[len(equal)-1], want.Revision); err != nil {
			return nil, nil, 0, err
		}
	default:
		if upd, err = history.Create(ctx, c.client, set, "apps/v1", "StatefulSet", set.Spec.Template.Labels, data, want.Revision, &collisions); err != nil {
			return nil, nil, 0, err
		}
	}
	cur = upd
	for _, r := range revs {
		if r.Name == set.Status.CurrentRevision {
			cur = r
		}
	}
	if cur.Name == upd.Name {
		cur = upd
	}
	return cur, upd, collisions, nil
}

// fromRevision returns the set as the revision describes it (its template
// patched in).
func fromRevision(set *appsv1.StatefulSet, rev *appsv1.ControllerRevision) (*appsv1.StatefulSet, error) {
	orig, err := json.Marshal(set)
	if err != nil {
		return nil, err
	}
	patched, err := strategicpatch.StrategicMergePatch(orig, rev.Data.Raw, set)
	if err != nil {
		return nil, err
	}
	out := &appsv1.StatefulSet{}
	if err := json.Unmarshal(patched, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *Controller) podHealthy(set *appsv1.StatefulSet, p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning &&
		ctrlutil.IsPodAvailable(p, set.Spec.MinReadySeconds, c.now())
}

// manage creates, replaces and deletes pods towards the desired replicas and
// the update revision.
func (c *Controller) manage(ctx context.Context, set *appsv1.StatefulSet, cur, upd *appsv1.ControllerRevision, pods []*corev1.Pod) error {
	curSet, err := fromRevision(set, cur)
	if err != nil {
		return fmt.Errorf("apply revision %s: %w", cur.Name, err)
	}
	start, n := startOrdinal(set), replicasOf(set)
	byOrd := map[int]*corev1.Pod{}
	var condemned []*corev1.Pod
	for _, p := range pods {
		o := ordinalOf(set, p.Name)
		if o >= start && o < start+n {
			byOrd[o] = p
		} else {
			condemned = append(condemned, p)
		}
	}
	sort.Slice(condemned, func(i, j int) bool { return ordinalOf(set, condemned[i].Name) > ordinalOf(set, condemned[j].Name) })
	partition := 0
	if ru := set.Spec.UpdateStrategy.RollingUpdate; set.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType && ru != nil && ru.Partition != nil {
		partition = int(*ru.Partition)
	}
	ordered := !parallel(set)
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	addErr := func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }

	// Replicas: create the missing, replace the failed, in ordinal order.
	for o := start; o < start+n; o++ {
		p := byOrd[o]
		switch {
		case p == nil:
			revSet, rev := set, upd
			if set.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType && o < start+partition {
				revSet, rev = curSet, cur
			}
			if ordered {
				return c.createPod(ctx, set, revSet, rev.Name, o)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := c.createPod(ctx, set, revSet, rev.Name, o); err != nil {
					addErr(err)
				}
			}()
			continue
		case ctrlutil.IsPodTerminal(p) && p.DeletionTimestamp == nil:
			// A failed (or succeeded) pod is deleted and recreated with
			// the same identity.
			c.rec.Eventf(set, corev1.EventTypeWarning, "RecreatingFailedPod", "StatefulSet %s/%s is recreating failed Pod %s", set.Namespace, set.Name, p.Name)
			if err := c.deletePod(ctx, set, p); err != nil {
				return err
			}
			if ordered {
				return nil
			}
			continue
		}
		if err := c.ensureClaims(ctx, set, p, o); err != nil {
			addErr(err)
		}
		if ordered && !c.podHealthy(set, p) {
			wg.Wait()
			return errors.Join(errs...) // wait for this ordinal before the next
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	// Scale down: the highest condemned ordinal first.
	for _, p := range condemned {
		if p.DeletionTimestamp != nil {
			if ordered {
				return nil
			}
			continue
		}
		if ordered {
			for _, q := range pods {
				if q != p && !c.podHealthy(set, q) && ordinalOf(set, q.Name) < ordinalOf(set, p.Name) {
					return nil // a predecessor is unhealthy: wait
				}
			}
		}
		if err := c.condemnClaims(ctx, set, p); err != nil {
			return err
		}
		if err := c.deletePod(ctx, set, p); err != nil {
			return err
		}
		if ordered {
			return nil
		}
	}

	if set.Spec.UpdateStrategy.Type == appsv1.OnDeleteStatefulSetStrategyType {
		return nil
	}
	// Rolling update: highest ordinal first, down to the partition, at most
	// maxUnavailable unavailable at once.
	maxUnavail := 1
	if ru := set.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		v, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, n, false)
		if err == nil {
			maxUnavail = max(v, 1)
		}
	}
	unavailable := 0
	for o := start + partition; o < start+n; o++ {
		if p := byOrd[o]; p == nil || !c.podHealthy(set, p) {
			unavailable++
		}
	}
	for o := start + n - 1; o >= start+partition && unavailable < maxUnavail; o-- {
		p := byOrd[o]
		if p == nil || p.DeletionTimestamp != nil {
			continue
		}
		if p.Labels[appsv1.ControllerRevisionHashLabelKey] == upd.Name {
			continue
		}
		c.rec.Eventf(set, corev1.EventTypeNormal, "SuccessfulDelete", "delete Pod %s in StatefulSet %s successful", p.Name, set.Name)
		if err := c.deletePodQuiet(ctx, p); err != nil {
			return err
		}
		if c.podHealthy(set, p) {
			unavailable++
		}
	}
	return nil
}

// newPod is ordinal's pod of the set as revSet describes it.
func newPod(set, revSet *appsv1.StatefulSet, revision string, ordinal int) *corev1.Pod {
	p := ctrlutil.PodFromTemplate(set, &revSet.Spec.Template, "apps/v1", "StatefulSet")
	name := fmt.Sprintf("%s-%d", set.Name, ordinal)
	p.GenerateName, p.Name = "", name
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[PodNameLabel] = name
	p.Labels[PodIndexLabel] = strconv.Itoa(ordinal)
	p.Labels[appsv1.ControllerRevisionHashLabelKey] = revision
	p.Spec.Hostname = name
	p.Spec.Subdomain = set.Spec.ServiceName
	for _, t := range set.Spec.VolumeClaimTemplates {
		v := corev1.Volume{Name: t.Name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ClaimName(set, t.Name, ordinal)}}}
		replaced := false
		for i := range p.Spec.Volumes {
			if p.Spec.Volumes[i].Name == t.Name {
				p.Spec.Volumes[i], replaced = v, true
			}
		}
		if !replaced {
			p.Spec.Volumes = append(p.Spec.Volumes, v)
		}
	}
	return p
}

func (c *Controller) createPod(ctx context.Context, set, revSet *appsv1.StatefulSet, revision string, ordinal int) error {
	p := newPod(set, revSet, revision, ordinal)
	if err := c.ensureClaims(ctx, set, p, ordinal); err != nil {
		return err
	}
	_, err := c.client.CoreV1().Pods(set.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return nil
	}
	if err != nil {
		c.rec.Eventf(set, corev1.EventTypeWarning, "FailedCreate", "create Pod %s in StatefulSet %s failed error: %v", p.Name, set.Name, err)
		return fmt.Errorf("create pod %s: %w", p.Name, err)
	}
	c.rec.Eventf(set, corev1.EventTypeNormal, "SuccessfulCreate", "create Pod %s in StatefulSet %s successful", p.Name, set.Name)
	return nil
}

func (c *Controller) deletePod(ctx context.Context, set *appsv1.StatefulSet, p *corev1.Pod) error {
	if err := c.deletePodQuiet(ctx, p); err != nil {
		c.rec.Eventf(set, corev1.EventTypeWarning, "FailedDelete", "delete Pod %s in StatefulSet %s failed error: %v", p.Name, set.Name, err)
		return err
	}
	c.rec.Eventf(set, corev1.EventTypeNormal, "SuccessfulDelete", "delete Pod %s in StatefulSet %s successful", p.Name, set.Name)
	return nil
}

func (c *Controller) deletePodQuiet(ctx context.Context, p *corev1.Pod) error {
	err := c.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s: %w", p.Name, err)
	}
	return nil
}

func retention(set *appsv1.StatefulSet) (whenDeleted, whenScaled appsv1.PersistentVolumeClaimRetentionPolicyType) {
	whenDeleted, whenScaled = appsv1.RetainPersistentVolumeClaimRetentionPolicyType, appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	if r := set.Spec.PersistentVolumeClaimRetentionPolicy; r != nil {
		if r.WhenDeleted != "" {
			whenDeleted = r.WhenDeleted
		}
		if r.WhenScaled != "" {
			whenScaled = r.WhenScaled
		}
	}
	return whenDeleted, whenScaled
}

// ensureClaims creates the pod's missing PVCs and sets their owners by the
// retention policy (the set when whenDeleted is Delete).
func (c *Controller) ensureClaims(ctx context.Context, set *appsv1.StatefulSet, p *corev1.Pod, ordinal int) error {
	whenDeleted, _ := retention(set)
	for _, t := range set.Spec.VolumeClaimTemplates {
		name := ClaimName(set, t.Name, ordinal)
		existing, err := c.pvcs.PersistentVolumeClaims(set.Namespace).Get(name)
		if err == nil {
			if existing.DeletionTimestamp != nil {
				return fmt.Errorf("pvc %s is being deleted; pod %s waits for it", name, p.Name)
			}
			if err := c.setClaimOwner(ctx, existing, set, whenDeleted == appsv1.DeletePersistentVolumeClaimRetentionPolicyType); err != nil {
				return err
			}
			continue
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		claim := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: set.Namespace, Labels: map[string]string{}, Annotations: t.Annotations},
			Spec:       *t.Spec.DeepCopy(),
		}
		for k, v := range t.Labels {
			claim.Labels[k] = v
		}
		if set.Spec.Selector != nil {
			for k, v := range set.Spec.Selector.MatchLabels {
				claim.Labels[k] = v
			}
		}
		if whenDeleted == appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
			claim.OwnerReferences = []metav1.OwnerReference{setOwnerRef(set)}
		}
		_, err = c.client.CoreV1().PersistentVolumeClaims(set.Namespace).Create(ctx, claim, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			c.rec.Eventf(set, corev1.EventTypeWarning, "FailedCreate", "create Claim %s for Pod %s in StatefulSet %s failed error: %v", name, p.Name, set.Name, err)
			return fmt.Errorf("create pvc %s: %w", name, err)
		}
		if err == nil {
			c.rec.Eventf(set, corev1.EventTypeNormal, "SuccessfulCreate", "create Claim %s Pod %s in StatefulSet %s success", name, p.Name, set.Name)
		}
	}
	return nil
}

func setOwnerRef(set *appsv1.StatefulSet) metav1.OwnerReference {
	t := true
	return metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: set.Name, UID: set.UID, BlockOwnerDeletion: &t}
}

// setClaimOwner adds (want) or removes the set's ownerReference on a claim.
func (c *Controller) setClaimOwner(ctx context.Context, claim *corev1.PersistentVolumeClaim, set *appsv1.StatefulSet, want bool) error {
	has := false
	for _, r := range claim.OwnerReferences {
		if r.UID == set.UID {
			has = true
		}
	}
	if has == want {
		return nil
	}
	cp := claim.DeepCopy()
	if want {
		cp.OwnerReferences = append(cp.OwnerReferences, setOwnerRef(set))
	} else {
		var refs []metav1.OwnerReference
		for _, r := range cp.OwnerReferences {
			if r.UID != set.UID {
				refs = append(refs, r)
			}
		}
		cp.OwnerReferences = refs
	}
	_, err := c.client.CoreV1().PersistentVolumeClaims(cp.Namespace).Update(ctx, cp, metav1.UpdateOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("set owner of pvc %s: %w", cp.Name, err)
	}
	return nil
}

// condemnClaims makes the claims of a pod removed by scale-down owned by
// that pod when whenScaled is Delete, so they go with it.
func (c *Controller) condemnClaims(ctx context.Context, set *appsv1.StatefulSet, p *corev1.Pod) error {
	if _, whenScaled := retention(set); whenScaled != appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
		return nil
	}
	o := ordinalOf(set, p.Name)
	for _, t := range set.Spec.VolumeClaimTemplates {
		claim, err := c.pvcs.PersistentVolumeClaims(set.Namespace).Get(ClaimName(set, t.Name, o))
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		owned := false
		for _, r := range claim.OwnerReferences {
			owned = owned || r.UID == p.UID
		}
		if owned {
			continue
		}
		cp := claim.DeepCopy()
		cp.OwnerReferences = append(cp.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID})
		if _, err := c.client.CoreV1().PersistentVolumeClaims(cp.Namespace).Update(ctx, cp, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("give pvc %s to pod %s: %w", cp.Name, p.Name, err)
		}
	}
	return nil
}

func (c *Controller) status(set *appsv1.StatefulSet, cur, upd *appsv1.ControllerRevision, collisions int32, pods []*corev1.Pod) appsv1.StatefulSetStatus {
	st := *set.Status.DeepCopy()
	st.ObservedGeneration = set.Generation
	st.CollisionCount = &collisions
	st.CurrentRevision, st.UpdateRevision = cur.Name, upd.Name
	st.Replicas, st.ReadyReplicas, st.AvailableReplicas, st.CurrentReplicas, st.UpdatedReplicas = 0, 0, 0, 0, 0
	now := c.now()
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		st.Replicas++
		if ctrlutil.IsPodReady(p) && p.Status.Phase == corev1.PodRunning {
			st.ReadyReplicas++
			if ctrlutil.IsPodAvailable(p, set.Spec.MinReadySeconds, now) {
				st.AvailableReplicas++
			}
		}
		switch p.Labels[appsv1.ControllerRevisionHashLabelKey] {
		case cur.Name:
			st.CurrentReplicas++
			if cur.Name == upd.Name {
				st.UpdatedReplicas++
			}
		case upd.Name:
			st.UpdatedReplicas++
		}
	}
	// The rollout is complete: the update revision becomes current.
	n := int32(replicasOf(set))
	if st.UpdatedReplicas == n && st.ReadyReplicas == n && st.Replicas == n {
		st.CurrentRevision = upd.Name
		st.CurrentReplicas = st.UpdatedReplicas
	}
	return st
}
