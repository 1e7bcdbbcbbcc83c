package routes

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// NodeFromAPI extracts what the controller needs from a Node object:
// spec.podCIDRs (or spec.podCIDR) and the InternalIP addresses. Unparsable
// values are left out.
func NodeFromAPI(n *corev1.Node) Node {
	out := Node{Name: n.Name}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out.PodCIDRs = append(out.PodCIDRs, p.Masked())
		}
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out.InternalIPs = append(out.InternalIPs, ip.Unmap())
		}
	}
	return out
}

func sameRouting(a, b *corev1.Node) bool {
	x, y := NodeFromAPI(a), NodeFromAPI(b)
	return slices.Equal(x.PodCIDRs, y.PodCIDRs) && slices.Equal(x.InternalIPs, y.InternalIPs)
}

// Run keeps the routes in step with the cluster's Node objects until ctx
// ends: a node informer triggers Sync on every change of a node's pod CIDRs
// or addresses, Sync is retried with backoff on failure, and re-run every
// cfg.Resync to repair drift. It leaves the routes in place when it returns,
// so restarting the node agent does not interrupt pod traffic.
//
// With the netlink Dataplane, Run programs the network namespace of the
// thread that runs Sync: call it from the node's own namespace (the node
// agent's process), not from a goroutine inside ns.Do.
func Run(ctx context.Context, client kubernetes.Interface, cfg Config) error {
	c, err := New(cfg)
	if err != nil {
		return err
	}
	cfg = c.cfg
	factory := informers.NewSharedInformerFactory(client, 0)
	nodes := factory.Core().V1().Nodes()
	kick := make(chan struct{}, 1)
	trigger := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	_, err = nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() },
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || !sameRouting(on, nn) {
				trigger()
			}
		},
		DeleteFunc: func(any) { trigger() },
	})
	if err != nil {
		return fmt.Errorf("watch nodes: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return fmt.Errorf("wait for the node cache: %w", ctx.Err())
	}
	cfg.Log.Info("route controller started", "node", cfg.NodeName, "mode", cfg.Mode)
	resync := time.NewTicker(cfg.Resync)
	defer resync.Stop()
	const minBackoff, maxBackoff = 500 * time.Millisecond, 30 * time.Second
	backoff := minBackoff
	var retry <-chan time.Time
	for {
		objs, err := nodes.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("list nodes from the cache: %w", err)
		}
		all := make([]Node, 0, len(objs))
		for _, o := range objs {
			all = append(all, NodeFromAPI(o))
		}
		if err := c.Sync(all); err != nil {
			cfg.Log.Warn("route sync failed; retrying", "err", err, "retry_in", backoff)
			retry = time.After(backoff)
			backoff = min(backoff*2, maxBackoff)
		} else {
			retry, backoff = nil, minBackoff
		}
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-resync.C:
		case <-retry:
		}
	}
}
