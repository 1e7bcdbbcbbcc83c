package policy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
)

// BPFConfig configures the eBPF datapath.
type BPFConfig struct {
	// PinDir is the policy pin directory (e.g. /sys/fs/bpf/waggle/<node>/policy).
	PinDir string
	// NetNS, when set, is the network namespace (a path) whose interfaces
	// the endpoints' ifindexes name; default: the caller's.
	NetNS string
	// MonitorAllows also reports allowed new flows to the ring buffer (drops
	// always are).
	MonitorAllows bool
	Log           *slog.Logger
}

// BPF is the eBPF Datapath.
type BPF struct {
	cfg  BPFConfig
	log  *slog.Logger
	mu   sync.Mutex
	objs polBPFObjects
	// cur mirrors what is written: entries per endpoint, the tables.
	cur     map[uint32]map[Key]Entry
	ipcache map[netip.Addr]uint32
	cidrs   map[netip.Prefix]uint32
	names   map[polBPFPolNameKey]string
	// stale endpoints had their isolation changed in phase one; phase two
	// bumps their revision.
	stale map[uint32]bool
}

var _ Datapath = (*BPF)(nil)

// NewBPF loads the programs and opens (or creates) the pinned maps. A
// restarted agent finds the last one's entries and links and carries on.
func NewBPF(cfg BPFConfig) (*BPF, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.PinDir == "" {
		return nil, errors.New("policy datapath: no pin directory")
	}
	if err := os.MkdirAll(filepath.Join(cfg.PinDir, LinkDir), 0o700); err != nil {
		return nil, fmt.Errorf("create policy pin directory: %w", err)
	}
	spec, err := loadPolBPF()
	if err != nil {
		return nil, err
	}
	d := &BPF{cfg: cfg, log: cfg.Log, cur: map[uint32]map[Key]Entry{}, ipcache: map[netip.Addr]uint32{},
		cidrs: map[netip.Prefix]uint32{}, names: map[polBPFPolNameKey]string{}, stale: map[uint32]bool{}}
	if err := spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: cfg.PinDir}}); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load policy programs: %+v", ve)
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("%w: %v (run waggle proxy --cleanup)", ErrLayoutMismatch, err)
		}
		return nil, fmt.Errorf("load policy objects: %w", err)
	}
	if err := d.init(); err != nil {
		d.objs.Close()
		return nil, err
	}
	return d, nil
}

func (d *BPF) init() error {
	var cfg polBPFPolConfig
	zero := uint32(0)
	if err := d.objs.WagglePolConfig.Lookup(zero, &cfg); err != nil {
		return fmt.Errorf("read %s: %w", MapConfig, err)
	}
	if cfg.Magic != 0 && (cfg.Magic != Magic || cfg.LayoutVersion != LayoutVersion) {
		return fmt.Errorf("%w: magic %#x version %d", ErrLayoutMismatch, cfg.Magic, cfg.LayoutVersion)
	}
	cfg.Magic, cfg.LayoutVersion = Magic, LayoutVersion
	cfg.Monitor = monDrops
	if d.cfg.MonitorAllows {
		cfg.Monitor |= monAllows
	}
	if err := d.objs.WagglePolConfig.Put(zero, cfg); err != nil {
		return fmt.Errorf("write %s: %w", MapConfig, err)
	}
	// Restore what the maps hold.
	var k polBPFPolKey
	var v polBPFPolEntry
	it := d.objs.WagglePolPolicy.Iterate()
	for it.Next(&k, &v) {
		key := keyFromBPF(k)
		if d.cur[key.Endpoint] == nil {
			d.cur[key.Endpoint] = map[Key]Entry{}
		}
		d.cur[key.Endpoint][key] = Entry{Policy: v.Policy, Rule: v.Rule}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", MapPolicy, err)
	}
	var ik polBPFPolIpKey
	var iv polBPFPolIpInfo
	it = d.objs.WagglePolIpcache.Iterate()
	for it.Next(&ik, &iv) {
		d.ipcache[netip.AddrFrom16(ik.Addr).Unmap()] = iv.Identity
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", MapIPCache, err)
	}
	var ck polBPFPolCidrKey
	it = d.objs.WagglePolCidr.Iterate()
	for it.Next(&ck, &iv) {
		d.cidrs[prefixFromBPF(ck)] = iv.Identity
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", MapCIDR, err)
	}
	var epk uint32
	var epv polBPFPolEndpoint
	it = d.objs.WagglePolEndpoints.Iterate()
	for it.Next(&epk, &epv) {
		if d.cur[epk] == nil {
			d.cur[epk] = map[Key]Entry{}
		}
	}
	return it.Err()
}

// Layout constants (bpf/lib/policy.h).
const (
	Magic         = 0x4c4f5057
	LayoutVersion = 1
	monDrops      = 1
	monAllows     = 2
)

func keyToBPF(k Key) polBPFPolKey {
	port := k.Port
	if k.PortBits < 16 {
		port &^= uint16(0xffff) >> k.PortBits
	}
	return polBPFPolKey{Prefixlen: k.Prefixlen(), Ep: k.Endpoint, Dir: k.Dir, Identity: k.Identity, Proto: k.Proto,
		Port: htons(port)}
}

func keyFromBPF(b polBPFPolKey) Key {
	k := Key{Endpoint: b.Ep, Dir: b.Dir, Identity: b.Identity, Proto: b.Proto, Port: ntohs(b.Port)}
	if b.Prefixlen > prefixProtoAnyPrt {
		k.PortBits = uint8(b.Prefixlen - prefixProtoAnyPrt)
	}
	if b.Prefixlen <= prefixAnyProto {
		k.Proto = 0
	}
	return k
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
func ntohs(v uint16) uint16 { return v<<8 | v>>8 }

func addrKey(a netip.Addr) [16]uint8 {
	if a.Is4() {
		return netip.AddrFrom16(a.As16()).As16() // As16 of an IPv4 address is IPv4-mapped
	}
	return a.As16()
}

func cidrKey(p netip.Prefix) polBPFPolCidrKey {
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return polBPFPolCidrKey{Prefixlen: uint32(bits), Addr: addrKey(p.Addr())}
}

func prefixFromBPF(k polBPFPolCidrKey) netip.Prefix {
	a := netip.AddrFrom16(k.Addr)
	bits := int(k.Prefixlen)
	if a.Is4In6() && bits >= 96 {
		return netip.PrefixFrom(a.Unmap(), bits-96)
	}
	return netip.PrefixFrom(a, bits)
}

// ApplyIPCache implements Datapath: upserts first, then deletes.
func (d *BPF) ApplyIPCache(m map[netip.Addr]uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for a, id := range m {
		if cur, ok := d.ipcache[a]; ok && cur == id {
			continue
		}
		if err := d.objs.WagglePolIpcache.Put(polBPFPolIpKey{Addr: addrKey(a)}, polBPFPolIpInfo{Identity: id}); err != nil {
			return fmt.Errorf("ipcache %s -> %d: %w", a, id, err)
		}
		d.ipcache[a] = id
	}
	for a := range d.ipcache {
		if _, ok := m[a]; ok {
			continue
		}
		if err := d.objs.WagglePolIpcache.Delete(polBPFPolIpKey{Addr: addrKey(a)}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("ipcache delete %s: %w", a, err)
		}
		delete(d.ipcache, a)
	}
	return nil
}

// ApplyCIDRs implements Datapath.
func (d *BPF) ApplyCIDRs(m map[netip.Prefix]uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for p, id := range m {
		if cur, ok := d.cidrs[p]; ok && cur == id {
			continue
		}
		if err := d.objs.WagglePolCidr.Put(cidrKey(p), polBPFPolIpInfo{Identity: id}); err != nil {
			return fmt.Errorf("cidr %s -> %d: %w", p, id, err)
		}
		d.cidrs[p] = id
	}
	for p := range d.cidrs {
		if _, ok := m[p]; ok {
			continue
		}
		if err := d.objs.WagglePolCidr.Delete(cidrKey(p)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("cidr delete %s: %w", p, err)
		}
		delete(d.cidrs, p)
	}
	return nil
}

func flagsOf(st *EndpointState) uint32 {
	var f uint32
	if st.IngressIsolated {
		f |= 1
	}
	if st.EgressIsolated {
		f |= 2
	}
	return f
}

// ApplyEndpoint implements Datapath.
func (d *BPF) ApplyEndpoint(st *EndpointState, prune bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ep := st.Ifindex
	cur := d.cur[ep]
	if cur == nil {
		cur = map[Key]Entry{}
		d.cur[ep] = cur
	}
	if prune {
		return d.prune(st, cur)
	}
	// 1. New and changed entries.
	for k, v := range st.Entries {
		if old, ok := cur[k]; ok && old == v {
			continue
		}
		if err := d.objs.WagglePolPolicy.Put(keyToBPF(k), polBPFPolEntry{Policy: v.Policy, Rule: v.Rule}); err != nil {
			return fmt.Errorf("endpoint %s: policy entry: %w", st.Pod, err)
		}
		cur[k] = v
	}
	// 2. Isolation (the revision stays: nothing was taken away yet).
	var e polBPFPolEndpoint
	existed := d.objs.WagglePolEndpoints.Lookup(ep, &e) == nil
	changed := !existed || e.Flags != flagsOf(st) || e.Identity != st.Identity
	e.Flags, e.Identity = flagsOf(st), st.Identity
	if changed {
		if err := d.objs.WagglePolEndpoints.Put(ep, e); err != nil {
			return fmt.Errorf("endpoint %s: %w", st.Pod, err)
		}
		d.stale[ep] = true
	}
	if err := d.putName(NameEndpoint, ep, st.Pod); err != nil {
		return err
	}
	return d.attach(ep, st.Pod)
}

// prune is ApplyEndpoint's second phase.
func (d *BPF) prune(st *EndpointState, cur map[Key]Entry) error {
	ep := st.Ifindex
	// 3. Removed entries.
	removed := d.stale[ep]
	for k := range cur {
		if _, ok := st.Entries[k]; ok {
			continue
		}
		if err := d.objs.WagglePolPolicy.Delete(keyToBPF(k)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("endpoint %s: delete policy entry: %w", st.Pod, err)
		}
		delete(cur, k)
		removed = true
	}
	// 4. The revision: established flows are checked once more. Counters
	// the program bumped meanwhile are kept (read again, then written).
	if removed {
		var e polBPFPolEndpoint
		if err := d.objs.WagglePolEndpoints.Lookup(ep, &e); err != nil {
			return fmt.Errorf("endpoint %s: %w", st.Pod, err)
		}
		e.Rev++
		if err := d.objs.WagglePolEndpoints.Put(ep, e); err != nil {
			return fmt.Errorf("endpoint %s: %w", st.Pod, err)
		}
	}
	delete(d.stale, ep)
	return nil
}

func (d *BPF) putName(kind, id uint32, name string) error {
	k := polBPFPolNameKey{Kind: kind, Id: id}
	if d.names[k] == name {
		return nil
	}
	var v polBPFPolName
	for i := 0; i < len(name) && i < len(v.Name)-1; i++ {
		v.Name[i] = int8(name[i])
	}
	if err := d.objs.WagglePolNames.Put(k, v); err != nil {
		return fmt.Errorf("name %d/%d: %w", kind, id, err)
	}
	d.names[k] = name
	return nil
}

// SetNames implements Datapath.
func (d *BPF) SetNames(kind uint32, names map[uint32]string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, n := range names {
		if err := d.putName(kind, id, n); err != nil {
			return err
		}
	}
	for k := range d.names {
		if _, ok := names[k.Id]; k.Kind == kind && !ok {
			if err := d.objs.WagglePolNames.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
			delete(d.names, k)
		}
	}
	return nil
}

func (d *BPF) linkPath(ep uint32, dir string) string {
	return filepath.Join(d.cfg.PinDir, LinkDir, strconv.FormatUint(uint64(ep), 10)+"-"+dir)
}

// inNetNS runs fn in the configured network namespace.
func (d *BPF) inNetNS(fn func() error) error {
	if d.cfg.NetNS == "" {
		return fn()
	}
	return ns.WithNetNSPath(d.cfg.NetNS, func(ns.NetNS) error { return fn() })
}

// attach attaches (or re-points, after a restart) the endpoint's two
// programs with pinned tcx links.
func (d *BPF) attach(ep uint32, pod string) error {
	for _, a := range []struct {
		dir  string
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		{"from", d.objs.WagglePolFromPod, ebpf.AttachTCXIngress},
		{"to", d.objs.WagglePolToPod, ebpf.AttachTCXEgress},
	} {
		path := d.linkPath(ep, a.dir)
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			info, ierr := l.Info()
			live := ierr == nil && info.TCX() != nil && info.TCX().Ifindex == ep
			if live {
				err = l.Update(a.prog)
				l.Close()
				if err != nil {
					return fmt.Errorf("endpoint %s: update %s link: %w", pod, a.dir, err)
				}
				continue
			}
			l.Unpin()
			l.Close()
		}
		err := d.inNetNS(func() error {
			l, err := link.AttachTCX(link.TCXOptions{Interface: int(ep), Program: a.prog, Attach: a.at})
			if err != nil {
				return err
			}
			defer l.Close()
			return l.Pin(path)
		})
		if err != nil {
			return fmt.Errorf("endpoint %s: attach tcx %s on ifindex %d: %w", pod, a.dir, ep, err)
		}
	}
	return nil
}

// RemoveEndpoint implements Datapath.
func (d *BPF) RemoveEndpoint(ep uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dir := range []string{"from", "to"} {
		path := d.linkPath(ep, dir)
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			if info, ierr := l.Info(); ierr == nil && info.TCX() != nil && info.TCX().Ifindex == ep {
				_ = l.Detach()
			}
			l.Unpin()
			l.Close()
		} else {
			os.Remove(path)
		}
	}
	if err := d.objs.WagglePolEndpoints.Delete(ep); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete endpoint %d: %w", ep, err)
	}
	for k := range d.cur[ep] {
		if err := d.objs.WagglePolPolicy.Delete(keyToBPF(k)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("endpoint %d: delete policy entry: %w", ep, err)
		}
	}
	delete(d.cur, ep)
	delete(d.stale, ep)
	k := polBPFPolNameKey{Kind: NameEndpoint, Id: ep}
	_ = d.objs.WagglePolNames.Delete(k)
	delete(d.names, k)
	return nil
}

// Endpoints returns the ifindexes the datapath holds state for (to remove
// those of pods gone while no agent ran).
func (d *BPF) Endpoints() []uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]uint32, 0, len(d.cur))
	for ep := range d.cur {
		out = append(out, ep)
	}
	return out
}

// Close releases the file descriptors; pinned state stays and enforcement
// goes on.
func (d *BPF) Close() error { return d.objs.Close() }

// Cleanup removes every pinned policy object under pinDir: links are
// detached first, then maps unpinned. Idempotent.
func Cleanup(pinDir string) error {
	links, _ := os.ReadDir(filepath.Join(pinDir, LinkDir))
	var errs []error
	for _, e := range links {
		p := filepath.Join(pinDir, LinkDir, e.Name())
		if l, err := link.LoadPinnedLink(p, nil); err == nil {
			_ = l.Detach()
			l.Close()
		}
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	os.Remove(filepath.Join(pinDir, LinkDir))
	ents, _ := os.ReadDir(pinDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "waggle_pol_") {
			if err := os.Remove(filepath.Join(pinDir, e.Name())); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	if err := os.Remove(pinDir); err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	// The node's pin directory, when nothing else is pinned there.
	os.Remove(filepath.Dir(pinDir))
	return errors.Join(errs...)
}

// Counters reads the verdict counters (for /metrics).
func (d *BPF) Counters() (Counters, error) {
	cs := Counters{Allowed: map[string][2]uint64{}, Denied: map[string][2]uint64{}, PolicyHits: map[uint32][2]uint64{}}
	d.mu.Lock()
	names := map[uint32]string{}
	for k, n := range d.names {
		if k.Kind == NameEndpoint {
			names[k.Id] = n
		}
	}
	d.mu.Unlock()
	var ep uint32
	var e polBPFPolEndpoint
	it := d.objs.WagglePolEndpoints.Iterate()
	for it.Next(&ep, &e) {
		pod := names[ep]
		if pod == "" {
			continue
		}
		cs.Allowed[pod] = e.Allowed
		cs.Denied[pod] = e.Denied
	}
	if err := it.Err(); err != nil {
		return cs, err
	}
	var k polBPFPolKey
	var v polBPFPolEntry
	it = d.objs.WagglePolPolicy.Iterate()
	for it.Next(&k, &v) {
		h := cs.PolicyHits[v.Policy]
		h[k.Dir&1] += v.Hits
		cs.PolicyHits[v.Policy] = h
	}
	return cs, it.Err()
}
