// Package nodelifecycle is the controller-manager's node lifecycle
// controller. Kubelets renew a Lease named after their node in
// kube-node-lease (and post node status now and then); when neither has been
// seen for --node-monitor-grace-period (40 s), the node's conditions become
// Unknown. From the Ready condition it keeps the node's NoExecute and
// NoSchedule taints: node.kubernetes.io/unreachable when Unknown,
// node.kubernetes.io/not-ready when False, none when True (so the taints go
// when the node comes back); and, as upstream's TaintNodesByCondition, a
// NoSchedule taint node.kubernetes.io/memory-pressure, disk-pressure,
// pid-pressure or network-unavailable while that condition is True. Pods on
// a node that is not Ready get their
// Ready condition set to False at once, so EndpointSlices drop them; pods on
// a node with NoExecute taints they do not tolerate are evicted at once, and
// pods that tolerate them for tolerationSeconds that long after the taint
// was added.
//
// Freshness is judged on this controller's own clock (when it saw a renewal
// change), never by comparing a kubelet's timestamps with ours, so clock skew
// between machines does not matter. It is not the pod garbage collector:
// pods of deleted nodes are not force-deleted here.
package nodelifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name in --controllers and in its queue metrics.
const Name = "nodelifecycle"

// Defaults of the flags, as kube-controller-manager's.
const (
	DefaultNodeMonitorGracePeriod = 40 * time.Second
	DefaultNodeMonitorPeriod      = 5 * time.Second
	DefaultNodeStartupGracePeriod = 60 * time.Second
	DefaultLeaseNamespace         = corev1.NamespaceNodeLease
)

// Options configure the controller; zero values take the defaults.
type Options struct {
	// NodeMonitorGracePeriod is how long a node may go without a Lease
	// renewal or status update before it is marked Unknown
	// (--node-monitor-grace-period, 40 s).
	NodeMonitorGracePeriod time.Duration
	// NodeMonitorPeriod is how often every node is checked
	// (--node-monitor-period, 5 s).
	NodeMonitorPeriod time.Duration
	// NodeStartupGracePeriod is the grace of a node that never posted a
	// Ready condition (--node-startup-grace-period, 60 s).
	NodeStartupGracePeriod time.Duration
	// LeaseNamespace holds the node Leases (kube-node-lease).
	LeaseNamespace string
}

func (o *Options) setDefaults() {
	if o.NodeMonitorGracePeriod <= 0 {
		o.NodeMonitorGracePeriod = DefaultNodeMonitorGracePeriod
	}
	if o.NodeMonitorPeriod <= 0 {
		o.NodeMonitorPeriod = DefaultNodeMonitorPeriod
	}
	if o.NodeStartupGracePeriod <= 0 {
		o.NodeStartupGracePeriod = DefaultNodeStartupGracePeriod
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = DefaultLeaseNamespace
	}
}

// Taints the controller owns.
var (
	unreachableTaints = []corev1.Taint{
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
	}
	notReadyTaints = []corev1.Taint{
		{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute},
	}
)

// conditionsMarkedUnknown are the kubelet's conditions set to Unknown when
// it goes silent, as Kubernetes does.
var conditionsMarkedUnknown = []corev1.NodeConditionType{
	corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure,
}

const podNodeIndex = "nodelifecycle/spec.nodeName"

// nodeHealth is what the controller observed of one node, on its own clock.
type nodeHealth struct {
	probe          time.Time // last time a renewal or heartbeat was seen to change
	readyHeartbeat metav1.Time
	leaseRenew     metav1.MicroTime
}

// Controller watches node health, taints, and evicts.
type Controller struct {
	client kubernetes.Interface
	log    *slog.Logger
	opts   Options

	nodes    corelisters.NodeLister
	leases   coordlisters.LeaseLister
	podIndex cache.Indexer
	pods     corelisters.PodLister
	synced   []cache.InformerSynced

	nodeQueue workqueue.TypedRateLimitingInterface[string]
	podQueue  workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	health map[string]*nodeHealth
	now    func() time.Time
}

// New builds the controller on factory's node, Lease and pod informers; the
// caller starts factory.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	opts.setDefaults()
	nodeInf := factory.Core().V1().Nodes()
	leaseInf := factory.Coordination().V1().Leases()
	podInf := factory.Core().V1().Pods()
	c := &Controller{
		client: client, log: log.With("controller", Name), opts: opts,
		nodes: nodeInf.Lister(), leases: leaseInf.Lister(), pods: podInf.Lister(),
		podIndex:  podInf.Informer().GetIndexer(),
		nodeQueue: ctrlutil.NewQueue(Name),
		podQueue:  ctrlutil.NewQueue(Name + "-eviction"),
		health:    map[string]*nodeHealth{},
		now:       time.Now,
		synced:    []cache.InformerSynced{nodeInf.Informer().HasSynced, leaseInf.Informer().HasSynced, podInf.Informer().HasSynced},
	}
	if err := podInf.Informer().AddIndexers(cache.Indexers{podNodeIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		c.log.Error("pod index by node", "err", err)
	}

	nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				c.nodeQueue.Add(n.Name)
				c.enqueuePodsOn(n.Name)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			old, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if !ok1 || !ok2 {
				return
			}
			c.nodeQueue.Add(n.Name)
			if !sameTaints(noExecute(old.Spec.Taints), noExecute(n.Spec.Taints)) || readyStatusOf(old) != readyStatusOf(n) {
				c.enqueuePodsOn(n.Name)
			}
		},
		DeleteFunc: func(obj any) {
			if n, ok := ctrlutil.Unwrap(obj).(*corev1.Node); ok {
				c.nodeQueue.Add(n.Name)
			}
		},
	})
	leaseInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.onLease,
		UpdateFunc: func(_, cur any) { c.onLease(cur) },
	})
	enqueuePod := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			c.podQueue.Add(p.Namespace + "/" + p.Name)
		}
	}
	podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueuePod,
		UpdateFunc: func(_, cur any) { enqueuePod(cur) },
	})
	return c
}

func (c *Controller) onLease(obj any) {
	if l, ok := obj.(*coordinationv1.Lease); ok && l.Namespace == c.opts.LeaseNamespace {
		c.nodeQueue.Add(l.Name)
	}
}

func (c *Controller) enqueuePodsOn(node string) {
	objs, err := c.podIndex.ByIndex(podNodeIndex, node)
	if err != nil {
		return
	}
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			c.podQueue.Add(p.Namespace + "/" + p.Name)
		}
	}
}

// Run monitors nodes every NodeMonitorPeriod and processes both queues with
// workers goroutines each until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		ctrlutil.RunWorkers(ctx, c.log, Name, c.nodeQueue, workers, c.syncNode, c.synced...)
	}()
	go func() {
		defer wg.Done()
		ctrlutil.RunWorkers(ctx, c.log, Name+"-eviction", c.podQueue, workers, c.syncPod, c.synced...)
	}()
	if cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		t := time.NewTicker(c.opts.NodeMonitorPeriod)
		defer t.Stop()
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case <-t.C:
				nodes, _ := c.nodes.List(labels.Everything())
				for _, n := range nodes {
					c.nodeQueue.Add(n.Name)
				}
			}
		}
	}
	wg.Wait()
}

func readyStatusOf(n *corev1.Node) corev1.ConditionStatus {
	if r := readyCondition(n); r != nil {
		return r.Status
	}
	return ""
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// observe records renewals and heartbeats seen now and returns how long the
// node has been silent.
func (c *Controller) observe(n *corev1.Node, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.health[n.Name]
	if !ok {
		h = &nodeHealth{probe: now} // a node first seen gets a full grace period
		c.health[n.Name] = h
	}
	if r := readyCondition(n); r != nil && !r.LastHeartbeatTime.Equal(&h.readyHeartbeat) {
		h.readyHeartbeat = r.LastHeartbeatTime
		h.probe = now
	}
	if l, err := c.leases.Leases(c.opts.LeaseNamespace).Get(n.Name); err == nil && l.Spec.RenewTime != nil && !l.Spec.RenewTime.Equal(&h.leaseRenew) {
		h.leaseRenew = *l.Spec.RenewTime
		h.probe = now
	}
	return now.Sub(h.probe)
}

func (c *Controller) syncNode(ctx context.Context, name string) error {
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		c.mu.Lock()
		delete(c.health, name)
		c.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	now := c.now()
	silent := c.observe(node, now)
	grace := c.opts.NodeMonitorGracePeriod
	ready := readyCondition(node)
	if ready == nil {
		grace = c.opts.NodeStartupGracePeriod
	}
	if silent > grace {
		if node, err = c.markUnknown(ctx, node, now); err != nil {
			return err
		}
	} else {
		// Look again right when the grace period would run out.
		c.nodeQueue.AddAfter(name, grace-silent+10*time.Millisecond)
	}
	return c.syncTaints(ctx, node, now)
}

// markUnknown sets the kubelet's conditions to Unknown, as Kubernetes does
// when a kubelet stops posting status.
func (c *Controller) markUnknown(ctx context.Context, node *corev1.Node, now time.Time) (*corev1.Node, error) {
	upd := node.DeepCopy()
	changed := false
	mt := metav1.NewTime(now)
	for _, t := range conditionsMarkedUnknown {
		found := false
		for i := range upd.Status.Conditions {
			cond := &upd.Status.Conditions[i]
			if cond.Type != t {
				continue
			}
			found = true
			if cond.Status != corev1.ConditionUnknown {
				cond.Status = corev1.ConditionUnknown
				cond.Reason = "NodeStatusUnknown"
				cond.Message = "Kubelet stopped posting node status."
				cond.LastTransitionTime = mt
				changed = true
			}
		}
		if !found && t == corev1.NodeReady {
			upd.Status.Conditions = append(upd.Status.Conditions, corev1.NodeCondition{
				Type: t, Status: corev1.ConditionUnknown, Reason: "NodeStatusNeverUpdated",
				Message: "Kubelet never posted node status.", LastHeartbeatTime: node.CreationTimestamp, LastTransitionTime: mt,
			})
			changed = true
		}
	}
	if !changed {
		return node, nil
	}
	out, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("mark node %s Unknown: %w", node.Name, err)
	}
	c.log.Info("node stopped reporting, conditions set to Unknown", "node", node.Name)
	return out, nil
}

// conditionTaints is upstream's TaintNodesByCondition
// (nodeConditionToTaintKeyStatusMap) beside Ready: a NoSchedule taint while
// the condition is True, removed once it is not.
var conditionTaints = map[corev1.NodeConditionType]string{
	corev1.NodeMemoryPressure:     corev1.TaintNodeMemoryPressure,
	corev1.NodeDiskPressure:       corev1.TaintNodeDiskPressure,
	corev1.NodePIDPressure:        corev1.TaintNodePIDPressure,
	corev1.NodeNetworkUnavailable: corev1.TaintNodeNetworkUnavailable,
}

// syncTaints keeps the not-ready/unreachable taints in line with Ready, and
// the condition taints (memory-pressure, disk-pressure, pid-pressure,
// network-unavailable: NoSchedule) in line with their conditions.
func (c *Controller) syncTaints(ctx context.Context, node *corev1.Node, now time.Time) error {
	var want []corev1.Taint
	if r := readyCondition(node); r != nil {
		switch r.Status {
		case corev1.ConditionFalse:
			want = append(want, notReadyTaints...)
		case corev1.ConditionUnknown:
			want = append(want, unreachableTaints...)
		}
	}
	for _, cond := range node.Status.Conditions {
		if key, ok := conditionTaints[cond.Type]; ok && cond.Status == corev1.ConditionTrue {
			want = append(want, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
		}
	}
	owned := func(t corev1.Taint) bool {
		if t.Key == corev1.TaintNodeUnreachable || t.Key == corev1.TaintNodeNotReady {
			return true
		}
		for _, key := range conditionTaints {
			if t.Key == key && t.Effect == corev1.TaintEffectNoSchedule {
				return true
			}
		}
		return false
	}
	var next []corev1.Taint
	for _, t := range node.Spec.Taints {
		if !owned(t) || containsTaint(want, t) {
			next = append(next, t)
		}
	}
	for _, w := range want {
		if !containsTaint(next, w) {
			w.TimeAdded = &metav1.Time{Time: now}
			next = append(next, w)
		}
	}
	if sameTaints(next, node.Spec.Taints) {
		return nil
	}
	upd := node.DeepCopy()
	upd.Spec.Taints = next
	if _, err := c.client.CoreV1().Nodes().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update taints of node %s: %w", node.Name, err)
	}
	c.log.Info("node taints updated", "node", node.Name, "taints", taintStrings(next))
	return nil
}

func containsTaint(ts []corev1.Taint, t corev1.Taint) bool {
	for i := range ts {
		if ts[i].MatchTaint(&t) {
			return true
		}
	}
	return false
}

func sameTaints(a, b []corev1.Taint) bool {
	if len(a) != len(b) {
		return false
	}
	for _, t := range a {
		if !containsTaint(b, t) {
			return false
		}
	}
	return true
}

func noExecute(ts []corev1.Taint) []corev1.Taint {
	var out []corev1.Taint
	for _, t := range ts {
		if t.Effect == corev1.TaintEffectNoExecute {
			out = append(out, t)
		}
	}
	return out
}

func taintStrings(ts []corev1.Taint) []string {
	out := make([]string, len(ts))
	for i := range ts {
		out[i] = ts[i].ToString()
	}
	return out
}

// evictionDelay says when a pod on a node with NoExecute taints must go:
// evict now (0, true), after d (d, true), or never (0, false).
func evictionDelay(pod *corev1.Pod, taints []corev1.Taint, now time.Time) (time.Duration, bool) {
	if len(taints) == 0 {
		return 0, false
	}
	var minSeconds *int64
	var since time.Time
	for i := range taints {
		t := &taints[i]
		tolerated := false
		for j := range pod.Spec.Tolerations {
			tol := &pod.Spec.Tolerations[j]
			if (tol.Effect != "" && tol.Effect != corev1.TaintEffectNoExecute) || !tol.ToleratesTaint(klog.Background(), t, false) {
				continue
			}
			tolerated = true
			if tol.TolerationSeconds != nil && (minSeconds == nil || *tol.TolerationSeconds < *minSeconds) {
				minSeconds = tol.TolerationSeconds
			}
		}
		if !tolerated {
			return 0, true
		}
		added := now
		if t.TimeAdded != nil {
			added = t.TimeAdded.Time
		}
		if added.After(since) {
			since = added
		}
	}
	if minSeconds == nil {
		return 0, false // tolerated forever
	}
	due := since.Add(time.Duration(max(*minSeconds, 0)) * time.Second)
	return max(due.Sub(now), 0), true
}

// markPodNotReady sets Ready=False on a pod whose node is not Ready, as
// Kubernetes does, so Services stop sending it traffic long before the pod
// is evicted.
func (c *Controller) markPodNotReady(ctx context.Context, pod *corev1.Pod, node *corev1.Node) error {
	r := readyCondition(node)
	if r == nil || r.Status == corev1.ConditionTrue {
		return nil
	}
	i := slices.IndexFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady })
	if i < 0 || pod.Status.Conditions[i].Status == corev1.ConditionFalse {
		return nil
	}
	upd := pod.DeepCopy()
	upd.Status.Conditions[i].Status = corev1.ConditionFalse
	upd.Status.Conditions[i].Reason = "NodeNotReady"
	upd.Status.Conditions[i].Message = fmt.Sprintf("node %s is not ready", node.Name)
	upd.Status.Conditions[i].LastTransitionTime = metav1.NewTime(c.now())
	if _, err := c.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("mark pod %s/%s not ready: %w", pod.Namespace, pod.Name, err)
	}
	c.log.Info("marked pod not ready", "pod", pod.Namespace+"/"+pod.Name, "node", node.Name)
	return nil
}

func (c *Controller) syncPod(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := c.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || ctrlutil.IsPodTerminal(pod) {
		return nil
	}
	node, err := c.nodes.Get(pod.Spec.NodeName)
	if err != nil {
		return nil
	}
	if err := c.markPodNotReady(ctx, pod, node); err != nil {
		return err
	}
	d, evict := evictionDelay(pod, noExecute(node.Spec.Taints), c.now())
	if !evict {
		return nil
	}
	if d > 0 {
		c.podQueue.AddAfter(key, d)
		return nil
	}
	uid := pod.UID
	err = c.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("evict pod %s from node %s: %w", key, node.Name, err)
	}
	c.log.Info("evicted pod from tainted node", "pod", key, "node", node.Name, "taints", taintStrings(noExecute(node.Spec.Taints)))
	return nil
}
