// Package nodeipam is the controller-manager's node IPAM controller: it gives
// every node a podCIDR (spec.podCIDR and spec.podCIDRs) cut from the cluster
// CIDR (--cluster-cidr, node mask --node-cidr-mask-size, default /24), which
// the CNI plugin then hands out to the node's pods. A node's CIDR is released
// when the node is deleted; at start the allocations are rebuilt from the
// existing nodes, so a restarted or newly elected controller never hands out a
// CIDR twice.
//
// It is not the pods' IPAM (that is the CNI plugin's, per node) and not the
// service CIDR allocator (the API server's). It allocates one CIDR per node
// (single stack).
package nodeipam

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name in --controllers and in its queue metrics.
const Name = "nodeipam"

// DefaultNodeCIDRMaskSize is the node subnet size for IPv4 (--node-cidr-mask-size);
// IPv6 cluster CIDRs default to /64.
const DefaultNodeCIDRMaskSize = 24

// Options configure the controller.
type Options struct {
	// ClusterCIDR is the pod network, e.g. "10.244.0.0/16" (--cluster-cidr).
	ClusterCIDR string
	// NodeCIDRMaskSize is the prefix length of each node's podCIDR
	// (--node-cidr-mask-size; 0 means 24 for IPv4, 64 for IPv6).
	NodeCIDRMaskSize int
}

// Validate parses the options; New on invalid options returns a controller
// whose Run logs the error and returns.
func (o Options) Validate() error {
	_, err := o.cidrSet()
	return err
}

func (o Options) cidrSet() (*CIDRSet, error) {
	p, err := netip.ParsePrefix(o.ClusterCIDR)
	if err != nil {
		return nil, fmt.Errorf("%w: --cluster-cidr %q: %w", ErrInvalidCIDR, o.ClusterCIDR, err)
	}
	mask := o.NodeCIDRMaskSize
	if mask == 0 {
		mask = DefaultNodeCIDRMaskSize
		if p.Addr().Is6() {
			mask = 64
		}
	}
	return NewCIDRSet(p, mask)
}

// Controller allocates node podCIDRs.
type Controller struct {
	client kubernetes.Interface
	log    *slog.Logger
	nodes  corelisters.NodeLister
	queue  workqueue.TypedRateLimitingInterface[string]
	synced cache.InformerSynced
	set    *CIDRSet
	err    error

	mu     sync.Mutex
	byNode map[string]netip.Prefix // allocated or occupied, by node
	owner  map[netip.Prefix]string
}

// New builds the controller on factory's node informer; the caller starts
// factory.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	inf := factory.Core().V1().Nodes()
	c := &Controller{
		client: client, log: log.With("controller", Name),
		nodes: inf.Lister(), queue: ctrlutil.NewQueue(Name), synced: inf.Informer().HasSynced,
		byNode: map[string]netip.Prefix{}, owner: map[netip.Prefix]string{},
	}
	c.set, c.err = opts.cidrSet()
	enqueue := func(obj any) {
		if n, ok := ctrlutil.Unwrap(obj).(*corev1.Node); ok {
			c.queue.Add(n.Name)
		}
	}
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, cur any) { enqueue(cur) },
		DeleteFunc: enqueue,
	})
	return c
}

// Run rebuilds the allocations from the existing nodes, then allocates with
// workers goroutines until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	if c.err != nil {
		c.log.Error("node IPAM disabled by its configuration", "err", c.err)
		c.queue.ShutDown()
		return
	}
	if !cache.WaitForNamedCacheSync(Name, ctx.Done(), c.synced) {
		c.queue.ShutDown()
		return
	}
	nodes, err := c.nodes.List(everything())
	if err != nil {
		c.log.Error("list nodes", "err", err)
	}
	for _, n := range nodes {
		c.occupy(n)
	}
	used, total := c.set.InUse()
	c.log.Info("node CIDRs rebuilt from existing nodes", "used", used, "total", total)
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced)
}

// occupy records the podCIDR a node already has. It reports false when the
// CIDR is held by another node (or unusable).
func (c *Controller) occupy(n *corev1.Node) bool {
	p, err := netip.ParsePrefix(n.Spec.PodCIDR)
	if err != nil {
		c.log.Warn("node has an unparsable podCIDR", "node", n.Name, "podCIDR", n.Spec.PodCIDR)
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.byNode[n.Name]; ok && cur == p {
		return true
	}
	if other, ok := c.owner[p]; ok && other != n.Name {
		c.log.Warn("podCIDR is already assigned to another node", "node", n.Name, "podCIDR", p, "other", other)
		return false
	}
	if _, err := c.set.Occupy(p); err != nil {
		c.log.Warn("node's podCIDR is outside the cluster CIDR", "node", n.Name, "err", err)
		return false
	}
	if old, ok := c.byNode[n.Name]; ok { // a reservation the node did not take
		delete(c.owner, old)
		_ = c.set.Release(old)
	}
	c.byNode[n.Name] = p
	c.owner[p] = n.Name
	return true
}

// reserve returns the CIDR reserved for a node, allocating one if needed.
func (c *Controller) reserve(name string) (netip.Prefix, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.byNode[name]; ok {
		return p, nil
	}
	p, err := c.set.Allocate()
	if err != nil {
		return netip.Prefix{}, err
	}
	c.byNode[name] = p
	c.owner[p] = name
	return p, nil
}

func (c *Controller) release(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.byNode[name]
	if !ok {
		return
	}
	delete(c.byNode, name)
	delete(c.owner, p)
	_ = c.set.Release(p)
	c.log.Info("released node CIDR", "node", name, "podCIDR", p)
}

// retryWaiting requeues the nodes still without a podCIDR (a CIDR was freed).
func (c *Controller) retryWaiting() {
	nodes, err := c.nodes.List(everything())
	if err != nil {
		return
	}
	for _, n := range nodes {
		if n.Spec.PodCIDR == "" {
			c.queue.Add(n.Name)
		}
	}
}

func (c *Controller) sync(ctx context.Context, name string) error {
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		c.release(name)
		c.retryWaiting()
		return nil
	}
	if err != nil {
		return err
	}
	if node.Spec.PodCIDR != "" {
		c.occupy(node)
		return nil
	}
	p, err := c.reserve(name)
	if err != nil {
		return fmt.Errorf("allocate a podCIDR for node %s: %w", name, err)
	}
	upd := node.DeepCopy()
	upd.Spec.PodCIDR = p.String()
	upd.Spec.PodCIDRs = []string{p.String()}
	// Update carries the node's resourceVersion: a stale writer (say, a
	// paused former leader) is refused instead of overwriting.
	if _, err := c.client.CoreV1().Nodes().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			c.release(name)
			return nil
		}
		return fmt.Errorf("set podCIDR %s on node %s: %w", p, name, err)
	}
	c.log.Info("allocated node CIDR", "node", name, "podCIDR", p)
	return nil
}

func everything() labels.Selector { return labels.Everything() }
