package policy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The iptables fallback's chains (filter table of both families).
const (
	IPTablesChain  = "WAGGLE-POLICY" // jumped to first from FORWARD
	iptChainPrefix = "WAGGLE-POL-"   // WAGGLE-POL-I-<ifindex>, WAGGLE-POL-E-<ifindex>
)

// dirName names a direction in rule comments.
func dirName(dir uint8) string {
	if dir == DirIngress {
		return "ingress"
	}
	return "egress"
}

// IPTablesView reads what the iptables fallback programmed, from
// `iptables-save -c` alone (so it works without the agent): each isolated
// endpoint's chains, their rules and packet counters. The rules carry the
// names the agent knew (the pod in the dispatch rules' and DROP rule's
// comments, the policy and rule in each RETURN rule's), so no other state is
// needed. It answers `waggle bpf policy list|get` on a node whose agent runs
// the iptables datapath; explain and monitor need the eBPF maps.
type IPTablesView struct {
	eps   []EndpointInfo
	rules map[uint32][]RuleInfo
	addrs map[netip.Addr]uint32
	// Revoked counts packets of established flows a policy change denied.
	Revoked uint64
}

// ErrIPTablesNoExplain: explain and monitor read the eBPF datapath's maps.
var ErrIPTablesNoExplain = fmt.Errorf("this node's NetworkPolicy runs on the iptables datapath, which keeps no identities or verdict ring buffer: "+
	"see `iptables-save -c -t filter` (chains %s and %s*) and `waggle bpf policy get POD`", IPTablesChain, iptChainPrefix)

type ruleCounter struct {
	chain, target, comment string
	packets                uint64
	fields                 []string
}

func (r ruleCounter) arg(flag string) string {
	if i := slices.Index(r.fields, flag); i >= 0 && i+1 < len(r.fields) {
		return r.fields[i+1]
	}
	return ""
}

// parseCounters reads `iptables-save -c` lines "[p:b] -A CHAIN ... -j T" of
// the WAGGLE-POL* chains.
func parseCounters(save []byte) ([]ruleCounter, error) {
	var out []ruleCounter
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "[") {
			continue
		}
		cnt, rest, ok := strings.Cut(line[1:], "] ")
		if !ok {
			continue
		}
		pk, _, _ := strings.Cut(cnt, ":")
		n, err := strconv.ParseUint(pk, 10, 64)
		if err != nil {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 || f[0] != "-A" || !strings.HasPrefix(f[1], "WAGGLE-POL") {
			continue
		}
		r := ruleCounter{chain: f[1], packets: n, fields: f}
		r.target = r.arg("-j")
		if i := strings.Index(rest, "--comment "); i >= 0 {
			c := rest[i+len("--comment "):]
			if strings.HasPrefix(c, `"`) {
				if uq, err := strconv.QuotedPrefix(c); err == nil {
					c, _ = strconv.Unquote(uq)
				}
			} else {
				c, _, _ = strings.Cut(c, " ")
			}
			r.comment = c
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// endpointChain splits WAGGLE-POL-I-<ifindex> / WAGGLE-POL-E-<ifindex>.
func endpointChain(chain string) (dir uint8, ep uint32, ok bool) {
	rest, ok := strings.CutPrefix(chain, iptChainPrefix)
	if !ok || len(rest) < 3 || rest[1] != '-' {
		return 0, 0, false
	}
	switch rest[0] {
	case 'I':
		dir = DirIngress
	case 'E':
		dir = DirEgress
	default:
		return 0, 0, false
	}
	n, err := strconv.ParseUint(rest[2:], 10, 32)
	if err != nil {
		return 0, 0, false
	}
	return dir, uint32(n), true
}

// parseIPTablesView builds the view from `iptables-save -c -t filter` of
// each family. ok is false when no WAGGLE-POLICY rule is there.
func parseIPTablesView(saves ...[]byte) (*IPTablesView, bool, error) {
	v := &IPTablesView{rules: map[uint32][]RuleInfo{}, addrs: map[netip.Addr]uint32{}}
	eps := map[uint32]*EndpointInfo{}
	ep := func(n uint32) *EndpointInfo {
		if e := eps[n]; e != nil {
			return e
		}
		e := &EndpointInfo{Pod: fmt.Sprintf("ifindex %d", n), Ifindex: n}
		eps[n] = e
		return e
	}
	found := false
	// A rule is written once per family: the families' packets add up.
	for _, save := range saves {
		rs, err := parseCounters(save)
		if err != nil {
			return nil, false, err
		}
		for _, r := range rs {
			if r.chain == IPTablesChain {
				found = true
				if r.target == "DROP" {
					v.Revoked += r.packets
					continue
				}
				dir, n, ok := endpointChain(r.target)
				if !ok {
					continue
				}
				e := ep(n)
				if pod, ok := strings.CutSuffix(r.comment, " "+dirName(dir)); ok && pod != "" {
					e.Pod = pod
				}
				addr := r.arg("-d")
				if dir == DirEgress {
					addr = r.arg("-s")
				}
				if p, err := netip.ParsePrefix(addr); err == nil {
					v.addrs[p.Addr()] = n
				} else if a, err := netip.ParseAddr(addr); err == nil {
					v.addrs[a] = n
				}
				continue
			}
			dir, n, ok := endpointChain(r.chain)
			if !ok {
				continue
			}
			e := ep(n)
			if dir == DirIngress {
				e.IngressIsolated = true
			} else {
				e.EgressIsolated = true
			}
			switch r.target {
			case "DROP":
				if pod, _, ok := strings.Cut(r.comment, " "+dirName(dir)+": "); ok && pod != "" {
					e.Pod = pod
				}
				if dir == DirIngress {
					e.IngressDenied += r.packets
				} else {
					e.EgressDenied += r.packets
				}
			case "RETURN":
				if dir == DirIngress {
					e.IngressAllowed += r.packets
				} else {
					e.EgressAllowed += r.packets
				}
				ri := RuleInfo{Direction: dirName(dir), Peer: "any", Protocol: "any", Ports: "any", Hits: r.packets}
				if p := r.arg("-p"); p != "" {
					ri.Protocol = strings.ToUpper(p)
				}
				if p := r.arg("--dport"); p != "" {
					ri.Ports = strings.Replace(p, ":", "-", 1)
				}
				if s := r.arg("--match-set"); s != "" {
					// One rule's set per family: name it without the family.
					ri.Peer = "ipset " + strings.TrimSuffix(strings.TrimSuffix(s, "-4"), "-6")
				}
				if pol, num, ok := strings.Cut(r.comment, " "+dirName(dir)+" rule "); ok {
					ri.Policy = pol
					ri.Rule, _ = strconv.Atoi(num)
				}
				merged := false
				for i, have := range v.rules[n] {
					if have.Direction == ri.Direction && have.Peer == ri.Peer && have.Protocol == ri.Protocol &&
						have.Ports == ri.Ports && have.Policy == ri.Policy && have.Rule == ri.Rule {
						v.rules[n][i].Hits += ri.Hits
						merged = true
						break
					}
				}
				if !merged {
					v.rules[n] = append(v.rules[n], ri)
				}
			}
		}
	}
	for n, e := range eps {
		e.Entries = len(v.rules[n])
		v.eps = append(v.eps, *e)
	}
	sort.Slice(v.eps, func(i, j int) bool { return v.eps[i].Pod < v.eps[j].Pod })
	for _, rs := range v.rules {
		sort.SliceStable(rs, func(i, j int) bool {
			a, b := rs[i], rs[j]
			if a.Direction != b.Direction {
				return a.Direction < b.Direction
			}
			if a.Policy != b.Policy {
				return a.Policy < b.Policy
			}
			return a.Rule < b.Rule
		})
	}
	return v, found, nil
}

// Endpoints lists the isolated endpoints (the others have no chain).
func (v *IPTablesView) Endpoints() ([]EndpointInfo, error) { return slices.Clone(v.eps), nil }

// FindEndpoint finds an endpoint by namespace/name, name (when unique), pod
// address or ifindex.
func (v *IPTablesView) FindEndpoint(ref string) (EndpointInfo, error) {
	var ip netip.Addr
	if a, err := netip.ParseAddr(ref); err == nil {
		ip = a.Unmap()
	}
	var found []EndpointInfo
	for _, e := range v.eps {
		_, name, _ := strings.Cut(e.Pod, "/")
		if e.Pod == ref || name == ref || strconv.FormatUint(uint64(e.Ifindex), 10) == ref || (ip.IsValid() && v.addrs[ip] == e.Ifindex) {
			found = append(found, e)
		}
	}
	switch len(found) {
	case 0:
		return EndpointInfo{}, fmt.Errorf("%w: no endpoint %q isolated by a NetworkPolicy on this node (iptables datapath)", os.ErrNotExist, ref)
	case 1:
		return found[0], nil
	}
	return EndpointInfo{}, fmt.Errorf("%q names %d endpoints: use namespace/name", ref, len(found))
}

// Rules lists an endpoint's rules and per-policy counters (new flows each
// rule let through).
func (v *IPTablesView) Rules(ep uint32) ([]RuleInfo, []PolicyCounter, error) {
	rs := slices.Clone(v.rules[ep])
	sums := map[[2]string]uint64{}
	for _, r := range rs {
		sums[[2]string{r.Policy, r.Direction}] += r.Hits
	}
	var counters []PolicyCounter
	for k, n := range sums {
		counters = append(counters, PolicyCounter{Policy: k[0], Direction: k[1], Hits: n})
	}
	sort.Slice(counters, func(i, j int) bool {
		return counters[i].Policy+counters[i].Direction < counters[j].Policy+counters[j].Direction
	})
	return rs, counters, nil
}

// Explain is not available on the iptables datapath.
func (v *IPTablesView) Explain(netip.Addr, netip.Addr, uint16, uint8) ([]Verdict, error) {
	return nil, ErrIPTablesNoExplain
}

// Monitor is not available on the iptables datapath.
func (v *IPTablesView) Monitor(context.Context, string, func(Event)) error {
	return ErrIPTablesNoExplain
}

// Close releases nothing.
func (v *IPTablesView) Close() error { return nil }
