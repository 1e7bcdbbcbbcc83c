package clusterdns

import (
	"net"
	"net/netip"
	"sort"
	"strings"

	"github.com/miekg/dns"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// SpecVersion is the version of the Kubernetes DNS-based service discovery
// specification answered at dns-version.<zone> (TXT).
const SpecVersion = "1.1.0"

const (
	indexClusterIP   = "clusterIP"
	indexService     = "service"
	indexEndpointIP  = "endpointIP"
	serviceNameLabel = discoveryv1.LabelServiceName
)

// Indexers are what the zone needs on the Service and EndpointSlice
// informers; add them before the informers start.
func serviceIndexers() cache.Indexers {
	return cache.Indexers{indexClusterIP: func(obj any) ([]string, error) {
		s, ok := obj.(*v1.Service)
		if !ok {
			return nil, nil
		}
		var out []string
		for _, ip := range clusterIPs(s) {
			out = append(out, ip)
		}
		return out, nil
	}}
}

func sliceIndexers() cache.Indexers {
	return cache.Indexers{
		indexService: func(obj any) ([]string, error) {
			es, ok := obj.(*discoveryv1.EndpointSlice)
			if !ok || es.Labels[serviceNameLabel] == "" {
				return nil, nil
			}
			return []string{es.Namespace + "/" + es.Labels[serviceNameLabel]}, nil
		},
		indexEndpointIP: func(obj any) ([]string, error) {
			es, ok := obj.(*discoveryv1.EndpointSlice)
			if !ok {
				return nil, nil
			}
			var out []string
			for _, ep := range es.Endpoints {
				for _, a := range ep.Addresses {
					if ip, err := netip.ParseAddr(a); err == nil {
						out = append(out, ip.String())
					}
				}
			}
			return out, nil
		},
	}
}

func clusterIPs(s *v1.Service) []string {
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	var out []string
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a.String())
		}
	}
	return out
}

func isHeadless(s *v1.Service) bool {
	return s.Spec.Type != v1.ServiceTypeExternalName && s.Spec.ClusterIP == v1.ClusterIPNone
}

// zone answers names under the cluster domain from the informers' stores.
type zone struct {
	origin string // "cluster.local."
	ttl    uint32
	svcs   cache.Indexer
	slices cache.Indexer
}

// endpoint is one address of a headless Service, with its DNS label.
type endpoint struct {
	name  string // hostname, or the address with '.'/':' as '-'
	addr  netip.Addr
	ports []discoveryv1.EndpointPort
}

func dashed(a netip.Addr) string {
	return strings.NewReplacer(".", "-", ":", "-").Replace(a.String())
}

// endpoints lists a Service's serving addresses (ready ones, or every one
// when publishNotReadyAddresses), deduplicated, in a stable order.
func (z *zone) endpoints(s *v1.Service) []endpoint {
	objs, _ := z.slices.ByIndex(indexService, s.Namespace+"/"+s.Name)
	seen := map[netip.Addr]bool{}
	var out []endpoint
	for _, o := range objs {
		es := o.(*discoveryv1.EndpointSlice)
		for _, ep := range es.Endpoints {
			if !s.Spec.PublishNotReadyAddresses && ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || seen[ip] {
					continue
				}
				seen[ip] = true
				name := dashed(ip)
				if ep.Hostname != nil && *ep.Hostname != "" {
					name = strings.ToLower(*ep.Hostname)
				}
				out = append(out, endpoint{name: name, addr: ip, ports: es.Ports})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].addr.Less(out[j].addr) })
	return out
}

func (z *zone) service(ns, name string) *v1.Service {
	o, ok, _ := z.svcs.GetByKey(ns + "/" + name)
	if !ok {
		return nil
	}
	return o.(*v1.Service)
}

func (z *zone) hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: z.ttl}
}

func (z *zone) soa() dns.RR {
	return &dns.SOA{Hdr: z.hdr(z.origin, dns.TypeSOA), Ns: "ns.dns." + z.origin, Mbox: "hostmaster." + z.origin,
		Serial: 1, Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: z.ttl}
}

// addrRR returns an A or AAAA record for ip when it matches qtype (nil otherwise).
func (z *zone) addrRR(name string, ip netip.Addr, qtype uint16) dns.RR {
	switch {
	case ip.Is4() && (qtype == dns.TypeA || qtype == dns.TypeANY):
		return &dns.A{Hdr: z.hdr(name, dns.TypeA), A: net.IP(ip.AsSlice())}
	case ip.Is6() && !ip.Is4In6() && (qtype == dns.TypeAAAA || qtype == dns.TypeANY):
		return &dns.AAAA{Hdr: z.hdr(name, dns.TypeAAAA), AAAA: net.IP(ip.AsSlice())}
	}
	return nil
}

// result is the zone's answer: rcode, records, and (for ExternalName) a
// target outside the zone the server should chase.
type result struct {
	rcode  int
	answer []dns.RR
	extra  []dns.RR
	chase  string // CNAME target to resolve further for A/AAAA
}

func (z *zone) nx() result { return result{rcode: dns.RcodeNameError} }

// lookup answers qname (lower-case, fully qualified, inside the zone).
func (z *zone) lookup(qname string, qtype uint16) result {
	rel := strings.TrimSuffix(strings.TrimSuffix(qname, z.origin), ".")
	var labels []string
	if rel != "" {
		labels = strings.Split(rel, ".")
	}
	n := len(labels)
	switch {
	case n == 0:
		switch qtype {
		case dns.TypeSOA:
			return result{answer: []dns.RR{z.soa()}}
		case dns.TypeNS:
			return result{answer: []dns.RR{&dns.NS{Hdr: z.hdr(z.origin, dns.TypeNS), Ns: "ns.dns." + z.origin}}}
		}
		return result{}
	case n == 1 && labels[0] == "dns-version":
		if qtype == dns.TypeTXT || qtype == dns.TypeANY {
			return result{answer: []dns.RR{&dns.TXT{Hdr: z.hdr(qname, dns.TypeTXT), Txt: []string{SpecVersion}}}}
		}
		return result{}
	case labels[n-1] == "svc":
		return z.lookupService(qname, labels[:n-1], qtype)
	case labels[n-1] == "pod" && n == 3:
		ip, err := netip.ParseAddr(strings.ReplaceAll(labels[0], "-", "."))
		if err != nil {
			ip, err = netip.ParseAddr(strings.ReplaceAll(labels[0], "-", ":"))
		}
		if err != nil {
			return z.nx()
		}
		if rr := z.addrRR(qname, ip, qtype); rr != nil {
			return result{answer: []dns.RR{rr}}
		}
		return result{}
	case labels[n-1] == "pod" && n <= 2:
		return result{}
	}
	return z.nx()
}

func (z *zone) lookupService(qname string, l []string, qtype uint16) result {
	switch len(l) {
	case 0: // svc.<zone>
		return result{}
	case 1: // <ns>.svc.<zone>
		if objs, _ := z.svcs.ByIndex(cache.NamespaceIndex, l[0]); len(objs) > 0 {
			return result{}
		}
		return z.nx()
	case 2: // <svc>.<ns>.svc.<zone>
		s := z.service(l[1], l[0])
		if s == nil {
			return z.nx()
		}
		return z.serviceRecords(qname, s, qtype)
	case 3: // <endpoint>.<svc>.<ns>.svc.<zone>
		s := z.service(l[2], l[1])
		if s == nil || !isHeadless(s) {
			return z.nx()
		}
		var r result
		found := false
		for _, ep := range z.endpoints(s) {
			if ep.name == l[0] {
				found = true
				if rr := z.addrRR(qname, ep.addr, qtype); rr != nil {
					r.answer = append(r.answer, rr)
				}
			}
		}
		if !found {
			return z.nx()
		}
		return r
	case 4: // _<port>._<proto>.<svc>.<ns>.svc.<zone>
		if !strings.HasPrefix(l[0], "_") || !strings.HasPrefix(l[1], "_") {
			return z.nx()
		}
		s := z.service(l[3], l[2])
		if s == nil {
			return z.nx()
		}
		return z.srv(qname, s, l[0][1:], l[1][1:], qtype)
	}
	return z.nx()
}

func (z *zone) svcName(s *v1.Service) string {
	return s.Name + "." + s.Namespace + ".svc." + z.origin
}

func (z *zone) serviceRecords(qname string, s *v1.Service, qtype uint16) result {
	var r result
	switch {
	case s.Spec.Type == v1.ServiceTypeExternalName:
		target := dns.Fqdn(strings.ToLower(s.Spec.ExternalName))
		r.answer = []dns.RR{&dns.CNAME{Hdr: z.hdr(qname, dns.TypeCNAME), Target: target}}
		if qtype != dns.TypeCNAME {
			r.chase = target
		}
		return r
	case qtype == dns.TypeSRV:
		return z.srv(qname, s, "", "", qtype)
	case isHeadless(s):
		for _, ep := range z.endpoints(s) {
			if rr := z.addrRR(qname, ep.addr, qtype); rr != nil {
				r.answer = append(r.answer, rr)
			}
		}
	default:
		for _, ip := range clusterIPs(s) {
			if rr := z.addrRR(qname, netip.MustParseAddr(ip), qtype); rr != nil {
				r.answer = append(r.answer, rr)
			}
		}
	}
	return r
}

// srv answers SRV records of a Service's ports: the named port (and
// protocol) given, or every port when port is "".
func (z *zone) srv(qname string, s *v1.Service, port, proto string, qtype uint16) result {
	if qtype != dns.TypeSRV && qtype != dns.TypeANY {
		if z.hasPort(s, port, proto) {
			return result{}
		}
		return z.nx()
	}
	match := func(name string, p v1.Protocol) bool {
		if port == "" {
			return true
		}
		if p == "" {
			p = v1.ProtocolTCP
		}
		return strings.EqualFold(name, port) && strings.EqualFold(string(p), proto)
	}
	type target struct {
		name string
		port int32
		addr netip.Addr
	}
	var ts []target
	if isHeadless(s) {
		for _, ep := range z.endpoints(s) {
			for _, p := range ep.ports {
				name, pr := "", v1.ProtocolTCP
				if p.Name != nil {
					name = *p.Name
				}
				if p.Protocol != nil {
					pr = *p.Protocol
				}
				if p.Port != nil && match(name, pr) {
					ts = append(ts, target{ep.name + "." + z.svcName(s), *p.Port, ep.addr})
				}
			}
		}
	} else if s.Spec.Type != v1.ServiceTypeExternalName {
		for _, p := range s.Spec.Ports {
			if match(p.Name, p.Protocol) {
				for _, ip := range clusterIPs(s) {
					ts = append(ts, target{z.svcName(s), p.Port, netip.MustParseAddr(ip)})
				}
			}
		}
	}
	if len(ts) == 0 {
		if port == "" || z.hasPort(s, port, proto) {
			return result{}
		}
		return z.nx()
	}
	var r result
	weight := uint16(100 / len(ts))
	if weight == 0 {
		weight = 1
	}
	seenExtra := map[string]bool{}
	for _, t := range ts {
		r.answer = append(r.answer, &dns.SRV{Hdr: z.hdr(qname, dns.TypeSRV), Priority: 0, Weight: weight, Port: uint16(t.port), Target: t.name})
		key := t.name + "/" + t.addr.String()
		if !seenExtra[key] {
			seenExtra[key] = true
			for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
				if rr := z.addrRR(t.name, t.addr, qt); rr != nil {
					r.extra = append(r.extra, rr)
				}
			}
		}
	}
	return r
}

func (z *zone) hasPort(s *v1.Service, port, proto string) bool {
	for _, p := range s.Spec.Ports {
		pr := p.Protocol
		if pr == "" {
			pr = v1.ProtocolTCP
		}
		if strings.EqualFold(p.Name, port) && strings.EqualFold(string(pr), proto) {
			return true
		}
	}
	return false
}

// reverse answers a PTR query for ip: the Service owning it as a ClusterIP,
// or the headless Service endpoint holding it. ok is false when the address
// is none of the cluster's (the query goes upstream).
func (z *zone) reverse(qname string, ip netip.Addr) (result, bool) {
	var r result
	objs, _ := z.svcs.ByIndex(indexClusterIP, ip.String())
	for _, o := range objs {
		s := o.(*v1.Service)
		r.answer = append(r.answer, &dns.PTR{Hdr: z.hdr(qname, dns.TypePTR), Ptr: z.svcName(s)})
	}
	objs, _ = z.slices.ByIndex(indexEndpointIP, ip.String())
	seen := map[string]bool{}
	for _, o := range objs {
		es := o.(*discoveryv1.EndpointSlice)
		s := z.service(es.Namespace, es.Labels[serviceNameLabel])
		if s == nil || !isHeadless(s) {
			continue
		}
		for _, ep := range z.endpoints(s) {
			name := ep.name + "." + z.svcName(s)
			if ep.addr == ip && !seen[name] {
				seen[name] = true
				r.answer = append(r.answer, &dns.PTR{Hdr: z.hdr(qname, dns.TypePTR), Ptr: name})
			}
		}
	}
	return r, len(r.answer) > 0
}

// parseReverse turns an in-addr.arpa / ip6.arpa name into its address.
func parseReverse(qname string) (netip.Addr, bool) {
	switch {
	case strings.HasSuffix(qname, ".in-addr.arpa."):
		l := strings.Split(strings.TrimSuffix(qname, ".in-addr.arpa."), ".")
		if len(l) != 4 {
			return netip.Addr{}, false
		}
		ip, err := netip.ParseAddr(l[3] + "." + l[2] + "." + l[1] + "." + l[0])
		return ip, err == nil
	case strings.HasSuffix(qname, ".ip6.arpa."):
		l := strings.Split(strings.TrimSuffix(qname, ".ip6.arpa."), ".")
		if len(l) != 32 {
			return netip.Addr{}, false
		}
		var b strings.Builder
		for i := 31; i >= 0; i-- {
			b.WriteString(l[i])
			if i%4 == 0 && i > 0 {
				b.WriteByte(':')
			}
		}
		ip, err := netip.ParseAddr(b.String())
		return ip, err == nil
	}
	return netip.Addr{}, false
}
