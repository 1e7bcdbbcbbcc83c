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
		if o := r.old[name]; name == MapServices && o != nil && o.ValueSize() == v1ServiceSize {
			cp = convertServicesV1
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
