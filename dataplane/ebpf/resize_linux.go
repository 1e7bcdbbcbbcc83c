package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
)

// resize is a map-size change in progress: new maps filled from the
// pinned ones, to be pinned in their place once the programs use them.
type resize struct {
	dir   string
	names []string
	old   map[string]*ebpf.Map
	fresh map[string]*ebpf.Map
}

// copyOrder writes backends before the slots naming them, and slots before
// master entries, as Sync does (the new maps are not live yet, but a
// half-copied set never is either).
var copyOrder = []string{MapMeta, MapBackends, MapRevNat, MapServiceNames, MapServices, MapAffinity, MapReverseSockets, MapStats}

// loadResized loads the objects with fresh, unpinned maps of the configured
// sizes, filled with the pinned maps' entries. Only sizes may differ: a
// different type or key/value size is another layout — except the services
// map of layout 1 (layout is what checkPinnedMeta found), whose entries are
// converted (convertServicesV1); writeMeta then stamps this layout.
func loadResized(spec *ebpf.CollectionSpec, cfg Config, layout uint32) (*sockLBObjects, *resize, error) {
	r := &resize{dir: cfg.PinDir, old: map[string]*ebpf.Map{}, fresh: map[string]*ebpf.Map{}}
	closeOld := func() {
		for _, m := range r.old {
			m.Close()
		}
	}
	for name, ms := range spec.Maps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(cfg.PinDir, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			closeOld()
			return nil, nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		r.old[name] = m
		if layout == 1 && name == MapServices && m.Type() == ms.Type && m.KeySize() == ms.KeySize && m.ValueSize() == v1ServiceSize {
			r.names = append(r.names, name)
			continue
		}
		if layout != 0 && layout < 3 && (name == MapBackends && m.Type() == ebpf.Hash && m.KeySize() == 4 &&
			m.ValueSize() == v2BackendSize || name == MapAffinity) {
			r.names = append(r.names, name) // converted below
			continue
		}
		if m.Type() != ms.Type || m.KeySize() != ms.KeySize || m.ValueSize() != ms.ValueSize {
			closeOld()
			return nil, nil, fmt.Errorf("pinned map %s is %s %d/%d bytes, this Waggle uses %s %d/%d: %w",
				name, m.Type(), m.KeySize(), m.ValueSize(), ms.Type, ms.KeySize, ms.ValueSize, ErrLayoutMismatch)
		}
		if m.MaxEntries() != ms.MaxEntries {
			r.names = append(r.names, name)
		}
	}
	fresh := spec.Copy()
	for _, ms := range fresh.Maps {
		ms.Pinning = ebpf.PinNone
	}
	objs := &sockLBObjects{}
	if err := fresh.LoadAndAssign(objs, nil); err != nil {
		closeOld()
		return nil, nil, fmt.Errorf("load eBPF objects with resized maps: %w", err)
	}
	r.fresh = map[string]*ebpf.Map{
		MapServices: objs.WaggleServices, MapBackends: objs.WaggleBackends, MapRevNat: objs.WaggleRevNat,
		MapServiceNames: objs.WaggleSvcNames, MapReverseSockets: objs.WaggleReverseSk, MapAffinity: objs.WaggleAffinity,
		MapMeta: objs.WaggleMeta, MapStats: objs.WaggleStats,
	}
	for _, name := range copyOrder {
		cp := copyMap
		switch o := r.old[name]; {
		case name == MapServices && o != nil && o.ValueSize() == v1ServiceSize:
			cp = convertServicesV1
		case name == MapBackends && o != nil && o.Type() == ebpf.Hash:
			cp = convertBackendsV2
		case name == MapBackends:
			cp = copyBackends
		case name == MapAffinity && layout != 0 && layout < 3:
			cp = convertAffinityV2
		}
		if err := cp(r.old[name], r.fresh[name], name); err != nil {
			objs.Close()
			closeOld()
			return nil, nil, err
		}
	}
	slices.Sort(r.names)
	return objs, r, nil
}

// v1ServiceSize is lb_service's size in layout 1 (no inline backends).
const v1ServiceSize = 16

// v2BackendSize is lb_backend's size in layouts 1 and 2 (no generation),
// when the backends map was a hash map.
const v2BackendSize = 20

// convertBackendsV2 copies a hash backends map of layout 1 or 2 into this
// layout's array: each backend at the index of its ID, generation 1.
func convertBackendsV2(from, to *ebpf.Map, name string) error {
	var id uint32
	var raw [v2BackendSize]byte
	var ids []uint32
	var vals []sockLBLbBackend
	it := from.Iterate()
	for it.Next(&id, &raw) {
		v := sockLBLbBackend{Port: uint16(raw[16]) | uint16(raw[17])<<8, Proto: raw[18], Flags: raw[19], Gen: 1}
		copy(v.Addr[:], raw[:16])
		ids, vals = append(ids, id), append(vals, v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pinned map %s: %w", name, err)
	}
	return putBackends(to, name, ids, vals)
}

// copyBackends copies the backends array into one of another size. An ID
// beyond the new size must be unused (an ID cannot move: entries name it).
func copyBackends(from, to *ebpf.Map, name string) error {
	if from == nil {
		return nil
	}
	var ids []uint32
	var vals []sockLBLbBackend
	err := arrayTable[sockLBLbBackend]{mapTable[uint32, sockLBLbBackend]{name, from}}.Iterate(func(id uint32, v sockLBLbBackend) bool {
		if v.Proto != 0 || v.Gen != 0 && id < to.MaxEntries() {
			ids, vals = append(ids, id), append(vals, v)
		}
		return true
	})
	if err != nil {
		return err
	}
	return putBackends(to, name, ids, vals)
}

func putBackends(to *ebpf.Map, name string, ids []uint32, vals []sockLBLbBackend) error {
	for _, id := range ids {
		if id >= to.MaxEntries() {
			return fmt.Errorf("map %s holds backend ID %d, beyond the new size %d: %w", name, id, to.MaxEntries()-1, errMapFull(name, errE2BIG))
		}
	}
	if err := (mapTable[uint32, sockLBLbBackend]{name, to}).Put(ids, vals); err != nil {
		return fmt.Errorf("copy map %s: %w", name, err)
	}
	return nil
}

// convertAffinityV2 copies the affinity LRU of layout 1 or 2, whose entries
// name no backend generation, giving them generation 1: that of every
// backend convertBackendsV2 wrote.
func convertAffinityV2(from, to *ebpf.Map, name string) error {
	if from == nil {
		return nil
	}
	var k sockLBLbAffinityKey
	var v sockLBLbAffinity
	it := from.Iterate()
	for it.Next(&k, &v) {
		v.BackendGen = 1
		to.Update(&k, &v, ebpf.UpdateAny) // an LRU: never full
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pinned map %s: %w", name, err)
	}
	return nil
}

// stampNPAffinityGen gives the pinned north-south affinity entries of
// layout 1 or 2 generation 1, as convertAffinityV2 does for the socket
// LB's: they are kept in place (the north-south maps have a layout of
// their own), converted before the new programs read them. An entry the
// old programs write meanwhile keeps 0, and its client chooses again.
func stampNPAffinityGen(dir string) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, MapNPAffinity), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer m.Close()
	var k nodePortNpAffinityKey
	var v nodePortNpAffinity
	var keys []nodePortNpAffinityKey
	var vals []nodePortNpAffinity
	it := m.Iterate()
	for it.Next(&k, &v) {
		if v.BackendGen == 0 {
			v.BackendGen = 1
			keys, vals = append(keys, k), append(vals, v)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for i := range keys {
		m.Update(&keys[i], &vals[i], ebpf.UpdateExist) // gone meanwhile: fine
	}
	return nil
}

// convertServicesV1 copies a layout-1 services map (a master entry and one
// slot entry per backend for every frontend) into this layout's: a master
// of at most inlineBackends backends takes their IDs inline (a missing slot
// stays 0, refused as before) and its slot entries are dropped; larger
// frontends keep their slot entries. Slots are written before masters.
func convertServicesV1(from, to *ebpf.Map, name string) error {
	type v1 struct {
		BackendID       uint32
		Count           uint16
		Flags           uint16
		RevNatID        uint32
		AffinityTimeout uint32
	}
	var k sockLBLbServiceKey
	var v v1
	masters := map[sockLBLbServiceKey]sockLBLbService{}
	slots := map[sockLBLbServiceKey]sockLBLbService{}
	it := from.Iterate()
	for it.Next(&k, &v) {
		nv := sockLBLbService{BackendId: v.BackendID, Count: v.Count, Flags: v.Flags, RevNatId: v.RevNatID, AffinityTimeout: v.AffinityTimeout}
		if k.Slot == 0 {
			masters[k] = nv
		} else {
			slots[k] = nv
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pinned map %s: %w", name, err)
	}
	for mk, m := range masters {
		if int(m.Count) > inlineBackends {
			continue
		}
		for i := range int(m.Count) {
			sk := mk
			sk.Slot = uint16(i + 1)
			m.Backends[i] = slots[sk].BackendId // 0 when missing
		}
		masters[mk] = m
	}
	var keys []sockLBLbServiceKey
	var vals []sockLBLbService
	for sk, s := range slots {
		mk := sk
		mk.Slot = 0
		if m, ok := masters[mk]; ok && int(m.Count) <= inlineBackends {
			continue // now inline (or beyond an inline count: unreachable)
		}
		keys, vals = append(keys, sk), append(vals, s)
	}
	for mk, m := range masters {
		keys, vals = append(keys, mk), append(vals, m)
	}
	if len(keys) > int(to.MaxEntries()) {
		return fmt.Errorf("map %s holds %d entries, more than the new size %d: %w", name, len(keys), to.MaxEntries(), errMapFull(name, errE2BIG))
	}
	for i := range keys {
		if err := to.Update(&keys[i], &vals[i], ebpf.UpdateAny); err != nil {
			return fmt.Errorf("convert map %s: %w", name, err)
		}
	}
	return nil
}

// copyMap copies every entry of from (nil: nothing) into to.
func copyMap(from, to *ebpf.Map, name string) error {
	if from == nil {
		return nil
	}
	if from.Type() == ebpf.PerCPUArray {
		for i := range min(from.MaxEntries(), to.MaxEntries()) {
			var v []uint64
			if err := from.Lookup(i, &v); err == nil {
				to.Update(i, v, ebpf.UpdateAny)
			}
		}
		return nil
	}
	var keys, vals [][]byte
	var k, v []byte
	it := from.Iterate()
	for it.Next(&k, &v) {
		keys, vals = append(keys, slices.Clone(k)), append(vals, slices.Clone(v))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pinned map %s: %w", name, err)
	}
	if name == MapServices { // slots first, masters last
		var sk, sv, mk, mv [][]byte
		for i, key := range keys {
			if key[18] == 0 && key[19] == 0 {
				mk, mv = append(mk, key), append(mv, vals[i])
			} else {
				sk, sv = append(sk, key), append(sv, vals[i])
			}
		}
		keys, vals = append(sk, mk...), append(sv, mv...)
	}
	lru := from.Type() == ebpf.LRUHash
	if !lru && len(keys) > int(to.MaxEntries()) {
		return fmt.Errorf("map %s holds %d entries, more than the new size %d: %w", name, len(keys), to.MaxEntries(), errMapFull(name, errE2BIG))
	}
	for i := range keys {
		if err := to.Update(keys[i], vals[i], ebpf.UpdateAny); err != nil && !lru {
			return fmt.Errorf("copy map %s: %w", name, err)
		}
	}
	return nil
}

// repin puts the new maps at the pinned paths. Called once the programs
// (through their links) use the new maps.
func (r *resize) repin() error {
	for name, m := range r.fresh {
		path := filepath.Join(r.dir, name)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpin old map %s: %w", name, err)
		}
		if err := m.Pin(path); err != nil {
			return fmt.Errorf("pin resized map %s: %w", name, err)
		}
	}
	for _, m := range r.old {
		m.Close()
	}
	return nil
}
