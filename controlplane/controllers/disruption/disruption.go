// Package disruption is the disruption controller: it keeps every
// PodDisruptionBudget's status as Kubernetes' does — currentHealthy (ready
// pods not being deleted and not just evicted), desiredHealthy and
// expectedPods (from minAvailable as a number, or, for a percentage or
// maxUnavailable, from the scale of the pods' controllers: ReplicaSets and
// their Deployments, StatefulSets, ReplicationControllers),
// disruptionsAllowed, the DisruptionAllowed condition (SufficientPods,
// InsufficientPods, SyncFailed) and the expiry of status.disruptedPods
// entries the eviction API writes (2 minutes).
//
// It does not evict anything; the eviction API reads this status.
package disruption

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name (queue and metrics label, --controllers).
const Name = "disruption"

// DeletionTimeout is how long an eviction's disruptedPods entry stands
// before the pod is expected to be gone (upstream's 2 minutes).
const DeletionTimeout = 2 * time.Minute

// Controller keeps PodDisruptionBudget status.
type Controller struct {
	client  kubernetes.Interface
	log     *slog.Logger
	queue   workqueue.TypedRateLimitingInterface[string]
	pdbs    policylisters.PodDisruptionBudgetLister
	pods    corelisters.PodLister
	rss     appslisters.ReplicaSetLister
	deps    appslisters.DeploymentLister
	sets    appslisters.StatefulSetLister
	rcs     corelisters.ReplicationControllerLister
	synced  []cache.InformerSynced
	now     func() time.Time
	rec     record.EventRecorder
	stopRec func()
}

// New wires the controller to the factory's informers.
func New(client kubernetes.Interface, f informers.SharedInformerFactory, log *slog.Logger) *Controller {
	pdbInf, podInf := f.Policy().V1().PodDisruptionBudgets(), f.Core().V1().Pods()
	rsInf, depInf, setInf, rcInf := f.Apps().V1().ReplicaSets(), f.Apps().V1().Deployments(), f.Apps().V1().StatefulSets(), f.Core().V1().ReplicationControllers()
	c := &Controller{client: client, log: log.With("controller", Name), queue: ctrlutil.NewQueue(Name),
		pdbs: pdbInf.Lister(), pods: podInf.Lister(), rss: rsInf.Lister(), deps: depInf.Lister(), sets: setInf.Lister(), rcs: rcInf.Lister(),
		now: time.Now}
	for _, inf := range []cache.SharedIndexInformer{pdbInf.Informer(), podInf.Informer(), rsInf.Informer(), depInf.Informer(), setInf.Informer(), rcInf.Informer()} {
		c.synced = append(c.synced, inf.HasSynced)
	}
	c.rec, c.stopRec = ctrlutil.NewRecorder(client, "controllermanager")
	pdbInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue, UpdateFunc: func(_, cur any) { c.enqueue(cur) },
	})
	podHandler := func(obj any) {
		if p, ok := ctrlutil.Unwrap(obj).(*corev1.Pod); ok {
			c.enqueueFor(p.Namespace, labels.Set(p.Labels))
		}
	}
	podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: podHandler, DeleteFunc: podHandler,
		UpdateFunc: func(old, cur any) {
			if ctrlutil.SameVersion(old.(*corev1.Pod), cur.(*corev1.Pod)) {
				return
			}
			podHandler(old)
			podHandler(cur)
		},
	})
	// A controller's scale changes expectedPods of the budgets in its
	// namespace.
	scaleHandler := func(obj any) {
		if o, ok := ctrlutil.Unwrap(obj).(metav1.Object); ok {
			c.enqueueFor(o.GetNamespace(), nil)
		}
	}
	for _, inf := range []cache.SharedIndexInformer{rsInf.Informer(), depInf.Informer(), setInf.Informer(), rcInf.Informer()} {
		inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, cur any) { scaleHandler(cur) }})
	}
	return c
}

func (c *Controller) enqueue(obj any) {
	if k := ctrlutil.KeyFunc(obj); k != "" {
		c.queue.Add(k)
	}
}

// enqueueFor enqueues the namespace's budgets whose selector matches set
// (every budget when set is nil).
func (c *Controller) enqueueFor(ns string, set labels.Set) {
	list, err := c.pdbs.PodDisruptionBudgets(ns).List(labels.Everything())
	if err != nil {
		return
	}
	for _, pdb := range list {
		if set != nil {
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil || !sel.Matches(set) {
				continue
			}
		}
		c.queue.Add(ns + "/" + pdb.Name)
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
	cached, err := c.pdbs.PodDisruptionBudgets(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	pdb := cached.DeepCopy()
	now := c.now()
	pods, err := c.selectedPods(pdb)
	var expected, desired int
	if err == nil {
		expected, desired, err = c.expectations(pdb, pods)
	}
	if err != nil {
		c.rec.Eventf(pdb, corev1.EventTypeWarning, "CalculateExpectedPodCountFailed", "Failed to calculate the number of expected pods: %v", err)
		return c.writeStatus(ctx, cached, func(st *policyv1.PodDisruptionBudgetStatus) {
			st.DisruptionsAllowed = 0
			setCondition(st, metav1.ConditionFalse, policyv1.SyncFailedReason, err.Error(), pdb.Generation, now)
		})
	}
	// Expire disruptedPods entries: the pod went, or it outlived the
	// timeout (the eviction did not happen).
	disrupted := map[string]metav1.Time{}
	var nextExpiry time.Duration
	byName := map[string]*corev1.Pod{}
	for _, p := range pods {
		byName[p.Name] = p
	}
	for podName, at := range pdb.Status.DisruptedPods {
		p := byName[podName]
		if p == nil || p.DeletionTimestamp != nil {
			continue
		}
		expiry := at.Add(DeletionTimeout)
		if !expiry.After(now) {
			continue
		}
		disrupted[podName] = at
		if d := expiry.Sub(now); nextExpiry == 0 || d < nextExpiry {
			nextExpiry = d
		}
	}
	healthy := 0
	for _, p := range pods {
		if _, gone := disrupted[p.Name]; gone {
			continue
		}
		if p.DeletionTimestamp == nil && ctrlutil.IsPodReady(p) {
			healthy++
		}
	}
	allowed := max(healthy-desired, 0)
	if expected <= 0 {
		allowed = 0
	}
	err = c.writeStatus(ctx, cached, func(st *policyv1.PodDisruptionBudgetStatus) {
		st.CurrentHealthy, st.DesiredHealthy, st.ExpectedPods = int32(healthy), int32(desired), int32(expected)
		st.DisruptionsAllowed = int32(allowed)
		st.DisruptedPods = disrupted
		if len(disrupted) == 0 {
			st.DisruptedPods = nil
		}
		st.ObservedGeneration = pdb.Generation
		if allowed > 0 {
			setCondition(st, metav1.ConditionTrue, policyv1.SufficientPodsReason, "", pdb.Generation, now)
		} else {
			setCondition(st, metav1.ConditionFalse, policyv1.InsufficientPodsReason, "", pdb.Generation, now)
		}
	})
	if nextExpiry > 0 {
		c.queue.AddAfter(key, nextExpiry)
	}
	return err
}

func (c *Controller) selectedPods(pdb *policyv1.PodDisruptionBudget) ([]*corev1.Pod, error) {
	if pdb.Spec.Selector == nil {
		return nil, nil // no selector: no pods (an empty one selects all, as in policy/v1)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("selector: %w", err)
	}
	return c.pods.Pods(pdb.Namespace).List(sel)
}

// expectations returns expectedPods and desiredHealthy as upstream's
// getExpectedPodCount computes them.
func (c *Controller) expectations(pdb *policyv1.PodDisruptionBudget, pods []*corev1.Pod) (expected, desired int, err error) {
	switch {
	case pdb.Spec.MaxUnavailable != nil:
		if expected, err = c.expectedScale(pods); err != nil {
			return 0, 0, err
		}
		unavail, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, expected, true)
		if err != nil {
			return 0, 0, err
		}
		return expected, max(expected-unavail, 0), nil
	case pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.Type == intstr.Int:
		return len(pods), pdb.Spec.MinAvailable.IntValue(), nil
	case pdb.Spec.MinAvailable != nil:
		if expected, err = c.expectedScale(pods); err != nil {
			return 0, 0, err
		}
		d, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, expected, true)
		if err != nil {
			return 0, 0, err
		}
		return expected, d, nil
	}
	return len(pods), 0, nil
}

// expectedScale sums the scale of the pods' distinct controllers; a pod
// with none (or one whose scale is unknown) is an error, as upstream.
func (c *Controller) expectedScale(pods []*corev1.Pod) (int, error) {
	seen := map[types.UID]bool{}
	total := 0
	for _, p := range pods {
		ref := metav1.GetControllerOf(p)
		if ref == nil {
			return 0, fmt.Errorf("found no controller ref for pod %q", p.Name)
		}
		uid, n, err := c.scaleOf(p.Namespace, ref)
		if err != nil {
			return 0, err
		}
		if !seen[uid] {
			seen[uid] = true
			total += n
		}
	}
	return total, nil
}

func replicas(r *int32) int {
	if r == nil {
		return 1
	}
	return int(*r)
}

func (c *Controller) scaleOf(ns string, ref *metav1.OwnerReference) (types.UID, int, error) {
	notFound := fmt.Errorf("found no controllers for pod's owner %s %q", ref.Kind, ref.Name)
	switch ref.Kind {
	case "ReplicaSet":
		rs, err := c.rss.ReplicaSets(ns).Get(ref.Name)
		if err != nil || rs.UID != ref.UID {
			return "", 0, notFound
		}
		if dref := metav1.GetControllerOf(rs); dref != nil && dref.Kind == "Deployment" {
			if d, err := c.deps.Deployments(ns).Get(dref.Name); err == nil && d.UID == dref.UID {
				return d.UID, replicas(d.Spec.Replicas), nil
			}
		}
		return rs.UID, replicas(rs.Spec.Replicas), nil
	case "StatefulSet":
		s, err := c.sets.StatefulSets(ns).Get(ref.Name)
		if err != nil || s.UID != ref.UID {
			return "", 0, notFound
		}
		return s.UID, replicas(s.Spec.Replicas), nil
	case "ReplicationController":
		rc, err := c.rcs.ReplicationControllers(ns).Get(ref.Name)
		if err != nil || rc.UID != ref.UID {
			return "", 0, notFound
		}
		return rc.UID, replicas(rc.Spec.Replicas), nil
	}
	return "", 0, fmt.Errorf("pods of %s %q: no scale known for that kind", ref.Kind, ref.Name)
}

func setCondition(st *policyv1.PodDisruptionBudgetStatus, status metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	for i := range st.Conditions {
		c := &st.Conditions[i]
		if c.Type != policyv1.DisruptionAllowedCondition {
			continue
		}
		if c.Status != status {
			c.LastTransitionTime = metav1.NewTime(now)
		}
		c.Status, c.Reason, c.Message, c.ObservedGeneration = status, reason, msg, gen
		return
	}
	st.Conditions = append(st.Conditions, metav1.Condition{Type: policyv1.DisruptionAllowedCondition, Status: status,
		Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)})
}

func (c *Controller) writeStatus(ctx context.Context, cached *policyv1.PodDisruptionBudget, mod func(*policyv1.PodDisruptionBudgetStatus)) error {
	pdb := cached.DeepCopy()
	mod(&pdb.Status)
	if apiequality.Semantic.DeepEqual(cached.Status, pdb.Status) {
		return nil
	}
	_, err := c.client.PolicyV1().PodDisruptionBudgets(pdb.Namespace).UpdateStatus(ctx, pdb, metav1.UpdateOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update status of pdb %s/%s: %w", pdb.Namespace, pdb.Name, err)
	}
	return nil
}
