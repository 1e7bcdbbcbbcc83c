package ebpf

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/waggle-io/waggle/dataplane"
)

// View reads a node's pinned dataplane state, read-only, without a running
// proxy: what `waggle bpf` prints. Open it with OpenPinned.
type View struct {
	dir  string
	maps map[string]*ebpf.Map
	// own: maps opened by OpenPinned (closed by Close).
	own bool
}

var mapNames = []string{MapServices, MapBackends, MapRevNat, MapServiceNames, MapReverseSockets, MapAffinity, MapMeta, MapStats}

// OpenPinned opens the pinned state in dir (e.g. /sys/fs/bpf/waggle/<node>).
// It fails with ErrNoPinnedState when there is none and ErrLayoutMismatch
// when another Waggle version wrote it.
func OpenPinned(dir string) (*View, error) {
	if _, err := os.Stat(filepath.Join(dir, MapMeta)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", dir, ErrNoPinnedState)
		}
		return nil, fmt.Errorf("open pinned state: %w", err)
	}
	v := &View{dir: dir, maps: map[string]*ebpf.Map{}, own: true}
	for _, name := range mapNames {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			v.Close()
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		v.maps[name] = m
	}
	if _, err := checkMeta(v.maps[MapMeta], dir); err != nil {
		v.Close()
		return nil, err
	}
	if err := v.checkSizes(); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}

// checkSizes compares key and value sizes with this version's layout.
func (v *View) checkSizes() error {
	spec, err := loadSockLB()
	if err != nil {
		return err
	}
	for _, name := range mapNames {
		s, m := spec.Maps[name], v.maps[name]
		if s.KeySize != m.KeySize() || s.ValueSize != m.ValueSize() || s.Type != m.Type() {
			return fmt.Errorf("map %s is %s %d/%d bytes, this Waggle expects %s %d/%d: %w",
				name, m.Type(), m.KeySize(), m.ValueSize(), s.Type, s.KeySize, s.ValueSize, ErrLayoutMismatch)
		}
	}
	return nil
}

// Close releases the maps.
func (v *View) Close() error {
	if !v.own {
		return nil
	}
	for _, m := range v.maps {
		m.Close()
	}
	return nil
}

// Dir is the pin directory.
func (v *View) Dir() string { return v.dir }

// Meta returns the meta record.
func (v *View) Meta() (Meta, error) {
	var m sockLBLbMeta
	if err := v.maps[MapMeta].Lookup(uint32(0), &m); err != nil {
		return Meta{}, fmt.Errorf("read %s: %w", MapMeta, err)
	}
	return Meta{Magic: m.Magic, LayoutVersion: m.LayoutVersion, Created: time.Unix(int64(m.CreatedUnix), 0).UTC()}, nil
}

func iterate[K, V any](m *ebpf.Map, name string, fn func(K, V)) error {
	var k K
	var val V
	it := m.Iterate()
	for it.Next(&k, &val) {
		fn(k, val)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	return nil
}

// Backends returns the backends map, by ID.
func (v *View) Backends() ([]BackendEntry, error) {
	var out []BackendEntry
	err := arrayTable[sockLBLbBackend]{mapTable[uint32, sockLBLbBackend]{MapBackends, v.maps[MapBackends]}}.Iterate(func(id uint32, b sockLBLbBackend) bool {
		if b.Proto != 0 { // else the ID is unused
			k := backendKeyOf(b)
			out = append(out, BackendEntry{ID: id, Backend: k.addrPort(), Protocol: protoName(k.proto), Terminating: k.terminating, Gen: b.Gen})
		}
		return true
	})
	slices.SortFunc(out, func(a, b BackendEntry) int { return cmp.Compare(a.ID, b.ID) })
	return out, err
}

// Services returns every frontend with its slots, decoded, sorted by
// frontend. A master entry whose slots are missing shows those slots with a
// zero BackendID; a slot whose backend is missing an invalid Backend.
func (v *View) Services() ([]Service, error) {
	backends := map[uint32]BackendEntry{}
	bes, err := v.Backends()
	if err != nil {
		return nil, err
	}
	for _, b := range bes {
		backends[b.ID] = b
	}
	names := map[uint32]sockLBLbSvcName{}
	if err := iterate(v.maps[MapServiceNames], MapServiceNames, func(id uint32, n sockLBLbSvcName) { names[id] = n }); err != nil {
		return nil, err
	}
	byKey := map[sockLBLbServiceKey]*Service{}
	slots := map[sockLBLbServiceKey][]Slot{}
	err = iterate(v.maps[MapServices], MapServices, func(k sockLBLbServiceKey, s sockLBLbService) {
		mk := k
		mk.Slot = 0
		if k.Slot == 0 {
			svc := &Service{ID: s.RevNatId, Frontend: frontendOf(k), Count: int(s.Count), Flags: s.Flags,
				AffinityTimeout: time.Duration(s.AffinityTimeout) * time.Second}
			svc.Address = svc.Frontend.String()
			svc.Kind, svc.Name = nameOf(names[s.RevNatId])
			if svc.Count <= inlineBackends {
				svc.Slots = inlineSlots(s, backends)
			}
			byKey[mk] = svc
			return
		}
		be := backends[s.BackendId]
		slots[mk] = append(slots[mk], Slot{Slot: int(k.Slot), BackendID: s.BackendId, Backend: be.Backend, Terminating: be.Terminating})
	})
	if err != nil {
		return nil, err
	}
	out := make([]Service, 0, len(byKey))
	for k, svc := range byKey {
		// An inline master's slot entries (left over) are unreachable.
		if svc.Count > inlineBackends {
			ss := slots[k]
			slices.SortFunc(ss, func(a, b Slot) int { return cmp.Compare(a.Slot, b.Slot) })
			svc.Slots = ss
		}
		out = append(out, *svc)
	}
	slices.SortFunc(out, func(a, b Service) int { return a.Frontend.Compare(b.Frontend) })
	return out, nil
}

// Affinity returns the affinity LRU's entries.
func (v *View) Affinity() ([]AffinityEntry, error) {
	var out []AffinityEntry
	err := iterate(v.maps[MapAffinity], MapAffinity, func(k sockLBLbAffinityKey, a sockLBLbAffinity) {
		out = append(out, AffinityEntry{NetnsCookie: k.NetnsCookie, ServiceID: k.RevNatId, BackendID: a.BackendId,
			BackendGen: a.BackendGen, LastUsed: time.Duration(a.LastUsedNs)})
	})
	slices.SortFunc(out, func(a, b AffinityEntry) int {
		return cmp.Or(cmp.Compare(a.ServiceID, b.ServiceID), cmp.Compare(a.NetnsCookie, b.NetnsCookie))
	})
	return out, err
}

// ReverseSockets returns the reverse-socket LRU's entries.
func (v *View) ReverseSockets() ([]ReverseSocketEntry, error) {
	var out []ReverseSocketEntry
	err := iterate(v.maps[MapReverseSockets], MapReverseSockets, func(k sockLBLbReverseSkKey, r sockLBLbReverseSk) {
		out = append(out, ReverseSocketEntry{Cookie: k.Cookie,
			Backend:  netip.AddrPortFrom(addrFrom16(k.Addr), fromNet16(k.Port)),
			Frontend: netip.AddrPortFrom(addrFrom16(r.Addr), fromNet16(r.Port)), ServiceID: r.RevNatId})
	})
	slices.SortFunc(out, func(a, b ReverseSocketEntry) int {
		return cmp.Or(cmp.Compare(a.Cookie, b.Cookie), a.Backend.Compare(b.Backend))
	})
	return out, err
}

// Counters returns the programs' event counters, summed over CPUs.
func (v *View) Counters() (map[Stat]uint64, error) { return readCounters(v.maps[MapStats]) }

func readCounters(m *ebpf.Map) (map[Stat]uint64, error) {
	out := map[Stat]uint64{}
	for _, s := range Stats() {
		var per []uint64
		if err := m.Lookup(uint32(s), &per); err != nil {
			return nil, fmt.Errorf("read %s: %w", MapStats, err)
		}
		for _, n := range per {
			out[s] += n
		}
	}
	return out, nil
}

func countEntries(m *ebpf.Map) (int, error) {
	if m.Type() == ebpf.Array || m.Type() == ebpf.PerCPUArray {
		return int(m.MaxEntries()), nil
	}
	key := make([]byte, m.KeySize())
	next := make([]byte, m.KeySize())
	n := 0
	var prev any // nil: first key
	for {
		err := m.NextKey(prev, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n++
		copy(key, next)
		prev = key
	}
}

// Maps describes every pinned map with its exact entry count.
func (v *View) Maps() ([]MapInfo, error) {
	out := make([]MapInfo, 0, len(mapNames))
	for _, name := range mapNames {
		m := v.maps[name]
		n, err := countEntries(m)
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", name, err)
		}
		maxEntries := int(m.MaxEntries())
		if name == MapBackends { // the used IDs of 1..--bpf-lb-backends-max
			bes, err := v.Backends()
			if err != nil {
				return nil, err
			}
			n, maxEntries = len(bes), maxEntries-1
		}
		out = append(out, MapInfo{Name: name, Type: m.Type().String(), KeySize: int(m.KeySize()),
			ValueSize: int(m.ValueSize()), Entries: n, MaxEntries: maxEntries,
			Path: filepath.Join(v.dir, name)})
	}
	return out, nil
}

// RawEntries returns a map's raw keys and values (as bpftool's hex dump).
func (v *View) RawEntries(name string) (keys, values [][]byte, err error) {
	m := v.maps[name]
	if m == nil {
		return nil, nil, fmt.Errorf("no map %q (maps: %s): %w", name, strings.Join(mapNames, ", "), os.ErrNotExist)
	}
	if m.Type() == ebpf.PerCPUArray {
		return nil, nil, fmt.Errorf("map %s is per-CPU: use Counters", name)
	}
	var k, val []byte
	it := m.Iterate()
	for it.Next(&k, &val) {
		if name == MapBackends && val[unsafe.Offsetof(sockLBLbBackend{}.Proto)] == 0 {
			continue // a free ID (lb_backend.proto 0)
		}
		keys, values = append(keys, slices.Clone(k)), append(values, slices.Clone(val))
	}
	return keys, values, it.Err()
}

// Programs lists the programs attached through the pinned links, with the
// kernel's run statistics (non-zero only while kernel.bpf_stats_enabled=1).
func (v *View) Programs() ([]ProgramInfo, error) { return listPrograms(v.dir) }

func listPrograms(dir string) ([]ProgramInfo, error) {
	paths, err := filepath.Glob(filepath.Join(dir, LinkDir, "*"))
	if err != nil {
		return nil, err
	}
	slices.Sort(paths)
	var out []ProgramInfo
	for _, p := range paths {
		l, err := link.LoadPinnedLink(p, nil)
		if err != nil {
			return nil, fmt.Errorf("open pinned link %s: %w", p, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			return nil, fmt.Errorf("link %s info: %w", p, err)
		}
		pi := ProgramInfo{Name: filepath.Base(p), LinkID: uint32(info.ID), ProgramID: uint32(info.Program), LinkPath: p}
		if cg := info.Cgroup(); cg != nil {
			pi.CgroupID = cg.CgroupId
			pi.AttachType = ebpf.AttachType(cg.AttachType).String()
		}
		prog, err := ebpf.NewProgramFromID(info.Program)
		if err == nil {
			if pinfo, err := prog.Info(); err == nil {
				pi.Type = pinfo.Type.String()
				if lt, ok := pinfo.LoadTime(); ok {
					pi.Loaded = lt
				}
			}
			if st, err := prog.Stats(); err == nil {
				pi.Runs, pi.RunTime = st.RunCount, st.Runtime
			}
			prog.Close()
		}
		out = append(out, pi)
	}
	return out, nil
}

// Backend side of the metrics.

func (b *Backend) mapCounts() ([]MapPressure, error) {
	b.mu.Lock()
	fronts, entries, backends := len(b.rec.fronts), b.rec.entries(), len(b.rec.beIDs)
	b.mu.Unlock()
	out := []MapPressure{
		{MapServices, entries, b.cfg.MaxServices},
		{MapBackends, backends, b.cfg.MaxBackends},
		{MapRevNat, fronts, b.cfg.MaxServices},
		{MapServiceNames, fronts, b.cfg.MaxServices},
	}
	for _, x := range []struct {
		name string
		m    *ebpf.Map
	}{{MapReverseSockets, b.objs.WaggleReverseSk}, {MapAffinity, b.objs.WaggleAffinity}} {
		n, err := countEntries(x.m)
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", x.name, err)
		}
		out = append(out, MapPressure{x.name, n, int(x.m.MaxEntries())})
	}
	return out, nil
}

func (b *Backend) programStats() (map[Stat]uint64, []ProgramRuns, error) {
	c, err := readCounters(b.objs.WaggleStats)
	if err != nil {
		return nil, nil, err
	}
	var runs []ProgramRuns
	for _, p := range progAttach(b.objs) {
		if st, err := p.prog.Stats(); err == nil {
			runs = append(runs, ProgramRuns{Name: p.name, Runs: st.RunCount, RunTime: st.Runtime})
		}
	}
	return c, runs, nil
}

// View returns a read-only view on the backend's own maps (valid until
// Close).
func (b *Backend) View() *View {
	o := b.objs
	return &View{dir: b.cfg.PinDir, maps: map[string]*ebpf.Map{
		MapServices: o.WaggleServices, MapBackends: o.WaggleBackends, MapRevNat: o.WaggleRevNat,
		MapServiceNames: o.WaggleSvcNames, MapReverseSockets: o.WaggleReverseSk, MapAffinity: o.WaggleAffinity,
		MapMeta: o.WaggleMeta, MapStats: o.WaggleStats,
	}}
}

// Explain replays the connect hook's decision for frontend k, for a client
// in the network namespace with cookie netnsCookie (0: unknown, affinity is
// then described, not applied), at CLOCK_MONOTONIC time now.
func (v *View) Explain(k dataplane.FrontendKey, netnsCookie uint64, now time.Duration) (Explanation, error) {
	ex := Explanation{Frontend: k.String()}
	svcs, err := v.Services()
	if err != nil {
		return ex, err
	}
	var svc *Service
	for i := range svcs {
		if svcs[i].Frontend == k {
			svc = &svcs[i]
		}
	}
	if svc == nil {
		ex.Verdict, ex.Reason = "passthrough", "no services-map entry for this address, port and protocol: the connect is not translated"
		return ex, nil
	}
	ex.Service = svc
	if svc.Count == 0 {
		ex.Verdict, ex.Reason = "refused", "the service has no backends: connect() and sendto() fail with ECONNREFUSED"
		return ex, nil
	}
	for _, s := range svc.Slots {
		if s.Slot <= svc.Count {
			ex.Candidates = append(ex.Candidates, s)
		}
	}
	if svc.Flags&FlagAffinity != 0 && netnsCookie != 0 {
		var a sockLBLbAffinity
		key := sockLBLbAffinityKey{NetnsCookie: netnsCookie, RevNatId: svc.ID}
		if err := v.maps[MapAffinity].Lookup(&key, &a); err == nil &&
			now-time.Duration(a.LastUsedNs) <= svc.AffinityTimeout {
			for _, s := range svc.Slots {
				if s.BackendID == a.BackendId {
					ex.Verdict, ex.Candidates = "affinity", []Slot{s}
					ex.Reason = fmt.Sprintf("ClientIP affinity: this client's entry (last used %s ago) names backend %d",
						(now - time.Duration(a.LastUsedNs)).Round(time.Millisecond), a.BackendId)
					return ex, nil
				}
			}
		}
	}
	if k.Protocol == dataplane.UDP {
		ex.Verdict = "per-socket"
		ex.Reason = fmt.Sprintf("UDP: slot 1..%d chosen from the socket cookie; one socket keeps one backend", svc.Count)
	} else {
		ex.Verdict = "random"
		ex.Reason = fmt.Sprintf("TCP: slot 1..%d chosen at random per connect", svc.Count)
	}
	if svc.Flags&FlagAffinity != 0 {
		ex.Reason += fmt.Sprintf("; with ClientIP affinity (%s) the choice then sticks for the client's network namespace", svc.AffinityTimeout)
	}
	return ex, nil
}

// Frontend reads one frontend's master entry, slots and backends by key
// (a handful of lookups, whatever the maps hold). ok is false when the
// frontend has no master entry.
func (v *View) Frontend(k dataplane.FrontendKey) (svc Service, ok bool, err error) {
	var m sockLBLbService
	if err := v.maps[MapServices].Lookup(serviceKey(k, 0), &m); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return svc, false, nil
		}
		return svc, false, fmt.Errorf("look up %s in %s: %w", k, MapServices, err)
	}
	svc = Service{ID: m.RevNatId, Frontend: k, Address: k.String(), Count: int(m.Count), Flags: m.Flags,
		AffinityTimeout: time.Duration(m.AffinityTimeout) * time.Second}
	if svc.Count <= inlineBackends {
		bes := map[uint32]BackendEntry{}
		for _, id := range m.Backends[:svc.Count] {
			var b sockLBLbBackend
			if err := v.maps[MapBackends].Lookup(id, &b); err == nil && b.Proto != 0 {
				bk := backendKeyOf(b)
				bes[id] = BackendEntry{ID: id, Backend: bk.addrPort(), Protocol: protoName(bk.proto), Terminating: bk.terminating}
			}
		}
		svc.Slots = inlineSlots(m, bes)
		return svc, true, nil
	}
	for i := 1; i <= int(m.Count); i++ {
		var s sockLBLbService
		slot := Slot{Slot: i}
		if err := v.maps[MapServices].Lookup(serviceKey(k, uint16(i)), &s); err == nil {
			slot.BackendID = s.BackendId
			var b sockLBLbBackend
			if err := v.maps[MapBackends].Lookup(s.BackendId, &b); err == nil && b.Proto != 0 {
				bk := backendKeyOf(b)
				slot.Backend, slot.Terminating = bk.addrPort(), bk.terminating
			}
		}
		svc.Slots = append(svc.Slots, slot)
	}
	return svc, true, nil
}

// inlineSlots decodes the slots a master entry holds itself; an ID the
// backends map lacks gives an invalid Backend, a zero ID a missing slot.
func inlineSlots(m sockLBLbService, backends map[uint32]BackendEntry) []Slot {
	out := make([]Slot, 0, m.Count)
	for i, id := range m.Backends[:min(int(m.Count), inlineBackends)] {
		if id == 0 {
			continue // as a missing slot entry
		}
		be := backends[id]
		out = append(out, Slot{Slot: i + 1, BackendID: id, Backend: be.Backend, Terminating: be.Terminating})
	}
	return out
}
