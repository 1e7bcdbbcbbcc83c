// Package nodeipam is the controller-manager's node IPAM controller: it gives
// every node a podCIDR (spec.podCIDR and spec.podCIDRs) cut from the cluster
// CIDR (--cluster-cidr, node mask --node-cidr-mask-size, default /24), which
// the CNI plugin then hands out to the node's pods. A node's CIDR is released
// when the node is deleted; at start the allocations are rebuilt from the
// existing nodes, so a restarted or newly elected controller never hands out a
// CIDR twice.
//
// It is not the pods' IPAM (that is the CNI plugin's, per node) and not the
// service CIDR allocator (the API server's). A dual-stack cluster CIDR
// ("10.244.0.0/16,fd00:10:244::/56") gives each node one CIDR per family.
package nodeipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
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
	// ClusterCIDR is the pod network (--cluster-cidr): one CIDR, or an IPv4
	// and an IPv6 CIDR separated by a comma for dual-stack nodes, e.g.
	// "10.244.0.0/16,fd00:10:244::/56".
	ClusterCIDR string
	// NodeCIDRMaskSize is the prefix length of each node's IPv4 podCIDR, or
	// of the single family's (--node-cidr-mask-size; 0 means 24 for IPv4, 64
	// for IPv6).
	NodeCIDRMaskSize int
	// NodeCIDRMaskSizeIPv6 is the IPv6 prefix length in a dual-stack cluster
	// (--node-cidr-mask-size-ipv6; 0 means 64).
	NodeCIDRMaskSizeIPv6 int
}

// Validate parses the options; New on invalid options returns a controller
// whose Run logs the error and returns.
func (o Options) Validate() error {
	_, err := o.cidrSets()
	return err
}

// cidrSets returns one CIDRSet per cluster CIDR, in the order given.
func (o Options) cidrSets() ([]*CIDRSet, error) {
	parts := strings.Split(o.ClusterCIDR, ",")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%w: --cluster-cidr %q: at most one IPv4 and one IPv6 CIDR", ErrInvalidCIDR, o.ClusterCIDR)
	}
	var sets []*CIDRSet
	for _, part := range parts {
		p, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("%w: --cluster-cidr %q: %w", ErrInvalidCIDR, o.ClusterCIDR, err)
		}
		mask := o.NodeCIDRMaskSize
		if p.Addr().Is6() && len(parts) == 2 {
			mask = o.NodeCIDRMaskSizeIPv6
		}
		if mask == 0 {
			mask = DefaultNodeCIDRMaskSize
			if p.Addr().Is6() {
				mask = 64
			}
		}
		set, err := NewCIDRSet(p, mask)
		if err != nil {
			return nil, err
		}
		if len(sets) == 1 && sets[0].cluster.Addr().Is6() == p.Addr().Is6() {
			return nil, fmt.Errorf("%w: --cluster-cidr %q: two CIDRs of the same family", ErrInvalidCIDR, o.ClusterCIDR)
		}
		sets = append(sets, set)
	}
	return sets, nil
}

// Controller allocates node podCIDRs.
type Controller struct {
	client kubernetes.Interface
	log    *slog.Logger
	nodes  corelisters.NodeLister
	queue  workqueue.TypedRateLimitingInterface[string]
	synced cache.InformerSynced
	sets   []*CIDRSet
	err    error
	// rec records CIDRNotAvailable on a node that gets no CIDR, as upstream.
	rec     record.EventRecorder
	stopRec func()

	mu     sync.Mutex
	byNode map[string][]netip.Prefix // allocated or occupied, by node, one per set
	owner  map[netip.Prefix]string
}

// New builds the controller on factory's node informer; the caller starts
// factory.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	inf := factory.Core().V1().Nodes()
	c := &Controller{
		client: client, log: log.With("controller", Name),
		nodes: inf.Lister(), queue: ctrlutil.NewQueue(Name), synced: inf.Informer().HasSynced,
		byNode: map[string][]netip.Prefix{}, owner: map[netip.Prefix]string{},
	}
	c.sets, c.err = opts.cidrSets()
	c.rec, c.stopRec = ctrlutil.NewRecorder(client, "cidrAllocator")
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
	defer c.stopRec()
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
		if n.Spec.PodCIDR != "" {
			c.occupy(n)
		}
	}
	for _, set := range c.sets {
		used, total := set.InUse()
		c.log.Info("node CIDRs rebuilt from existing nodes", "cluster", set.cluster, "used", used, "total", total)
	}
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced)
}

// setFor returns the CIDRSet p belongs to.
func (c *Controller) setFor(p netip.Prefix) (*CIDRSet, error) {
	for _, set := range c.sets {
		if set.cluster.Addr().Is6() == p.Addr().Is6() {
			if _, err := set.index(p); err != nil {
				return nil, err
			}
			return set, nil
		}
	}
	return nil, fmt.Errorf("%w: %s: no cluster CIDR of its family", ErrOutOfRange, p)
}

// occupy records the podCIDRs a node already has. It reports false when one
// is held by another node or unusable.
func (c *Controller) occupy(n *corev1.Node) bool {
	specs := n.Spec.PodCIDRs
	if len(specs) == 0 {
		specs = []string{n.Spec.PodCIDR}
	}
	var want []netip.Prefix
	for _, str := range specs {
		p, err := netip.ParsePrefix(str)
		if err != nil {
			c.log.Warn("node has an unparsable podCIDR", "node", n.Name, "podCIDR", str)
			return false
		}
		want = append(want, p)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.Equal(c.byNode[n.Name], want) {
		return true
	}
	for _, p := range want {
		if other, ok := c.owner[p]; ok && other != n.Name {
			c.log.Warn("podCIDR is already assigned to another node", "node", n.Name, "podCIDR", p, "other", other)
			return false
		}
		if _, err := c.setFor(p); err != nil {
			c.log.Warn("node's podCIDR is outside the cluster CIDR", "node", n.Name, "err", err)
			return false
		}
	}
	c.releaseLocked(n.Name) // a reservation the node did not take
	for _, p := range want {
		set, _ := c.setFor(p)
		_, _ = set.Occupy(p)
		c.owner[p] = n.Name
	}
	c.byNode[n.Name] = want
	return true
}

// reserve returns the CIDRs reserved for a node, one per cluster CIDR,
// allocating them if needed.
func (c *Controller) reserve(name string) ([]netip.Prefix, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ps, ok := c.byNode[name]; ok {
		return ps, nil
	}
	var got []netip.Prefix
	for _, set := range c.sets {
		p, err := set.Allocate()
		if err != nil {
			for i, q := range got {
				_ = c.sets[i].Release(q)
			}
			return nil, err
		}
		got = append(got, p)
	}
	c.byNode[name] = got
	for _, p := range got {
		c.owner[p] = name
	}
	return got, nil
}

func (c *Controller) release(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ps := c.releaseLocked(name); len(ps) > 0 {
		c.log.Info("released node CIDRs", "node", name, "podCIDRs", ps)
	}
}

func (c *Controller) releaseLocked(name string) []netip.Prefix {
	ps, ok := c.byNode[name]
	if !ok {
		return nil
	}
	delete(c.byNode, name)
	for _, p := range ps {
		delete(c.owner, p)
		if set, err := c.setFor(p); err == nil {
			_ = set.Release(p)
		}
	}
	return ps
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
	ps, err := c.reserve(name)
	if errors.Is(err, ErrCIDRSetFull) {
		// Upstream's status-change event (the recorder folds repeats of it
		// into one Event with a count); the node is retried with back-off
		// and at once when a CIDR is freed (retryWaiting).
		c.rec.Eventf(node, corev1.EventTypeNormal, "CIDRNotAvailable", "Node %s status is now: CIDRNotAvailable", name)
	}
	if err != nil {
		return fmt.Errorf("allocate podCIDRs for node %s: %w", name, err)
	}
	upd := node.DeepCopy()
	upd.Spec.PodCIDR = ps[0].String()
	upd.Spec.PodCIDRs = nil
	for _, p := range ps {
		upd.Spec.PodCIDRs = append(upd.Spec.PodCIDRs, p.String())
	}
	// Update carries the node's resourceVersion: a stale writer (say, a
	// paused former leader) is refused instead of overwriting.
	if _, err := c.client.CoreV1().Nodes().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			c.release(name)
			return nil
		}
		return fmt.Errorf("set podCIDRs %v on node %s: %w", upd.Spec.PodCIDRs, name, err)
	}
	c.log.Info("allocated node CIDRs", "node", name, "podCIDRs", upd.Spec.PodCIDRs)
	return nil
}

func everything() labels.Selector { return labels.Everything() }
