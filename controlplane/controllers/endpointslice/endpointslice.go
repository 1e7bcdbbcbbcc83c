// Package endpointslice is the EndpointSlice controller, with the legacy
// Endpoints mirror: for every Service with a selector it publishes the
// selected pods as endpoints with ready, serving and terminating conditions,
// ports resolved per pod (a targetPort given by name is looked up in each
// pod's containers), nodeName, zone (from the node's
// topology.kubernetes.io/zone label) and hostname, in EndpointSlices of at
// most MaxEndpointsPerSlice endpoints per address type (IPv4/IPv6), labelled
// kubernetes.io/service-name and endpointslice.kubernetes.io/managed-by and
// owned by the Service. Slices are changed in place where possible (an
// unchanged endpoint stays in its slice), and written create-first,
// delete-last so consumers never see a gap.
//
// It is not the EndpointSlice mirroring controller (custom Endpoints are not
// mirrored into slices) and it does not program any dataplane.
package endpointslice

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name.
const Name = "endpointslice"

// ManagedBy is the endpointslice.kubernetes.io/managed-by value of the
// slices this controller owns (Kubernetes' own value, so tools recognise it).
const ManagedBy = "endpointslice-controller.k8s.io"

// ErrStaleCache means the informer has not yet caught up with this
// controller's own writes; the service is retried shortly.
var ErrStaleCache = errors.New("endpointslice cache is older than the controller's last write")

// Options tune the controller.
type Options struct {
	// MaxEndpointsPerSlice caps the endpoints in one slice (default 100).
	MaxEndpointsPerSlice int
	// SkipLegacyEndpoints turns off the core/v1 Endpoints mirror.
	SkipLegacyEndpoints bool
	// EndpointsWorkers is how many workers write the Endpoints mirror (its
	// own queue, so a slow Endpoints write never delays a slice); 0 means
	// as many as the slice workers.
	EndpointsWorkers int
}

// Controller publishes Services' endpoints.
type Controller struct {
	client   kubernetes.Interface
	log      *slog.Logger
	opts     Options
	queue    workqueue.TypedRateLimitingInterface[string]
	epQueue  workqueue.TypedRateLimitingInterface[string] // nil without the mirror
	services corelisters.ServiceLister
	pods     corelisters.PodLister
	nodes    corelisters.NodeLister
	slices   discoverylisters.EndpointSliceLister
	eps      corelisters.EndpointsLister
	synced   []cache.InformerSynced
	tracker  *tracker
	rec      record.EventRecorder
	stopRec  func()
}

// New wires the controller to the factory's Service, Pod, Node,
// EndpointSlice and Endpoints informers.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	if opts.MaxEndpointsPerSlice <= 0 {
		opts.MaxEndpointsPerSlice = 100
	}
	svcInf := factory.Core().V1().Services()
	podInf := factory.Core().V1().Pods()
	nodeInf := factory.Core().V1().Nodes()
	sliceInf := factory.Discovery().V1().EndpointSlices()
	c := &Controller{
		client: client, log: log.With("controller", Name), opts: opts, queue: ctrlutil.NewQueue(Name),
		services: svcInf.Lister(), pods: podInf.Lister(), nodes: nodeInf.Lister(), slices: sliceInf.Lister(),
		synced: []cache.InformerSynced{svcInf.Informer().HasSynced, podInf.Informer().HasSynced,
			nodeInf.Informer().HasSynced, sliceInf.Informer().HasSynced},
		tracker: newTracker(),
	}
	c.rec, c.stopRec = ctrlutil.NewRecorder(client, "endpoint-slice-controller")
	if !opts.SkipLegacyEndpoints {
		epInf := factory.Core().V1().Endpoints()
		c.eps = epInf.Lister()
		c.epQueue = ctrlutil.NewQueue(EndpointsName)
		c.synced = append(c.synced, epInf.Informer().HasSynced)
		epEnqueue := func(obj any) {
			if k := ctrlutil.KeyFunc(obj); k != "" {
				c.epQueue.Add(k)
			}
		}
		epInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, cur any) { epEnqueue(cur) },
			DeleteFunc: epEnqueue,
		})
	}
	svcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, cur any) { c.enqueue(cur) },
		DeleteFunc: c.enqueue,
	})
	podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { c.podChanged(obj.(*corev1.Pod), nil) },
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Pod), cur.(*corev1.Pod)
			if !ctrlutil.SameVersion(o, n) {
				c.podChanged(n, o)
			}
		},
		DeleteFunc: func(obj any) {
			if p, ok := ctrlutil.Unwrap(obj).(*corev1.Pod); ok {
				c.podChanged(p, nil)
			}
		},
	})
	sliceHandler := func(obj any) {
		s, ok := ctrlutil.Unwrap(obj).(*discoveryv1.EndpointSlice)
		if !ok || s.Labels[discoveryv1.LabelManagedBy] != ManagedBy {
			return
		}
		if svc := s.Labels[discoveryv1.LabelServiceName]; svc != "" {
			c.queue.Add(s.Namespace + "/" + svc)
		}
	}
	sliceInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    sliceHandler,
		UpdateFunc: func(_, cur any) { sliceHandler(cur) },
		DeleteFunc: sliceHandler,
	})
	nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Node), cur.(*corev1.Node)
			if o.Labels[corev1.LabelTopologyZone] != n.Labels[corev1.LabelTopologyZone] {
				c.nodeZoneChanged(n.Name)
			}
		},
	})
	return c
}

func (c *Controller) enqueue(obj any) {
	if k := ctrlutil.KeyFunc(obj); k != "" {
		c.add(k)
	}
}

// add queues a service for both its slices and its Endpoints.
func (c *Controller) add(key string) {
	c.queue.Add(key)
	if c.epQueue != nil {
		c.epQueue.Add(key)
	}
}

// podChanged enqueues the services selecting pod (or, for an update, the
// old version of it).
func (c *Controller) podChanged(pod, old *corev1.Pod) {
	svcs, err := c.services.Services(pod.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, s := range svcs {
		if s.Spec.Selector == nil {
			continue
		}
		sel := labels.SelectorFromSet(s.Spec.Selector)
		if sel.Matches(labels.Set(pod.Labels)) || (old != nil && sel.Matches(labels.Set(old.Labels))) {
			c.add(s.Namespace + "/" + s.Name)
		}
	}
}

func (c *Controller) nodeZoneChanged(node string) {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return
	}
	for _, p := range pods {
		if p.Spec.NodeName == node {
			c.podChanged(p, nil)
		}
	}
}

// EndpointsName names the Endpoints mirror's queue (as Kubernetes'
// "endpoint" controller).
const EndpointsName = "endpoint"

// Run runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.stopRec()
	var wg sync.WaitGroup
	if c.epQueue != nil {
		n := c.opts.EndpointsWorkers
		if n <= 0 {
			n = workers
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctrlutil.RunWorkers(ctx, c.log, EndpointsName, c.epQueue, n, c.syncEndpoints, c.synced...)
		}()
	}
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced...)
	wg.Wait()
}

// syncEndpoints writes one service's legacy Endpoints object.
func (c *Controller) syncEndpoints(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		ep, err := c.eps.Endpoints(ns).Get(name)
		if err != nil || ep.Labels[discoveryv1.LabelSkipMirror] != "true" {
			return nil // gone, or not ours
		}
		if err := c.client.CoreV1().Endpoints(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete endpoints %s: %w", key, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if svc.Spec.Selector == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	pods, err := c.pods.Pods(ns).List(labels.SelectorFromSet(svc.Spec.Selector))
	if err != nil {
		return err
	}
	return c.reconcileEndpoints(ctx, svc, pods)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		// The slices and Endpoints are owned by the Service (slices by
		// ownerReference, for the garbage collector); delete them here too
		// so nothing lingers when the garbage collector is off.
		c.tracker.forget(key)
		return c.deleteAll(ctx, ns, name)
	}
	if err != nil {
		return err
	}
	if svc.Spec.Selector == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		// Endpoints of selector-less services are the user's to manage;
		// ExternalName services get none (as Kubernetes, issue 105986).
		return nil
	}
	pods, err := c.pods.Pods(ns).List(labels.SelectorFromSet(svc.Spec.Selector))
	if err != nil {
		return err
	}
	existing, err := c.slices.EndpointSlices(ns).List(labels.SelectorFromSet(labels.Set{
		discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: ManagedBy}))
	if err != nil {
		return err
	}
	if c.tracker.stale(key, existing) {
		// The informer has not yet delivered this controller's last write;
		// its event enqueues the service again. The delayed add is only a
		// safety net.
		c.log.Debug("endpointslice cache is stale, waiting for the informer", "service", key)
		c.queue.AddAfter(key, trackTimeout)
		return nil
	}
	start := time.Now()
	sliceErr := c.reconcileSlices(ctx, svc, pods, existing)
	if sliceErr != nil {
		c.rec.Eventf(svc, corev1.EventTypeWarning, "FailedToUpdateEndpointSlices", "Error updating Endpoint Slices for Service %s/%s: %v", svc.Namespace, svc.Name, sliceErr)
	}
	c.log.Debug("synced endpointslices", "service", key, "pods", len(pods), "took", time.Since(start))
	return sliceErr
}

func (c *Controller) deleteAll(ctx context.Context, ns, name string) error {
	existing, err := c.slices.EndpointSlices(ns).List(labels.SelectorFromSet(labels.Set{
		discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: ManagedBy}))
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range existing {
		if err := c.client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// addressTypes returns the slice address types a service needs.
func addressTypes(svc *corev1.Service) []discoveryv1.AddressType {
	var out []discoveryv1.AddressType
	for _, f := range svc.Spec.IPFamilies {
		if f == corev1.IPv6Protocol {
			out = append(out, discoveryv1.AddressTypeIPv6)
		} else {
			out = append(out, discoveryv1.AddressTypeIPv4)
		}
	}
	if len(out) == 0 {
		if ip := net.ParseIP(svc.Spec.ClusterIP); ip != nil && ip.To4() == nil {
			return []discoveryv1.AddressType{discoveryv1.AddressTypeIPv6}
		}
		return []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4}
	}
	return out
}

func podIPs(pod *corev1.Pod, at discoveryv1.AddressType) []string {
	var ips []string
	add := func(s string) {
		ip := net.ParseIP(s)
		if ip == nil || slices.Contains(ips, s) {
			return
		}
		if (ip.To4() != nil) == (at == discoveryv1.AddressTypeIPv4) {
			ips = append(ips, s)
		}
	}
	for _, p := range pod.Status.PodIPs {
		add(p.IP)
	}
	add(pod.Status.PodIP)
	return ips
}

// FindPort resolves a service port's targetPort for one pod: a number as is
// (0 means the service port), a name through the pod's container ports.
func FindPort(pod *corev1.Pod, sp *corev1.ServicePort) (int32, error) {
	tp := sp.TargetPort
	switch {
	case tp.Type == intstr.String && tp.StrVal != "":
		for _, ct := range pod.Spec.Containers {
			for _, p := range ct.Ports {
				if p.Name == tp.StrVal && p.Protocol == protocol(sp.Protocol) {
					return p.ContainerPort, nil
				}
			}
		}
		return 0, fmt.Errorf("pod %s has no container port named %q (%s)", pod.Name, tp.StrVal, protocol(sp.Protocol))
	case tp.Type == intstr.Int && tp.IntVal != 0:
		return tp.IntVal, nil
	}
	return sp.Port, nil
}

func protocol(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// include reports whether pod belongs in the service's slices at all: it
// has an IP and has not finished (terminating pods stay, marked).
func include(pod *corev1.Pod) bool {
	if pod.Status.PodIP == "" && len(pod.Status.PodIPs) == 0 {
		return false
	}
	return !ctrlutil.IsPodTerminal(pod)
}

// PortGroup is the endpoints of a service that share one resolved port set.
type PortGroup struct {
	Ports     []discoveryv1.EndpointPort
	Endpoints map[string]discoveryv1.Endpoint // by address and pod UID
}

func endpointKey(e *discoveryv1.Endpoint) string {
	k := strings.Join(e.Addresses, ",")
	if e.TargetRef != nil {
		k += "/" + string(e.TargetRef.UID)
	}
	return k
}

func portsKey(ports []discoveryv1.EndpointPort) string {
	var b strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&b, "%s/%s/%d/%s;", deref(p.Name), derefProto(p.Protocol), derefInt(p.Port), deref(p.AppProtocol))
	}
	return b.String()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
func derefProto(p *corev1.Protocol) corev1.Protocol {
	if p == nil {
		return ""
	}
	return *p
}
func derefInt(i *int32) int32 {
	if i == nil {
		return 0
	}
	return *i
}

// Desired computes, for one address type, the endpoints of svc grouped by
// their resolved port set.
func (c *Controller) Desired(svc *corev1.Service, pods []*corev1.Pod, at discoveryv1.AddressType) map[string]*PortGroup {
	groups := map[string]*PortGroup{}
	for _, pod := range pods {
		if !include(pod) {
			continue
		}
		ips := podIPs(pod, at)
		if len(ips) == 0 {
			continue
		}
		var ports []discoveryv1.EndpointPort
		for i := range svc.Spec.Ports {
			sp := &svc.Spec.Ports[i]
			n, err := FindPort(pod, sp)
			if err != nil {
				c.log.Debug("skipping port for pod", "service", svc.Namespace+"/"+svc.Name, "err", err)
				continue
			}
			name, proto := sp.Name, protocol(sp.Protocol)
			ports = append(ports, discoveryv1.EndpointPort{Name: &name, Port: &n, Protocol: &proto, AppProtocol: sp.AppProtocol})
		}
		sort.Slice(ports, func(i, j int) bool { return *ports[i].Name < *ports[j].Name })
		pk := portsKey(ports)
		g := groups[pk]
		if g == nil {
			g = &PortGroup{Ports: ports, Endpoints: map[string]discoveryv1.Endpoint{}}
			groups[pk] = g
		}
		for _, ip := range ips[:1] {
			ep := c.endpointFor(svc, pod, ip)
			g.Endpoints[endpointKey(&ep)] = ep
		}
	}
	return groups
}

func (c *Controller) endpointFor(svc *corev1.Service, pod *corev1.Pod, ip string) discoveryv1.Endpoint {
	podReady := ctrlutil.IsPodReady(pod)
	terminating := pod.DeletionTimestamp != nil
	ready := podReady && !terminating
	serving := podReady
	if svc.Spec.PublishNotReadyAddresses {
		ready, serving = true, true
	}
	ep := discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
	}
	if pod.Spec.NodeName != "" {
		n := pod.Spec.NodeName
		ep.NodeName = &n
		if node, err := c.nodes.Get(n); err == nil {
			if z, ok := node.Labels[corev1.LabelTopologyZone]; ok {
				ep.Zone = &z
			}
		}
	}
	if pod.Spec.Hostname != "" && pod.Spec.Subdomain == svc.Name {
		h := pod.Spec.Hostname
		ep.Hostname = &h
	}
	return ep
}

func (c *Controller) sliceLabels(svc *corev1.Service) map[string]string {
	l := map[string]string{}
	for k, v := range svc.Labels {
		if k == discoveryv1.LabelServiceName || k == discoveryv1.LabelManagedBy {
			continue
		}
		l[k] = v
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		l[corev1.IsHeadlessService] = ""
	}
	l[discoveryv1.LabelServiceName] = svc.Name
	l[discoveryv1.LabelManagedBy] = ManagedBy
	return l
}

// Plan is what one reconciliation writes.
type Plan struct {
	Create, Update, Delete []*discoveryv1.EndpointSlice
}

// PlanSlices computes the slice writes for one service: endpoints that did
// not change stay in their slice; changed ones are updated in place; removed
// ones leave; new ones fill slices with room before new slices are made;
// empty slices go, but one empty placeholder remains when the service has no
// endpoints at all, as Kubernetes keeps one.
func PlanSlices(svc *corev1.Service, desired map[discoveryv1.AddressType]map[string]*PortGroup, existing []*discoveryv1.EndpointSlice, maxPer int, lbls map[string]string) Plan {
	var plan Plan
	ownerRef := ctrlutil.NewControllerRef(svc, "v1", "Service")
	newSlice := func(at discoveryv1.AddressType, ports []discoveryv1.EndpointPort) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: svc.Name + "-", Namespace: svc.Namespace, Labels: copyLabels(lbls),
				OwnerReferences: []metav1.OwnerReference{ownerRef},
			},
			AddressType: at, Ports: ports, Endpoints: []discoveryv1.Endpoint{},
		}
	}
	var kept []*discoveryv1.EndpointSlice // slices that survive (updated or not)
	total := 0
	for _, at := range sortedTypes(desired) {
		groups := desired[at]
		byPorts := map[string][]*discoveryv1.EndpointSlice{}
		for _, s := range existing {
			if s.AddressType != at {
				continue
			}
			pk := portsKey(s.Ports)
			if _, ok := groups[pk]; !ok {
				plan.Delete = append(plan.Delete, s)
				continue
			}
			byPorts[pk] = append(byPorts[pk], s)
		}
		for _, pk := range sortedKeys(groups) {
			g := groups[pk]
			want := make(map[string]discoveryv1.Endpoint, len(g.Endpoints))
			for k, v := range g.Endpoints {
				want[k] = v
			}
			total += len(want)
			type slot struct {
				s       *discoveryv1.EndpointSlice
				changed bool
			}
			var slots []*slot
			for _, s := range byPorts[pk] {
				cp := s.DeepCopy()
				cp.Endpoints = cp.Endpoints[:0]
				changed := !apiequality.Semantic.DeepEqual(s.Labels, lbls)
				for i := range s.Endpoints {
					e := &s.Endpoints[i]
					k := endpointKey(e)
					w, ok := want[k]
					if !ok || len(cp.Endpoints) >= maxPer {
						changed = true
						continue
					}
					if !apiequality.Semantic.DeepEqual(*e, w) {
						changed = true
					}
					cp.Endpoints = append(cp.Endpoints, w)
					delete(want, k)
				}
				if len(cp.Endpoints) == 0 {
					plan.Delete = append(plan.Delete, s)
					continue
				}
				cp.Labels = copyLabels(lbls)
				slots = append(slots, &slot{s: cp, changed: changed})
			}
			// Fill slices that already change first, then the fullest
			// unchanged ones, so fewer slices are rewritten.
			sort.SliceStable(slots, func(i, j int) bool {
				if slots[i].changed != slots[j].changed {
					return slots[i].changed
				}
				return len(slots[i].s.Endpoints) > len(slots[j].s.Endpoints)
			})
			rest := sortedKeys(want)
			for _, sl := range slots {
				for len(rest) > 0 && len(sl.s.Endpoints) < maxPer {
					sl.s.Endpoints = append(sl.s.Endpoints, want[rest[0]])
					rest = rest[1:]
					sl.changed = true
				}
				if sl.changed {
					plan.Update = append(plan.Update, sl.s)
				}
				kept = append(kept, sl.s)
			}
			for len(rest) > 0 {
				s := newSlice(at, g.Ports)
				n := min(maxPer, len(rest))
				for _, k := range rest[:n] {
					s.Endpoints = append(s.Endpoints, want[k])
				}
				rest = rest[n:]
				plan.Create = append(plan.Create, s)
				kept = append(kept, s)
			}
		}
	}
	if total == 0 && len(kept) == 0 {
		// Keep (or make) one placeholder slice: an empty slice tells
		// consumers the service has no endpoints, rather than no data.
		at := addressTypes(svc)[0]
		for i, s := range plan.Delete {
			if s.AddressType == at {
				cp := s.DeepCopy()
				if len(cp.Endpoints) != 0 || len(cp.Ports) != 0 || !apiequality.Semantic.DeepEqual(cp.Labels, lbls) {
					cp.Endpoints, cp.Ports, cp.Labels = []discoveryv1.Endpoint{}, nil, copyLabels(lbls)
					plan.Update = append(plan.Update, cp)
				}
				plan.Delete = append(plan.Delete[:i:i], plan.Delete[i+1:]...)
				return plan
			}
		}
		plan.Create = append(plan.Create, newSlice(at, nil))
	}
	return plan
}

func copyLabels(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedTypes(m map[discoveryv1.AddressType]map[string]*PortGroup) []discoveryv1.AddressType {
	var out []discoveryv1.AddressType
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b discoveryv1.AddressType) int { return cmp.Compare(a, b) })
	return out
}

func (c *Controller) reconcileSlices(ctx context.Context, svc *corev1.Service, pods []*corev1.Pod, existing []*discoveryv1.EndpointSlice) error {
	desired := map[discoveryv1.AddressType]map[string]*PortGroup{}
	for _, at := range addressTypes(svc) {
		desired[at] = c.Desired(svc, pods, at)
	}
	// Slices of another Service object with the same name (deleted and
	// recreated) are not ours to reuse.
	var mine []*discoveryv1.EndpointSlice
	var errs []error
	for _, s := range existing {
		if ref := metav1.GetControllerOf(s); ref != nil && ref.UID != svc.UID {
			if err := c.client.DiscoveryV1().EndpointSlices(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
			continue
		}
		mine = append(mine, s)
	}
	plan := PlanSlices(svc, desired, mine, c.opts.MaxEndpointsPerSlice, c.sliceLabels(svc))
	key := svc.Namespace + "/" + svc.Name
	api := c.client.DiscoveryV1().EndpointSlices(svc.Namespace)
	for _, s := range plan.Create {
		created, err := api.Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				return nil
			}
			errs = append(errs, fmt.Errorf("create endpointslice for %s: %w", key, err))
			continue
		}
		c.tracker.wrote(key, created)
	}
	for _, s := range plan.Update {
		updated, err := api.Update(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("update endpointslice %s: %w", s.Name, err))
			continue
		}
		c.tracker.wrote(key, updated)
	}
	for _, s := range plan.Delete {
		if err := api.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete endpointslice %s: %w", s.Name, err))
			continue
		}
		c.tracker.deleted(key, s)
	}
	return errors.Join(errs...)
}

// reconcileEndpoints writes the legacy core/v1 Endpoints object: ready
// addresses, and not-ready ones (terminating pods excluded), per port set.
func (c *Controller) reconcileEndpoints(ctx context.Context, svc *corev1.Service, pods []*corev1.Pod) error {
	at := addressTypes(svc)[0]
	groups := map[string]*corev1.EndpointSubset{}
	for _, pod := range pods {
		if !include(pod) || (pod.DeletionTimestamp != nil && !svc.Spec.PublishNotReadyAddresses) {
			continue
		}
		ips := podIPs(pod, at)
		if len(ips) == 0 {
			continue
		}
		var ports []corev1.EndpointPort
		for i := range svc.Spec.Ports {
			sp := &svc.Spec.Ports[i]
			n, err := FindPort(pod, sp)
			if err != nil {
				continue
			}
			ports = append(ports, corev1.EndpointPort{Name: sp.Name, Port: n, Protocol: protocol(sp.Protocol), AppProtocol: sp.AppProtocol})
		}
		sort.Slice(ports, func(i, j int) bool { return ports[i].Name < ports[j].Name })
		var kb strings.Builder
		for _, p := range ports {
			fmt.Fprintf(&kb, "%s/%d/%s;", p.Name, p.Port, p.Protocol)
		}
		sub := groups[kb.String()]
		if sub == nil {
			sub = &corev1.EndpointSubset{Ports: ports}
			groups[kb.String()] = sub
		}
		addr := corev1.EndpointAddress{IP: ips[0],
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}}
		if pod.Spec.NodeName != "" {
			n := pod.Spec.NodeName
			addr.NodeName = &n
		}
		if pod.Spec.Hostname != "" && pod.Spec.Subdomain == svc.Name {
			addr.Hostname = pod.Spec.Hostname
		}
		if ctrlutil.IsPodReady(pod) || svc.Spec.PublishNotReadyAddresses {
			sub.Addresses = append(sub.Addresses, addr)
		} else {
			sub.NotReadyAddresses = append(sub.NotReadyAddresses, addr)
		}
	}
	var subsets []corev1.EndpointSubset
	for _, k := range sortedKeys(groups) {
		s := groups[k]
		byIP := func(a, b corev1.EndpointAddress) int { return cmp.Compare(a.IP, b.IP) }
		slices.SortFunc(s.Addresses, byIP)
		slices.SortFunc(s.NotReadyAddresses, byIP)
		subsets = append(subsets, *s)
	}
	lbls := map[string]string{}
	for k, v := range svc.Labels {
		lbls[k] = v
	}
	lbls[discoveryv1.LabelSkipMirror] = "true"
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		lbls[corev1.IsHeadlessService] = ""
	}
	cur, err := c.eps.Endpoints(svc.Namespace).Get(svc.Name)
	api := c.client.CoreV1().Endpoints(svc.Namespace)
	if apierrors.IsNotFound(err) {
		ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: svc.Namespace, Labels: lbls}, Subsets: subsets}
		_, err := api.Create(ctx, ep, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return nil // the informer will bring it; the update comes then
		}
		if err != nil {
			return fmt.Errorf("create endpoints %s/%s: %w", svc.Namespace, svc.Name, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if apiequality.Semantic.DeepEqual(cur.Subsets, subsets) && apiequality.Semantic.DeepEqual(cur.Labels, lbls) {
		return nil
	}
	cp := cur.DeepCopy()
	cp.Subsets, cp.Labels = subsets, lbls
	if _, err := api.Update(ctx, cp, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update endpoints %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return nil
}

// tracker remembers the resourceVersion of every slice this controller
// wrote, per service, so a sync that would read an older informer copy (and
// so might create a duplicate slice or undo a write) waits for the informer
// instead, as Kubernetes' endpointSliceTracker does.
type tracker struct {
	mu sync.Mutex
	m  map[string]map[types.UID]tracked
}

type tracked struct {
	rv      uint64
	deleted bool
	at      time.Time
}

// trackTimeout bounds how long a write is waited for: a slice someone else
// deleted before the informer saw it must not block the service forever.
const trackTimeout = 10 * time.Second

func newTracker() *tracker { return &tracker{m: map[string]map[types.UID]tracked{}} }

func rvOf(s *discoveryv1.EndpointSlice) uint64 {
	v, _ := strconv.ParseUint(s.ResourceVersion, 10, 64)
	return v
}

func (t *tracker) wrote(key string, s *discoveryv1.EndpointSlice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[key] == nil {
		t.m[key] = map[types.UID]tracked{}
	}
	t.m[key][s.UID] = tracked{rv: rvOf(s), at: time.Now()}
}

func (t *tracker) deleted(key string, s *discoveryv1.EndpointSlice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[key] == nil {
		t.m[key] = map[types.UID]tracked{}
	}
	t.m[key][s.UID] = tracked{deleted: true, at: time.Now()}
}

func (t *tracker) forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, key)
}

// stale reports whether the cached slices lag this controller's writes;
// entries the cache has caught up with are dropped.
func (t *tracker) stale(key string, cached []*discoveryv1.EndpointSlice) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.m[key]
	if len(m) == 0 {
		return false
	}
	byUID := make(map[types.UID]*discoveryv1.EndpointSlice, len(cached))
	for _, s := range cached {
		byUID[s.UID] = s
	}
	stale := false
	for uid, tr := range m {
		s, inCache := byUID[uid]
		switch {
		case time.Since(tr.at) > trackTimeout:
			delete(m, uid)
		case tr.deleted && inCache:
			stale = true
		case tr.deleted:
			delete(m, uid)
		case !inCache || rvOf(s) < tr.rv:
			stale = true
		default:
			delete(m, uid)
		}
	}
	return stale
}
