package dataplane

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// DefaultAffinityTimeout is sessionAffinity ClientIP's timeout when the
// Service does not set one (Kubernetes' default, 3 hours).
const DefaultAffinityTimeout = 10800 * time.Second

// Reasons of the Warnings Compute reports (also the Events' reasons).
const (
	// ReasonUnsupportedProtocol: a Service port uses a protocol the proxy
	// does not load-balance (SCTP).
	ReasonUnsupportedProtocol = "UnsupportedProtocol"
	// ReasonFrontendConflict: two Services claim the same address, port and
	// protocol; the first by namespace/name keeps it.
	ReasonFrontendConflict = "FrontendConflict"
	// ReasonInvalidAddress: a Service field holds an address that does not
	// parse.
	ReasonInvalidAddress = "InvalidAddress"
	// ReasonMapFull: the backend had no room for the Service.
	ReasonMapFull = "MapFull"
)

// ServiceRef names a Service.
type ServiceRef struct {
	Namespace, Name string
}

func (r ServiceRef) String() string { return r.Namespace + "/" + r.Name }

// Warning is a problem with one Service found while computing the State. The
// proxy logs it and records it as an Event on the Service.
type Warning struct {
	Service ServiceRef
	Reason  string
	Message string
}

// ComputeOptions are Compute's optional inputs.
type ComputeOptions struct {
	// ClusterCIDRs are the pod networks, copied into the State.
	ClusterCIDRs []netip.Prefix
	// NoLoopbackNodePorts leaves out the 127.0.0.1 NodePort frontends (the
	// iptables and IPVS backends cannot serve them without route_localnet,
	// which Waggle never sets).
	NoLoopbackNodePorts bool
	// Warn, when set, receives every Warning.
	Warn func(Warning)
	// Pods are this node's pods: their hostPorts are frontends too (kind
	// HostPort), named by HostPortRef and ordered with the Services by
	// namespace/name when two claim one key.
	Pods []*v1.Pod
}

// Compute turns the informers' objects into the desired State of node
// nodeName. It is a pure function: the same inputs give the same State.
//
// Frontends, per Service port and protocol (TCP or UDP; SCTP is refused with
// a Warning):
//   - ClusterIP: every address of spec.clusterIPs (dual-stack), endpoints
//     restricted to this node's when internalTrafficPolicy is Local;
//   - NodePort: for Services of type NodePort and LoadBalancer, on this node's
//     InternalIP and ExternalIP addresses (from its Node object) and on
//     127.0.0.1, like kube-proxy's nodePortAddresses default restricted to
//     the node's own addresses plus localhost;
//   - ExternalIP: every spec.externalIPs address;
//   - LoadBalancer: every status.loadBalancer.ingress IP (except ipMode
//     Proxy, where the load balancer itself proxies);
//
// the last three with endpoints restricted to this node's when
// externalTrafficPolicy is Local. Endpoints come from the EndpointSlices
// labelled with the Service's name, matched to the Service port by port name
// and protocol, deduplicated across slices by address and port. Ready ones are
// used; when none is ready, serving-and-terminating ones (KEP-1669).
func Compute(nodeName string, services []*v1.Service, endpointSlices []*discoveryv1.EndpointSlice, nodes []*v1.Node, opts ComputeOptions) *State {
	warn := opts.Warn
	if warn == nil {
		warn = func(Warning) {}
	}
	st := &State{NodeName: nodeName, ClusterCIDRs: slices.Clone(opts.ClusterCIDRs)}

	nodeIPs := nodeAddresses(nodeName, nodes)

	bySvc := map[ServiceRef][]*discoveryv1.EndpointSlice{}
	for _, es := range endpointSlices {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		ref := ServiceRef{es.Namespace, name}
		bySvc[ref] = append(bySvc[ref], es)
	}

	svcs := slices.Clone(services)
	slices.SortFunc(svcs, func(a, b *v1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})

	owner := map[FrontendKey]ServicePortName{}
	add := func(ref ServiceRef, f Frontend) {
		if prev, ok := owner[f.FrontendKey]; ok {
			warn(Warning{ref, ReasonFrontendConflict, fmt.Sprintf("%s %s is already used by Service %s; ignored here", f.Kind, f.FrontendKey, prev)})
			return
		}
		owner[f.FrontendKey] = f.Service
		st.Frontends = append(st.Frontends, f)
	}

	type source struct {
		ref ServiceRef
		fs  []Frontend
	}
	var srcs []source
	for _, svc := range svcs {
		ref := ServiceRef{svc.Namespace, svc.Name}
		srcs = append(srcs, source{ref, serviceFrontends(svc, bySvc[ref], nodeName, nodeIPs, opts.NoLoopbackNodePorts, warn)})
	}
	for _, pod := range opts.Pods {
		if fs := hostPortFrontends(pod, nodeName, nodeIPs, opts.NoLoopbackNodePorts, warn); len(fs) > 0 {
			srcs = append(srcs, source{HostPortRef(pod.Namespace, pod.Name), fs})
		}
	}
	slices.SortStableFunc(srcs, func(a, b source) int { return compareRef(a.ref, b.ref) })
	for _, s := range srcs {
		for _, f := range s.fs {
			add(s.ref, f)
		}
	}
	slices.SortFunc(st.Frontends, func(a, b Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
	return st
}

// serviceFrontends returns the frontends one Service asks for, in the order
// Compute considers them (before conflicts between Services are resolved).
// svcSlices are the Service's EndpointSlices; nodeIPs this node's addresses.
func serviceFrontends(svc *v1.Service, svcSlices []*discoveryv1.EndpointSlice, nodeName string, nodeIPs []netip.Addr, noLoopback bool, warn func(Warning)) []Frontend {
	var out []Frontend
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return nil
	}
	ref := ServiceRef{svc.Namespace, svc.Name}
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	if len(clusterIPs) == 0 || clusterIPs[0] == v1.ClusterIPNone {
		return nil // headless: DNS only
	}
	var vips []netip.Addr
	for _, s := range clusterIPs {
		a, err := parseIP(s)
		if err != nil {
			warn(Warning{ref, ReasonInvalidAddress, fmt.Sprintf("clusterIP %q: %v", s, err)})
			continue
		}
		vips = append(vips, a)
	}
	families := map[bool]bool{} // is4 → served
	for _, a := range vips {
		families[a.Is4()] = true
	}

	var affinity time.Duration
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		affinity = DefaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			affinity = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	externalLocal := svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal

	var externals []netip.Addr
	for _, s := range svc.Spec.ExternalIPs {
		a, err := parseIP(s)
		if err != nil {
			warn(Warning{ref, ReasonInvalidAddress, fmt.Sprintf("externalIP %q: %v", s, err)})
			continue
		}
		externals = append(externals, a)
	}
	var lbs []netip.Addr
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy) {
				continue
			}
			a, err := parseIP(ing.IP)
			if err != nil {
				warn(Warning{ref, ReasonInvalidAddress, fmt.Sprintf("load balancer ingress IP %q: %v", ing.IP, err)})
				continue
			}
			lbs = append(lbs, a)
		}
	}
	terminateTCP := svc.Annotations[AnnotationTerminateTCP] == "true"
	ranges := sourceRanges(svc, ref, warn)
	hasNodePort := svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer

	for _, sp := range svc.Spec.Ports {
		proto := Protocol(sp.Protocol)
		if sp.Protocol == "" {
			proto = TCP
		}
		if proto != TCP && proto != UDP {
			warn(Warning{ref, ReasonUnsupportedProtocol, fmt.Sprintf("port %q: protocol %s is not supported by waggle proxy; only TCP and UDP are load-balanced", portLabel(sp), sp.Protocol)})
			continue
		}
		if sp.Port <= 0 || sp.Port > 65535 {
			continue
		}
		spn := ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: sp.Name}
		all := endpointsFor(svcSlices, sp.Name, sp.Protocol)
		// The port's frontends of one family and traffic policy share one
		// endpoint list (a NodePort Service's ClusterIP and NodePort
		// frontends, for one), held once by whoever keeps them.
		var picked [2][2][]Endpoint // [IPv4][local]
		var done [2][2]bool
		pick := func(a netip.Addr, local bool) []Endpoint {
			i, j := 0, 0
			if a.Is4() {
				i = 1
			}
			if local {
				j = 1
			}
			if !done[i][j] {
				picked[i][j], done[i][j] = selectEndpoints(all, a.Is4(), local, nodeName), true
			}
			return picked[i][j]
		}
		for _, a := range vips {
			out = append(out, Frontend{
				FrontendKey:     FrontendKey{Addr: a, Port: uint16(sp.Port), Protocol: proto},
				Kind:            ClusterIP,
				Service:         spn,
				Endpoints:       pick(a, internalLocal),
				AffinityTimeout: affinity,
				LocalOnly:       internalLocal,
				TerminateTCP:    terminateTCP,
			})
		}
		if hasNodePort && sp.NodePort > 0 && sp.NodePort <= 65535 {
			addrs := slices.Clone(nodeIPs)
			if !noLoopback {
				addrs = append(addrs, netip.AddrFrom4([4]byte{127, 0, 0, 1}))
			}
			for _, a := range addrs {
				if !families[a.Is4()] {
					continue
				}
				out = append(out, Frontend{
					FrontendKey:     FrontendKey{Addr: a, Port: uint16(sp.NodePort), Protocol: proto},
					Kind:            NodePort,
					Service:         spn,
					Endpoints:       pick(a, externalLocal),
					AffinityTimeout: affinity,
					LocalOnly:       externalLocal,
					TerminateTCP:    terminateTCP,
				})
			}
		}
		for _, kind := range []struct {
			k     FrontendKind
			addrs []netip.Addr
		}{{ExternalIP, externals}, {LoadBalancer, lbs}} {
			for _, a := range kind.addrs {
				if !families[a.Is4()] {
					continue
				}
				var rs []netip.Prefix
				if kind.k == LoadBalancer {
					rs = ranges[a.Is4()]
				}
				out = append(out, Frontend{
					SourceRanges:    rs,
					FrontendKey:     FrontendKey{Addr: a, Port: uint16(sp.Port), Protocol: proto},
					Kind:            kind.k,
					Service:         spn,
					Endpoints:       pick(a, externalLocal),
					AffinityTimeout: affinity,
					LocalOnly:       externalLocal,
					TerminateTCP:    terminateTCP,
				})
			}
		}
	}
	return out
}

// sourceRanges parses spec.loadBalancerSourceRanges by family (is4 →
// prefixes, masked, sorted, deduplicated), as kube-proxy's service info does:
// entries are trimmed, an invalid one is skipped with a warning (the API
// server's validation refuses them on create; this covers older objects).
// The legacy annotation service.beta.kubernetes.io/load-balancer-source-ranges
// is for cloud providers, and kube-proxy ignores it too.
func sourceRanges(svc *v1.Service, ref ServiceRef, warn func(Warning)) map[bool][]netip.Prefix {
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer || len(svc.Spec.LoadBalancerSourceRanges) == 0 {
		return nil
	}
	out := map[bool][]netip.Prefix{}
	for _, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			warn(Warning{ref, ReasonInvalidAddress, fmt.Sprintf("loadBalancerSourceRanges entry %q: %v", s, err)})
			continue
		}
		p = p.Masked()
		out[p.Addr().Is4()] = append(out[p.Addr().Is4()], p)
	}
	for k, ps := range out {
		slices.SortFunc(ps, func(a, b netip.Prefix) int {
			return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
		})
		out[k] = slices.Compact(ps)
	}
	return out
}

// parseIP parses a Service, Node or endpoint address: IPv4-mapped IPv6 is
// unmapped; zones and the unspecified address are refused.
func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("address %q has a zone", s)
	}
	if a.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("address %q is unspecified", s)
	}
	return a.Unmap(), nil
}

func portLabel(sp v1.ServicePort) string {
	if sp.Name != "" {
		return sp.Name
	}
	return fmt.Sprint(sp.Port)
}

// nodeAddresses returns node nodeName's InternalIP and ExternalIP addresses,
// deduplicated, in their listed order.
func nodeAddresses(nodeName string, nodes []*v1.Node) []netip.Addr {
	var out []netip.Addr
	for _, n := range nodes {
		if n.Name != nodeName {
			continue
		}
		for _, na := range n.Status.Addresses {
			if na.Type != v1.NodeInternalIP && na.Type != v1.NodeExternalIP {
				continue
			}
			a, err := parseIP(na.Address)
			if err != nil {
				continue
			}
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// candidate is an endpoint address with its conditions.
type candidate struct {
	Endpoint
	ready, serving bool
}

// endpointsFor collects the endpoints of the slices for the Service port
// named portName, deduplicated by address and port (a ready copy wins), in
// address order.
func endpointsFor(ess []*discoveryv1.EndpointSlice, portName string, proto v1.Protocol) []candidate {
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	seen := map[netip.AddrPort]int{}
	var out []candidate
	for _, es := range ess {
		if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		var port int32
		for _, p := range es.Ports {
			pn, pp := "", v1.ProtocolTCP
			if p.Name != nil {
				pn = *p.Name
			}
			if p.Protocol != nil {
				pp = *p.Protocol
			}
			if pn == portName && pp == proto && p.Port != nil {
				port = *p.Port
				break
			}
		}
		if port <= 0 || port > 65535 {
			continue
		}
		for _, ep := range es.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			serving := ready
			if ep.Conditions.Serving != nil {
				serving = *ep.Conditions.Serving
			}
			terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			if terminating {
				ready = false
			}
			node := ""
			if ep.NodeName != nil {
				node = *ep.NodeName
			}
			for _, s := range ep.Addresses {
				a, err := parseIP(s)
				if err != nil {
					continue
				}
				c := candidate{Endpoint: Endpoint{Addr: a, Port: uint16(port), NodeName: node, Terminating: terminating}, ready: ready, serving: serving}
				key := c.AddrPort()
				if i, ok := seen[key]; ok {
					if c.ready && !out[i].ready {
						out[i] = c
					}
					continue
				}
				seen[key] = len(out)
				out = append(out, c)
			}
		}
	}
	slices.SortFunc(out, func(a, b candidate) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	return out
}

// selectEndpoints applies the address family, the traffic policy and the
// ready-else-serving-terminating rule. The list it returns is allocated at
// its exact size (it is kept as long as the frontend is desired).
func selectEndpoints(all []candidate, is4, local bool, nodeName string) []Endpoint {
	use := func(c *candidate) bool {
		return c.Addr.Is4() == is4 && (!local || strings.EqualFold(c.NodeName, nodeName))
	}
	var nready, nterm int
	for i := range all {
		if c := &all[i]; use(c) {
			switch {
			case c.ready:
				nready++
			case c.serving && c.Terminating:
				nterm++
			}
		}
	}
	if nready == 0 && nterm == 0 {
		return nil
	}
	wantReady, n := nready > 0, nready
	if !wantReady {
		n = nterm
	}
	out := make([]Endpoint, 0, n)
	for i := range all {
		c := &all[i]
		if !use(c) {
			continue
		}
		if (wantReady && c.ready) || (!wantReady && !c.ready && c.serving && c.Terminating) {
			out = append(out, c.Endpoint)
		}
	}
	return out
}
