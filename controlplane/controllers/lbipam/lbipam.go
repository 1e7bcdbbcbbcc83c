// Package lbipam is Waggle's LoadBalancer IP address management, the part
// of a cloud's service controller a bare-metal cluster needs: every
// Service of type LoadBalancer without a spec.loadBalancerClass (or with
// Class) gets an address per IP family from the pools of
// --loadbalancer-ip-pool, written to status.loadBalancer.ingress (ipMode
// VIP); the dataplane answers on it.
//
// A Service may ask for its addresses: the annotation
// waggle.io/loadBalancerIPs (or any other "<prefix>/loadBalancerIPs", as
// MetalLB's, comma-separated) or the deprecated spec.loadBalancerIP. An
// address outside the pools or held by another Service is refused with a
// Warning Event (AllocationFailed) and the Service stays pending, as it
// does when a pool is exhausted. Addresses are released when the Service
// is deleted, stops being of type LoadBalancer or changes to another
// class; the allocation is rebuilt from the Services' status at start, so
// a restarted (or newly elected) controller keeps every address where it
// is.
//
// It allocates addresses; it does not announce them (no ARP/BGP): the
// dataplane answers for them on the nodes.
package lbipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/netip"
	"slices"
	"sort"
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

// Name is the controller's name (--controllers, queue metrics).
const Name = "lb-ipam"

// Class is the spec.loadBalancerClass this controller serves besides none.
const Class = "waggle.io/lb-ipam"

// Annotation asks for specific addresses (comma-separated, one per family).
const Annotation = "waggle.io/loadBalancerIPs"

// Event reasons.
const (
	ReasonAllocated = "IPAllocated"
	ReasonFailed    = "AllocationFailed"
	ReasonReleased  = "IPReleased"
)

// Range is one contiguous pool range, both ends included.
type Range struct{ First, Last netip.Addr }

// ParsePools parses --loadbalancer-ip-pool entries: CIDRs
// ("192.168.100.0/24", "fd00:10::/120") or ranges ("10.0.0.10-10.0.0.20").
// An IPv4 CIDR wider than /31 leaves out its network and broadcast
// addresses, which many clients and routers treat specially.
func ParsePools(specs []string) ([]Range, error) {
	var out []Range
	for _, raw := range specs {
		for _, s := range strings.Split(raw, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			r, err := parseRange(s)
			if err != nil {
				return nil, fmt.Errorf("--loadbalancer-ip-pool %q: %w", s, err)
			}
			for _, o := range out {
				if r.First.Is4() == o.First.Is4() && r.First.Compare(o.Last) <= 0 && o.First.Compare(r.Last) <= 0 {
					return nil, fmt.Errorf("--loadbalancer-ip-pool %q overlaps %s-%s", s, o.First, o.Last)
				}
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func parseRange(s string) (Range, error) {
	if a, b, ok := strings.Cut(s, "-"); ok {
		first, err := netip.ParseAddr(strings.TrimSpace(a))
		if err != nil {
			return Range{}, err
		}
		last, err := netip.ParseAddr(strings.TrimSpace(b))
		if err != nil {
			return Range{}, err
		}
		first, last = first.Unmap(), last.Unmap()
		if first.Is4() != last.Is4() || last.Less(first) {
			return Range{}, errors.New("a range goes from a lower to a higher address of one family")
		}
		return Range{first, last}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return Range{}, errors.New("want a CIDR (10.0.0.0/24) or a range (10.0.0.10-10.0.0.20)")
	}
	p = p.Masked()
	first := p.Addr()
	last := lastOf(p)
	if first.Is4() && p.Bits() < 31 {
		first, last = first.Next(), last.Prev()
	}
	return Range{first, last}, nil
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	n := new(big.Int).SetBytes(b)
	host := len(b)*8 - p.Bits()
	n.Or(n, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), uint(host)), big.NewInt(1)))
	out := n.FillBytes(make([]byte, len(b)))
	a, _ := netip.AddrFromSlice(out)
	return a
}

func (r Range) contains(a netip.Addr) bool {
	return a.Is4() == r.First.Is4() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

// Options configure the controller.
type Options struct {
	Pools []Range
}

// Controller allocates LoadBalancer addresses.
type Controller struct {
	client   kubernetes.Interface
	log      *slog.Logger
	pools    []Range
	services corelisters.ServiceLister
	synced   cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	stopRec  func()

	mu     sync.Mutex
	owner  map[netip.Addr]string   // address → service key
	holds  map[string][]netip.Addr // service key → its addresses
	failed map[string]string       // service key → last failure (events once per change)
	freed  bool                    // an address was freed: retry the pending
}

// New wires the controller to the factory's Service informer.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	inf := factory.Core().V1().Services()
	rec, stop := ctrlutil.NewRecorder(client, "lb-ipam-controller")
	c := &Controller{client: client, log: log.With("controller", Name), pools: opts.Pools,
		services: inf.Lister(), synced: inf.Informer().HasSynced, queue: ctrlutil.NewQueue(Name),
		recorder: rec, stopRec: stop,
		owner: map[netip.Addr]string{}, holds: map[string][]netip.Addr{}, failed: map[string]string{}}
	enqueue := func(obj any) {
		if k := ctrlutil.KeyFunc(obj); k != "" {
			c.queue.Add(k)
		}
	}
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Service), cur.(*corev1.Service)
			if o.ResourceVersion != n.ResourceVersion {
				enqueue(cur)
			}
		},
		DeleteFunc: enqueue,
	})
	return c
}

// Run rebuilds the allocation from the Services' status, then syncs with
// workers goroutines until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.stopRec()
	if !cache.WaitForNamedCacheSync(Name, ctx.Done(), c.synced) {
		return
	}
	c.rebuild()
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced)
}

// served reports whether this controller allocates for svc.
func served(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer &&
		(svc.Spec.LoadBalancerClass == nil || *svc.Spec.LoadBalancerClass == Class)
}

func ingressAddrs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// rebuild takes over the addresses Services already hold (oldest Service
// first, so of two claiming one address the older keeps it).
func (c *Controller) rebuild() {
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return
	}
	sort.Slice(svcs, func(i, j int) bool {
		ti, tj := svcs[i].CreationTimestamp, svcs[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return svcs[i].Namespace+"/"+svcs[i].Name < svcs[j].Namespace+"/"+svcs[j].Name
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, svc := range svcs {
		if !served(svc) {
			continue
		}
		key := svc.Namespace + "/" + svc.Name
		for _, a := range ingressAddrs(svc) {
			if _, taken := c.owner[a]; !taken && c.inPool(a) {
				c.owner[a] = key
				c.holds[key] = append(c.holds[key], a)
			}
		}
	}
}

func (c *Controller) inPool(a netip.Addr) bool {
	for _, r := range c.pools {
		if r.contains(a) {
			return true
		}
	}
	return false
}

// requested returns the addresses svc asks for (annotation first).
func requested(svc *corev1.Service) ([]netip.Addr, error) {
	var raw []string
	if v, ok := svc.Annotations[Annotation]; ok {
		raw = strings.Split(v, ",")
	} else {
		keys := make([]string, 0, len(svc.Annotations))
		for k := range svc.Annotations {
			if strings.HasSuffix(k, "/loadBalancerIPs") {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		if len(keys) > 0 {
			raw = strings.Split(svc.Annotations[keys[0]], ",")
		} else if svc.Spec.LoadBalancerIP != "" {
			raw = []string{svc.Spec.LoadBalancerIP}
		}
	}
	var out []netip.Addr
	for _, s := range raw {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("requested address %q is not an IP address", s)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// families are the Service's IP families that have a pool, in its order.
func (c *Controller) families(svc *corev1.Service) []corev1.IPFamily {
	fams := svc.Spec.IPFamilies
	if len(fams) == 0 {
		fams = []corev1.IPFamily{corev1.IPv4Protocol}
	}
	var out []corev1.IPFamily
	for _, f := range fams {
		for _, r := range c.pools {
			if familyOf(r.First) == f {
				out = append(out, f)
				break
			}
		}
	}
	return out
}

func (c *Controller) sync(ctx context.Context, key string) error {
	defer c.retryPending(key)
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.release(key)
		return nil
	}
	if err != nil {
		return err
	}
	if !served(svc) {
		return c.unserve(ctx, svc, key)
	}
	want, reason := c.allocate(svc, key)
	if reason != "" {
		c.mu.Lock()
		changed := c.failed[key] != reason
		c.failed[key] = reason
		c.mu.Unlock()
		if changed {
			c.recorder.Event(svc, corev1.EventTypeWarning, ReasonFailed, reason)
			c.log.Info("allocation failed", "service", key, "reason", reason)
		}
	} else {
		c.mu.Lock()
		delete(c.failed, key)
		c.mu.Unlock()
	}
	return c.writeStatus(ctx, svc, want)
}

// allocate returns the addresses svc should have (what it holds if still
// right, else new ones), or why it cannot have them.
func (c *Controller) allocate(svc *corev1.Service, key string) ([]netip.Addr, string) {
	asked, err := requested(svc)
	if err != nil {
		return nil, err.Error()
	}
	fams := c.families(svc)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(asked) > 0 {
		// A request that cannot be met holds nothing: the Service stays
		// pending rather than keep an address it no longer asks for.
		for _, a := range asked {
			var why string
			if o, taken := c.owner[a]; taken && o != key {
				why = fmt.Sprintf("requested address %s is already allocated to %s", a, o)
			}
			if !slices.Contains(fams, familyOf(a)) {
				why = fmt.Sprintf("requested address %s is not of the Service's IP families %v", a, svc.Spec.IPFamilies)
			}
			if !c.inPool(a) {
				why = fmt.Sprintf("requested address %s is not in any --loadbalancer-ip-pool", a)
			}
			if why != "" {
				c.setHolds(key, nil)
				return nil, why
			}
		}
		c.setHolds(key, asked)
		return asked, ""
	}
	if len(fams) == 0 {
		return nil, fmt.Sprintf("no --loadbalancer-ip-pool of the Service's IP families %v", svc.Spec.IPFamilies)
	}
	held := c.holds[key]
	var out []netip.Addr
	for _, f := range fams {
		if i := slices.IndexFunc(held, func(a netip.Addr) bool { return familyOf(a) == f && c.inPool(a) }); i >= 0 {
			out = append(out, held[i])
			continue
		}
		a, ok := c.free(f)
		if !ok {
			c.setHolds(key, out)
			return out, fmt.Sprintf("no %s address left in --loadbalancer-ip-pool", f)
		}
		c.owner[a] = key // reserve before the next family's search
		out = append(out, a)
	}
	c.setHolds(key, out)
	return out, ""
}

// setHolds makes key hold exactly addrs (c.mu held).
func (c *Controller) setHolds(key string, addrs []netip.Addr) {
	for _, a := range c.holds[key] {
		if !slices.Contains(addrs, a) && c.owner[a] == key {
			delete(c.owner, a)
			c.freed = true
		}
	}
	for _, a := range addrs {
		c.owner[a] = key
	}
	if len(addrs) == 0 {
		delete(c.holds, key)
		return
	}
	c.holds[key] = slices.Clone(addrs)
}

// free returns the lowest unallocated address of family f (c.mu held).
func (c *Controller) free(f corev1.IPFamily) (netip.Addr, bool) {
	for _, r := range c.pools {
		if familyOf(r.First) != f {
			continue
		}
		for a := r.First; a.IsValid() && a.Compare(r.Last) <= 0; a = a.Next() {
			if _, taken := c.owner[a]; !taken {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}

// release frees what key held.
func (c *Controller) release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setHolds(key, nil)
	delete(c.failed, key)
}

// retryPending requeues the Services waiting for an address once one was
// freed.
func (c *Controller) retryPending(self string) {
	c.mu.Lock()
	var pending []string
	if c.freed {
		c.freed = false
		for k := range c.failed {
			if k != self {
				pending = append(pending, k)
			}
		}
	}
	c.mu.Unlock()
	for _, k := range pending {
		c.queue.Add(k)
	}
}

// unserve releases what a Service no longer served held and clears the
// addresses it put in the Service's status (another class's status is left
// alone).
func (c *Controller) unserve(ctx context.Context, svc *corev1.Service, key string) error {
	c.mu.Lock()
	held := slices.Clone(c.holds[key])
	c.mu.Unlock()
	if len(held) == 0 {
		return nil
	}
	if slices.ContainsFunc(ingressAddrs(svc), func(a netip.Addr) bool { return slices.Contains(held, a) }) {
		if err := c.writeStatus(ctx, svc, nil); err != nil {
			return err
		}
	}
	c.release(key)
	c.recorder.Eventf(svc, corev1.EventTypeNormal, ReasonReleased, "Released %s", joinAddrs(held))
	return nil
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// writeStatus sets status.loadBalancer.ingress to addrs (ipMode VIP).
func (c *Controller) writeStatus(ctx context.Context, svc *corev1.Service, addrs []netip.Addr) error {
	var ingress []corev1.LoadBalancerIngress
	vip := corev1.LoadBalancerIPModeVIP
	for _, a := range addrs {
		ingress = append(ingress, corev1.LoadBalancerIngress{IP: a.String(), IPMode: &vip})
	}
	cur := svc.Status.LoadBalancer.Ingress
	same := len(cur) == len(ingress)
	for i := 0; same && i < len(cur); i++ {
		same = cur[i].IP == ingress[i].IP && cur[i].Hostname == "" && cur[i].IPMode != nil && *cur[i].IPMode == vip && len(cur[i].Ports) == 0
	}
	if same {
		return nil
	}
	upd := svc.DeepCopy()
	upd.Status.LoadBalancer.Ingress = ingress
	if _, err := c.client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("update status of %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	if len(addrs) > 0 {
		c.recorder.Eventf(svc, corev1.EventTypeNormal, ReasonAllocated, "Allocated %s", joinAddrs(addrs))
		c.log.Info("allocated", "service", svc.Namespace+"/"+svc.Name, "addresses", joinAddrs(addrs))
	}
	return nil
}
