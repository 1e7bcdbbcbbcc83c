package dataplane

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Change is what a sync hands an IncrementalBackend: the frontends of the
// Services that changed since the last sync, and the frontends no longer
// desired. A key is never in both (a frontend that moves between Services
// is an Upsert, written in place).
type Change struct {
	// Upsert holds every frontend of each changed Service, sorted by key.
	// Unchanged ones among them cost a comparison, no write.
	Upsert []Frontend
	// Remove holds the keys of frontends no Service wants any more, sorted.
	Remove []FrontendKey
	// Services are the Services this change covers.
	Services []ServiceRef
}

// Empty reports whether the change has nothing to write.
func (c *Change) Empty() bool { return len(c.Upsert) == 0 && len(c.Remove) == 0 }

// IncrementalBackend is a Backend that can program a Change without seeing
// the whole State, in time and memory proportional to the change. Sync (the
// whole State) is still used for the first sync, for periodic full
// reconciles and after errors that are not confined to frontends.
type IncrementalBackend interface {
	Backend
	// Apply programs ch on top of what the backend holds. Per-frontend
	// failures are reported as FrontendErrors (errors.Join); the proxy
	// retries exactly those Services.
	Apply(ctx context.Context, ch *Change) error
}

// Tracker is the proxy's change tracker, as kube-proxy's Service and
// EndpointSlice change trackers: informer events update its copy of the
// objects and mark the Services concerned dirty; Drain recomputes only the
// dirty Services and returns what changed; State materializes the whole
// desired State (equal to Compute over the same objects) for backends that
// program everything at once.
//
// Memory and CPU per Drain are proportional to the dirty Services (a Node
// address change dirties every Service with NodePorts). It is safe for
// concurrent use: event handlers and the sync run on different goroutines.
type Tracker struct {
	nodeName   string
	noLoopback bool

	mu       sync.Mutex
	services map[ServiceRef]*v1.Service
	slices   map[ServiceRef]map[string]*discoveryv1.EndpointSlice
	// pods: this node's pods with hostPorts, by HostPortRef.
	pods    map[ServiceRef]*v1.Pod
	nodeIPs []netip.Addr
	dirty   map[ServiceRef]struct{}
	// fronts: every frontend each Service asks for, and which of them it
	// owns, as last drained: the one copy of the desired state (State and
	// every Change are built from it).
	fronts map[ServiceRef]tracked
	// claims: every Service asking for a key; the first by namespace/name
	// owns it (as Compute).
	claims     map[FrontendKey]claim
	frontends  int
	endpoints  int
	withFronts int
}

// NewTracker returns an empty tracker for node nodeName. noLoopback leaves
// out 127.0.0.1 NodePort frontends (ComputeOptions.NoLoopbackNodePorts).
func NewTracker(nodeName string, noLoopback bool) *Tracker {
	return &Tracker{
		nodeName: nodeName, noLoopback: noLoopback,
		services: map[ServiceRef]*v1.Service{},
		slices:   map[ServiceRef]map[string]*discoveryv1.EndpointSlice{},
		pods:     map[ServiceRef]*v1.Pod{},
		dirty:    map[ServiceRef]struct{}{},
		fronts:   map[ServiceRef]tracked{},
		claims:   map[FrontendKey]claim{},
	}
}

// Service records a Service added or updated (svc) or deleted (deleted).
func (t *Tracker) Service(svc *v1.Service, deleted bool) {
	if svc == nil {
		return
	}
	ref := ServiceRef{svc.Namespace, svc.Name}
	t.mu.Lock()
	defer t.mu.Unlock()
	if deleted {
		delete(t.services, ref)
	} else {
		t.services[ref] = svc
	}
	t.dirty[ref] = struct{}{}
}

// EndpointSlice records an EndpointSlice added, updated or deleted and
// returns the Service it belongs to ("" name when none).
func (t *Tracker) EndpointSlice(es *discoveryv1.EndpointSlice, deleted bool) ServiceRef {
	if es == nil {
		return ServiceRef{}
	}
	name := es.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return ServiceRef{}
	}
	ref := ServiceRef{es.Namespace, name}
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.slices[ref]
	if deleted {
		delete(m, es.Name)
		if len(m) == 0 {
			delete(t.slices, ref)
		}
	} else {
		if m == nil {
			m = map[string]*discoveryv1.EndpointSlice{}
			t.slices[ref] = m
		}
		m[es.Name] = es
	}
	t.dirty[ref] = struct{}{}
	return ref
}

// Pod records a pod added, updated or deleted; only this node's pods with
// hostPorts are kept (their frontends, kind HostPort, are tracked under
// HostPortRef).
func (t *Tracker) Pod(pod *v1.Pod, deleted bool) {
	if pod == nil {
		return
	}
	ref := HostPortRef(pod.Namespace, pod.Name)
	keep := !deleted && pod.Spec.NodeName == t.nodeName && HasHostPorts(pod)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, had := t.pods[ref]; !had && !keep {
		return
	}
	if keep {
		t.pods[ref] = pod
	} else {
		delete(t.pods, ref)
	}
	t.dirty[ref] = struct{}{}
}

// Node records this node's Node object (nil when deleted or absent). When
// its addresses change, every Service with NodePorts is dirty.
func (t *Tracker) Node(n *v1.Node) {
	var ips []netip.Addr
	if n != nil {
		ips = nodeAddresses(t.nodeName, []*v1.Node{n})
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if slices.Equal(ips, t.nodeIPs) {
		return
	}
	t.nodeIPs = ips
	for ref, svc := range t.services {
		if svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer {
			t.dirty[ref] = struct{}{}
		}
	}
	for ref := range t.pods {
		t.dirty[ref] = struct{}{}
	}
}

// HasNode reports whether this node's addresses are known.
func (t *Tracker) HasNode() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.nodeIPs) > 0
}

// Requeue marks Services dirty again (their last Change was not fully
// programmed), so the next Drain hands all their frontends out again.
func (t *Tracker) Requeue(refs ...ServiceRef) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range refs {
		t.dirty[r] = struct{}{}
	}
}

// Pending reports whether some Service is dirty.
func (t *Tracker) Pending() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.dirty) > 0
}

// Drain recomputes the dirty Services and returns what changed. warn
// receives the recomputed Services' Warnings (after the tracker's lock is
// released, so it may call back into the tracker).
func (t *Tracker) Drain(warn func(Warning)) *Change {
	var warns []Warning
	ch := t.drain(func(w Warning) { warns = append(warns, w) })
	if warn != nil {
		for _, w := range warns {
			warn(w)
		}
	}
	return ch
}

func (t *Tracker) drain(warn func(Warning)) *Change {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch := &Change{}
	if len(t.dirty) == 0 {
		return ch
	}
	// 1. Recompute the dirty Services' candidates and their claims; a key
	// whose owner changes makes its old and new owners affected too.
	affected := make(map[ServiceRef]struct{}, len(t.dirty))
	// before: what each dirty Service owned as last drained (its
	// frontends are replaced here, its ownership is decided in step 2).
	before := make(map[ServiceRef]ownedSummary, len(t.dirty))
	var conflictKeys []FrontendKey
	for ref := range t.dirty {
		affected[ref] = struct{}{}
		var next []Frontend
		if svc := t.services[ref]; svc != nil {
			var ss []*discoveryv1.EndpointSlice
			if m := t.slices[ref]; len(m) > 0 {
				ss = make([]*discoveryv1.EndpointSlice, 0, len(m))
				for _, es := range m {
					ss = append(ss, es)
				}
				// Compute sees slices in the lister's order; the result
				// does not depend on it (endpoints are sorted, duplicates
				// resolved by readiness), but keep it deterministic.
				slices.SortFunc(ss, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
			}
			next = serviceFrontends(svc, ss, t.nodeName, t.nodeIPs, t.noLoopback, warn)
		} else if pod := t.pods[ref]; pod != nil {
			next = hostPortFrontends(pod, t.nodeName, t.nodeIPs, t.noLoopback, warn)
		}
		if len(next) > 0 {
			// A key asked for twice by one Service: the first wins, as in
			// Compute.
			for i := 1; i < len(next); i++ {
				if containsKey(next[:i], next[i].FrontendKey) {
					warn(Warning{ref, ReasonFrontendConflict, conflictMessage(next[i:i+1], next, next[i].FrontendKey)})
					next = slices.Delete(next, i, i+1)
					i--
				}
			}
		}
		old := t.fronts[ref]
		before[ref] = old.summary()
		prev := old.fs
		for i := range prev {
			k := prev[i].FrontendKey
			if !containsKey(next, k) {
				cl := t.claims[k]
				switch {
				case cl.owner == ref && len(cl.others) == 0:
					delete(t.claims, k)
				case cl.owner == ref:
					t.claims[k] = claim{cl.others[0], slices.Clone(cl.others[1:])}
					affected[cl.others[0]] = struct{}{}
				default:
					cl.others = slices.DeleteFunc(slices.Clone(cl.others), func(r ServiceRef) bool { return r == ref })
					t.claims[k] = cl
				}
			}
		}
		for i := range next {
			k := next[i].FrontendKey
			if containsKey(prev, k) {
				if len(t.claims[k].others) > 0 {
					conflictKeys = append(conflictKeys, k)
				}
				continue
			}
			cl, ok := t.claims[k]
			switch {
			case !ok:
				t.claims[k] = claim{owner: ref}
				continue
			case compareRef(ref, cl.owner) < 0:
				t.claims[k] = claim{ref, slices.Insert(slices.Clone(cl.others), 0, cl.owner)}
				affected[cl.owner] = struct{}{}
			default:
				i, _ := slices.BinarySearchFunc(cl.others, ref, compareRef)
				t.claims[k] = claim{cl.owner, slices.Insert(slices.Clone(cl.others), i, ref)}
			}
			conflictKeys = append(conflictKeys, k)
		}
		if len(next) == 0 {
			delete(t.fronts, ref)
		} else {
			t.fronts[ref] = tracked{fs: next} // its ownership: step 2
		}
	}
	t.dirty = make(map[ServiceRef]struct{}) // not clear(): that walks every bucket of the old size
	for _, k := range conflictKeys {
		cl := t.claims[k]
		for _, r := range cl.others {
			if _, ok := affected[r]; ok {
				warn(Warning{r, ReasonFrontendConflict, conflictMessage(t.fronts[r].fs, t.fronts[cl.owner].fs, k)})
			}
		}
	}

	// 2. Each affected Service's owned frontends, against what it owned.
	removed := map[FrontendKey]bool{}
	upserted := map[FrontendKey]bool{}
	for ref := range affected {
		tr, ok := t.fronts[ref]
		prev, dirty := before[ref]
		if !dirty {
			prev = tr.summary()
		}
		tr.lost = nil
		for i := range tr.fs {
			if cl, ok := t.claims[tr.fs[i].FrontendKey]; !ok || cl.owner != ref {
				if tr.lost == nil {
					tr.lost = make([]bool, len(tr.fs))
				}
				tr.lost[i] = true
			}
		}
		if ok {
			t.fronts[ref] = tr
		}
		if len(prev.keys) > 0 {
			t.withFronts--
		}
		t.frontends -= len(prev.keys)
		t.endpoints -= prev.endpoints
		n := len(ch.Upsert)
		ch.Upsert = tr.appendOwned(ch.Upsert)
		own := ch.Upsert[n:]
		for _, k := range prev.keys {
			if !containsKey(own, k) {
				removed[k] = true
			}
		}
		for i := range own {
			t.frontends++
			t.endpoints += len(own[i].Endpoints)
			upserted[own[i].FrontendKey] = true
		}
		if len(own) > 0 {
			t.withFronts++
		}
		ch.Services = append(ch.Services, ref)
	}
	for k := range removed {
		if !upserted[k] {
			ch.Remove = append(ch.Remove, k)
		}
	}
	slices.SortFunc(ch.Upsert, func(a, b Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
	slices.SortFunc(ch.Remove, FrontendKey.Compare)
	slices.SortFunc(ch.Services, compareRef)
	return ch
}

// claim is the Services asking for one frontend key: the owner (first by
// namespace/name) and the others, sorted (nil unless Services conflict: no
// allocation per key).
type claim struct {
	owner  ServiceRef
	others []ServiceRef
}

// tracked is one Service's frontends: every one it asks for (its
// candidates, in Compute's order, its own duplicate keys dropped) and which
// of them it owns (a key asked for by several Services belongs to the
// first by namespace/name, as in Compute), as last drained.
type tracked struct {
	fs []Frontend
	// lost[i]: fs[i]'s key belongs to another Service. nil when the
	// Service owns every frontend it asks for (the usual case).
	lost []bool
}

// appendOwned appends the frontends tr owns to dst.
func (tr tracked) appendOwned(dst []Frontend) []Frontend {
	if tr.lost == nil {
		return append(dst, tr.fs...)
	}
	for i := range tr.fs {
		if !tr.lost[i] {
			dst = append(dst, tr.fs[i])
		}
	}
	return dst
}

// ownedSummary is what a Service owned: the keys and their endpoints
// (summed), for the counts and for finding the keys it gave up.
type ownedSummary struct {
	keys      []FrontendKey
	endpoints int
}

func (tr tracked) summary() ownedSummary {
	var s ownedSummary
	for i := range tr.fs {
		if tr.lost == nil || !tr.lost[i] {
			s.keys = append(s.keys, tr.fs[i].FrontendKey)
			s.endpoints += len(tr.fs[i].Endpoints)
		}
	}
	return s
}

// State returns the whole desired State (Drain first to include pending
// changes). It is built on each call from the tracker's one copy of the
// frontends (full syncs are rare: the first one, the periodic reconcile,
// after errors); the caller may keep it, but must not modify the
// frontends' endpoint lists, which the tracker shares.
func (t *Tracker) State(clusterCIDRs []netip.Prefix) *State {
	t.mu.Lock()
	defer t.mu.Unlock()
	fs := make([]Frontend, 0, t.frontends)
	for _, tr := range t.fronts {
		fs = tr.appendOwned(fs)
	}
	slices.SortFunc(fs, func(a, b Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
	return &State{Frontends: fs, NodeName: t.nodeName, ClusterCIDRs: slices.Clone(clusterCIDRs)}
}

// Counts returns the Services with frontends, the frontends and the
// endpoints (summed over frontends) of the desired state, as last drained.
func (t *Tracker) Counts() (services, frontends, endpoints int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.withFronts, t.frontends, t.endpoints
}

// Frontends returns the frontends Service ref owns, as last drained.
func (t *Tracker) Frontends(ref ServiceRef) []Frontend {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fronts[ref].appendOwned(nil)
}

// ServiceObject returns the Service object recorded for ref (nil if none).
func (t *Tracker) ServiceObject(ref ServiceRef) *v1.Service {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.services[ref]
}

func conflictMessage(fs, ownerFs []Frontend, k FrontendKey) string {
	var kind FrontendKind
	for _, f := range fs {
		if f.FrontendKey == k {
			kind = f.Kind
			break
		}
	}
	var owner ServicePortName
	for _, f := range ownerFs {
		if f.FrontendKey == k {
			owner = f.Service
			break
		}
	}
	return fmt.Sprintf("%s %s is already used by Service %s; ignored here", kind, k, owner)
}

func containsKey(fs []Frontend, k FrontendKey) bool {
	for i := range fs {
		if fs[i].FrontendKey == k {
			return true
		}
	}
	return false
}

func compareRef(a, b ServiceRef) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// ServiceRefs lists every Service the tracker holds.
func (t *Tracker) ServiceRefs() []ServiceRef {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]ServiceRef, 0, len(t.services))
	for r := range t.services {
		out = append(out, r)
	}
	return out
}

// HealthCheckNodePort returns the Service's healthCheckNodePort (0: none:
// not a LoadBalancer with externalTrafficPolicy Local) and how many ready
// endpoints it has on this node (distinct addresses), as kube-proxy's
// LocalReadyEndpoints.
func (t *Tracker) HealthCheckNodePort(ref ServiceRef) (port uint16, local int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	svc := t.services[ref]
	if svc == nil || svc.Spec.Type != v1.ServiceTypeLoadBalancer || svc.Spec.HealthCheckNodePort == 0 ||
		svc.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
		return 0, 0
	}
	return uint16(svc.Spec.HealthCheckNodePort), t.localReadyLocked(ref)
}

func (t *Tracker) localReady(ref ServiceRef) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.localReadyLocked(ref)
}

// localReadyLocked counts the Service's ready endpoints on this node
// (distinct addresses); t.mu held.
func (t *Tracker) localReadyLocked(ref ServiceRef) int {
	seen := map[string]bool{}
	for _, es := range t.slices[ref] {
		for _, e := range es.Endpoints {
			if e.NodeName == nil || *e.NodeName != t.nodeName || (e.Conditions.Ready != nil && !*e.Conditions.Ready) {
				continue
			}
			for _, a := range e.Addresses {
				seen[a] = true
			}
		}
	}
	return len(seen)
}

// LoadBalancerIPs returns the LoadBalancer ingress IPs (IPv4 and IPv6) of a Service
// this node can serve to traffic from outside (the L2 announcement
// candidates): all of them for externalTrafficPolicy Cluster; for Local only
// while this node has a ready endpoint of the Service. ipMode Proxy IPs are
// left out (the load balancer proxies to node ports itself).
func (t *Tracker) LoadBalancerIPs(ref ServiceRef) []netip.Addr {
	t.mu.Lock()
	svc := t.services[ref]
	t.mu.Unlock()
	if svc == nil || svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return nil
	}
	if svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
		if t.localReady(ref) == 0 {
			return nil
		}
	}
	var out []netip.Addr
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IPMode != nil && *in.IPMode == v1.LoadBalancerIPModeProxy {
			continue
		}
		if a, err := netip.ParseAddr(in.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}
