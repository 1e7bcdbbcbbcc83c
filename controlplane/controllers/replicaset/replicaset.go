// Package replicaset is the ReplicaSet controller: it keeps spec.replicas
// pods running for every ReplicaSet, as Kubernetes' does — pods created from
// the template with generateName and a controller ownerReference, in
// slow-start batches (1, 2, 4, ...), guarded by expectations so a stale cache
// never causes double creation; orphans matching the selector are adopted and
// owned pods that stop matching are released; surplus pods are deleted
// least-valuable first (unscheduled, pending, not ready, most recently ready);
// and status (replicas, fullyLabeledReplicas, readyReplicas,
// availableReplicas with minReadySeconds, observedGeneration) is written
// through the status subresource.
//
// It does not schedule or run pods; the scheduler and kubelets do.
package replicaset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
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
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name (queue and metrics label, --controllers).
const Name = "replicaset"

// Options tune the controller.
type Options struct {
	// BurstReplicas caps the pods created or deleted in one sync (default
	// 500, as Kubernetes).
	BurstReplicas int
}

// Controller reconciles ReplicaSets with their pods.
type Controller struct {
	client  kubernetes.Interface
	log     *slog.Logger
	opts    Options
	queue   workqueue.TypedRateLimitingInterface[string]
	b       backend
	pods    corelisters.PodLister
	synced  []cache.InformerSynced
	exp     *ctrlutil.Expectations
	now     func() time.Time
	rec     record.EventRecorder
	stopRec func()
}

// New wires the controller to the factory's ReplicaSet and Pod informers.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	rsInf := factory.Apps().V1().ReplicaSets()
	return newController(client, factory, log, opts, rsBackend{client: client, lister: rsInf.Lister()}, rsInf.Informer())
}

func newController(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options, b backend, ownerInf cache.SharedIndexInformer) *Controller {
	if opts.BurstReplicas <= 0 {
		opts.BurstReplicas = 500
	}
	podInf := factory.Core().V1().Pods()
	c := &Controller{
		client: client, log: log.With("controller", b.name()), opts: opts,
		queue: ctrlutil.NewQueue(b.name()),
		b:     b, pods: podInf.Lister(),
		synced: []cache.InformerSynced{ownerInf.HasSynced, podInf.Informer().HasSynced},
		exp:    ctrlutil.NewExpectations(), now: time.Now,
	}
	c.rec, c.stopRec = ctrlutil.NewRecorder(client, b.component())
	c.watch(ownerInf, podInf.Informer())
	return c
}

func (c *Controller) watch(ownerInf cache.SharedIndexInformer, podInf cache.SharedIndexInformer) {
	ownerInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		UpdateFunc: func(old, cur any) {
			// A shrinking selector can release pods; a grown replicas must be
			// acted on now. Every change is cheap to sync.
			c.enqueue(cur)
		},
		DeleteFunc: func(obj any) {
			if k := ctrlutil.KeyFunc(obj); k != "" {
				c.exp.Forget(k)
				c.queue.Add(k)
			}
		},
	})
	podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			pod := obj.(*corev1.Pod)
			if pod.DeletionTimestamp != nil {
				c.deletePod(pod)
				return
			}
			if rs := c.resolveRef(pod); rs != "" {
				c.exp.CreationObserved(rs)
				c.queue.Add(rs)
				return
			}
			c.enqueueMatching(pod)
		},
		UpdateFunc: func(old, cur any) {
			op, np := old.(*corev1.Pod), cur.(*corev1.Pod)
			if ctrlutil.SameVersion(op, np) {
				return
			}
			if np.DeletionTimestamp != nil && op.DeletionTimestamp == nil {
				c.deletePod(np)
			}
			oref, nref := c.resolveRef(op), c.resolveRef(np)
			if oref != "" && oref != nref {
				c.queue.Add(oref)
			}
			if nref != "" {
				c.queue.Add(nref)
				// A pod that just became ready becomes available
				// minReadySeconds later: look again then.
				if !ctrlutil.IsPodReady(op) && ctrlutil.IsPodReady(np) {
					if rs, err := c.rsByKey(nref); err == nil && rs.Spec.MinReadySeconds > 0 {
						c.queue.AddAfter(nref, time.Duration(rs.Spec.MinReadySeconds)*time.Second+time.Second)
					}
				}
			}
			if nref == "" || !apiequality.Semantic.DeepEqual(op.Labels, np.Labels) {
				c.enqueueMatching(np)
			}
		},
		DeleteFunc: func(obj any) {
			if pod, ok := ctrlutil.Unwrap(obj).(*corev1.Pod); ok {
				c.deletePod(pod)
			}
		},
	})
}

func (c *Controller) deletePod(pod *corev1.Pod) {
	if rs := c.resolveRef(pod); rs != "" {
		c.exp.DeletionObserved(rs, pod.Namespace+"/"+pod.Name)
		c.queue.Add(rs)
	}
}

func (c *Controller) enqueue(obj any) {
	if k := ctrlutil.KeyFunc(obj); k != "" {
		c.queue.Add(k)
	}
}

func (c *Controller) rsByKey(key string) (*appsv1.ReplicaSet, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, err
	}
	return c.b.get(ns, name)
}

// resolveRef returns the key of the ReplicaSet that controls pod, if it is
// one this controller knows (same UID).
func (c *Controller) resolveRef(pod *corev1.Pod) string {
	rs, ok := ctrlutil.ResolveController(pod, c.b.kind(), c.b.get)
	if !ok {
		return ""
	}
	return pod.Namespace + "/" + rs.Name
}

// enqueueMatching enqueues every ReplicaSet whose selector matches an orphan
// (it may adopt it) or a pod whose labels changed.
func (c *Controller) enqueueMatching(pod *corev1.Pod) {
	list, err := c.b.list(pod.Namespace)
	if err != nil {
		return
	}
	for _, rs := range list {
		sel, err := metav1.LabelSelectorAsSelector(rs.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		c.queue.Add(pod.Namespace + "/" + rs.Name)
	}
}

// Run runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.stopRec()
	ctrlutil.RunWorkers(ctx, c.log, c.b.name(), c.queue, workers, c.sync, c.synced...)
}

// Queue exposes the work queue, for tests and the manager's readiness.
func (c *Controller) Queue() workqueue.TypedRateLimitingInterface[string] { return c.queue }

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	cached, err := c.b.get(ns, name)
	if apierrors.IsNotFound(err) {
		c.exp.Forget(key)
		return nil
	}
	if err != nil {
		return err
	}
	rs := cached.DeepCopy()
	sel, err := metav1.LabelSelectorAsSelector(rs.Spec.Selector)
	if err != nil {
		c.log.Warn("invalid selector", "replicaset", key, "err", err)
		return nil
	}
	satisfied := c.exp.Satisfied(key)
	all, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	var live []*corev1.Pod
	for _, p := range all {
		if !ctrlutil.IsPodTerminal(p) {
			live = append(live, p)
		}
	}
	cl := &ctrlutil.Claimer[*corev1.Pod]{
		Owner: rs, APIVersion: c.b.apiVersion(), Kind: c.b.kind(), Selector: sel,
		CanAdopt: ctrlutil.RecheckOwner(rs, func(ctx context.Context) (metav1.Object, error) {
			return c.b.getLive(ctx, ns, name)
		}),
		Patch: func(ctx context.Context, name string, data []byte) error {
			_, err := c.client.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
			return err
		},
		Copy: func(p *corev1.Pod) *corev1.Pod { return p.DeepCopy() },
	}
	owned, claimErr := cl.Claim(ctx, live)
	var active []*corev1.Pod
	for _, p := range owned {
		if ctrlutil.IsPodActive(p) {
			active = append(active, p)
		}
	}
	var manageErr error
	if satisfied && rs.DeletionTimestamp == nil {
		manageErr = c.manage(ctx, key, active, rs)
	}
	status := c.status(rs, active, manageErr)
	if err := c.writeStatus(ctx, rs, status); err != nil {
		return err
	}
	if manageErr == nil && claimErr == nil && rs.Spec.MinReadySeconds > 0 &&
		status.ReadyReplicas == replicas(rs) && status.AvailableReplicas != replicas(rs) {
		c.queue.AddAfter(key, time.Duration(rs.Spec.MinReadySeconds)*time.Second)
	}
	return errors.Join(claimErr, manageErr)
}

func replicas(rs *appsv1.ReplicaSet) int32 {
	if rs.Spec.Replicas == nil {
		return 1
	}
	return *rs.Spec.Replicas
}

// manage creates or deletes pods so that len(active) approaches spec.replicas.
func (c *Controller) manage(ctx context.Context, key string, active []*corev1.Pod, rs *appsv1.ReplicaSet) error {
	diff := len(active) - int(replicas(rs))
	switch {
	case diff < 0:
		n := min(-diff, c.opts.BurstReplicas)
		c.exp.ExpectCreations(key, n)
		created, err := ctrlutil.SlowStartBatch(n, 1, func() error {
			pod := ctrlutil.PodFromTemplate(rs, &rs.Spec.Template, c.b.apiVersion(), c.b.kind())
			created, err := c.client.CoreV1().Pods(rs.Namespace).Create(ctx, pod, metav1.CreateOptions{})
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				return nil // the namespace is going away; nothing to do
			}
			if err != nil {
				c.rec.Eventf(c.b.eventObject(rs), corev1.EventTypeWarning, "FailedCreate", "Error creating: %v", err)
				return err
			}
			c.rec.Eventf(c.b.eventObject(rs), corev1.EventTypeNormal, "SuccessfulCreate", "Created pod: %v", created.Name)
			return nil
		})
		// Creations that were never attempted or failed will not be observed.
		for i := created; i < n; i++ {
			c.exp.CreationObserved(key)
		}
		if err != nil {
			return fmt.Errorf("create pods for %s: %w", key, err)
		}
	case diff > 0:
		n := min(diff, c.opts.BurstReplicas)
		victims := PodsToDelete(active, n)
		keys := make([]string, len(victims))
		for i, p := range victims {
			keys[i] = p.Namespace + "/" + p.Name
		}
		c.exp.ExpectDeletions(key, keys)
		var mu sync.Mutex
		var errs []error
		var wg sync.WaitGroup
		for i, p := range victims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := c.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
				if err == nil {
					c.rec.Eventf(c.b.eventObject(rs), corev1.EventTypeNormal, "SuccessfulDelete", "Deleted pod: %v", p.Name)
				}
				if err != nil {
					c.exp.DeletionObserved(key, keys[i])
					if !apierrors.IsNotFound(err) {
						c.rec.Eventf(c.b.eventObject(rs), corev1.EventTypeWarning, "FailedDelete", "Error deleting: %v", err)
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("delete pods of %s: %w", key, err)
		}
	}
	return nil
}

// PodsToDelete picks the n least valuable pods, as Kubernetes ranks them:
// unscheduled before scheduled, pending before unknown before running, not
// ready before ready, lower controller.kubernetes.io/pod-deletion-cost
// first, pods doubled up on a node before lone ones, ready for less time
// before ready for longer, more restarts before fewer, newer before older.
func PodsToDelete(pods []*corev1.Pod, n int) []*corev1.Pod {
	s := append([]*corev1.Pod(nil), pods...)
	onNode := map[string]int{}
	for _, p := range s {
		if p.Spec.NodeName != "" {
			onNode[p.Spec.NodeName]++
		}
	}
	sort.SliceStable(s, func(i, j int) bool { return lessValuable(s[i], s[j], onNode) })
	if n > len(s) {
		n = len(s)
	}
	return s[:n]
}

var phaseRank = map[corev1.PodPhase]int{corev1.PodPending: 0, corev1.PodUnknown: 1, corev1.PodRunning: 2}

// deletionCost reads the controller.kubernetes.io/pod-deletion-cost
// annotation (0 when absent or invalid).
func deletionCost(p *corev1.Pod) int64 {
	v, err := strconv.ParseInt(p.Annotations[corev1.PodDeletionCost], 10, 32)
	if err != nil {
		return 0
	}
	return v
}

func lessValuable(a, b *corev1.Pod, onNode map[string]int) bool {
	if (a.Spec.NodeName == "") != (b.Spec.NodeName == "") {
		return a.Spec.NodeName == ""
	}
	if phaseRank[a.Status.Phase] != phaseRank[b.Status.Phase] {
		return phaseRank[a.Status.Phase] < phaseRank[b.Status.Phase]
	}
	ar, br := ctrlutil.IsPodReady(a), ctrlutil.IsPodReady(b)
	if ar != br {
		return !ar
	}
	if ca, cb := deletionCost(a), deletionCost(b); ca != cb {
		return ca < cb
	}
	if na, nb := onNode[a.Spec.NodeName], onNode[b.Spec.NodeName]; na != nb {
		return na > nb
	}
	if ar && br {
		at, bt := ctrlutil.PodReadyCondition(a).LastTransitionTime, ctrlutil.PodReadyCondition(b).LastTransitionTime
		if !at.Equal(&bt) {
			return bt.Before(&at) // ready more recently is worth less
		}
	}
	if ra, rb := restarts(a), restarts(b); ra != rb {
		return ra > rb
	}
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	return a.Name > b.Name
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

func (c *Controller) status(rs *appsv1.ReplicaSet, active []*corev1.Pod, manageErr error) appsv1.ReplicaSetStatus {
	st := *rs.Status.DeepCopy()
	st.Replicas = int32(len(active))
	st.FullyLabeledReplicas, st.ReadyReplicas, st.AvailableReplicas = 0, 0, 0
	tmpl := labels.Set(rs.Spec.Template.Labels).AsSelectorPreValidated()
	now := c.now()
	for _, p := range active {
		if tmpl.Matches(labels.Set(p.Labels)) {
			st.FullyLabeledReplicas++
		}
		if ctrlutil.IsPodReady(p) {
			st.ReadyReplicas++
			if ctrlutil.IsPodAvailable(p, rs.Spec.MinReadySeconds, now) {
				st.AvailableReplicas++
			}
		}
	}
	// ReplicaFailure reports a failed create/delete; it clears once the
	// controller manages again.
	var conds []appsv1.ReplicaSetCondition
	for _, cond := range st.Conditions {
		if cond.Type != appsv1.ReplicaSetReplicaFailure {
			conds = append(conds, cond)
		}
	}
	if manageErr != nil {
		reason := "FailedCreate"
		if len(active) > int(replicas(rs)) {
			reason = "FailedDelete"
		}
		conds = append(conds, appsv1.ReplicaSetCondition{
			Type: appsv1.ReplicaSetReplicaFailure, Status: corev1.ConditionTrue,
			LastTransitionTime: metav1.NewTime(now), Reason: reason, Message: manageErr.Error(),
		})
	}
	st.Conditions = conds
	st.ObservedGeneration = rs.Generation
	return st
}

func (c *Controller) writeStatus(ctx context.Context, rs *appsv1.ReplicaSet, st appsv1.ReplicaSetStatus) error {
	if apiequality.Semantic.DeepEqual(rs.Status, st) {
		return nil
	}
	rs.Status = st
	err := c.b.updateStatus(ctx, rs)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("update status of %s/%s: %w", rs.Namespace, rs.Name, err)
	}
	return nil
}
