package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Reserved identities (bpf/lib/policy.h).
const (
	IdentityAny       uint32 = 0
	IdentityHost      uint32 = 1
	IdentityWorld     uint32 = 2
	firstLabelID      uint32 = 256
	firstCIDRID       uint32 = 0x01000000
	DirIngress        uint8  = 0
	DirEgress         uint8  = 1
	protoAny          uint8  = 0
	protoTCP          uint8  = 6
	protoUDP          uint8  = 17
	protoSCTP         uint8  = 132
	prefixAnyProto           = 96
	prefixProtoAnyPrt        = 112
)

// Key is one policy entry's key: {endpoint, direction, peer identity,
// protocol, port prefix}. Protocol 0 with PortBits... see Prefix.
type Key struct {
	Endpoint uint32
	Dir      uint8
	Identity uint32
	Proto    uint8 // 0: any protocol (and any port)
	Port     uint16
	PortBits uint8 // leading bits of Port that must match (0: any port)
}

// Prefixlen is the LPM prefix length of k (bpf/lib/policy.h).
func (k Key) Prefixlen() uint32 {
	if k.Proto == protoAny {
		return prefixAnyProto
	}
	return prefixProtoAnyPrt + uint32(k.PortBits)
}

// Entry is what a key allows: the policy and rule, for counters and explain.
type Entry struct {
	Policy uint32
	Rule   uint16
}

// EndpointState is the compiled policy of one local pod.
type EndpointState struct {
	Pod              string // namespace/name
	Ifindex          uint32
	IPs              []netip.Addr // the pod's addresses (the iptables datapath matches on them)
	Identity         uint32
	IngressIsolated  bool
	EgressIsolated   bool
	Entries          map[Key]Entry
	IngressPolicies  []string // namespace/name of the policies isolating it
	EgressPolicies   []string
	usesPeers        bool // has rules naming pods or namespaces
	usesCIDR         bool
	usesEgressNamed  bool
	selectedIdentity map[uint32]bool
}

// Equal reports whether two endpoint states program the same thing.
func (e *EndpointState) Equal(o *EndpointState) bool {
	if e == nil || o == nil {
		return e == o
	}
	if e.Ifindex != o.Ifindex || e.Identity != o.Identity || e.IngressIsolated != o.IngressIsolated ||
		e.EgressIsolated != o.EgressIsolated || len(e.Entries) != len(o.Entries) || !slices.Equal(e.IPs, o.IPs) {
		return false
	}
	for k, v := range e.Entries {
		if w, ok := o.Entries[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Identity is a label set: the namespace, the pod's labels and the
// namespace's labels. Pods with equal label sets share one.
type Identity struct {
	ID        uint32
	Namespace string
	Labels    labels.Set
	NSLabels  labels.Set
	key       string
	refs      int
	pods      map[string]*podInfo
}

type podInfo struct {
	key      string
	ns, name string
	labels   labels.Set
	ips      []netip.Addr
	local    bool
	ifindex  uint32
	identity *Identity
	ports    []v1.ContainerPort
}

type peer struct {
	pod, ns  labels.Selector // ns nil: the policy's namespace
	cidr     netip.Prefix
	excepts  []netip.Prefix
	isIPBlok bool
}

type rulePort struct {
	proto    uint8
	port     int32 // 0: every port
	endPort  int32
	named    string
	anyProto bool // no ports given: every protocol and port
}

type rule struct {
	peers []peer // empty: every peer
	ports []rulePort
}

type compiledPolicy struct {
	key       string
	id        uint32
	ns, name  string
	subject   labels.Selector
	ingress   []rule
	egress    []rule
	isIngress bool
	isEgress  bool
	cidrs     []netip.Prefix
	warnings  []string
}

// Compiler holds the cluster's policy inputs and the compiled state of the
// local endpoints. It is not safe for concurrent use (the Agent serializes).
type Compiler struct {
	node       string
	namespaces map[string]labels.Set
	pods       map[string]*podInfo
	identities map[string]*Identity
	byID       map[uint32]*Identity
	nextID     uint32
	policies   map[string]*compiledPolicy
	policyByID map[uint32]*compiledPolicy
	nextPolID  uint32
	freePolIDs []uint32
	// CIDR identities: every prefix an ipBlock names (cidr or except).
	cidrRefs map[netip.Prefix]int
	cidrIDs  map[netip.Prefix]uint32
	nextCIDR uint32
	// Compiled local endpoints, by pod key.
	endpoints map[string]*EndpointState
	// dirty endpoints (pod keys) and whether the CIDR/ipcache sets changed.
	dirty      map[string]bool
	ipsDirty   bool
	cidrsDirty bool
	// hostIPs are this node's own addresses (identity host).
	hostIPs []netip.Addr
	// Warnings collected since the last Take.
	warnings []string
}

// NewCompiler returns an empty compiler for node.
func NewCompiler(node string) *Compiler {
	return &Compiler{
		node: node, namespaces: map[string]labels.Set{}, pods: map[string]*podInfo{},
		identities: map[string]*Identity{}, byID: map[uint32]*Identity{}, nextID: firstLabelID,
		policies: map[string]*compiledPolicy{}, policyByID: map[uint32]*compiledPolicy{}, nextPolID: 1,
		cidrRefs: map[netip.Prefix]int{}, cidrIDs: map[netip.Prefix]uint32{}, nextCIDR: firstCIDRID,
		endpoints: map[string]*EndpointState{}, dirty: map[string]bool{},
	}
}

func nsKey(ns, name string) string { return ns + "/" + name }

// SetHostIPs sets this node's addresses.
func (c *Compiler) SetHostIPs(ips []netip.Addr) {
	c.hostIPs = slices.Clone(ips)
	c.ipsDirty = true
}

// SetNamespace records a namespace (add or update).
func (c *Compiler) SetNamespace(ns *v1.Namespace) {
	l := labels.Set(ns.Labels)
	if old, ok := c.namespaces[ns.Name]; ok && labels.Equals(old, l) {
		return
	}
	c.namespaces[ns.Name] = labels.Merge(nil, l)
	for _, p := range c.pods {
		if p.ns == ns.Name {
			c.reidentify(p)
		}
	}
}

// DeleteNamespace forgets a namespace.
func (c *Compiler) DeleteNamespace(name string) {
	if _, ok := c.namespaces[name]; !ok {
		return
	}
	delete(c.namespaces, name)
	for _, p := range c.pods {
		if p.ns == name {
			c.reidentify(p)
		}
	}
}

// podIPs returns the pod's addresses (none for hostNetwork pods: they are
// the node's own, and policy does not apply to them).
func podIPs(pod *v1.Pod) []netip.Addr {
	if pod.Spec.HostNetwork {
		return nil
	}
	var out []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	if len(out) == 0 && pod.Status.PodIP != "" {
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// podDone: a pod that finished holds no address any more.
func podDone(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}

// SetPod records a pod (add or update). ifindex is the host-side veth of a
// local pod (0 while unknown: the endpoint is compiled once it is known).
func (c *Compiler) SetPod(pod *v1.Pod, ifindex uint32) {
	key := nsKey(pod.Namespace, pod.Name)
	if podDone(pod) || pod.Spec.HostNetwork {
		c.DeletePod(pod.Namespace, pod.Name)
		return
	}
	var ports []v1.ContainerPort
	for _, ct := range pod.Spec.Containers {
		ports = append(ports, ct.Ports...)
	}
	p, ok := c.pods[key]
	if !ok {
		p = &podInfo{key: key, ns: pod.Namespace, name: pod.Name}
		c.pods[key] = p
	}
	ips := podIPs(pod)
	if !slices.Equal(ips, p.ips) {
		c.ipsDirty = true
		if len(ports) > 0 {
			c.markNamedPortUsers()
		}
	}
	portsChanged := !slices.Equal(ports, p.ports)
	labelsChanged := !ok || !labels.Equals(p.labels, labels.Set(pod.Labels))
	local := pod.Spec.NodeName == c.node && len(ips) > 0
	wasLocal := p.local
	p.ips, p.ports, p.local, p.ifindex = ips, ports, local, ifindex
	if wasLocal || local {
		c.markPod(p)
	}
	p.labels = labels.Merge(nil, labels.Set(pod.Labels))
	if labelsChanged || p.identity == nil {
		c.reidentify(p)
	}
	if portsChanged {
		c.markPod(p)
		c.markNamedPortUsers()
	}
}

// markPod marks p's endpoint dirty when it is (or was) a local endpoint.
func (c *Compiler) markPod(p *podInfo) {
	if _, ok := c.endpoints[p.key]; ok || p.local {
		c.dirty[p.key] = true
	}
}

// DeletePod forgets a pod.
func (c *Compiler) DeletePod(ns, name string) {
	key := nsKey(ns, name)
	p, ok := c.pods[key]
	if !ok {
		return
	}
	delete(c.pods, key)
	if len(p.ips) > 0 {
		c.ipsDirty = true
	}
	c.release(p)
	if len(p.ports) > 0 {
		c.markNamedPortUsers()
	}
	if _, ok := c.endpoints[key]; ok {
		c.dirty[key] = true
	}
}

func (c *Compiler) markNamedPortUsers() {
	for k, e := range c.endpoints {
		if e.usesEgressNamed {
			c.dirty[k] = true
		}
	}
}

func identityKey(ns string, l, nsl labels.Set) string {
	return ns + "\x00" + l.String() + "\x00" + nsl.String()
}

// reidentify gives p the identity of its current label set.
func (c *Compiler) reidentify(p *podInfo) {
	nsl := c.namespaces[p.ns]
	k := identityKey(p.ns, p.labels, nsl)
	if p.identity != nil && p.identity.key == k {
		return
	}
	c.release(p)
	id, ok := c.identities[k]
	if !ok {
		id = &Identity{ID: c.nextID, Namespace: p.ns, Labels: p.labels, NSLabels: labels.Merge(nil, nsl), key: k, pods: map[string]*podInfo{}}
		c.nextID++
		c.identities[k] = id
		c.byID[id.ID] = id
		c.identityChanged(id)
	}
	id.refs++
	id.pods[p.key] = p
	p.identity = id
	c.ipsDirty = true
	c.markPod(p)
}

func (c *Compiler) release(p *podInfo) {
	id := p.identity
	if id == nil {
		return
	}
	p.identity = nil
	delete(id.pods, p.key)
	id.refs--
	c.ipsDirty = true
	if id.refs > 0 {
		if len(p.ports) > 0 {
			c.markNamedPortUsers()
		}
		return
	}
	delete(c.identities, id.key)
	delete(c.byID, id.ID)
	c.identityChanged(id)
}

// identityChanged marks the endpoints a new or removed identity can matter
// to: those whose rules select it (or could: any rule naming pods or
// namespaces whose selectors match it).
func (c *Compiler) identityChanged(id *Identity) {
	for k, e := range c.endpoints {
		if e.selectedIdentity[id.ID] {
			c.dirty[k] = true
			continue
		}
		if !e.usesPeers {
			continue
		}
		p := c.pods[k]
		if p == nil {
			continue
		}
		for _, pol := range c.policies {
			if pol.ns != p.ns || !pol.subject.Matches(p.labels) {
				continue
			}
			if pol.selectsIdentity(id) {
				c.dirty[k] = true
				break
			}
		}
	}
}

func (pol *compiledPolicy) selectsIdentity(id *Identity) bool {
	for _, rs := range [][]rule{pol.ingress, pol.egress} {
		for _, r := range rs {
			for _, pe := range r.peers {
				if pe.matches(pol.ns, id) {
					return true
				}
			}
		}
	}
	return false
}

func (pe *peer) matches(policyNS string, id *Identity) bool {
	if pe.isIPBlok {
		return false
	}
	if pe.ns == nil {
		if id.Namespace != policyNS {
			return false
		}
	} else if !pe.ns.Matches(id.NSLabels) {
		return false
	}
	return pe.pod == nil || pe.pod.Matches(id.Labels)
}

// SetPolicy records a NetworkPolicy (add or update).
func (c *Compiler) SetPolicy(np *networkingv1.NetworkPolicy) error {
	key := nsKey(np.Namespace, np.Name)
	old := c.policies[key]
	cp, err := compilePolicy(np)
	if err != nil {
		return fmt.Errorf("networkpolicy %s: %w", key, err)
	}
	if old != nil {
		cp.id = old.id
		c.markSubjects(old)
		c.unrefCIDRs(old)
	} else {
		cp.id = c.allocPolicyID()
	}
	c.policies[key] = cp
	c.policyByID[cp.id] = cp
	c.refCIDRs(cp)
	c.markSubjects(cp)
	for _, w := range cp.warnings {
		c.warnings = append(c.warnings, "networkpolicy "+key+": "+w)
	}
	return nil
}

// DeletePolicy forgets a NetworkPolicy.
func (c *Compiler) DeletePolicy(ns, name string) {
	key := nsKey(ns, name)
	old, ok := c.policies[key]
	if !ok {
		return
	}
	c.markSubjects(old)
	c.unrefCIDRs(old)
	delete(c.policies, key)
	delete(c.policyByID, old.id)
	c.freePolIDs = append(c.freePolIDs, old.id)
}

func (c *Compiler) allocPolicyID() uint32 {
	if n := len(c.freePolIDs); n > 0 {
		id := c.freePolIDs[n-1]
		c.freePolIDs = c.freePolIDs[:n-1]
		return id
	}
	id := c.nextPolID
	c.nextPolID++
	return id
}

func (c *Compiler) markSubjects(pol *compiledPolicy) {
	for k := range c.endpoints {
		c.markIfSubject(k, pol)
	}
	for k, p := range c.pods {
		if p.local && p.ns == pol.ns && pol.subject.Matches(p.labels) {
			c.dirty[k] = true
		}
	}
}

func (c *Compiler) markIfSubject(k string, pol *compiledPolicy) {
	p := c.pods[k]
	if p == nil || (p.ns == pol.ns && pol.subject.Matches(p.labels)) {
		c.dirty[k] = true
	}
}

func (c *Compiler) refCIDRs(pol *compiledPolicy) {
	for _, p := range pol.cidrs {
		c.cidrRefs[p]++
		if c.cidrRefs[p] == 1 {
			c.cidrIDs[p] = c.nextCIDR
			c.nextCIDR++
			c.cidrsChanged()
		}
	}
}

func (c *Compiler) unrefCIDRs(pol *compiledPolicy) {
	for _, p := range pol.cidrs {
		c.cidrRefs[p]--
		if c.cidrRefs[p] <= 0 {
			delete(c.cidrRefs, p)
			delete(c.cidrIDs, p)
			c.cidrsChanged()
		}
	}
}

// cidrsChanged: the longest-prefix identities of addresses may have moved,
// so every endpoint with ipBlock rules is recompiled.
func (c *Compiler) cidrsChanged() {
	c.cidrsDirty = true
	for k, e := range c.endpoints {
		if e.usesCIDR {
			c.dirty[k] = true
		}
	}
}

func compilePolicy(np *networkingv1.NetworkPolicy) (*compiledPolicy, error) {
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		return nil, fmt.Errorf("podSelector: %w", err)
	}
	cp := &compiledPolicy{key: nsKey(np.Namespace, np.Name), ns: np.Namespace, name: np.Name, subject: sel}
	types := np.Spec.PolicyTypes
	if len(types) == 0 {
		// Upstream's defaulting: Ingress always, Egress when egress rules exist.
		types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(np.Spec.Egress) > 0 {
			types = append(types, networkingv1.PolicyTypeEgress)
		}
	}
	for _, t := range types {
		switch t {
		case networkingv1.PolicyTypeIngress:
			cp.isIngress = true
		case networkingv1.PolicyTypeEgress:
			cp.isEgress = true
		}
	}
	if cp.isIngress {
		for _, r := range np.Spec.Ingress {
			cr, err := cp.compileRule(r.From, r.Ports)
			if err != nil {
				return nil, fmt.Errorf("ingress: %w", err)
			}
			cp.ingress = append(cp.ingress, cr)
		}
	}
	if cp.isEgress {
		for _, r := range np.Spec.Egress {
			cr, err := cp.compileRule(r.To, r.Ports)
			if err != nil {
				return nil, fmt.Errorf("egress: %w", err)
			}
			cp.egress = append(cp.egress, cr)
		}
	}
	return cp, nil
}

func (cp *compiledPolicy) compileRule(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) (rule, error) {
	var r rule
	for _, p := range peers {
		var pe peer
		if p.IPBlock != nil {
			pfx, err := netip.ParsePrefix(p.IPBlock.CIDR)
			if err != nil {
				return r, fmt.Errorf("ipBlock.cidr %q: %w", p.IPBlock.CIDR, err)
			}
			pe.isIPBlok, pe.cidr = true, canonPrefix(pfx)
			cp.cidrs = append(cp.cidrs, pe.cidr)
			for _, e := range p.IPBlock.Except {
				ep, err := netip.ParsePrefix(e)
				if err != nil {
					return r, fmt.Errorf("ipBlock.except %q: %w", e, err)
				}
				pe.excepts = append(pe.excepts, canonPrefix(ep))
				cp.cidrs = append(cp.cidrs, canonPrefix(ep))
			}
		} else {
			if p.PodSelector == nil && p.NamespaceSelector == nil {
				continue // an empty peer selects nothing (rejected by validation)
			}
			if p.PodSelector != nil {
				s, err := metav1.LabelSelectorAsSelector(p.PodSelector)
				if err != nil {
					return r, fmt.Errorf("podSelector: %w", err)
				}
				pe.pod = s
			}
			if p.NamespaceSelector != nil {
				s, err := metav1.LabelSelectorAsSelector(p.NamespaceSelector)
				if err != nil {
					return r, fmt.Errorf("namespaceSelector: %w", err)
				}
				pe.ns = s
			}
		}
		r.peers = append(r.peers, pe)
	}
	if len(peers) > 0 && len(r.peers) == 0 {
		r.peers = []peer{{pod: labels.Nothing()}}
	}
	if len(ports) == 0 {
		r.ports = []rulePort{{anyProto: true}}
	}
	for _, p := range ports {
		rp := rulePort{proto: protoTCP}
		if p.Protocol != nil {
			switch *p.Protocol {
			case v1.ProtocolTCP:
			case v1.ProtocolUDP:
				rp.proto = protoUDP
			case v1.ProtocolSCTP:
				rp.proto = protoSCTP
				cp.warnings = append(cp.warnings, "SCTP is not supported by Waggle's dataplane: its SCTP ports allow nothing")
				continue
			default:
				return r, fmt.Errorf("protocol %q: want TCP, UDP or SCTP", *p.Protocol)
			}
		}
		if p.Port != nil {
			if p.Port.Type == intstr.String {
				rp.named = p.Port.StrVal
			} else {
				rp.port = p.Port.IntVal
				rp.endPort = p.Port.IntVal
				if p.EndPort != nil && *p.EndPort >= rp.port {
					rp.endPort = *p.EndPort
				}
			}
		}
		r.ports = append(r.ports, rp)
	}
	if len(ports) > 0 && len(r.ports) == 0 {
		r.ports = []rulePort{} // only unsupported protocols: allows nothing
	}
	return r, nil
}

func canonPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}

// portPrefixes covers [lo, hi] with port prefixes (value, leading bits).
func portPrefixes(lo, hi int32) [][2]uint32 {
	var out [][2]uint32
	l, h := uint32(lo), uint32(hi)
	for l <= h {
		bits := uint32(16)
		// the largest aligned block starting at l within [l, h]
		for bits > 0 {
			size := uint32(1) << (16 - bits + 1)
			if l%size != 0 || l+size-1 > h {
				break
			}
			bits--
		}
		out = append(out, [2]uint32{l, bits})
		l += 1 << (16 - bits)
		if l == 0 {
			break
		}
	}
	return out
}

// Dirty reports whether anything awaits Compile.
func (c *Compiler) Dirty() bool { return len(c.dirty) > 0 || c.ipsDirty || c.cidrsDirty }

// Changes is what one Compile changed.
type Changes struct {
	// Endpoints recompiled whose state changed.
	Endpoints map[string]*EndpointState
	// Removed endpoints: pod key -> the ifindex they had.
	Removed map[string]uint32
	// IPCache is the full address -> identity table when it changed.
	IPCache map[netip.Addr]uint32
	// CIDRs is the full prefix -> identity table when it changed.
	CIDRs map[netip.Prefix]uint32
	// Recompiled counts the endpoints compiled (changed or not).
	Recompiled int
	Warnings   []string
}

// Compile recompiles the dirty endpoints and returns what changed.
func (c *Compiler) Compile() Changes {
	ch := Changes{Endpoints: map[string]*EndpointState{}, Removed: map[string]uint32{}, Warnings: c.warnings}
	c.warnings = nil
	if c.ipsDirty {
		ch.IPCache = c.IPCache()
		c.ipsDirty = false
	}
	if c.cidrsDirty {
		ch.CIDRs = maps2(c.cidrIDs)
		c.cidrsDirty = false
	}
	for k := range c.dirty {
		ch.Recompiled++
		p := c.pods[k]
		var st *EndpointState
		if p != nil && p.local && p.ifindex != 0 {
			st = c.compileEndpoint(p)
		}
		old := c.endpoints[k]
		if old != nil && (st == nil || st.Ifindex != old.Ifindex) {
			ch.Removed[k] = old.Ifindex
		}
		if st == nil {
			delete(c.endpoints, k)
			continue
		}
		c.endpoints[k] = st
		if !old.Equal(st) {
			ch.Endpoints[k] = st
		}
	}
	clear(c.dirty)
	return ch
}

func maps2[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// IPCache is every known address with its identity: pods (label-set
// identities) and this node (host).
func (c *Compiler) IPCache() map[netip.Addr]uint32 {
	out := map[netip.Addr]uint32{}
	for _, p := range c.pods {
		if p.identity == nil {
			continue
		}
		for _, ip := range p.ips {
			out[ip] = p.identity.ID
		}
	}
	for _, ip := range c.hostIPs {
		out[ip.Unmap()] = IdentityHost
	}
	return out
}

// Endpoint returns the compiled state of a local pod.
func (c *Compiler) Endpoint(ns, name string) *EndpointState { return c.endpoints[nsKey(ns, name)] }

// Endpoints returns every compiled endpoint by pod key.
func (c *Compiler) Endpoints() map[string]*EndpointState { return c.endpoints }

// PolicyName returns the namespace/name of a policy ID.
func (c *Compiler) PolicyName(id uint32) string {
	if p := c.policyByID[id]; p != nil {
		return p.key
	}
	return ""
}

// PolicyNames returns every policy ID with its namespace/name.
func (c *Compiler) PolicyNames() map[uint32]string {
	out := map[uint32]string{}
	for id, p := range c.policyByID {
		out[id] = p.key
	}
	return out
}

// IdentityOf returns an identity by ID.
func (c *Compiler) IdentityOf(id uint32) *Identity { return c.byID[id] }

// cidrIdentities returns the CIDR identities an ipBlock allows: those of
// every known prefix inside cidr and inside none of the excepts.
func (c *Compiler) cidrIdentities(pe *peer) []uint32 {
	var out []uint32
	for p, id := range c.cidrIDs {
		if !contains(pe.cidr, p) {
			continue
		}
		excluded := false
		for _, e := range pe.excepts {
			if contains(e, p) {
				excluded = true
				break
			}
		}
		if !excluded {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// contains: inner is within outer.
func contains(outer, inner netip.Prefix) bool {
	return outer.Addr().Is4() == inner.Addr().Is4() && inner.Bits() >= outer.Bits() && outer.Contains(inner.Addr())
}

func (c *Compiler) compileEndpoint(p *podInfo) *EndpointState {
	st := &EndpointState{Pod: p.key, Ifindex: p.ifindex, IPs: slices.Clone(p.ips), Entries: map[Key]Entry{}, selectedIdentity: map[uint32]bool{}}
	if p.identity != nil {
		st.Identity = p.identity.ID
	}
	pols := make([]*compiledPolicy, 0, 4)
	for _, pol := range c.policies {
		if pol.ns == p.ns && pol.subject.Matches(p.labels) {
			pols = append(pols, pol)
		}
	}
	sort.Slice(pols, func(i, j int) bool { return pols[i].id < pols[j].id })
	for _, pol := range pols {
		if pol.isIngress {
			st.IngressIsolated = true
			st.IngressPolicies = append(st.IngressPolicies, pol.key)
			for i := range pol.ingress {
				c.addRule(st, p, pol, DirIngress, uint16(i), &pol.ingress[i])
			}
		}
		if pol.isEgress {
			st.EgressIsolated = true
			st.EgressPolicies = append(st.EgressPolicies, pol.key)
			for i := range pol.egress {
				c.addRule(st, p, pol, DirEgress, uint16(i), &pol.egress[i])
			}
		}
	}
	return st
}

// peerTarget is one peer identity with, for egress named ports, the pods
// that carry it (to resolve the name per destination pod).
func (c *Compiler) addRule(st *EndpointState, self *podInfo, pol *compiledPolicy, dir uint8, idx uint16, r *rule) {
	var ids []uint32
	anyPeer := len(r.peers) == 0
	if anyPeer {
		ids = []uint32{IdentityAny}
	}
	for i := range r.peers {
		pe := &r.peers[i]
		if pe.isIPBlok {
			st.usesCIDR = true
			ids = append(ids, c.cidrIdentities(pe)...)
			continue
		}
		st.usesPeers = true
		for _, id := range c.byID {
			if pe.matches(pol.ns, id) {
				ids = append(ids, id.ID)
			}
		}
	}
	ent := Entry{Policy: pol.id, Rule: idx}
	put := func(k Key) {
		k.Endpoint, k.Dir = st.Ifindex, dir
		if old, ok := st.Entries[k]; ok && cmp.Or(cmp.Compare(old.Policy, ent.Policy), cmp.Compare(old.Rule, ent.Rule)) <= 0 {
			return
		}
		st.Entries[k] = ent
	}
	for _, id := range ids {
		if id >= firstLabelID && id < firstCIDRID {
			st.selectedIdentity[id] = true
		}
		for _, rp := range r.ports {
			switch {
			case rp.anyProto:
				put(Key{Identity: id})
			case rp.named != "" && dir == DirIngress:
				for _, port := range c.resolveNamed([]*podInfo{self}, rp) {
					put(Key{Identity: id, Proto: rp.proto, Port: uint16(port), PortBits: 16})
				}
			case rp.named != "":
				// Resolved below, per destination pod.
			case rp.port == 0:
				put(Key{Identity: id, Proto: rp.proto})
			default:
				for _, pp := range portPrefixes(rp.port, rp.endPort) {
					put(Key{Identity: id, Proto: rp.proto, Port: uint16(pp[0]), PortBits: uint8(pp[1])})
				}
			}
		}
	}
	// Egress named ports name a port of the destination pod, so only pods
	// can match them: each destination pod's identity gets its own number.
	for _, rp := range r.ports {
		if rp.named == "" || dir != DirEgress {
			continue
		}
		st.usesEgressNamed = true
		for _, idn := range c.byID {
			if !anyPeer && !c.peersSelect(pol, r, idn) {
				continue
			}
			var pods []*podInfo
			for _, p := range idn.pods {
				if anyPeer || c.peersSelectPod(pol, r, idn, p) {
					pods = append(pods, p)
				}
			}
			for _, port := range c.resolveNamed(pods, rp) {
				st.selectedIdentity[idn.ID] = true
				put(Key{Identity: idn.ID, Proto: rp.proto, Port: uint16(port), PortBits: 16})
			}
		}
	}
}

// peersSelect: some peer of r can select pods of identity idn (a pod or
// namespace selector matching it, or an ipBlock holding one of its pods).
func (c *Compiler) peersSelect(pol *compiledPolicy, r *rule, idn *Identity) bool {
	for i := range r.peers {
		pe := &r.peers[i]
		if pe.isIPBlok || pe.matches(pol.ns, idn) {
			return true
		}
	}
	return false
}

// peersSelectPod: some peer of r selects pod p (of identity idn).
func (c *Compiler) peersSelectPod(pol *compiledPolicy, r *rule, idn *Identity, p *podInfo) bool {
	for i := range r.peers {
		pe := &r.peers[i]
		if !pe.isIPBlok {
			if pe.matches(pol.ns, idn) {
				return true
			}
			continue
		}
		for _, ip := range p.ips {
			if !pe.cidr.Contains(ip) {
				continue
			}
			excluded := false
			for _, e := range pe.excepts {
				if e.Contains(ip) {
					excluded = true
				}
			}
			if !excluded {
				return true
			}
		}
	}
	return false
}

// resolveNamed returns the numbers pods give a port name (with the
// rule's protocol).
func (c *Compiler) resolveNamed(pods []*podInfo, rp rulePort) []int32 {
	want := v1.ProtocolTCP
	if rp.proto == protoUDP {
		want = v1.ProtocolUDP
	}
	var out []int32
	for _, p := range pods {
		for _, cp := range p.ports {
			proto := cp.Protocol
			if proto == "" {
				proto = v1.ProtocolTCP
			}
			if cp.Name == rp.named && proto == want && !slices.Contains(out, cp.ContainerPort) {
				out = append(out, cp.ContainerPort)
			}
		}
	}
	return out
}

// Describe renders an identity for people.
func (id *Identity) Describe() string {
	var b strings.Builder
	b.WriteString("ns=" + id.Namespace)
	if len(id.Labels) > 0 {
		b.WriteString(" " + id.Labels.String())
	}
	return b.String()
}
