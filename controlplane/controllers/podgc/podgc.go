// Package podgc is the pod garbage collector, as Kubernetes' PodGC
// controller: every period it deletes terminated pods (Succeeded or Failed)
// beyond --terminated-pod-gc-threshold, oldest first; pods bound to a node
// that no longer exists (after a quarantine, and confirmed with the API
// server, not just the cache); terminating pods never scheduled; and
// terminating pods on nodes tainted node.kubernetes.io/out-of-service. Pods
// it removes that have not finished are first marked Failed with the
// DisruptionTarget condition (reason DeletionByPodGC), then force-deleted.
//
// It does not evict pods from live nodes (the node lifecycle controller
// does).
package podgc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name (queue and metrics label, --controllers).
const Name = "podgc"

// Upstream's defaults.
const (
	DefaultThreshold  = 12500
	DefaultPeriod     = 20 * time.Second
	DefaultQuarantine = 40 * time.Second
)

// Options tune the controller.
type Options struct {
	// TerminatedPodThreshold: terminated pods kept before the oldest are
	// deleted; ≤ 0 disables that part (as upstream's 0).
	TerminatedPodThreshold int
	// Period between collections; Quarantine is how long a node must have
	// been missing before its pods are orphans.
	Period, Quarantine time.Duration
}

// Controller collects pods.
type Controller struct {
	client  kubernetes.Interface
	log     *slog.Logger
	opts    Options
	queue   workqueue.TypedRateLimitingInterface[string]
	pods    corelisters.PodLister
	nodes   corelisters.NodeLister
	synced  []cache.InformerSynced
	now     func() time.Time
	mu      sync.Mutex
	missing map[string]time.Time // node name → first seen missing
}

// New wires the controller to the factory's Pod and Node informers.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	if opts.Period <= 0 {
		opts.Period = DefaultPeriod
	}
	if opts.Quarantine < 0 {
		opts.Quarantine = DefaultQuarantine
	}
	podInf, nodeInf := factory.Core().V1().Pods(), factory.Core().V1().Nodes()
	return &Controller{client: client, log: log.With("controller", Name), opts: opts, queue: ctrlutil.NewQueue(Name),
		pods: podInf.Lister(), nodes: nodeInf.Lister(),
		synced: []cache.InformerSynced{podInf.Informer().HasSynced, nodeInf.Informer().HasSynced},
		now:    time.Now, missing: map[string]time.Time{}}
}

// Run collects every period until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Add("gc")
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, 1, func(ctx context.Context, key string) error {
		err := c.collect(ctx)
		c.queue.AddAfter(key, c.opts.Period)
		return err
	}, c.synced...)
}

func (c *Controller) collect(ctx context.Context) error {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return err
	}
	return errors.Join(c.terminated(ctx, pods), c.orphaned(ctx, pods), c.unscheduledTerminating(ctx, pods), c.outOfService(ctx, pods))
}

// terminated deletes the oldest terminated pods beyond the threshold.
func (c *Controller) terminated(ctx context.Context, pods []*corev1.Pod) error {
	if c.opts.TerminatedPodThreshold <= 0 {
		return nil
	}
	var done []*corev1.Pod
	for _, p := range pods {
		if ctrlutil.IsPodTerminal(p) && p.DeletionTimestamp == nil {
			done = append(done, p)
		}
	}
	excess := len(done) - c.opts.TerminatedPodThreshold
	if excess <= 0 {
		return nil
	}
	sort.Slice(done, func(i, j int) bool {
		a, b := done[i], done[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	c.log.Info("deleting terminated pods over the threshold", "count", excess, "threshold", c.opts.TerminatedPodThreshold)
	var errs []error
	for _, p := range done[:excess] {
		if err := c.forceDelete(ctx, p, ""); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// orphaned deletes pods bound to nodes that have been gone for the
// quarantine, as the API server confirms.
func (c *Controller) orphaned(ctx context.Context, pods []*corev1.Pod) error {
	now := c.now()
	byNode := map[string][]*corev1.Pod{}
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
	}
	c.mu.Lock()
	for n := range c.missing {
		if _, ok := byNode[n]; !ok {
			delete(c.missing, n)
		}
	}
	c.mu.Unlock()
	var errs []error
	for node, ps := range byNode {
		if _, err := c.nodes.Get(node); err == nil {
			c.mu.Lock()
			delete(c.missing, node)
			c.mu.Unlock()
			continue
		}
		c.mu.Lock()
		since, ok := c.missing[node]
		if !ok {
			since = now
			c.missing[node] = now
		}
		c.mu.Unlock()
		if now.Sub(since) < c.opts.Quarantine {
			continue
		}
		// The cache may lag: believe only the API server.
		if _, err := c.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		for _, p := range ps {
			if err := c.forceDelete(ctx, p, "PodGC: node no longer exists"); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// unscheduledTerminating force-deletes terminating pods no node will ever
// finalize.
func (c *Controller) unscheduledTerminating(ctx context.Context, pods []*corev1.Pod) error {
	var errs []error
	for _, p := range pods {
		if p.DeletionTimestamp != nil && p.Spec.NodeName == "" {
			if err := c.forceDelete(ctx, p, ""); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// outOfService force-deletes terminating pods on nodes an operator tainted
// node.kubernetes.io/out-of-service (the node is known to be down).
func (c *Controller) outOfService(ctx context.Context, pods []*corev1.Pod) error {
	var errs []error
	for _, p := range pods {
		if p.DeletionTimestamp == nil || p.Spec.NodeName == "" {
			continue
		}
		n, err := c.nodes.Get(p.Spec.NodeName)
		if err != nil {
			continue
		}
		for _, t := range n.Spec.Taints {
			if t.Key == corev1.TaintNodeOutOfService {
				if err := c.forceDelete(ctx, p, "PodGC: node is out-of-service"); err != nil {
					errs = append(errs, err)
				}
				break
			}
		}
	}
	return errors.Join(errs...)
}

// forceDelete deletes p with grace period 0; a pod that has not finished is
// first marked Failed with DisruptionTarget (reason DeletionByPodGC,
// message msg), as upstream does.
func (c *Controller) forceDelete(ctx context.Context, p *corev1.Pod, msg string) error {
	if msg != "" && !ctrlutil.IsPodTerminal(p) {
		// A strategic-merge patch of the status (conditions merge by
		// type): system:controller:pod-garbage-collector may patch
		// pods/status, not update it.
		patch, err := json.Marshal(map[string]any{"status": map[string]any{
			"phase": corev1.PodFailed,
			"conditions": []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
				Reason: "DeletionByPodGC", Message: msg, LastTransitionTime: metav1.NewTime(c.now())}},
		}})
		if err != nil {
			return err
		}
		if _, err := c.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil && !apierrors.IsNotFound(err) {
			c.log.Debug("could not mark pod failed before deleting it", "pod", p.Namespace+"/"+p.Name, "err", err)
		}
	}
	zero := int64(0)
	err := c.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	c.log.Info("garbage collected pod", "pod", p.Namespace+"/"+p.Name, "reason", msg)
	return nil
}
