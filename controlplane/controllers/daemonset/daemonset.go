// Package daemonset is the DaemonSet controller: one pod per eligible node
// (nodeSelector, required node affinity, and taints against the pod's
// tolerations plus the tolerations Kubernetes gives every daemon pod), each
// pod pinned to its node the way Kubernetes does it — spec.affinity
// nodeAffinity matchFields metadata.name In [node] — so the scheduler binds
// it; pods on nodes that no longer qualify are deleted, failed ones
// replaced; RollingUpdate replaces pods whose controller-revision-hash is
// stale, never more than maxUnavailable unavailable at a time (or, with
// maxSurge, starting the new pod beside the old one first); and status
// (desired, current, misscheduled, ready, available, updated, unavailable,
// observedGeneration) is what `kubectl rollout status ds` reads.
//
// It does not bind pods (the scheduler does) and keeps no ControllerRevision
// history (the API server does not serve controllerrevisions), so `kubectl
// rollout undo ds` is not supported.
package daemonset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	schedhelper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name.
const Name = "daemonset"

// Options tune the controller.
type Options struct {
	// BurstReplicas caps the pods created or deleted in one sync (250).
	BurstReplicas int
	// Revisions keeps ControllerRevisions (the API server must serve
	// them): `kubectl rollout history/undo daemonset` read them.
	Revisions bool
}

// Controller reconciles DaemonSets with nodes and pods.
type Controller struct {
	client  kubernetes.Interface
	log     *slog.Logger
	opts    Options
	queue   workqueue.TypedRateLimitingInterface[string]
	dsl     appslisters.DaemonSetLister
	nodes   corelisters.NodeLister
	pods    corelisters.PodLister
	revs    appslisters.ControllerRevisionLister
	synced  []cache.InformerSynced
	exp     *ctrlutil.Expectations
	now     func() time.Time
	rec     record.EventRecorder
	stopRec func()
}

// New wires the controller to the factory's DaemonSet, Node and Pod
// informers.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	if opts.BurstReplicas <= 0 {
		opts.BurstReplicas = 250
	}
	dsInf := factory.Apps().V1().DaemonSets()
	nodeInf := factory.Core().V1().Nodes()
	podInf := factory.Core().V1().Pods()
	c := &Controller{
		client: client, log: log.With("controller", Name), opts: opts, queue: ctrlutil.NewQueue(Name),
		dsl: dsInf.Lister(), nodes: nodeInf.Lister(), pods: podInf.Lister(),
		synced: []cache.InformerSynced{dsInf.Informer().HasSynced, nodeInf.Informer().HasSynced, podInf.Informer().HasSynced},
		exp:    ctrlutil.NewExpectations(), now: time.Now,
	}
	c.rec, c.stopRec = ctrlutil.NewRecorder(client, "daemonset-controller")
	if opts.Revisions {
		revInf := factory.Apps().V1().ControllerRevisions()
		c.revs = revInf.Lister()
		c.synced = append(c.synced, revInf.Informer().HasSynced)
	}
	dsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, cur any) { c.enqueue(cur) },
		DeleteFunc: func(obj any) {
			if k := ctrlutil.KeyFunc(obj); k != "" {
				c.exp.Forget(k)
				c.queue.Add(k)
			}
		},
	})
	nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.enqueueAll() },
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Node), cur.(*corev1.Node)
			if !apiequality.Semantic.DeepEqual(o.Labels, n.Labels) || !apiequality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints) {
				c.enqueueAll()
			}
		},
		DeleteFunc: func(any) { c.enqueueAll() },
	})
	podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			p := obj.(*corev1.Pod)
			if k := c.owner(p); k != "" {
				c.exp.CreationObserved(k)
				c.queue.Add(k)
			}
		},
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Pod), cur.(*corev1.Pod)
			if ctrlutil.SameVersion(o, n) {
				return
			}
			k := c.owner(n)
			if k == "" {
				return
			}
			if n.DeletionTimestamp != nil && o.DeletionTimestamp == nil {
				c.exp.DeletionObserved(k, n.Namespace+"/"+n.Name)
			}
			c.queue.Add(k)
			if !ctrlutil.IsPodReady(o) && ctrlutil.IsPodReady(n) {
				if ds, err := c.dsByKey(k); err == nil && ds.Spec.MinReadySeconds > 0 {
					c.queue.AddAfter(k, time.Duration(ds.Spec.MinReadySeconds)*time.Second+time.Second)
				}
			}
		},
		DeleteFunc: func(obj any) {
			p, ok := ctrlutil.Unwrap(obj).(*corev1.Pod)
			if !ok {
				return
			}
			if k := c.owner(p); k != "" {
				c.exp.DeletionObserved(k, p.Namespace+"/"+p.Name)
				c.queue.Add(k)
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

func (c *Controller) enqueueAll() {
	all, err := c.dsl.List(labels.Everything())
	if err != nil {
		return
	}
	for _, ds := range all {
		c.enqueue(ds)
	}
}

func (c *Controller) dsByKey(key string) (*appsv1.DaemonSet, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, err
	}
	return c.dsl.DaemonSets(ns).Get(name)
}

func (c *Controller) owner(p *corev1.Pod) string {
	ds, ok := ctrlutil.ResolveController(p, "DaemonSet", func(ns, name string) (*appsv1.DaemonSet, error) { return c.dsl.DaemonSets(ns).Get(name) })
	if !ok {
		return ""
	}
	return p.Namespace + "/" + ds.Name
}

// Run runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.stopRec()
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced...)
}

// DefaultTolerations are added to every daemon pod, as Kubernetes does: a
// daemon keeps running on not-ready, unreachable, pressured or cordoned
// nodes.
func DefaultTolerations(hostNetwork bool) []corev1.Toleration {
	t := []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	}
	if hostNetwork {
		t = append(t, corev1.Toleration{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	return t
}

func addTolerations(spec *corev1.PodSpec) {
	for _, t := range DefaultTolerations(spec.HostNetwork) {
		found := false
		for _, have := range spec.Tolerations {
			if have.Key == t.Key && have.Effect == t.Effect && have.Operator == t.Operator {
				found = true
				break
			}
		}
		if !found {
			spec.Tolerations = append(spec.Tolerations, t)
		}
	}
}

// PinToNode sets the pod's required node affinity to the single term
// matchFields metadata.name In [node], replacing any required terms it had
// (the node was already checked against them), as Kubernetes'
// ReplaceDaemonSetPodNodeNameNodeAffinity does.
func PinToNode(a *corev1.Affinity, node string) *corev1.Affinity {
	sel := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}
	if a == nil {
		a = &corev1.Affinity{}
	}
	if a.NodeAffinity == nil {
		a.NodeAffinity = &corev1.NodeAffinity{}
	}
	a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = sel
	return a
}

// TargetNode returns the node a daemon pod is for: its nodeName once bound,
// else the node named by its matchFields affinity.
func TargetNode(p *corev1.Pod) string {
	if p.Spec.NodeName != "" {
		return p.Spec.NodeName
	}
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == metav1.ObjectNameField && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

// NodeShouldRun decides, for a node and a daemon set, whether a daemon pod
// should be placed there (shouldRun) and whether one already there may stay
// (shouldContinue): a NoSchedule taint stops new pods only, a NoExecute
// taint evicts.
func NodeShouldRun(node *corev1.Node, ds *appsv1.DaemonSet) (shouldRun, shouldContinue bool) {
	pod := &corev1.Pod{Spec: *ds.Spec.Template.Spec.DeepCopy()}
	pod.Spec.NodeName = ""
	addTolerations(&pod.Spec)
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); err != nil || !ok {
		return false, false
	}
	if _, untolerated := schedhelper.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoExecute
	}, false); untolerated {
		return false, false
	}
	if _, untolerated := schedhelper.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule
	}, false); untolerated {
		return false, true
	}
	return true, true
}

// Hash is the controller-revision-hash of the daemon set's template.
func Hash(ds *appsv1.DaemonSet) string {
	return ctrlutil.ComputeHash(&ds.Spec.Template, ds.Status.CollisionCount)
}

func (c *Controller) newPod(ds *appsv1.DaemonSet, node, hash string) *corev1.Pod {
	pod := ctrlutil.PodFromTemplate(ds, &ds.Spec.Template, "apps/v1", "DaemonSet")
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] = hash
	pod.Spec.NodeName = ""
	pod.Spec.Affinity = PinToNode(pod.Spec.Affinity, node)
	addTolerations(&pod.Spec)
	return pod
}

// rollingParams resolves maxSurge (rounded up) and maxUnavailable (rounded
// up, as Kubernetes does for daemon sets) against the desired node count.
// Both zero would never progress and becomes maxUnavailable 1.
func rollingParams(ds *appsv1.DaemonSet, desired int) (surge, unavailable int, err error) {
	u, sg := intstr.FromInt32(1), intstr.FromInt32(0)
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru != nil {
		if ru.MaxUnavailable != nil {
			u = *ru.MaxUnavailable
		}
		if ru.MaxSurge != nil {
			sg = *ru.MaxSurge
		}
	}
	if unavailable, err = intstr.GetScaledValueFromIntOrPercent(&u, desired, true); err != nil {
		return 0, 0, fmt.Errorf("maxUnavailable: %w", err)
	}
	if surge, err = intstr.GetScaledValueFromIntOrPercent(&sg, desired, true); err != nil {
		return 0, 0, fmt.Errorf("maxSurge: %w", err)
	}
	if surge == 0 && unavailable == 0 {
		unavailable = 1
	}
	return surge, unavailable, nil
}

func maxUnavailable(ds *appsv1.DaemonSet, desired int) (int, error) {
	_, u, err := rollingParams(ds, desired)
	return u, err
}

func surgeEnabled(ds *appsv1.DaemonSet) bool {
	if ds.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType {
		return false
	}
	s, _, err := rollingParams(ds, 100)
	return err == nil && s > 0
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	cached, err := c.dsl.DaemonSets(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.exp.Forget(key)
		return nil
	}
	if err != nil {
		return err
	}
	ds := cached.DeepCopy()
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || sel.Empty() {
		c.log.Warn("daemonset has an empty or invalid selector; not acting", "daemonset", key, "err", err)
		return nil
	}
	all, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	cl := &ctrlutil.Claimer[*corev1.Pod]{
		Owner: ds, APIVersion: "apps/v1", Kind: "DaemonSet", Selector: sel,
		CanAdopt: ctrlutil.RecheckOwner(ds, func(ctx context.Context) (metav1.Object, error) {
			return c.client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		}),
		Patch: func(ctx context.Context, name string, data []byte) error {
			_, err := c.client.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
			return err
		},
		Copy: func(p *corev1.Pod) *corev1.Pod { return p.DeepCopy() },
	}
	owned, claimErr := cl.Claim(ctx, all)
	byNode := map[string][]*corev1.Pod{}
	for _, p := range owned {
		if p.DeletionTimestamp != nil {
			continue
		}
		if n := TargetNode(p); n != "" {
			byNode[n] = append(byNode[n], p)
		}
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	hash := Hash(ds)
	var revErr error
	if c.revs != nil && ds.DeletionTimestamp == nil {
		podHashes := map[string]bool{}
		for _, p := range owned {
			podHashes[p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]] = true
		}
		if revErr = c.syncRevisions(ctx, ds, sel, hash, podHashes); revErr != nil {
			return errors.Join(claimErr, revErr)
		}
	}
	var manageErr error
	if c.exp.Satisfied(key) && ds.DeletionTimestamp == nil {
		manageErr = c.manage(ctx, key, ds, nodes, byNode, hash)
	}
	return errors.Join(claimErr, manageErr, c.updateStatus(ctx, ds, nodes, byNode, hash))
}

func (c *Controller) manage(ctx context.Context, key string, ds *appsv1.DaemonSet, nodes []*corev1.Node, byNode map[string][]*corev1.Pod, hash string) error {
	var create []string
	var del []*corev1.Pod
	known := map[string]bool{}
	desired := 0
	for _, node := range nodes {
		known[node.Name] = true
		run, cont := NodeShouldRun(node, ds)
		if run {
			desired++
		}
		pods := byNode[node.Name]
		switch {
		case run && len(pods) == 0:
			create = append(create, node.Name)
		case cont:
			var alive []*corev1.Pod
			for _, p := range pods {
				if p.Status.Phase == corev1.PodFailed {
					del = append(del, p) // replaced on a later sync
					continue
				}
				alive = append(alive, p)
			}
			if len(alive) > 1 {
				// Keep the oldest; delete the duplicates. While surging, a
				// node may hold one old and one updated pod: keep the
				// oldest of each.
				sort.Slice(alive, func(i, j int) bool { return alive[i].CreationTimestamp.Before(&alive[j].CreationTimestamp) })
				if surgeEnabled(ds) {
					keptOld, keptNew := false, false
					for _, p := range alive {
						isNew := p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] == hash
						switch {
						case isNew && !keptNew:
							keptNew = true
						case !isNew && !keptOld:
							keptOld = true
						default:
							del = append(del, p)
						}
					}
				} else {
					del = append(del, alive[1:]...)
				}
			}
		case !cont:
			del = append(del, pods...)
		}
	}
	// Pods for nodes that no longer exist.
	for n, pods := range byNode {
		if !known[n] {
			del = append(del, pods...)
		}
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType && len(create) == 0 && len(del) == 0 {
		if surgeEnabled(ds) {
			cr, d, err := c.surgeUpdate(ds, nodes, byNode, hash, desired)
			if err != nil {
				return err
			}
			create, del = append(create, cr...), append(del, d...)
		} else {
			d, err := c.rollingUpdateVictims(ds, nodes, byNode, hash, desired)
			if err != nil {
				return err
			}
			del = append(del, d...)
		}
	}
	if len(create) > c.opts.BurstReplicas {
		create = create[:c.opts.BurstReplicas]
	}
	if len(del) > c.opts.BurstReplicas {
		del = del[:c.opts.BurstReplicas]
	}
	var errs []error
	if len(create) > 0 {
		c.exp.ExpectCreations(key, len(create))
		next := make(chan string, len(create))
		for _, n := range create {
			next <- n
		}
		close(next)
		done, err := ctrlutil.SlowStartBatch(len(create), 1, func() error {
			node := <-next
			created, err := c.client.CoreV1().Pods(ds.Namespace).Create(ctx, c.newPod(ds, node, hash), metav1.CreateOptions{})
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				return nil
			}
			if err != nil {
				c.rec.Eventf(ds, corev1.EventTypeWarning, "FailedCreate", "Error creating: %v", err)
				return err
			}
			c.rec.Eventf(ds, corev1.EventTypeNormal, "SuccessfulCreate", "Created pod: %v", created.Name)
			return nil
		})
		for i := done; i < len(create); i++ {
			c.exp.CreationObserved(key)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("create daemon pods for %s: %w", key, err))
		}
	}
	if len(del) > 0 {
		keys := make([]string, len(del))
		for i, p := range del {
			keys[i] = p.Namespace + "/" + p.Name
		}
		c.exp.ExpectDeletions(key, keys)
		for i, p := range del {
			err := c.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err == nil {
				c.rec.Eventf(ds, corev1.EventTypeNormal, "SuccessfulDelete", "Deleted pod: %v", p.Name)
			}
			if err != nil {
				c.exp.DeletionObserved(key, keys[i])
				if !apierrors.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("delete daemon pod %s: %w", keys[i], err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// rollingUpdateVictims picks the old-revision pods to delete now: every
// unavailable one (it serves nothing), then available ones while fewer
// than maxUnavailable nodes are without an available daemon pod.
func (c *Controller) rollingUpdateVictims(ds *appsv1.DaemonSet, nodes []*corev1.Node, byNode map[string][]*corev1.Pod, hash string, desired int) ([]*corev1.Pod, error) {
	maxUnavail, err := maxUnavailable(ds, desired)
	if err != nil {
		return nil, err
	}
	now := c.now()
	unavailable := 0
	var free, candidates []*corev1.Pod
	for _, node := range nodes {
		if run, _ := NodeShouldRun(node, ds); !run {
			continue
		}
		pods := byNode[node.Name]
		if len(pods) != 1 {
			unavailable++
			continue
		}
		p := pods[0]
		available := ctrlutil.IsPodAvailable(p, ds.Spec.MinReadySeconds, now)
		if p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] == hash {
			if !available {
				unavailable++
			}
			continue
		}
		if !available {
			free = append(free, p)
			unavailable++
			continue
		}
		candidates = append(candidates, p)
	}
	sort.Slice(candidates, func(i, j int) bool { return TargetNode(candidates[i]) < TargetNode(candidates[j]) })
	for _, p := range candidates {
		if unavailable >= maxUnavail {
			break
		}
		free = append(free, p)
		unavailable++
	}
	return free, nil
}

// surgeUpdate is the rolling update with maxSurge > 0: an updated pod is
// started next to an old one (at most maxSurge nodes at a time; at once where
// the old pod is unavailable anyway), and the old pod is deleted once the
// updated one is available.
func (c *Controller) surgeUpdate(ds *appsv1.DaemonSet, nodes []*corev1.Node, byNode map[string][]*corev1.Pod, hash string, desired int) ([]string, []*corev1.Pod, error) {
	maxSurge, _, err := rollingParams(ds, desired)
	if err != nil {
		return nil, nil, err
	}
	now := c.now()
	surging := 0
	var create, candidates []string
	var del []*corev1.Pod
	for _, node := range nodes {
		if run, _ := NodeShouldRun(node, ds); !run {
			continue
		}
		var oldPod, newPod *corev1.Pod
		for _, p := range byNode[node.Name] {
			if p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] == hash {
				newPod = p
			} else {
				oldPod = p
			}
		}
		switch {
		case oldPod == nil:
		case newPod == nil && !ctrlutil.IsPodAvailable(oldPod, ds.Spec.MinReadySeconds, now):
			create = append(create, node.Name) // nothing to lose here
		case newPod == nil:
			candidates = append(candidates, node.Name)
		default:
			surging++
			if ctrlutil.IsPodAvailable(newPod, ds.Spec.MinReadySeconds, now) {
				del = append(del, oldPod)
			}
		}
	}
	sort.Strings(candidates)
	if room := maxSurge - surging; room > 0 {
		create = append(create, candidates[:min(room, len(candidates))]...)
	}
	return create, del, nil
}

func (c *Controller) updateStatus(ctx context.Context, ds *appsv1.DaemonSet, nodes []*corev1.Node, byNode map[string][]*corev1.Pod, hash string) error {
	var st appsv1.DaemonSetStatus
	now := c.now()
	for _, node := range nodes {
		run, _ := NodeShouldRun(node, ds)
		pods := byNode[node.Name]
		if !run {
			if len(pods) > 0 {
				st.NumberMisscheduled++
			}
			continue
		}
		st.DesiredNumberScheduled++
		if len(pods) == 0 {
			continue
		}
		st.CurrentNumberScheduled++
		// A node counts once: ready/available if one of its daemon pods is
		// (during a surge it has two), updated if one carries the hash.
		ready, available, updated := false, false, false
		for _, p := range pods {
			ready = ready || ctrlutil.IsPodReady(p)
			available = available || ctrlutil.IsPodAvailable(p, ds.Spec.MinReadySeconds, now)
			updated = updated || p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] == hash
		}
		if ready {
			st.NumberReady++
		}
		if available {
			st.NumberAvailable++
		}
		if updated {
			st.UpdatedNumberScheduled++
		}
	}
	st.NumberUnavailable = max(0, st.DesiredNumberScheduled-st.NumberAvailable)
	st.ObservedGeneration = ds.Generation
	st.CollisionCount = ds.Status.CollisionCount
	st.Conditions = ds.Status.Conditions
	if ds.Spec.MinReadySeconds > 0 && st.NumberReady != st.NumberAvailable {
		c.queue.AddAfter(ds.Namespace+"/"+ds.Name, time.Duration(ds.Spec.MinReadySeconds)*time.Second)
	}
	if apiequality.Semantic.DeepEqual(ds.Status, st) {
		return nil
	}
	ds.Status = st
	_, err := c.client.AppsV1().DaemonSets(ds.Namespace).UpdateStatus(ctx, ds, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("update status of daemonset %s/%s: %w", ds.Namespace, ds.Name, err)
	}
	return nil
}
