package policy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Names of the iptables fallback (filter table of both families) and its
// ipsets.
// (IPTablesChain and iptChainPrefix, which the view parses on every
// platform, are in iptview.go.)
const (
	IPSetPrefix      = "waggle-pol-" // waggle-pol-<hash>-4|6: the peers of one rule
	iptComment       = "waggle NetworkPolicy"
	revokedMark      = 0x00100000 // ct mark bit: a policy change denied this established flow
	iptablesTimeout  = time.Minute
	bridgeNFCallIPv4 = "/proc/sys/net/bridge/bridge-nf-call-iptables"
	bridgeNFCallIPv6 = "/proc/sys/net/bridge/bridge-nf-call-ip6tables"
)

// IPTablesConfig configures the iptables fallback datapath.
type IPTablesConfig struct {
	// NetNS, when set, is the network namespace (a path) to program;
	// default: the caller's.
	NetNS string
	Log   *slog.Logger
}

// IPTables is the Datapath of nodes whose kernel cannot run the tcx
// programs: iptables rules (filter FORWARD, both families) per endpoint and
// direction, the peers of each rule in an ipset (hash:net), replies and
// established flows accepted by conntrack, and a policy change that denies
// an established flow marks its conntrack entry revoked (then dropped), as
// the eBPF datapath re-checks its flows. Writes are batched: Program calls
// Commit last, which writes the sets, then every changed chain in one
// iptables-restore per family (atomic), then removes what is unused.
type IPTables struct {
	cfg IPTablesConfig
	log *slog.Logger
	r   iptRunner
	mu  sync.Mutex
	h   *netlink.Handle
	nsh netns.NsHandle

	want    map[uint32]*EndpointState
	ipcache map[netip.Addr]uint32
	cidrs   map[netip.Prefix]uint32
	names   map[uint32]string // policy ID -> namespace/name

	// What is written.
	done     map[uint32]*EndpointState
	chains   map[string]string // chain -> its rendered rules, per family key "4/" "6/"
	sets     map[string]map[netip.Prefix]bool
	dirty    bool
	recheck  map[uint32]bool
	restored bool
}

var _ Datapath = (*IPTables)(nil)

// NewIPTables checks that iptables, ipsets and conntrack are usable in the
// namespace, makes bridged pod traffic pass iptables (br_netfilter), hooks
// WAGGLE-POLICY into FORWARD and picks up what a previous agent left.
func NewIPTables(cfg IPTablesConfig) (*IPTables, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	d := &IPTables{cfg: cfg, log: cfg.Log, r: iptRunner{netns: cfg.NetNS}, nsh: netns.None(), want: map[uint32]*EndpointState{},
		ipcache: map[netip.Addr]uint32{}, cidrs: map[netip.Prefix]uint32{}, names: map[uint32]string{},
		done: map[uint32]*EndpointState{}, chains: map[string]string{}, sets: map[string]map[netip.Prefix]bool{},
		recheck: map[uint32]bool{}}
	var err error
	if cfg.NetNS != "" {
		if d.nsh, err = netns.GetFromPath(cfg.NetNS); err != nil {
			return nil, fmt.Errorf("%w: open netns %s: %v", ErrNotSupported, cfg.NetNS, err)
		}
		d.h, err = netlink.NewHandleAt(d.nsh)
	} else {
		d.h, err = netlink.NewHandle()
	}
	if err != nil {
		d.nsh.Close()
		return nil, fmt.Errorf("%w: netlink: %v", ErrNotSupported, err)
	}
	if err := d.init(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

func (d *IPTables) init() error {
	if _, _, err := d.h.IpsetProtocol(); err != nil {
		return fmt.Errorf("%w: ipset (CONFIG_IP_SET) unavailable: %v", ErrNotSupported, err)
	}
	// Bridged pod-to-pod traffic passes iptables only with br_netfilter
	// (as kubeadm requires of every node).
	err := d.inNetNS(func() error {
		for _, p := range []string{bridgeNFCallIPv4, bridgeNFCallIPv6} {
			if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == "1" {
				continue
			}
			if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
				return fmt.Errorf("%s: %w (is br_netfilter loaded?)", p, err)
			}
			d.log.Info("enabled bridged traffic through iptables for NetworkPolicy", "sysctl", p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotSupported, err)
	}
	ctx := context.Background()
	for _, fam := range []ipFamily{ipv4, ipv6} {
		// Declaring the chain in a restore would flush it: only when missing
		// (a restarted agent keeps enforcing what the last one wrote).
		save, err := d.r.Save(ctx, fam, "filter")
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrNotSupported, fam, err)
		}
		if !strings.Contains(string(save), "\n:"+IPTablesChain+" ") {
			if err := d.r.Restore(ctx, fam, []byte("*filter\n:"+IPTablesChain+" - [0:0]\nCOMMIT\n")); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrNotSupported, fam, err)
			}
		}
		if err := d.r.EnsureRule(ctx, fam, "filter", "FORWARD", forwardJump...); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrNotSupported, fam, err)
		}
	}
	// Sets a previous agent left: reused when still wanted, else removed.
	all, err := d.h.IpsetListAll()
	if err != nil {
		return fmt.Errorf("list ipsets: %w", err)
	}
	for _, s := range all {
		if !strings.HasPrefix(s.SetName, IPSetPrefix) {
			continue
		}
		res, err := d.h.IpsetList(s.SetName)
		if err != nil {
			return fmt.Errorf("list ipset %s: %w", s.SetName, err)
		}
		m := map[netip.Prefix]bool{}
		for _, e := range res.Entries {
			if a, ok := netip.AddrFromSlice(e.IP); ok {
				bits := int(e.CIDR)
				if bits == 0 {
					bits = a.Unmap().BitLen()
				}
				m[netip.PrefixFrom(a.Unmap(), bits)] = true
			}
		}
		d.sets[s.SetName] = m
	}
	return nil
}

func (d *IPTables) inNetNS(fn func() error) error {
	if d.cfg.NetNS == "" {
		return fn()
	}
	return ns.WithNetNSPath(d.cfg.NetNS, func(ns.NetNS) error { return fn() })
}

// ApplyIPCache implements Datapath (written at Commit).
func (d *IPTables) ApplyIPCache(m map[netip.Addr]uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ipcache = maps2(m)
	d.dirty = true
	return nil
}

// ApplyCIDRs implements Datapath (written at Commit).
func (d *IPTables) ApplyCIDRs(m map[netip.Prefix]uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cidrs = maps2(m)
	d.dirty = true
	return nil
}

// ApplyEndpoint implements Datapath: phase one records the state; phase
// two (prune) marks the endpoint for the conntrack re-check when it lost an
// entry or changed isolation. Commit writes both.
func (d *IPTables) ApplyEndpoint(st *EndpointState, prune bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !prune {
		d.want[st.Ifindex] = st
		d.dirty = true
		return nil
	}
	old := d.done[st.Ifindex]
	if old == nil {
		d.recheck[st.Ifindex] = true // flows opened before it was known
		return nil
	}
	if old.IngressIsolated != st.IngressIsolated || old.EgressIsolated != st.EgressIsolated {
		d.recheck[st.Ifindex] = true
		return nil
	}
	for k := range old.Entries {
		if _, ok := st.Entries[k]; !ok {
			d.recheck[st.Ifindex] = true
			break
		}
	}
	return nil
}

// RemoveEndpoint implements Datapath; it writes at once (the agent also
// calls it outside Program).
func (d *IPTables) RemoveEndpoint(ifindex uint32) error {
	d.mu.Lock()
	delete(d.want, ifindex)
	delete(d.recheck, ifindex)
	d.dirty = true
	d.mu.Unlock()
	return d.Commit()
}

// SetNames implements Datapath: policy names go into the rules' comments.
func (d *IPTables) SetNames(kind uint32, names map[uint32]string) error {
	if kind != NamePolicy {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !mapsEqual(d.names, names) {
		d.names = maps2(names)
		d.dirty = true
	}
	return nil
}

func mapsEqual[K, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Endpoints returns the ifindexes programmed (as BPF.Endpoints).
func (d *IPTables) Endpoints() []uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]uint32, 0, len(d.want))
	for ep := range d.want {
		out = append(out, ep)
	}
	return out
}

// Close releases the netlink handle; the rules and sets stay and go on
// enforcing.
func (d *IPTables) Close() error {
	if d.h != nil {
		d.h.Close()
	}
	d.nsh.Close()
	return nil
}

// A rule group: the entries of one endpoint, direction, policy rule and
// port prefix; its peers are one ipset.
type iptGroup struct {
	dir      uint8
	policy   uint32
	rule     uint16
	proto    uint8
	port     uint16
	portBits uint8
	ids      []uint32
}

func groupsOf(st *EndpointState) []*iptGroup {
	type gkey struct {
		dir, proto, portBits uint8
		policy               uint32
		rule, port           uint16
	}
	by := map[gkey]*iptGroup{}
	for k, e := range st.Entries {
		g := gkey{dir: k.Dir, policy: e.Policy, rule: e.Rule, proto: k.Proto, port: k.Port, portBits: k.PortBits}
		if by[g] == nil {
			by[g] = &iptGroup{dir: k.Dir, policy: e.Policy, rule: e.Rule, proto: k.Proto, port: k.Port, portBits: k.PortBits}
		}
		by[g].ids = append(by[g].ids, k.Identity)
	}
	out := make([]*iptGroup, 0, len(by))
	for _, g := range by {
		slices.Sort(g.ids)
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.dir != b.dir {
			return a.dir < b.dir
		}
		if a.policy != b.policy {
			return a.policy < b.policy
		}
		if a.rule != b.rule {
			return a.rule < b.rule
		}
		if a.proto != b.proto {
			return a.proto < b.proto
		}
		if a.port != b.port {
			return a.port < b.port
		}
		return a.portBits < b.portBits
	})
	return out
}

func (g *iptGroup) anyPeer() bool { return slices.Contains(g.ids, IdentityAny) }

func setName(ids []uint32, fam ipFamily) string {
	h := sha256.New()
	for _, id := range ids {
		h.Write([]byte(strconv.FormatUint(uint64(id), 10) + ","))
	}
	return IPSetPrefix + hex.EncodeToString(h.Sum(nil))[:16] + "-" + strconv.Itoa(int(fam))
}

func isFam(a netip.Addr, fam ipFamily) bool { return a.Is4() == (fam == ipv4) }

// members computes a set's prefixes: the addresses of the pods of its
// label identities, and for each ipBlock prefix identity the prefix minus
// every known prefix inside it (the addresses whose longest known prefix
// it is, as the eBPF LPM lookup decides).
func (d *IPTables) members(ids []uint32, fam ipFamily, byID map[uint32][]netip.Addr) map[netip.Prefix]bool {
	out := map[netip.Prefix]bool{}
	want := map[uint32]bool{}
	for _, id := range ids {
		want[id] = true
		for _, a := range byID[id] {
			if isFam(a, fam) {
				out[netip.PrefixFrom(a, a.BitLen())] = true
			}
		}
	}
	for p, id := range d.cidrs {
		if !want[id] || !isFam(p.Addr(), fam) {
			continue
		}
		var inner []netip.Prefix
		for q := range d.cidrs {
			if q != p && contains(p, q) {
				inner = append(inner, q)
			}
		}
		for _, r := range subtract(p, inner) {
			if r.Bits() == 0 { // hash:net takes no /0: two halves
				lo, hi := halves(r)
				out[lo], out[hi] = true, true
				continue
			}
			out[r] = true
		}
	}
	return out
}

// halves splits p into its two sub-prefixes one bit longer.
func halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits() + 1
	lo := netip.PrefixFrom(p.Addr(), bits)
	b := p.Addr().AsSlice()
	b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	a, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(a, bits)
}

// subtract returns p minus every prefix of inner (each inside p) as
// disjoint prefixes.
func subtract(p netip.Prefix, inner []netip.Prefix) []netip.Prefix {
	var holes []netip.Prefix
	for _, q := range inner {
		if !contains(p, q) {
			continue
		}
		if q.Bits() == p.Bits() {
			return nil
		}
		holes = append(holes, q)
	}
	if len(holes) == 0 {
		return []netip.Prefix{p}
	}
	lo, hi := halves(p)
	return append(subtract(lo, holes), subtract(hi, holes)...)
}

func chainName(dir uint8, ep uint32) string {
	if dir == DirIngress {
		return iptChainPrefix + "I-" + strconv.FormatUint(uint64(ep), 10)
	}
	return iptChainPrefix + "E-" + strconv.FormatUint(uint64(ep), 10)
}

func protoName(p uint8) string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	case protoSCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

func quote(s string) string { return strconv.Quote(s) }

// render returns the rules of one endpoint chain and the sets they use.
func (d *IPTables) renderChain(st *EndpointState, dir uint8, fam ipFamily, groups []*iptGroup, sets map[string][]uint32) string {
	var b strings.Builder
	chain := chainName(dir, st.Ifindex)
	for _, g := range groups {
		if g.dir != dir {
			continue
		}
		b.WriteString("-A " + chain)
		if g.proto != protoAny {
			b.WriteString(" -p " + protoName(g.proto))
			if g.portBits > 0 {
				lo := g.port &^ (uint16(0xffff) >> g.portBits)
				hi := lo | uint16(0xffff)>>g.portBits
				if lo == hi {
					fmt.Fprintf(&b, " --dport %d", lo)
				} else {
					fmt.Fprintf(&b, " --dport %d:%d", lo, hi)
				}
			}
		}
		if !g.anyPeer() {
			name := setName(g.ids, fam)
			sets[name] = g.ids
			way := "src"
			if dir == DirEgress {
				way = "dst"
			}
			b.WriteString(" -m set --match-set " + name + " " + way)
		}
		pol := d.names[g.policy]
		if pol == "" {
			pol = "policy " + strconv.FormatUint(uint64(g.policy), 10)
		}
		fmt.Fprintf(&b, " -m comment --comment %s -j RETURN\n", quote(fmt.Sprintf("%s %s rule %d", pol, dirName(dir), g.rule)))
	}
	fmt.Fprintf(&b, "-A %s -m comment --comment %s -j DROP\n", chain, quote(st.Pod+" "+dirName(dir)+": no policy allows it"))
	return b.String()
}

// Commit implements the batching Program ends with: sets (created and
// filled before any rule names them), then each family's changed chains
// in one iptables-restore, then unused sets removed, then established
// flows of endpoints that lost something re-checked.
func (d *IPTables) Commit() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.dirty && len(d.recheck) == 0 {
		return nil
	}
	ctx := context.Background()
	byID := map[uint32][]netip.Addr{}
	for a, id := range d.ipcache {
		byID[id] = append(byID[id], a)
	}
	eps := make([]uint32, 0, len(d.want))
	for ep := range d.want {
		eps = append(eps, ep)
	}
	slices.Sort(eps)
	wantSets := map[string]map[netip.Prefix]bool{}
	type famOut struct {
		chains   map[string]string
		dispatch strings.Builder
	}
	outs := map[ipFamily]*famOut{}
	for _, fam := range []ipFamily{ipv4, ipv6} {
		o := &famOut{chains: map[string]string{}}
		outs[fam] = o
		fmt.Fprintf(&o.dispatch, "-A %s -m connmark --mark %#x/%#x -m comment --comment %s -j DROP\n", IPTablesChain, revokedMark, revokedMark,
			quote("established flow a policy change denied"))
		fmt.Fprintf(&o.dispatch, "-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN\n", IPTablesChain)
		if fam == ipv6 {
			for t := 133; t <= 137; t++ { // neighbour discovery is never subject to policy
				fmt.Fprintf(&o.dispatch, "-A %s -p ipv6-icmp -m icmp6 --icmpv6-type %d -j RETURN\n", IPTablesChain, t)
			}
		}
		for _, ep := range eps {
			st := d.want[ep]
			groups := groupsOf(st)
			sets := map[string][]uint32{}
			for _, dir := range []uint8{DirEgress, DirIngress} {
				isolated := st.EgressIsolated
				match := "-s"
				if dir == DirIngress {
					isolated, match = st.IngressIsolated, "-d"
				}
				if !isolated {
					continue
				}
				chain := chainName(dir, ep)
				o.chains[chain] = d.renderChain(st, dir, fam, groups, sets)
				for _, ip := range st.IPs {
					if isFam(ip, fam) {
						fmt.Fprintf(&o.dispatch, "-A %s %s %s -m comment --comment %s -j %s\n", IPTablesChain, match, ip,
							quote(st.Pod+" "+dirName(dir)), chain)
					}
				}
			}
			for name, ids := range sets {
				if wantSets[name] == nil {
					wantSets[name] = d.members(ids, fam, byID)
				}
			}
		}
	}
	// 1. Sets: create, add, then remove members.
	for name, want := range wantSets {
		have, ok := d.sets[name]
		if !ok {
			fam := uint8(unix.AF_INET)
			if strings.HasSuffix(name, "-6") {
				fam = unix.AF_INET6
			}
			if err := d.h.IpsetCreate(name, "hash:net", netlink.IpsetCreateOptions{Family: fam, Replace: true}); err != nil {
				return fmt.Errorf("create ipset %s: %w", name, err)
			}
			have = map[netip.Prefix]bool{}
			d.sets[name] = have
		}
		for p := range want {
			if !have[p] {
				if err := d.h.IpsetAdd(name, setEntry(p)); err != nil {
					return fmt.Errorf("ipset %s add %s: %w", name, p, err)
				}
				have[p] = true
			}
		}
		for p := range have {
			if !want[p] {
				if err := d.h.IpsetDel(name, setEntry(p)); err != nil && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("ipset %s del %s: %w", name, p, err)
				}
				delete(have, p)
			}
		}
	}
	// 2. Chains: one atomic restore per family. The first commit after a
	// start also deletes chains of endpoints a previous agent left.
	for _, fam := range []ipFamily{ipv4, ipv6} {
		o := outs[fam]
		key := strconv.Itoa(int(fam)) + "/"
		var b bytes.Buffer
		b.WriteString("*filter\n")
		var body bytes.Buffer
		names := make([]string, 0, len(o.chains))
		for c := range o.chains {
			names = append(names, c)
		}
		slices.Sort(names)
		for _, c := range names {
			if d.chains[key+c] == o.chains[c] {
				continue
			}
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
			body.WriteString(o.chains[c])
		}
		if d.chains[key+IPTablesChain] != o.dispatch.String() {
			fmt.Fprintf(&b, ":%s - [0:0]\n", IPTablesChain)
			body.WriteString(o.dispatch.String())
		}
		stale, err := d.staleChains(ctx, fam, key, o.chains)
		if err != nil {
			return err
		}
		for _, c := range stale { // flushed, so that they can go
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		b.Write(body.Bytes())
		for _, c := range stale {
			fmt.Fprintf(&b, "-X %s\n", c)
		}
		b.WriteString("COMMIT\n")
		if body.Len() == 0 && len(stale) == 0 {
			continue
		}
		if err := d.r.Restore(ctx, fam, b.Bytes()); err != nil {
			return fmt.Errorf("%s policy rules: %w", fam, err)
		}
		for k := range d.chains {
			if strings.HasPrefix(k, key) {
				delete(d.chains, k)
			}
		}
		for c, rules := range o.chains {
			d.chains[key+c] = rules
		}
		d.chains[key+IPTablesChain] = o.dispatch.String()
	}
	d.restored = true
	// 3. Sets no rule names any more.
	for name := range d.sets {
		if _, ok := wantSets[name]; ok {
			continue
		}
		if err := d.h.IpsetDestroy(name); err != nil && !errors.Is(err, unix.ENOENT) {
			d.log.Warn("cannot destroy an unused NetworkPolicy ipset", "set", name, "err", err)
			continue
		}
		delete(d.sets, name)
	}
	d.done = maps2(d.want)
	d.dirty = false
	// 4. Established flows.
	if len(d.recheck) > 0 {
		if err := d.recheckFlows(); err != nil {
			return err
		}
		clear(d.recheck)
	}
	return nil
}

// staleChains lists the policy chains of the table that are not wanted:
// from what was written, or (first commit after a start) from
// iptables-save.
func (d *IPTables) staleChains(ctx context.Context, fam ipFamily, key string, want map[string]string) ([]string, error) {
	var out []string
	if d.restored {
		for k := range d.chains {
			c, ok := strings.CutPrefix(k, key)
			if ok && c != IPTablesChain {
				if _, w := want[c]; !w {
					out = append(out, c)
				}
			}
		}
		slices.Sort(out)
		return out, nil
	}
	save, err := d.r.Save(ctx, fam, "filter")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fam, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(save))
	for sc.Scan() {
		line := sc.Text()
		if c, ok := strings.CutPrefix(line, ":"+iptChainPrefix); ok {
			c = iptChainPrefix + strings.Fields(c)[0]
			if _, w := want[c]; !w {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

func setEntry(p netip.Prefix) *netlink.IPSetEntry {
	return &netlink.IPSetEntry{IP: net.IP(p.Addr().AsSlice()), CIDR: uint8(p.Bits())}
}

// allowed decides a new flow as the eBPF check does: the node always,
// a direction the endpoint is not isolated for always, else an entry for
// the peer's pod identity, its prefix identity or any peer.
func (d *IPTables) allowed(st *EndpointState, dir uint8, peer netip.Addr, proto uint8, dport uint16) bool {
	label := d.ipcache[peer]
	if label == IdentityHost {
		return true
	}
	if (dir == DirIngress && !st.IngressIsolated) || (dir == DirEgress && !st.EgressIsolated) {
		return true
	}
	var cidr uint32
	best := -1
	for p, id := range d.cidrs {
		if p.Contains(peer) && p.Bits() > best {
			best, cidr = p.Bits(), id
		}
	}
	for k := range st.Entries {
		if k.Dir != dir {
			continue
		}
		switch {
		case k.Identity == IdentityAny:
		case label != 0 && k.Identity == label:
		case cidr != 0 && k.Identity == cidr:
		default:
			continue
		}
		if k.Proto == protoAny {
			return true
		}
		if k.Proto != proto {
			continue
		}
		if k.PortBits == 0 {
			return true
		}
		mask := ^(uint16(0xffff) >> k.PortBits)
		if dport&mask == k.Port&mask {
			return true
		}
	}
	return false
}

// recheckFlows marks revoked the established flows of re-checked
// endpoints that the policy no longer allows (and un-marks those it allows
// again); the dispatch chain drops revoked flows' packets.
func (d *IPTables) recheckFlows() error {
	byIP := map[netip.Addr]*EndpointState{}
	for _, st := range d.want {
		for _, ip := range st.IPs {
			byIP[ip] = st
		}
	}
	var errs []error
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := d.h.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return fmt.Errorf("list conntrack: %w", err)
		}
		for _, f := range flows {
			src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
			dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
			src, dst = src.Unmap(), dst.Unmap()
			es, ed := byIP[src], byIP[dst]
			if (es == nil || !d.recheck[es.Ifindex]) && (ed == nil || !d.recheck[ed.Ifindex]) {
				continue
			}
			ok := (es == nil || d.allowed(es, DirEgress, dst, f.Forward.Protocol, f.Forward.DstPort)) &&
				(ed == nil || d.allowed(ed, DirIngress, src, f.Forward.Protocol, f.Forward.DstPort))
			revoked := f.Mark&revokedMark != 0
			if ok == !revoked {
				continue
			}
			if ok {
				f.Mark &^= revokedMark
			} else {
				f.Mark |= revokedMark
			}
			if err := d.h.ConntrackUpdate(netlink.ConntrackTable, fam, f); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("conntrack update %s -> %s: %w", src, dst, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Counters reads the rules' packet counters (for /metrics): per endpoint
// the new flows its rules allowed and the packets its chains dropped;
// per policy the new flows its rules allowed. Flows of endpoints not
// isolated pass no rule and are not counted.
func (d *IPTables) Counters() (Counters, error) {
	cs := Counters{Allowed: map[string][2]uint64{}, Denied: map[string][2]uint64{}, PolicyHits: map[uint32][2]uint64{}}
	d.mu.Lock()
	byChain := map[string]*EndpointState{}
	for ep, st := range d.want {
		byChain[chainName(DirIngress, ep)] = st
		byChain[chainName(DirEgress, ep)] = st
	}
	polID := map[string]uint32{}
	for id, n := range d.names {
		polID[n] = id
	}
	d.mu.Unlock()
	ctx := context.Background()
	for _, fam := range []ipFamily{ipv4, ipv6} {
		save, err := d.saveCounters(ctx, fam)
		if err != nil {
			return cs, err
		}
		rules, err := parseCounters(save)
		if err != nil {
			return cs, err
		}
		for _, r := range rules {
			if r.chain == IPTablesChain && r.target == "DROP" {
				cs.Revoked += r.packets
				continue
			}
			st := byChain[r.chain]
			if st == nil { // left by a previous agent, not programmed yet
				st = &EndpointState{Pod: r.chain}
			}
			dir := DirIngress
			if strings.HasPrefix(r.chain, iptChainPrefix+"E-") {
				dir = DirEgress
			}
			switch r.target {
			case "DROP":
				v := cs.Denied[st.Pod]
				v[dir] += r.packets
				cs.Denied[st.Pod] = v
			case "RETURN":
				v := cs.Allowed[st.Pod]
				v[dir] += r.packets
				cs.Allowed[st.Pod] = v
				if pol, _, ok := strings.Cut(r.comment, " "+dirName(dir)+" rule "); ok {
					if id, ok := polID[pol]; ok {
						h := cs.PolicyHits[id]
						h[dir] += r.packets
						cs.PolicyHits[id] = h
					}
				}
			}
		}
	}
	return cs, nil
}

// saveCounters is `iptables-save -c -t filter` in the namespace.
func (d *IPTables) saveCounters(ctx context.Context, fam ipFamily) ([]byte, error) {
	return d.r.run(ctx, nil, fam.tool("-save"), "-c", "-t", "filter")
}

// OpenIPTablesView reads the iptables fallback's rules and counters in the
// network namespace at netnsPath (empty: the caller's); ErrNoState when the
// fallback programmed nothing there.
func OpenIPTablesView(netnsPath string) (*IPTablesView, error) {
	r := iptRunner{netns: netnsPath}
	var saves [][]byte
	for _, fam := range []ipFamily{ipv4, ipv6} {
		save, err := r.run(context.Background(), nil, fam.tool("-save"), "-c", "-t", "filter")
		if err != nil {
			if fam == ipv6 && len(saves) > 0 { // a node without IPv6 tables
				break
			}
			return nil, err
		}
		saves = append(saves, save)
	}
	v, found, err := parseIPTablesView(saves...)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%w: no %s chain in iptables", ErrNoState, IPTablesChain)
	}
	return v, nil
}

// CleanupIPTables removes the fallback's rules, chains and ipsets from the
// namespace at netnsPath (empty: the caller's). Idempotent.
func CleanupIPTables(netnsPath string) error {
	r := iptRunner{netns: netnsPath}
	ctx := context.Background()
	var errs []error
	for _, fam := range []ipFamily{ipv4, ipv6} {
		if _, err := exec.LookPath(fam.tool("-save")); err != nil {
			continue // no iptables here: none of its rules either
		}
		if err := r.removeAll(ctx, fam); err != nil {
			errs = append(errs, err)
		}
	}
	var h *netlink.Handle
	var err error
	if netnsPath != "" {
		nsh, nerr := netns.GetFromPath(netnsPath)
		if nerr != nil {
			return errors.Join(append(errs, nerr)...)
		}
		defer nsh.Close()
		h, err = netlink.NewHandleAt(nsh)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer h.Close()
	if _, _, err := h.IpsetProtocol(); err != nil {
		return errors.Join(errs...) // no ipsets in this kernel
	}
	sets, err := h.IpsetListAll()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, s := range sets {
		if strings.HasPrefix(s.SetName, IPSetPrefix) {
			if err := h.IpsetDestroy(s.SetName); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("destroy ipset %s: %w", s.SetName, err))
			}
		}
	}
	return errors.Join(errs...)
}

// ipFamily is iptables (4) or ip6tables (6).
type ipFamily int

const (
	ipv4 ipFamily = 4
	ipv6 ipFamily = 6
)

func (f ipFamily) String() string {
	if f == ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

func (f ipFamily) tool(suffix string) string {
	if f == ipv6 {
		return "ip6tables" + suffix
	}
	return "iptables" + suffix
}

// iptRunner runs the iptables binaries in a network namespace (through
// nsenter) or the caller's. (dataplane/iptables has the service backend's
// runner; this package cannot import it: dataplane imports this one.)
type iptRunner struct{ netns string }

func (r iptRunner) run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, iptablesTimeout)
	defer cancel()
	if r.netns != "" {
		args = append([]string{"--net=" + r.netns, "--", name}, args...)
		name = "nsenter"
	}
	c := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Restore feeds iptables-restore --noflush (atomic per table).
func (r iptRunner) Restore(ctx context.Context, fam ipFamily, data []byte) error {
	_, err := r.run(ctx, data, fam.tool("-restore"), "--noflush", "--wait")
	return err
}

// Save is iptables-save of one table.
func (r iptRunner) Save(ctx context.Context, fam ipFamily, table string) ([]byte, error) {
	return r.run(ctx, nil, fam.tool("-save"), "-t", table)
}

var forwardJump = []string{"-m", "comment", "--comment", iptComment, "-j", IPTablesChain}

// EnsureRule inserts rule first in chain unless it is there.
func (r iptRunner) EnsureRule(ctx context.Context, fam ipFamily, table, chain string, rule ...string) error {
	if _, err := r.run(ctx, nil, fam.tool(""), append([]string{"-w", "-t", table, "-C", chain}, rule...)...); err == nil {
		return nil
	}
	_, err := r.run(ctx, nil, fam.tool(""), append([]string{"-w", "-t", table, "-I", chain, "1"}, rule...)...)
	return err
}

// removeAll deletes the FORWARD jump and every WAGGLE-POL* chain.
func (r iptRunner) removeAll(ctx context.Context, fam ipFamily) error {
	save, err := r.Save(ctx, fam, "filter")
	if err != nil {
		return err
	}
	var chains []string
	for _, line := range strings.Split(string(save), "\n") {
		if name, ok := strings.CutPrefix(line, ":"); ok {
			name, _, _ = strings.Cut(name, " ")
			if strings.HasPrefix(name, "WAGGLE-POL") {
				chains = append(chains, name)
			}
		}
	}
	if len(chains) == 0 {
		return nil
	}
	for {
		if _, err := r.run(ctx, nil, fam.tool(""), append([]string{"-w", "-t", "filter", "-D", "FORWARD"}, forwardJump...)...); err != nil {
			break // no (more) jump
		}
	}
	var b bytes.Buffer
	b.WriteString("*filter\n")
	for _, c := range chains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, c := range chains {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	if err := r.Restore(ctx, fam, b.Bytes()); err != nil {
		return fmt.Errorf("%s: remove NetworkPolicy chains: %w", fam, err)
	}
	return nil
}
