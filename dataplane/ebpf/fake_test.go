package ebpf

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
)

// fakeTable is an in-memory table. It applies writes one entry at a time
// and calls check after each, so tests see every intermediate state the
// kernel maps would go through.
type fakeTable[K comparable, V any] struct {
	name string
	m    map[K]V
	max  int
	f    *fakeMaps
	// array: an array map of max+1 entries (keys 0..max): a key beyond
	// is refused, nothing is deleted, and a value that isFree is an
	// unused entry, kept in free (m holds the used ones).
	array  bool
	isFree func(V) bool
	free   map[K]V
}

func (t *fakeTable[K, V]) Put(keys []K, vals []V) error {
	for i, k := range keys {
		if err := t.f.step(); err != nil {
			return err
		}
		if t.array {
			if int(any(k).(uint32)) > t.max {
				return errMapFull(t.name, errors.New("E2BIG"))
			}
			if t.isFree(vals[i]) {
				delete(t.m, k)
				t.free[k] = vals[i]
			} else {
				delete(t.free, k)
				t.m[k] = vals[i]
			}
			t.f.ops++
			t.f.checkNow()
			continue
		}
		if _, ok := t.m[k]; !ok && t.max > 0 && len(t.m) >= t.max {
			return errMapFull(t.name, errors.New("E2BIG"))
		}
		t.m[k] = vals[i]
		t.f.ops++
		t.f.checkNow()
	}
	return nil
}

func (t *fakeTable[K, V]) Delete(keys []K) error {
	if t.array && len(keys) > 0 {
		return fmt.Errorf("map %s: delete: an array entry cannot be deleted", t.name)
	}
	for _, k := range keys {
		if err := t.f.step(); err != nil {
			return err
		}
		delete(t.m, k)
		t.f.ops++
		t.f.checkNow()
	}
	return nil
}

func (t *fakeTable[K, V]) Iterate(fn func(K, V) bool) error {
	for _, k := range slices.Collect(maps.Keys(t.m)) {
		if !fn(k, t.m[k]) {
			return nil
		}
	}
	for _, k := range slices.Collect(maps.Keys(t.free)) {
		if !fn(k, t.free[k]) {
			return nil
		}
	}
	return nil
}

// fakeMaps is a set of fake tables with an invariant check and fault
// injection (the Cilium fake-and-faulty LB map idea).
type fakeMaps struct {
	services *fakeTable[sockLBLbServiceKey, sockLBLbService]
	backends *fakeTable[uint32, sockLBLbBackend]
	revNat   *fakeTable[uint32, sockLBLbRevNat]
	names    *fakeTable[uint32, sockLBLbSvcName]
	affinity *fakeTable[sockLBLbAffinityKey, sockLBLbAffinity]
	ops      int
	// failAt makes the failAt-th operation from now fail (0: never).
	failAt int
	// check, when set, runs after every single entry written or deleted.
	check func()
}

var errInjected = errors.New("injected fault")

func (f *fakeMaps) step() error {
	if f.failAt > 0 {
		f.failAt--
		if f.failAt == 0 {
			return errInjected
		}
	}
	return nil
}

func (f *fakeMaps) checkNow() {
	if f.check != nil {
		f.check()
	}
}

func newFakeMaps(maxServices, maxBackends int) *fakeMaps {
	f := &fakeMaps{}
	f.services = &fakeTable[sockLBLbServiceKey, sockLBLbService]{name: MapServices, m: map[sockLBLbServiceKey]sockLBLbService{}, max: maxServices, f: f}
	f.backends = &fakeTable[uint32, sockLBLbBackend]{name: MapBackends, m: map[uint32]sockLBLbBackend{}, max: maxBackends, f: f,
		array: true, isFree: func(v sockLBLbBackend) bool { return v.Proto == 0 }, free: map[uint32]sockLBLbBackend{}}
	f.revNat = &fakeTable[uint32, sockLBLbRevNat]{name: MapRevNat, m: map[uint32]sockLBLbRevNat{}, max: maxServices, f: f}
	f.names = &fakeTable[uint32, sockLBLbSvcName]{name: MapServiceNames, m: map[uint32]sockLBLbSvcName{}, max: maxServices, f: f}
	f.affinity = &fakeTable[sockLBLbAffinityKey, sockLBLbAffinity]{name: MapAffinity, m: map[sockLBLbAffinityKey]sockLBLbAffinity{}, max: 0, f: f}
	return f
}

func (f *fakeMaps) tables() tables {
	return tables{services: f.services, backends: f.backends, revNat: f.revNat, names: f.names, affinity: f.affinity}
}

// consistent reports the first violation of what the programs rely on:
// every master entry's slots 1..count (its own when count ≤ inlineBackends,
// else slot entries) exist and name a backend that exists, an inline
// master's unused IDs are 0, and the rev_nat entry of its ID names the
// frontend.
func consistent(t tables) error {
	svc := map[sockLBLbServiceKey]sockLBLbService{}
	be := map[uint32]bool{}
	rev := map[uint32]sockLBLbRevNat{}
	t.services.Iterate(func(k sockLBLbServiceKey, v sockLBLbService) bool { svc[k] = v; return true })
	t.backends.Iterate(func(k uint32, v sockLBLbBackend) bool { be[k] = v.Proto != 0; return true })
	t.revNat.Iterate(func(k uint32, v sockLBLbRevNat) bool { rev[k] = v; return true })
	for k, v := range svc {
		if k.Slot != 0 {
			continue
		}
		fk := frontendOf(k)
		if r, ok := rev[v.RevNatId]; !ok || r != revNatValue(fk) {
			return fmt.Errorf("%s: rev_nat %d missing or wrong", fk, v.RevNatId)
		}
		if int(v.Count) <= inlineBackends {
			for i, id := range v.Backends {
				if i < int(v.Count) && !be[id] {
					return fmt.Errorf("%s: inline slot %d names missing backend %d", fk, i+1, id)
				}
				if i >= int(v.Count) && id != 0 {
					return fmt.Errorf("%s: inline slot %d beyond count %d names backend %d", fk, i+1, v.Count, id)
				}
			}
			continue
		}
		if v.Backends != ([inlineBackends]uint32{}) {
			return fmt.Errorf("%s: count %d > %d with inline backends %v", fk, v.Count, inlineBackends, v.Backends)
		}
		for s := uint16(1); s <= v.Count; s++ {
			sk := k
			sk.Slot = s
			slot, ok := svc[sk]
			if !ok {
				return fmt.Errorf("%s: count %d but slot %d missing", fk, v.Count, s)
			}
			if !be[slot.BackendId] {
				return fmt.Errorf("%s: slot %d names missing backend %d", fk, s, slot.BackendId)
			}
		}
	}
	return nil
}

// dumpTables renders the maps canonically (sorted, decoded), the format
// of the golden files. Real maps and fakes render alike.
func dumpTables(t tables) string {
	var b strings.Builder
	type svcLine struct {
		k sockLBLbServiceKey
		v sockLBLbService
	}
	var svcs []svcLine
	t.services.Iterate(func(k sockLBLbServiceKey, v sockLBLbService) bool { svcs = append(svcs, svcLine{k, v}); return true })
	slices.SortFunc(svcs, func(a, b svcLine) int {
		return cmp.Or(frontendOf(a.k).Compare(frontendOf(b.k)), cmp.Compare(a.k.Slot, b.k.Slot))
	})
	fmt.Fprintf(&b, "# %s: frontend slot -> backend_id count flags rev_nat_id affinity_timeout [inline backend IDs]\n", MapServices)
	for _, s := range svcs {
		fmt.Fprintf(&b, "%s %d -> %d %d %#x %d %d", frontendOf(s.k), s.k.Slot, s.v.BackendId, s.v.Count, s.v.Flags, s.v.RevNatId, s.v.AffinityTimeout)
		if n := slices.IndexFunc(s.v.Backends[:], func(id uint32) bool { return id == 0 }); n != 0 {
			if n < 0 {
				n = inlineBackends
			}
			fmt.Fprintf(&b, " %v", s.v.Backends[:n])
		}
		b.WriteByte('\n')
	}
	dumpIDs(&b, MapBackends+": id -> backend", t.backends, func(v sockLBLbBackend) string {
		if v.Proto == 0 {
			return "" // unused: not shown
		}
		return backendKeyOf(v).String()
	})
	dumpIDs(&b, MapRevNat+": id -> frontend", t.revNat, func(v sockLBLbRevNat) string {
		return fmt.Sprintf("%s/%s", netip.AddrPortFrom(addrFrom16(v.Addr), fromNet16(v.Port)), protoName(v.Proto))
	})
	dumpIDs(&b, MapServiceNames+": id -> kind name", t.names, func(v sockLBLbSvcName) string {
		k, n := nameOf(v)
		return string(k) + " " + n
	})
	return b.String()
}

func dumpIDs[V any](b *strings.Builder, title string, t table[uint32, V], f func(V) string) {
	var ids []uint32
	vals := map[uint32]V{}
	t.Iterate(func(k uint32, v V) bool { ids = append(ids, k); vals[k] = v; return true })
	slices.Sort(ids)
	fmt.Fprintf(b, "# %s\n", title)
	for _, id := range ids {
		if s := f(vals[id]); s != "" {
			fmt.Fprintf(b, "%d -> %s\n", id, s)
		}
	}
}

// failingTable fails the Put that brings *left to zero.
type failingTable[K comparable, V any] struct {
	table[K, V]
	left *atomic.Int32
}

func (t failingTable[K, V]) Put(keys []K, vals []V) error {
	if t.left.Add(-1) == 0 {
		return errInjected
	}
	return t.table.Put(keys, vals)
}
