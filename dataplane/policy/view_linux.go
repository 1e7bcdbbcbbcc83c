package policy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// ErrNoState: no policy maps are pinned in the directory.
var ErrNoState = errors.New("no NetworkPolicy state pinned")

// View reads the pinned policy maps (read-only; works while no agent runs).
type View struct {
	// NetNS is the node's network namespace (a path), where the pods'
	// veths are; empty: the caller's.
	NetNS  string
	pinDir string
	m      map[string]*ebpf.Map
}

// OpenView opens the maps pinned under pinDir.
func OpenView(pinDir string) (*View, error) {
	v := &View{pinDir: pinDir, m: map[string]*ebpf.Map{}}
	for _, n := range []string{MapEndpoints, MapPolicy, MapIPCache, MapCIDR, MapNames, MapEvents, MapConfig} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, n), &ebpf.LoadPinOptions{ReadOnly: n != MapEvents})
		if err != nil {
			v.Close()
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%w in %s (is waggle proxy running with --network-policy on this node?)", ErrNoState, pinDir)
			}
			return nil, fmt.Errorf("open %s: %w", n, err)
		}
		v.m[n] = m
	}
	var cfg polBPFPolConfig
	if err := v.m[MapConfig].Lookup(uint32(0), &cfg); err != nil || cfg.Magic != Magic || cfg.LayoutVersion != LayoutVersion {
		v.Close()
		return nil, fmt.Errorf("%w: %s (magic %#x, version %d)", ErrLayoutMismatch, pinDir, cfg.Magic, cfg.LayoutVersion)
	}
	return v, nil
}

// Close closes the maps.
func (v *View) Close() error {
	for _, m := range v.m {
		m.Close()
	}
	return nil
}

func (v *View) name(kind, id uint32) string {
	var n polBPFPolName
	if err := v.m[MapNames].Lookup(polBPFPolNameKey{Kind: kind, Id: id}, &n); err != nil {
		return ""
	}
	b := make([]byte, 0, len(n.Name))
	for _, c := range n.Name {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

func (v *View) identityName(id uint32) string {
	if n := IdentityName(id); n != "" {
		return n
	}
	if id >= firstCIDRID {
		var k polBPFPolCidrKey
		var info polBPFPolIpInfo
		it := v.m[MapCIDR].Iterate()
		for it.Next(&k, &info) {
			if info.Identity == id {
				return "cidr " + prefixFromBPF(k).String()
			}
		}
		return "cidr"
	}
	return v.name(NameIdentity, id)
}

func (v *View) policyName(id uint32) string {
	if n := v.name(NamePolicy, id); n != "" {
		return n
	}
	return fmt.Sprintf("policy#%d", id)
}

func (v *View) endpointName(ep uint32) string {
	if n := v.name(NameEndpoint, ep); n != "" {
		return n
	}
	return fmt.Sprintf("ifindex %d", ep)
}

// Endpoints lists every endpoint.
func (v *View) Endpoints() ([]EndpointInfo, error) {
	counts := map[uint32]int{}
	var k polBPFPolKey
	var e polBPFPolEntry
	it := v.m[MapPolicy].Iterate()
	for it.Next(&k, &e) {
		counts[k.Ep]++
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	var out []EndpointInfo
	var ep uint32
	var val polBPFPolEndpoint
	it = v.m[MapEndpoints].Iterate()
	for it.Next(&ep, &val) {
		out = append(out, EndpointInfo{Pod: v.endpointName(ep), Ifindex: ep, Identity: val.Identity, Labels: v.identityName(val.Identity),
			IngressIsolated: val.Flags&1 != 0, EgressIsolated: val.Flags&2 != 0, Revision: val.Rev, Entries: counts[ep],
			IngressAllowed: val.Allowed[0], IngressDenied: val.Denied[0], EgressAllowed: val.Allowed[1], EgressDenied: val.Denied[1]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	return out, it.Err()
}

// FindEndpoint finds an endpoint by namespace/name, name (when unique),
// pod address or ifindex.
func (v *View) FindEndpoint(ref string) (EndpointInfo, error) {
	eps, err := v.Endpoints()
	if err != nil {
		return EndpointInfo{}, err
	}
	var ip netip.Addr
	if a, err := netip.ParseAddr(ref); err == nil {
		ip = a.Unmap()
	}
	var found []EndpointInfo
	for _, e := range eps {
		_, name, _ := strings.Cut(e.Pod, "/")
		if e.Pod == ref || name == ref || fmt.Sprint(e.Ifindex) == ref || (ip.IsValid() && v.ipIsEndpoint(ip, e)) {
			found = append(found, e)
		}
	}
	switch len(found) {
	case 0:
		return EndpointInfo{}, fmt.Errorf("%w: no endpoint %q on this node", os.ErrNotExist, ref)
	case 1:
		return found[0], nil
	}
	return EndpointInfo{}, fmt.Errorf("%q names %d endpoints: use namespace/name", ref, len(found))
}

// ipIsEndpoint: the address is the endpoint's pod's (the veth alias).
func (v *View) ipIsEndpoint(ip netip.Addr, e EndpointInfo) bool {
	eps, _ := v.endpointsByAddr()
	return eps[ip] == e.Ifindex
}

// Rules lists an endpoint's entries and per-policy hit counters.
func (v *View) Rules(ep uint32) ([]RuleInfo, []PolicyCounter, error) {
	var out []RuleInfo
	sums := map[[2]string]uint64{}
	var k polBPFPolKey
	var e polBPFPolEntry
	it := v.m[MapPolicy].Iterate()
	for it.Next(&k, &e) {
		if k.Ep != ep {
			continue
		}
		key := keyFromBPF(k)
		pol := v.policyName(e.Policy)
		out = append(out, RuleInfo{Direction: DirName(key.Dir), PeerIdentity: key.Identity, Peer: v.identityName(key.Identity),
			Protocol: ProtoName(key.Proto), Ports: portsString(key), Policy: pol, Rule: int(e.Rule), Hits: e.Hits})
		sums[[2]string{pol, DirName(key.Dir)}] += e.Hits
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Direction != b.Direction {
			return a.Direction < b.Direction
		}
		if a.Policy != b.Policy {
			return a.Policy < b.Policy
		}
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		if a.PeerIdentity != b.PeerIdentity {
			return a.PeerIdentity < b.PeerIdentity
		}
		return a.Ports < b.Ports
	})
	var counters []PolicyCounter
	for k, n := range sums {
		counters = append(counters, PolicyCounter{Policy: k[0], Direction: k[1], Hits: n})
	}
	sort.Slice(counters, func(i, j int) bool {
		return counters[i].Policy+counters[i].Direction < counters[j].Policy+counters[j].Direction
	})
	return out, counters, it.Err()
}

// Explain tells what the programs decide for a new flow from src to
// dst:port/proto: at src's endpoint (egress) and at dst's (ingress), for
// those on this node. It mirrors bpf/policy.c's check.
func (v *View) Explain(src, dst netip.Addr, port uint16, proto uint8) ([]Verdict, error) {
	src, dst = src.Unmap(), dst.Unmap()
	byAddr, err := v.endpointsByAddr()
	if err != nil {
		return nil, err
	}
	var out []Verdict
	for _, side := range []struct {
		local, peer netip.Addr
		dir         uint8
	}{{src, dst, DirEgress}, {dst, src, DirIngress}} {
		ep, ok := byAddr[side.local]
		if !ok {
			continue
		}
		var e polBPFPolEndpoint
		if err := v.m[MapEndpoints].Lookup(ep, &e); err != nil {
			continue
		}
		out = append(out, v.check(ep, &e, side.dir, side.peer, proto, port))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: neither %s nor %s is a pod with policy on this node", os.ErrNotExist, src, dst)
	}
	return out, nil
}

func (v *View) check(ep uint32, e *polBPFPolEndpoint, dir uint8, peer netip.Addr, proto uint8, port uint16) Verdict {
	var label, cidr uint32
	var info polBPFPolIpInfo
	if v.m[MapIPCache].Lookup(polBPFPolIpKey{Addr: addrKey(peer)}, &info) == nil {
		label = info.Identity
	}
	ck := polBPFPolCidrKey{Prefixlen: 128, Addr: addrKey(peer)}
	if v.m[MapCIDR].Lookup(ck, &info) == nil {
		cidr = info.Identity
	}
	vd := Verdict{Endpoint: v.endpointName(ep), Direction: DirName(dir)}
	vd.PeerIdentity = label
	if label == 0 {
		vd.PeerIdentity = cmpOr(cidr, IdentityWorld)
	}
	vd.Peer = v.identityName(vd.PeerIdentity)
	if label == IdentityHost {
		vd.Allowed, vd.Reason = true, ReasonName(2)
		return vd
	}
	mask := uint32(1)
	if dir == DirEgress {
		mask = 2
	}
	if e.Flags&mask == 0 {
		vd.Allowed, vd.Reason = true, ReasonName(1)
		return vd
	}
	var ids []uint32
	for _, id := range []uint32{label, cidr} {
		if id != 0 && id != IdentityHost {
			ids = append(ids, id)
		}
	}
	for _, id := range append(ids, IdentityAny) {
		k := polBPFPolKey{Prefixlen: 128, Ep: ep, Dir: dir, Identity: id, Proto: proto, Port: htons(port)}
		var ent polBPFPolEntry
		if v.m[MapPolicy].Lookup(k, &ent) == nil {
			vd.Allowed, vd.Reason = true, ReasonName(0)
			vd.Policy, vd.Rule = v.policyName(ent.Policy), int(ent.Rule)
			vd.Entry = fmt.Sprintf("%s rule %d: peer %s", DirName(dir), ent.Rule, v.identityName(id))
			return vd
		}
	}
	vd.Reason = ReasonName(4) + ": isolated for " + DirName(dir) + " and no policy allows this peer and port"
	return vd
}

func cmpOr(a, b uint32) uint32 {
	if a != 0 {
		return a
	}
	return b
}

// endpointsByAddr maps pod addresses to host veth ifindexes (this netns).
func (v *View) endpointsByAddr() (map[netip.Addr]uint32, error) {
	return NetlinkLinks{NetNS: v.NetNS}.Veths()
}

// Monitor reads verdict events until ctx ends; verdict filters ("drop",
// "allow", "" for both). Only one reader can follow the ring buffer.
func (v *View) Monitor(ctx context.Context, verdict string, fn func(Event)) error {
	rd, err := ringbuf.NewReader(v.m[MapEvents])
	if err != nil {
		return fmt.Errorf("open %s: %w", MapEvents, err)
	}
	defer rd.Close()
	go func() { <-ctx.Done(); rd.Close() }()
	bootOffset := bootTime()
	for {
		rec, err := rd.Read()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ringbuf.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read %s: %w", MapEvents, err)
		}
		var ev polBPFPolEvent
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.LittleEndian, &ev); err != nil {
			continue
		}
		e := Event{Time: bootOffset.Add(time.Duration(ev.TsNs)), Endpoint: v.endpointName(ev.Ep), Direction: DirName(ev.Dir),
			Reason: ReasonName(ev.Reason), Protocol: ProtoName(ev.Proto), Local: netip.AddrFrom16(ev.Local).Unmap(),
			LocalPort: ntohs(ev.LocalPort), Peer: netip.AddrFrom16(ev.Peer).Unmap(), PeerPort: ntohs(ev.PeerPort), PeerID: ev.PeerIdentity,
			PeerName: v.identityName(ev.PeerIdentity), Verdict: "allow"}
		if ev.Verdict == 1 {
			e.Verdict = "drop"
		}
		if ev.Policy != 0 {
			e.Policy = v.policyName(ev.Policy)
		}
		if verdict != "" && verdict != e.Verdict {
			continue
		}
		fn(e)
	}
}

// bootTime is when CLOCK_MONOTONIC was 0 (bpf_ktime_get_ns's clock).
func bootTime() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Time{}
	}
	return time.Now().Add(-time.Duration(ts.Nano()))
}

// SetMonitorAllows switches reporting of allowed flows on or off (the
// agent sets it from --policy-monitor-allows at start).
func SetMonitorAllows(pinDir string, on bool) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, MapConfig), nil)
	if err != nil {
		return err
	}
	defer m.Close()
	var cfg polBPFPolConfig
	if err := m.Lookup(uint32(0), &cfg); err != nil {
		return err
	}
	cfg.Monitor = monDrops
	if on {
		cfg.Monitor |= monAllows
	}
	return m.Put(uint32(0), cfg)
}
