package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"
)

// DefaultSchedulerName is the spec.schedulerName this scheduler serves
// unless told otherwise.
const DefaultSchedulerName = v1.DefaultSchedulerName

// DefaultBindConcurrency is how many bindings may be in flight at once.
const DefaultBindConcurrency = 256

// Options tune a Scheduler. Zero values take the defaults named on each.
type Options struct {
	// SchedulerName is the spec.schedulerName of the pods to schedule
	// (default "default-scheduler"); pods naming another scheduler are left
	// alone, so several schedulers can run side by side.
	SchedulerName string
	// PodInitialBackoff and PodMaxBackoff bound the exponential back-off of
	// a pod that failed (defaults 1 s and 10 s, as Kubernetes).
	PodInitialBackoff, PodMaxBackoff time.Duration
	// MaxUnschedulableDuration is how long an unschedulable pod waits for a
	// cluster change before it is retried anyway (default 5 min).
	MaxUnschedulableDuration time.Duration
	// Parallelism is how many goroutines filter and score nodes (default 16).
	Parallelism int
	// PercentageOfNodesToScore: once this share of the nodes is found
	// feasible, the rest are not evaluated (0: adaptive as Kubernetes, 50 %
	// of 100 nodes down to 5 % of 5,000; never fewer than 100 nodes).
	PercentageOfNodesToScore int
	// BindConcurrency caps bindings and status writes in flight (default
	// 256: a binding is one API round trip, mostly waiting).
	BindConcurrency int
	// Registerer receives the scheduler's metrics; nil exports none.
	Registerer prometheus.Registerer
}

func (o *Options) setDefaults() {
	if o.SchedulerName == "" {
		o.SchedulerName = DefaultSchedulerName
	}
	if o.PodInitialBackoff <= 0 {
		o.PodInitialBackoff = time.Second
	}
	if o.PodMaxBackoff <= 0 {
		o.PodMaxBackoff = 10 * time.Second
	}
	if o.MaxUnschedulableDuration <= 0 {
		o.MaxUnschedulableDuration = 5 * time.Minute
	}
	if o.Parallelism <= 0 {
		o.Parallelism = 16
	}
	if o.BindConcurrency <= 0 {
		o.BindConcurrency = DefaultBindConcurrency
	}
}

// Scheduler places pending pods on nodes and binds them.
type Scheduler struct {
	cs      kubernetes.Interface
	factory informers.SharedInformerFactory
	log     *slog.Logger
	opts    Options

	cache   *cache
	queue   *queue
	metrics *metrics

	pods   corelisters.PodLister
	synced []toolscache.InformerSynced
	ready  atomic.Bool

	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder

	rr        atomic.Uint64 // round-robin among equally scored nodes
	nextStart int           // first node of the next decision
	buf       decideBuffers
	bindSem   chan struct{}
	wg        sync.WaitGroup
	// volumes is upstream's VolumeBinding binder (k8s.io/kubernetes/pkg/
	// scheduler/framework/plugins/volumebinding): it matches a pod's unbound
	// claims to volumes whose node affinity admits a node, and, for a
	// WaitForFirstConsumer claim to provision, writes
	// volume.kubernetes.io/selected-node before the pod is bound.
	volumes volumebinding.SchedulerVolumeBinder
	klog    klog.Logger
	// bgCtx is Run's context, for writes started by informer events.
	bgCtx context.Context
	// Listers read by InterPodAffinity (namespaceSelector), PodTopologySpread
	// (the default constraints' selector) and preemption (budgets); nil in
	// unit tests that build a Scheduler by hand.
	namespaces corelisters.NamespaceLister
	services   corelisters.ServiceLister
	rcs        corelisters.ReplicationControllerLister
	rss        appslisters.ReplicaSetLister
	sss        appslisters.StatefulSetLister
	pdbs       policylisters.PodDisruptionBudgetLister
}

// New returns a scheduler that reads pods and nodes through factory's
// informers; Run starts them.
func New(cs kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) (*Scheduler, error) {
	opts.setDefaults()
	if opts.PodMaxBackoff < opts.PodInitialBackoff {
		return nil, fmt.Errorf("pod max back-off %v is shorter than the initial back-off %v", opts.PodMaxBackoff, opts.PodInitialBackoff)
	}
	s := &Scheduler{
		cs: cs, factory: factory, log: log.With("scheduler", opts.SchedulerName), opts: opts,
		cache:   newCache(),
		queue:   newQueue(opts.PodInitialBackoff, opts.PodMaxBackoff, opts.MaxUnschedulableDuration),
		bindSem: make(chan struct{}, opts.BindConcurrency),
	}
	s.metrics = newMetrics(opts.Registerer, s.queue)

	podInf := factory.Core().V1().Pods()
	nodeInf := factory.Core().V1().Nodes()
	s.pods = podInf.Lister()
	if _, err := podInf.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    s.onPodAdd,
		UpdateFunc: s.onPodUpdate,
		DeleteFunc: s.onPodDelete,
	}); err != nil {
		return nil, fmt.Errorf("pod event handler: %w", err)
	}
	if _, err := nodeInf.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    s.onNodeAdd,
		UpdateFunc: s.onNodeUpdate,
		DeleteFunc: s.onNodeDelete,
	}); err != nil {
		return nil, fmt.Errorf("node event handler: %w", err)
	}
	s.synced = []toolscache.InformerSynced{podInf.Informer().HasSynced, nodeInf.Informer().HasSynced}
	s.klog = logr.FromSlogHandler(s.log.Handler())
	st := factory.Storage().V1()
	pvcInf, pvInf := factory.Core().V1().PersistentVolumeClaims(), factory.Core().V1().PersistentVolumes()
	vb, err := volumebinding.NewVolumeBinder(s.klog, cs, feature.Features{}, podInf, nodeInf, st.CSINodes(), pvcInf, pvInf, st.StorageClasses(),
		volumebinding.CapacityCheck{CSIDriverInformer: st.CSIDrivers(), CSIStorageCapacityInformer: st.CSIStorageCapacities()}, 10*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("volume binder: %w", err)
	}
	s.volumes = vb
	// A claim or volume that changes may make a parked pod schedulable.
	move := toolscache.ResourceEventHandlerFuncs{AddFunc: func(any) { s.queue.MoveAll() }, UpdateFunc: func(any, any) { s.queue.MoveAll() }}
	for _, inf := range []toolscache.SharedIndexInformer{pvcInf.Informer(), pvInf.Informer(), st.StorageClasses().Informer()} {
		if _, err := inf.AddEventHandler(move); err != nil {
			return nil, fmt.Errorf("volume event handler: %w", err)
		}
		s.synced = append(s.synced, inf.HasSynced)
	}
	s.synced = append(s.synced, st.CSINodes().Informer().HasSynced, st.CSIDrivers().Informer().HasSynced, st.CSIStorageCapacities().Informer().HasSynced)
	nsInf, svcInf, rcInf := factory.Core().V1().Namespaces(), factory.Core().V1().Services(), factory.Core().V1().ReplicationControllers()
	rsInf, ssInf, pdbInf := factory.Apps().V1().ReplicaSets(), factory.Apps().V1().StatefulSets(), factory.Policy().V1().PodDisruptionBudgets()
	s.namespaces, s.services, s.rcs = nsInf.Lister(), svcInf.Lister(), rcInf.Lister()
	s.rss, s.sss, s.pdbs = rsInf.Lister(), ssInf.Lister(), pdbInf.Lister()
	for _, inf := range []toolscache.SharedIndexInformer{nsInf.Informer(), svcInf.Informer(), rcInf.Informer(), rsInf.Informer(), ssInf.Informer(), pdbInf.Informer()} {
		s.synced = append(s.synced, inf.HasSynced)
	}
	// A namespace's labels decide namespaceSelector terms.
	if _, err := nsInf.Informer().AddEventHandler(move); err != nil {
		return nil, fmt.Errorf("namespace event handler: %w", err)
	}
	return s, nil
}

// Ready reports whether the scheduler's caches have synced and it is
// scheduling.
func (s *Scheduler) Ready() bool { return s.ready.Load() }

// Run starts the informers, waits for them to sync, and schedules until ctx
// ends; it returns once in-flight bindings have finished.
func (s *Scheduler) Run(ctx context.Context) {
	s.broadcaster = record.NewBroadcaster(record.WithContext(ctx))
	s.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.cs.CoreV1().Events("")})
	s.recorder = s.broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: s.opts.SchedulerName})
	defer s.broadcaster.Shutdown()
	s.bgCtx = ctx

	s.factory.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return
	}
	s.log.Info("caches synced, scheduling", "nodes", s.cache.NodeCount())
	s.ready.Store(true)
	defer s.ready.Store(false)

	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				s.queue.Close()
				return
			case <-t.C:
				s.queue.Flush()
			}
		}
	}()
	for s.scheduleOne(ctx) {
	}
	s.wg.Wait()
}

func (s *Scheduler) responsible(pod *v1.Pod) bool {
	name := pod.Spec.SchedulerName
	if name == "" {
		name = DefaultSchedulerName
	}
	return name == s.opts.SchedulerName
}

// gated reports whether the pod still has scheduling gates: it waits, not
// tried, until they are all removed (as Kubernetes' SchedulingGates).
func gated(pod *v1.Pod) bool { return len(pod.Spec.SchedulingGates) > 0 }

func terminal(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}

func (s *Scheduler) onPodAdd(obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	switch {
	case pod.Spec.NodeName != "":
		s.queue.Delete(podKey(pod))
		if !terminal(pod) {
			s.cache.AddPod(pod)
		}
	case !s.responsible(pod) || terminal(pod):
	case gated(pod):
		s.markGated(pod)
	case !s.cache.IsAssumed(podKey(pod)):
		if pod.Status.NominatedNodeName != "" {
			s.cache.Nominate(pod, pod.Status.NominatedNodeName)
		}
		s.queue.Add(pod)
	}
}

// specChanged reports whether an update changed more than status and
// bookkeeping (our own status writes must not retry a parked pod).
func specChanged(old, cur *v1.Pod) bool {
	strip := func(p *v1.Pod) *v1.Pod {
		c := p.DeepCopy()
		c.ResourceVersion, c.Generation, c.ManagedFields, c.Status = "", 0, nil, v1.PodStatus{}
		return c
	}
	return !reflect.DeepEqual(strip(old), strip(cur))
}

func (s *Scheduler) onPodUpdate(oldObj, newObj any) {
	old, ok1 := oldObj.(*v1.Pod)
	pod, ok2 := newObj.(*v1.Pod)
	if !ok1 || !ok2 {
		return
	}
	switch {
	case pod.Spec.NodeName != "":
		s.queue.Delete(podKey(pod))
		if terminal(pod) {
			s.cache.RemovePod(pod)
			s.queue.MoveAll()
		} else {
			s.cache.AddPod(pod)
		}
	case !s.responsible(pod) || terminal(pod):
		s.queue.Delete(podKey(pod))
		s.cache.Nominate(pod, "")
	case gated(pod):
		s.queue.Delete(podKey(pod))
		s.markGated(pod)
	case s.cache.IsAssumed(podKey(pod)):
	default:
		// The nomination follows the pod's status when that changes (an
		// update that still lacks the one just decided keeps it).
		if old.Status.NominatedNodeName != pod.Status.NominatedNodeName || pod.Status.NominatedNodeName != "" {
			s.cache.Nominate(pod, pod.Status.NominatedNodeName)
		}
		if specChanged(old, pod) {
			s.queue.Add(pod)
		} else {
			s.queue.UpdateObject(pod)
		}
	}
}

func (s *Scheduler) onPodDelete(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	s.queue.Delete(podKey(pod))
	if pod.Spec.NodeName != "" {
		s.cache.RemovePod(pod)
		s.queue.MoveAll()
	} else {
		s.cache.Nominate(pod, "")
	}
}

func (s *Scheduler) onNodeAdd(obj any) {
	if node, ok := obj.(*v1.Node); ok {
		s.cache.AddNode(node)
		s.queue.MoveAll()
	}
}

func (s *Scheduler) onNodeUpdate(oldObj, newObj any) {
	old, ok1 := oldObj.(*v1.Node)
	node, ok2 := newObj.(*v1.Node)
	if !ok1 || !ok2 {
		return
	}
	s.cache.AddNode(node)
	if old.Spec.Unschedulable != node.Spec.Unschedulable ||
		!reflect.DeepEqual(old.Spec.Taints, node.Spec.Taints) ||
		!reflect.DeepEqual(old.Labels, node.Labels) ||
		!reflect.DeepEqual(old.Status.Allocatable, node.Status.Allocatable) {
		s.queue.MoveAll()
	}
}

func (s *Scheduler) onNodeDelete(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if node, ok := obj.(*v1.Node); ok {
		s.cache.RemoveNode(node.Name)
	}
}

// errUnschedulable marks a decision that found no node.
var errUnschedulable = errors.New("unschedulable")

// decision is the outcome of filtering and scoring.
type decision struct {
	node     string
	feasible int
	message  string // why no node fits
	// volumes is what the volume binder decided for node (nil: the pod
	// has no claims).
	volumes *volumebinding.PodVolumes
	// preemption is what preemption decided when no node fits.
	preemption preemptionResult
}

// decide filters and scores nodes for pod (all of them when none fits,
// else until enough feasible ones are found) and picks the best.
func (s *Scheduler) decide(ctx context.Context, pod *v1.Pod) (decision, error) {
	st, err := newCycleState(pod)
	if err != nil {
		return decision{}, err
	}
	if hasClaims(pod) {
		claims, err := s.volumes.GetPodVolumeClaims(s.klog, pod)
		if err != nil {
			return decision{message: err.Error()}, errUnschedulable
		}
		st.volumes = &volumeState{binder: s.volumes, log: s.klog, claims: claims}
	}
	c := s.cache
	c.mu.RLock()
	defer c.mu.RUnlock()
	names, infos := c.nodeNames, c.infos
	n := len(names)
	if n == 0 {
		return decision{message: "no nodes available to schedule pods"}, errUnschedulable
	}
	s.prefilter(st, infos)
	// A pod nominated to a node by preemption takes it if it fits there now.
	nom := c.nominatedOn[st.key]
	if nom == "" {
		nom = pod.Status.NominatedNodeName
	}
	if ni := c.nodes[nom]; nom != "" && ni != nil && ni.node != nil && runFiltersNominated(st, ni) == nil {
		d := decision{node: nom, feasible: 1}
		if st.volumes != nil {
			if v, ok := st.volumes.found.Load(d.node); ok {
				d.volumes = v.(*volumebinding.PodVolumes)
			}
		}
		return d, nil
	}
	// Decisions are serialized (one scheduling loop): the buffers are reused.
	ns := len(scores)
	buf := &s.buf
	buf.reasons = resize(buf.reasons, n)
	buf.fits = resize(buf.fits, n)
	buf.raw = resize(buf.raw, n*ns)
	reasons, fits, raw := buf.reasons, buf.fits, buf.raw
	// As Kubernetes does, stop once enough feasible nodes are found, and
	// start each decision where the previous one stopped, so every node gets
	// its turn. Positions p are in evaluation order: node (start+p) mod n.
	want := numFeasibleNodesToFind(n, s.opts.PercentageOfNodesToScore)
	start := s.nextStart % n
	evaluated, found := 0, 0
	for evaluated < n && found < want {
		lo, hi := evaluated, min(evaluated+max(want-found, 128), n)
		parallelize(ctx, s.opts.Parallelism, hi-lo, func(k int) {
			p := lo + k
			ni := infos[(start+p)%n]
			if r := runFiltersNominated(st, ni); r != nil {
				reasons[p], fits[p] = r, false
				return
			}
			reasons[p], fits[p] = nil, true
			for j := range scores {
				raw[p*ns+j] = scores[j].fn(st, ni)
			}
		})
		for p := lo; p < hi; p++ {
			if fits[p] {
				found++
			}
		}
		evaluated = hi
	}
	s.nextStart = (start + evaluated) % n
	if err := ctx.Err(); err != nil {
		return decision{}, err
	}
	feasible := buf.feasible[:0]
	defer func() { buf.feasible = feasible }()
	for p := range evaluated {
		if fits[p] {
			feasible = append(feasible, p)
		}
	}
	if len(feasible) == 0 {
		d := decision{message: diagnose(n, reasons)}
		d.preemption = s.preemptLocked(st, names, infos, start, reasons)
		if d.preemption.node == "" {
			d.message += " " + d.preemption.message
		}
		return d, errUnschedulable
	}
	buf.total = resize(buf.total, len(feasible))
	buf.col = resize(buf.col, len(feasible))
	total, col := buf.total, buf.col
	clear(total)
	for j, sc := range scores {
		for k, i := range feasible {
			col[k] = raw[i*ns+j]
		}
		if sc.normalize != nil {
			sc.normalize(col)
		}
		for k := range col {
			total[k] += sc.weight * col[k]
		}
	}
	best := slices.Max(total)
	var ties []int
	for k, t := range total {
		if t == best {
			ties = append(ties, feasible[k])
		}
	}
	pick := ties[int(s.rr.Add(1)-1)%len(ties)]
	d := decision{node: names[(start+pick)%n], feasible: len(feasible)}
	if st.volumes != nil {
		if v, ok := st.volumes.found.Load(d.node); ok {
			d.volumes = v.(*volumebinding.PodVolumes)
		}
	}
	return d, nil
}

// numFeasibleNodesToFind is how many feasible nodes a decision looks for,
// Kubernetes' rule: all of a small cluster, else a percentage of the nodes
// (adaptive: 50% - nodes/125, at least 5%), at least 100.
func numFeasibleNodesToFind(nodes, percentage int) int {
	const minFeasible = 100
	if nodes < minFeasible || percentage >= 100 {
		return nodes
	}
	if percentage <= 0 {
		percentage = max(50-nodes/125, 5)
	}
	return max(nodes*percentage/100, minFeasible)
}

// decideBuffers are the per-node slices of one decision, reused.
type decideBuffers struct {
	reasons [][]string
	fits    []bool
	raw     []int64
	// over the feasible nodes
	feasible   []int
	total, col []int64
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n, n+n/4)
	}
	return s[:n]
}

// parallelize runs fn(0..n-1) in at most workers goroutines, each over a
// contiguous range (cheaper than one channel hand-off per node).
func parallelize(ctx context.Context, workers, n int, fn func(i int)) {
	workers = min(workers, runtime.GOMAXPROCS(0), (n+63)/64)
	if workers <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	chunk := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		lo, hi := w*chunk, min((w+1)*chunk, n)
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := lo; i < hi && ctx.Err() == nil; i++ {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// diagnose words why no node fits as Kubernetes does: "0/5 nodes are
// available: 2 Insufficient cpu, 3 node(s) had untolerated taint {a: b}."
func diagnose(total int, reasons [][]string) string {
	counts := map[string]int{}
	for _, rs := range reasons {
		for _, r := range rs {
			counts[r]++
		}
	}
	parts := make([]string, 0, len(counts))
	for r, c := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", c, r))
	}
	sort.Strings(parts)
	return fmt.Sprintf("0/%d nodes are available: %s.", total, strings.Join(parts, ", "))
}

// scheduleOne runs one scheduling attempt; false once the queue is closed.
func (s *Scheduler) scheduleOne(ctx context.Context) bool {
	it, cycle := s.queue.Pop()
	if it == nil {
		return false
	}
	pod := it.pod
	// The queued object may be stale: skip pods deleted, being deleted or
	// bound since.
	cur, err := s.pods.Pods(pod.Namespace).Get(pod.Name)
	if err != nil || cur.UID != pod.UID || cur.Spec.NodeName != "" || cur.DeletionTimestamp != nil {
		s.queue.Done(it)
		return true
	}
	pod = cur
	start := time.Now()
	d, err := s.decide(ctx, pod)
	switch {
	case errors.Is(err, errUnschedulable):
		s.metrics.attempt(resultUnschedulable, time.Since(start))
		s.log.Debug("pod is unschedulable", "pod", it.key, "why", d.message)
		nominated := ""
		if pr := d.preemption; pr.node != "" {
			// Nominated at once, so the next decisions keep the room for it;
			// the victims go in the background. Their deletion requeues it.
			nominated = pr.node
			s.cache.Nominate(pod, pr.node)
			s.log.Info("preempting", "pod", it.key, "node", pr.node, "victims", len(pr.victims))
			s.inBackground(ctx, func() { s.preemptVictims(ctx, pod, pr) })
		}
		s.failed(ctx, pod, v1.PodReasonUnschedulable, d.message, nominated)
		s.queue.Requeue(it, cycle, true)
		return true
	case err != nil:
		if ctx.Err() != nil {
			s.queue.Done(it)
			return true
		}
		s.metrics.attempt(resultError, time.Since(start))
		s.failed(ctx, pod, v1.PodReasonSchedulerError, err.Error(), "")
		s.queue.Requeue(it, cycle, false)
		return true
	}

	assumed := pod.DeepCopy()
	assumed.Spec.NodeName = d.node
	if err := s.cache.Assume(assumed); err != nil {
		s.metrics.attempt(resultError, time.Since(start))
		s.log.Error("assume pod", "pod", it.key, "err", err)
		s.queue.Requeue(it, cycle, false)
		return true
	}
	allBound := true
	if d.volumes != nil {
		allBound, err = s.volumes.AssumePodVolumes(s.klog, assumed, d.node, d.volumes)
		if err != nil {
			s.cache.Forget(assumed)
			s.metrics.attempt(resultError, time.Since(start))
			s.failed(ctx, pod, v1.PodReasonSchedulerError, err.Error(), "")
			s.queue.Requeue(it, cycle, false)
			return true
		}
	}
	decided := time.Since(start)
	s.queue.Done(it)

	select {
	case s.bindSem <- struct{}{}:
	case <-ctx.Done():
		s.cache.Forget(assumed)
		return true
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.bindSem }()
		var err error
		if !allBound {
			// PreBind, as upstream: prebind volumes / select the node for
			// provisioning, and wait for the claims to be bound.
			err = s.volumes.BindPodVolumes(ctx, assumed, d.volumes)
		}
		if err == nil {
			err = s.bind(ctx, assumed)
		}
		if err != nil {
			if d.volumes != nil {
				s.volumes.RevertAssumedPodVolumes(d.volumes)
			}
			s.cache.Forget(assumed)
			s.metrics.attempt(resultError, decided)
			if ctx.Err() != nil {
				return
			}
			s.log.Info("binding failed, will retry", "pod", it.key, "node", d.node, "err", err)
			s.failed(ctx, pod, v1.PodReasonSchedulerError, fmt.Sprintf("binding rejected: %v", err), "")
			s.queue.Requeue(it, cycle, false)
			return
		}
		s.metrics.attempt(resultScheduled, decided)
		s.metrics.e2e.Observe(time.Since(it.added).Seconds())
		s.recorder.Eventf(assumed, v1.EventTypeNormal, "Scheduled", "Successfully assigned %s to %s", it.key, d.node)
		s.log.Debug("bound", "pod", it.key, "node", d.node, "feasible", d.feasible)
	}()
	return true
}

// bind posts the pods/binding subresource.
func (s *Scheduler) bind(ctx context.Context, pod *v1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     v1.ObjectReference{Kind: "Node", Name: pod.Spec.NodeName},
	}
	if err := s.cs.CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bind %s/%s to %s: %w", pod.Namespace, pod.Name, pod.Spec.NodeName, err)
	}
	return nil
}

// failed records a failed attempt: a FailedScheduling event and the
// PodScheduled=False condition with the reason and message, and the node
// preemption nominated the pod to ("" leaves status.nominatedNodeName).
func (s *Scheduler) failed(ctx context.Context, pod *v1.Pod, reason, message, nominated string) {
	s.recorder.Event(pod, v1.EventTypeWarning, "FailedScheduling", message)
	if hasCondition(pod, reason, message) && (nominated == "" || pod.Status.NominatedNodeName == nominated) {
		return
	}
	s.inBackground(ctx, func() {
		if err := s.setCondition(ctx, pod, reason, message, nominated); err != nil && ctx.Err() == nil {
			s.log.Warn("update PodScheduled condition", "pod", podKey(pod), "err", err)
		}
	})
}

// markGated writes PodScheduled=False/SchedulingGated on a pod that still
// has scheduling gates, as upstream does.
func (s *Scheduler) markGated(pod *v1.Pod) {
	const msg = "Scheduling is blocked due to non-empty scheduling gates"
	if hasCondition(pod, v1.PodReasonSchedulingGated, msg) || s.bgCtx == nil {
		return
	}
	ctx := s.bgCtx
	s.inBackground(ctx, func() {
		if err := s.setCondition(ctx, pod, v1.PodReasonSchedulingGated, msg, ""); err != nil && ctx.Err() == nil {
			s.log.Warn("update PodScheduled condition", "pod", podKey(pod), "err", err)
		}
	})
}

// inBackground runs an API write in a goroutine, within BindConcurrency.
func (s *Scheduler) inBackground(ctx context.Context, fn func()) {
	select {
	case s.bindSem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.bindSem }()
		fn()
	}()
}

func (s *Scheduler) setCondition(ctx context.Context, pod *v1.Pod, reason, message, nominated string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pods := s.cs.CoreV1().Pods(pod.Namespace)
	cur := pod.DeepCopy()
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if cur == nil {
			var err error
			if cur, err = pods.Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		if cur.UID != pod.UID || cur.Spec.NodeName != "" ||
			(hasCondition(cur, reason, message) && (nominated == "" || cur.Status.NominatedNodeName == nominated)) {
			return nil
		}
		if reason == v1.PodReasonSchedulingGated && !gated(cur) {
			return nil // the gates went meanwhile
		}
		if nominated != "" {
			cur.Status.NominatedNodeName = nominated
		}
		cond := v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: reason, Message: message, LastTransitionTime: metav1.Now()}
		replaced := false
		for i := range cur.Status.Conditions {
			if cur.Status.Conditions[i].Type == v1.PodScheduled {
				if cur.Status.Conditions[i].Status == v1.ConditionFalse {
					cond.LastTransitionTime = cur.Status.Conditions[i].LastTransitionTime
				}
				cur.Status.Conditions[i] = cond
				replaced = true
			}
		}
		if !replaced {
			cur.Status.Conditions = append(cur.Status.Conditions, cond)
		}
		_, err := pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			cur = nil
		}
		return err
	})
}

func hasCondition(pod *v1.Pod, reason, message string) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled {
			return c.Status == v1.ConditionFalse && c.Reason == reason && c.Message == message
		}
	}
	return false
}
