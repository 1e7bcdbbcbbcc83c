package ebpf

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/waggle-io/waggle/dataplane"
)

// table is one BPF map as the reconciler sees it: the real implementation
// wraps an *ebpf.Map (batched syscalls), the fake in tests is a Go map that
// records every operation.
type table[K comparable, V any] interface {
	// Put writes the entries in order.
	Put(keys []K, vals []V) error
	// Delete removes the keys; a missing key is not an error.
	Delete(keys []K) error
	// Iterate calls fn for every entry until it returns false.
	Iterate(fn func(K, V) bool) error
}

// tables are the maps the reconciler writes.
type tables struct {
	services table[sockLBLbServiceKey, sockLBLbService]
	backends table[uint32, sockLBLbBackend]
	revNat   table[uint32, sockLBLbRevNat]
	names    table[uint32, sockLBLbSvcName]
	affinity table[sockLBLbAffinityKey, sockLBLbAffinity]
	// maglev, when north-south load balancing is on: the Maglev table of
	// every NodePort, ExternalIP and LoadBalancer frontend.
	maglev maglevTables
	// parallel: the tables may be written from two goroutines at once
	// (different tables; real maps, not the tests' recording fakes).
	parallel bool
}

// programmed is the reconciler's mirror of one frontend in the maps: what
// was written (IDs, counts, flags) and hashes, enough to tell whether a
// desired frontend changes anything, not a copy of the frontend (its
// backends are its slots' IDs, whose keys beByID holds once for all).
type programmed struct {
	id        uint32
	hasMaster bool
	count     int      // the master's count
	slots     []uint32 // backend ID per slot (index 0 is slot 1); 0: missing
	// inline: slots are the master entry's own (count ≤ inlineBackends);
	// else they are the slot entries.
	inline bool
	// entries: slot entries in the map (keys 1..entries): len(slots)
	// unless inline, where it is 0 but for slot entries left over.
	entries int
	flags   uint16
	timeout uint32
	kind    dataplane.FrontendKind
	// nameHash: the names-map entry, hashed (hashName), to tell whether
	// it must be rewritten.
	nameHash uint64
	// hash: the desired frontend it was written from (frontendHash).
	hash uint64
	seen uint64 // the sync generation that last saw it desired
	// synced: written by this process from a desired frontend, so hash is
	// known (false after restore: the next sync compares the frontend with
	// the maps entry by entry, which also repairs what a hash collision,
	// 2^-64 per comparison, could have left stale).
	synced bool
	// terminateTCP: TCP sockets to a backend it loses are destroyed too.
	terminateTCP bool
	// maglev: its Maglev table is written for exactly these slots.
	maglev bool
	// ranges: its loadBalancerSourceRanges, as last written with its table.
	ranges []netip.Prefix
}

// lostBackend is a backend that a frontend no longer has.
type lostBackend struct {
	serviceID uint32
	frontend  dataplane.FrontendKey
	backend   netip.AddrPort
	// terminateTCP: the frontend asked for its TCP sockets to go too.
	terminateTCP bool
}

// syncResult tells the caller what a sync changed.
type syncResult struct {
	writes, deletes int
	// lost lists backends removed from frontends (for stale sockets).
	lost []lostBackend
	// rejected lists frontends that did not fit in the maps.
	rejected []*dataplane.FrontendError
}

// reconciler keeps the maps equal to the desired state with make-before-
// break writes, and mirrors what it wrote so a repeated Sync writes nothing.
type reconciler struct {
	t           tables
	maxServices int
	maxBackends int

	fronts map[dataplane.FrontendKey]*programmed
	beIDs  map[backendKey]uint32
	// beByID, indexed by backend ID (the backends map is an array): the
	// ID's key and the number of slots naming it while it is used, and its
	// generation always. len(beByID) == nextBe; index 0 is never used.
	beByID  []backendRef
	nextSvc uint32
	// nextBe: the lowest ID never used (by this mirror or the maps).
	nextBe uint32
	// ids: backend IDs freed and waiting to be reused.
	ids idPool
	// touched: backend IDs whose reference count dropped (or that are
	// new), candidates for deletion at the end of a sync.
	touched []uint32
	// pending deletes found at restore: orphaned rev_nat/name entries.
	orphanRev []uint32
	// dirty: a write failed; re-read the maps before the next sync.
	dirty bool
	gen   uint64
	// used: services-map entries the mirror holds (kept current, so that
	// admission costs nothing per unchanged frontend).
	used int
}

func newReconciler(t tables, maxServices, maxBackends int) *reconciler {
	return &reconciler{t: t, maxServices: maxServices, maxBackends: maxBackends, dirty: true}
}

// withGrace makes freed backend IDs wait for grace (an RCU grace period:
// every program run that may have read them is over) before reuse.
func (r *reconciler) withGrace(grace func()) *reconciler {
	r.ids.grace = grace
	return r
}

// entries returns how many services-map entries the mirror holds.
func (r *reconciler) entries() int {
	n := 0
	for _, p := range r.fronts {
		n += p.entries
		if p.hasMaster {
			n++
		}
	}
	return n
}

// restore rebuilds the mirror, and the ID allocators, from the maps.
func (r *reconciler) restore() error {
	r.fronts = map[dataplane.FrontendKey]*programmed{}
	r.beIDs = map[backendKey]uint32{}
	r.beByID = make([]backendRef, 1)
	r.ids.reset()
	refs := map[uint32]int32{} // slots naming each backend ID, until the backends are read
	maxSlotID := uint32(0)     // the highest backend ID any entry names
	inl := map[*programmed][]uint32{}
	r.nextSvc, r.nextBe = 1, 1
	r.orphanRev = nil
	get := func(k dataplane.FrontendKey) *programmed {
		p := r.fronts[k]
		if p == nil {
			p = &programmed{}
			r.fronts[k] = p
		}
		return p
	}
	err := r.t.services.Iterate(func(k sockLBLbServiceKey, v sockLBLbService) bool {
		p := get(frontendOf(k))
		if v.RevNatId != 0 {
			p.id = v.RevNatId
		}
		if k.Slot == 0 {
			p.hasMaster = true
			p.count = int(v.Count)
			p.flags = v.Flags
			p.timeout = v.AffinityTimeout
			if p.count <= inlineBackends {
				inl[p] = slices.Clone(v.Backends[:p.count])
				for _, id := range inl[p] {
					maxSlotID = max(maxSlotID, id)
				}
			}
			return true
		}
		for len(p.slots) < int(k.Slot) {
			p.slots = append(p.slots, 0)
		}
		p.slots[k.Slot-1] = v.BackendId
		maxSlotID = max(maxSlotID, v.BackendId)
		return true
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", MapServices, err)
	}
	// An inline master's slots are its own; slot entries it has are left
	// over (a sync failed before deleting them) and name nothing.
	for _, p := range r.fronts {
		p.entries = len(p.slots)
		if ids, ok := inl[p]; ok {
			p.inline, p.slots = true, ids
		}
		for _, id := range p.slots {
			if id != 0 {
				refs[id]++
			}
		}
	}
	// No new backend gets an ID an entry names, even one missing from the
	// backends map: its reference count would include that slot.
	r.growIDs(maxSlotID)
	ids := map[uint32]*programmed{}
	for _, p := range r.fronts {
		if p.id != 0 {
			ids[p.id] = p
			r.nextSvc = max(r.nextSvc, p.id+1)
		}
	}
	err = r.t.backends.Iterate(func(id uint32, v sockLBLbBackend) bool {
		if id == 0 || v.Proto == 0 && v.Gen == 0 {
			return true // never used
		}
		r.growIDs(id)
		e := &r.beByID[id]
		e.gen = v.Gen
		if v.Proto != 0 {
			b := backendKeyOf(v)
			r.beIDs[b] = id
			e.key, e.used = b, true
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", MapBackends, err)
	}
	r.touched = nil
	var unused []uint32
	for id := 1; id < len(r.beByID); id++ {
		e := &r.beByID[id]
		e.refs = refs[uint32(id)]
		switch {
		case e.refs > 0 && !e.used:
			// Named by a slot but missing: kept from reuse until no slot
			// names it.
			e.used = true
			r.touched = append(r.touched, uint32(id))
		case e.used && e.refs == 0: // left over: freed by the next sync
			r.touched = append(r.touched, uint32(id))
		case !e.used:
			unused = append(unused, uint32(id))
		}
	}
	// A program may still be reading the entry of an ID freed just before
	// this restore: the free IDs wait for a grace period like any other.
	r.ids.quarantine(unused)
	hasRev := make(map[uint32]bool, len(ids))
	err = r.t.revNat.Iterate(func(id uint32, _ sockLBLbRevNat) bool {
		r.nextSvc = max(r.nextSvc, id+1)
		hasRev[id] = true
		if ids[id] == nil {
			r.orphanRev = append(r.orphanRev, id)
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", MapRevNat, err)
	}
	// A frontend whose entries name a service ID that has no rev_nat entry
	// (a sync failed between writing its slots and its rev_nat, which go
	// to the kernel in chunks, in any order) takes a new ID at the next
	// sync, which writes every entry of it again; its name is an orphan.
	for id, p := range ids {
		if !hasRev[id] {
			p.id = 0
			delete(ids, id)
		}
	}
	err = r.t.names.Iterate(func(id uint32, v sockLBLbSvcName) bool {
		r.nextSvc = max(r.nextSvc, id+1)
		if p := ids[id]; p != nil {
			var name string
			p.kind, name = nameOf(v)
			p.nameHash = hashName(v.Kind, [5]string{name})
		} else if !slices.Contains(r.orphanRev, id) {
			r.orphanRev = append(r.orphanRev, id)
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", MapServiceNames, err)
	}
	slices.Sort(r.orphanRev)
	r.used = r.entries()
	r.dirty = false
	return nil
}

// want is one frontend of the desired state, resolved.
type want struct {
	key      dataplane.FrontendKey
	backends []backendKey
	flags    uint16
	timeout  uint32
	kind     dataplane.FrontendKind
	svc      dataplane.ServicePortName
	ids      []uint32 // backend IDs, set at admission
	// terminateTCP, from the frontend.
	terminateTCP bool
	hash         uint64 // frontendHash
	ranges       []netip.Prefix
}

func frontendFlags(f *dataplane.Frontend) (flags uint16, timeout uint32) {
	if f.AffinityTimeout > 0 {
		flags |= FlagAffinity
		timeout = uint32(max(1, (f.AffinityTimeout+time.Second-1)/time.Second))
	}
	if f.LocalOnly {
		flags |= FlagLocal
	}
	return flags, timeout
}

// sameAs reports whether p already holds f: an endpoint change among
// 10,000 services costs one hash of each frontend of the Services it names
// (a whole-State sync, one of every frontend), without allocating.
func (p *programmed) sameAs(f *dataplane.Frontend) bool {
	if p == nil || !p.synced || !p.hasMaster || len(p.slots) != len(f.Endpoints) || p.count != len(p.slots) ||
		!slices.Equal(p.ranges, f.SourceRanges) {
		return false
	}
	if flags, timeout := frontendFlags(f); flags != p.flags || timeout != p.timeout {
		return false
	}
	return p.hash == frontendHash(f)
}

// frontendHash digests what of a frontend the maps hold besides its flags
// and source ranges: its endpoints in order (address, port, protocol,
// terminating), its kind, Service port name and TCP termination.
func frontendHash(f *dataplane.Frontend) uint64 {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	var b [20]byte
	b[18] = protoNum(f.Protocol)
	for i := range f.Endpoints {
		e := &f.Endpoints[i]
		a := e.Addr.As16()
		copy(b[:16], a[:])
		b[16], b[17] = byte(e.Port>>8), byte(e.Port)
		b[19] = 0
		if e.Terminating {
			b[19] = 1
		}
		h.Write(b[:])
	}
	b[0] = 0
	if f.TerminateTCP {
		b[0] = 1
	}
	h.Write(b[:1])
	for _, s := range [...]string{string(f.Kind), f.Service.Namespace, f.Service.Name, f.Service.Port} {
		h.WriteString(s)
		h.WriteByte(0)
	}
	return h.Sum64()
}

// hashSeed seeds the mirror's hashes (they live only in this process).
var hashSeed = maphash.MakeSeed()

// hashName hashes a names-map entry: its kind and the concatenated parts,
// cut as nameValue cuts a name, so that the hash of a frontend's name
// equals the hash of the entry written for it and read back at restore.
func hashName(kind uint8, parts [5]string) uint64 {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	h.WriteByte(kind)
	room := len(sockLBLbSvcName{}.Name) - 1
	for _, s := range parts {
		s = s[:min(len(s), room)]
		h.WriteString(s)
		room -= len(s)
	}
	return h.Sum64()
}

// frontendNameHash is hashName of the entry nameValue(kind, spn.String())
// writes, without building the string.
func frontendNameHash(kind dataplane.FrontendKind, spn dataplane.ServicePortName) uint64 {
	colon := ":"
	if spn.Port == "" {
		colon = ""
	}
	return hashName(kindNums[kind], [...]string{spn.Namespace, "/", spn.Name, colon, spn.Port})
}

// wantsOf resolves the frontends of fs that differ from what r holds, and
// marks every desired frontend r holds with this sync's generation.
func (r *reconciler) wantsOf(fs []dataplane.Frontend) []want {
	var out []want
	// The backend lists are carved out of shared chunks (one allocation
	// for a whole first sync, instead of one per frontend); each is capped
	// so that nothing appends into its neighbour.
	var buf []backendKey
	rest := 0 // endpoints of fs[i:]
	for i := range fs {
		rest += len(fs[i].Endpoints)
	}
	if len(r.fronts) == 0 {
		buf = make([]backendKey, 0, rest)
		out = make([]want, 0, len(fs))
	}
	for i := range fs {
		f := &fs[i]
		rest -= len(f.Endpoints)
		p := r.fronts[f.FrontendKey]
		if p != nil {
			p.seen = r.gen
		}
		if p.sameAs(f) {
			continue
		}
		w := want{key: f.FrontendKey, kind: f.Kind, svc: f.Service, terminateTCP: f.TerminateTCP, hash: frontendHash(f),
			ranges: f.SourceRanges}
		if cap(buf)-len(buf) < len(f.Endpoints) {
			// Room for this frontend and up to 256 more endpoints of the
			// frontends after it (none for a lone change).
			buf = make([]backendKey, 0, len(f.Endpoints)+min(rest, 256))
		}
		start := len(buf)
		var seen map[backendKey]bool // only for long lists
		if len(f.Endpoints) > 16 {
			seen = make(map[backendKey]bool, len(f.Endpoints))
		}
		proto := protoNum(f.Protocol)
		for _, e := range f.Endpoints {
			b := newBackendKey(e.Addr, e.Port, proto, e.Terminating)
			if seen != nil {
				if seen[b] {
					continue
				}
				seen[b] = true
			} else if slices.Contains(buf[start:], b) {
				continue
			}
			buf = append(buf, b)
		}
		w.backends = buf[start:len(buf):len(buf)]
		w.flags, w.timeout = frontendFlags(f)
		out = append(out, w)
	}
	return out
}

// sync makes the maps match st. Order, per the make-before-break rule:
// frontends gone are removed; then new backends, rev_nat and names; then
// every changed slot; then every changed master entry (the count last);
// then stale slots; then unreferenced backends and affinity entries.
func (r *reconciler) sync(st *dataplane.State) (syncResult, error) {
	var res syncResult
	if err := st.Validate(); err != nil {
		return res, fmt.Errorf("invalid dataplane state: %w", err)
	}
	if r.dirty {
		if err := r.restore(); err != nil {
			return res, err
		}
	}
	r.gen++
	wants := r.wantsOf(st.Frontends)
	var gone []dataplane.FrontendKey
	for k, p := range r.fronts {
		if p.seen != r.gen { // wantsOf marked every desired frontend
			gone = append(gone, k)
		}
	}
	slices.SortFunc(gone, dataplane.FrontendKey.Compare)
	return r.applyAndMark(wants, gone)
}

// applyAndMark applies and, after a failed write (not a mere rejection,
// which leaves the maps as mirrored), marks the mirror for re-reading.
func (r *reconciler) applyAndMark(wants []want, gone []dataplane.FrontendKey) (syncResult, error) {
	res, err := r.apply(wants, gone)
	var rej *dataplane.RejectedFrontends
	if err != nil && !errors.As(err, &rej) {
		r.dirty = true
	}
	return res, err
}

// applyChange programs a Change: only the frontends it names are looked at,
// so its cost is proportional to the change, not to the maps.
func (r *reconciler) applyChange(ch *dataplane.Change) (syncResult, error) {
	var res syncResult
	if err := (&dataplane.State{Frontends: ch.Upsert}).Validate(); err != nil {
		return res, fmt.Errorf("invalid dataplane change: %w", err)
	}
	if r.dirty {
		if err := r.restore(); err != nil {
			return res, err
		}
	}
	r.gen++
	wants := r.wantsOf(ch.Upsert)
	var gone []dataplane.FrontendKey
	for _, k := range ch.Remove {
		if _, ok := r.fronts[k]; ok {
			gone = append(gone, k)
		}
	}
	return r.applyAndMark(wants, gone)
}

// apply writes wants and removes gone (sorted), make-before-break.
func (r *reconciler) apply(wants []want, gone []dataplane.FrontendKey) (syncResult, error) {
	var res syncResult
	lostPairs := map[[2]uint32]bool{} // service ID, backend ID
	goneServices := map[uint32]bool{} // service IDs deleted

	// 1. Frontends no longer desired: master first, so connects stop
	// finding them, then their slots, rev_nat and name.
	if len(gone) > 0 || len(r.orphanRev) > 0 {
		var masters, slots []sockLBLbServiceKey
		revs := slices.Clone(r.orphanRev)
		for _, k := range gone {
			p := r.fronts[k]
			if p.hasMaster {
				masters = append(masters, serviceKey(k, 0))
			}
			for i := range p.entries {
				slots = append(slots, serviceKey(k, uint16(i+1)))
			}
			for _, id := range p.slots {
				if id != 0 {
					res.lost = append(res.lost, r.lost(p, k, id))
				}
			}
			if p.id != 0 {
				revs = append(revs, p.id)
				if p.flags&FlagAffinity != 0 {
					goneServices[p.id] = true
				}
			}
		}
		if err := r.t.services.Delete(masters); err != nil {
			return res, fmt.Errorf("delete removed frontends: %w", err)
		}
		if r.t.maglev != nil {
			var ids []uint32
			for _, k := range gone {
				if p := r.fronts[k]; p.maglev {
					ids = append(ids, p.id)
				}
			}
			if err := r.t.maglev.Delete(ids); err != nil {
				return res, fmt.Errorf("delete removed frontends' Maglev tables: %w", err)
			}
			res.deletes += len(ids)
		}
		if err := r.t.services.Delete(slots); err != nil {
			return res, fmt.Errorf("delete removed frontends' slots: %w", err)
		}
		if err := r.t.revNat.Delete(revs); err != nil {
			return res, fmt.Errorf("delete removed frontends' reverse NAT: %w", err)
		}
		if err := r.t.names.Delete(revs); err != nil {
			return res, fmt.Errorf("delete removed frontends' names: %w", err)
		}
		res.deletes += len(masters) + len(slots) + 2*len(revs)
		for _, k := range gone {
			p := r.fronts[k]
			for _, id := range p.slots {
				r.release(id)
			}
			r.used -= p.entries
			if p.hasMaster {
				r.used--
			}
			delete(r.fronts, k)
		}
		r.orphanRev = nil
	}

	// What no program can reach yet (new backends, rev_nat and names of
	// new IDs, slots of frontends without a master entry) goes to the
	// kernel as it is found, in chunks, in any order; a large sync writes
	// it on two goroutines (two maps at once) while the next chunks are
	// prepared, so the kernel's share overlaps the reconciler's. Everything a program
	// can reach waits for all of it (step 5).
	nb := 0 // backends named by wants
	for _, w := range wants {
		nb += len(w.backends)
	}
	hw := newHiddenWriter(r.t.parallel && nb+len(wants) >= parallelMin)
	newBackends := newChunker(hw, 0, r.t.backends, "write backends")
	newRevNat := newChunker(hw, 0, r.t.revNat, "write reverse NAT")
	newNames := newChunker(hw, 1, r.t.names, "write service names")
	hiddenSlots := newChunker(hw, 1, r.t.services, "write backend slots of new frontends")
	defer hw.wait() // on every return: no write outlives the sync

	// 2. Admission: what fits in the maps, counting the peak of the
	// make-before-break transition (new slots are written before stale
	// ones are deleted).
	used := r.used
	nfronts := len(r.fronts)
	if len(r.beIDs) == 0 && len(wants) > 0 && r.nextBe == 1 { // a first sync: size the mirror once
		r.beIDs = make(map[backendKey]uint32, nb)
		r.beByID = make([]backendRef, 1, nb+1)
	}
	if len(r.fronts) == 0 && len(wants) > 0 {
		r.fronts = make(map[dataplane.FrontendKey]*programmed, len(wants))
	}
	// One allocation for every want's backend IDs (which become the
	// frontends' slots), instead of one per frontend.
	idBuf := make([]uint32, nb)
	accepted := make([]want, 0, len(wants))
	// olds[i]: what the mirror held for accepted[i] (nil: new), looked up
	// once.
	olds := make([]*programmed, 0, len(wants))
	var reusedIDs []uint32 // backend IDs given out again, written below
	for _, w := range wants {
		p := r.fronts[w.key]
		growth := slotEntries(len(w.backends))
		if p != nil {
			growth = max(0, growth-p.entries)
			if !p.hasMaster {
				growth++
			}
		} else {
			growth++
		}
		w.ids, idBuf = idBuf[:len(w.backends):len(w.backends)], idBuf[len(w.backends):]
		fresh := 0
		for i, b := range w.backends {
			if id, ok := r.beIDs[b]; ok {
				w.ids[i] = id
			} else {
				fresh++
			}
		}
		var full string
		switch {
		case used+growth > r.maxServices:
			full = fmt.Sprintf("%s needs %d more entries, %d of %d used", MapServices, growth, used, r.maxServices)
		case fresh > r.idsLeft():
			full = fmt.Sprintf("%s needs %d more entries, %d of %d used", MapBackends, fresh, r.maxBackends-r.idsLeft(), r.maxBackends)
		case p == nil && nfronts+1 > r.maxServices:
			full = fmt.Sprintf("%s has room for %d frontends", MapRevNat, r.maxServices)
		}
		if full != "" {
			res.rejected = append(res.rejected, &dataplane.FrontendError{Frontend: w.key, Service: w.svc,
				Err: fmt.Errorf("%s: %w", full, dataplane.ErrMapFull)})
			continue
		}
		used += growth
		if p == nil {
			nfronts++
		}
		// Every backend of the want gains a slot naming it. New backends
		// get their IDs now (the mirror is re-read from the maps if a
		// write fails), and go to the kernel at once: every one is named
		// by the slots of an accepted want, so none is a candidate for
		// deletion (a failed write re-reads the maps, which finds any
		// orphan).
		for i, b := range w.backends {
			if id := w.ids[i]; id != 0 {
				r.beByID[id].refs++
				continue
			}
			id, reused := r.allocID()
			e := &r.beByID[id]
			e.key, e.refs, e.used = b, 1, true
			if e.gen++; e.gen == 0 {
				e.gen = 1
			}
			r.beIDs[b], w.ids[i] = id, id
			if reused {
				reusedIDs = append(reusedIDs, id)
			} else {
				newBackends.add(id, backendValue(b, e.gen))
			}
		}
		accepted = append(accepted, w)
		olds = append(olds, p)
	}

	// A reused ID's entry gets its new generation first, still free, and
	// only then the backend: the entry is rewritten in place, and a program
	// following a stale affinity entry may read it meanwhile, a mix of the
	// two values. Whatever it reads is free (proto 0) or has the new
	// generation, never the stale entry's generation with a used proto.
	if len(reusedIDs) > 0 {
		pre := make([]sockLBLbBackend, len(reusedIDs))
		for i, id := range reusedIDs {
			pre[i].Gen = r.beByID[id].gen
		}
		if err := r.t.backends.Put(reusedIDs, pre); err != nil {
			return res, fmt.Errorf("write generations of reused backend IDs: %w", err)
		}
		res.writes += len(reusedIDs)
		for _, id := range reusedIDs {
			e := &r.beByID[id]
			newBackends.add(id, backendValue(e.key, e.gen))
		}
	}

	// 3. rev_nat and names of new frontends and the slots of frontends
	// without a master entry (hidden: on their way to the kernel); the
	// slots of visible frontends, master entries and stale slots (step 5).
	na := len(accepted)
	masterKeys, masterVals := make([]sockLBLbServiceKey, 0, na), make([]sockLBLbService, 0, na)
	// The slots of a frontend without a master entry in the map (a new
	// one) are invisible to the programs until that entry is written, so
	// they need not wait for the new backends; those of visible frontends
	// must.
	var slotKeys, staleKeys []sockLBLbServiceKey
	var slotVals []sockLBLbService
	// next[i] is accepted[i] as it will be programmed; one allocation for
	// all of them.
	next := make([]programmed, na)
	for i, w := range accepted {
		old := olds[i]
		p := &next[i]
		*p = programmed{hasMaster: true, count: len(w.backends), flags: w.flags, timeout: w.timeout, kind: w.kind,
			nameHash: frontendNameHash(w.kind, w.svc), hash: w.hash, seen: r.gen, synced: true, terminateTCP: w.terminateTCP, ranges: w.ranges}
		if old != nil && old.id != 0 {
			p.id = old.id
		} else {
			p.id = r.nextSvc
			r.nextSvc++
		}
		if old == nil || old.id != p.id {
			newRevNat.add(p.id, revNatValue(w.key))
		}
		if old == nil || old.id != p.id || old.kind != w.kind || old.nameHash != p.nameHash {
			newNames.add(p.id, nameValue(w.kind, w.svc.String()))
		}
		p.slots = w.ids
		p.inline = len(w.ids) <= inlineBackends
		p.entries = slotEntries(len(w.ids))
		// Slot entries are read only through a master entry that is not
		// inline: those of a frontend whose master is missing or inline
		// are hidden until its new master entry is written.
		visible := old != nil && old.hasMaster && !old.inline
		for i, id := range w.ids {
			if p.inline {
				break
			}
			if old == nil || old.inline || i >= old.entries || old.slots[i] != id || old.id != p.id {
				if visible {
					slotKeys = append(slotKeys, serviceKey(w.key, uint16(i+1)))
					slotVals = append(slotVals, sockLBLbService{BackendId: id, RevNatId: p.id})
				} else {
					hiddenSlots.add(serviceKey(w.key, uint16(i+1)), sockLBLbService{BackendId: id, RevNatId: p.id})
				}
			}
		}
		if old == nil || !old.hasMaster || old.count != p.count || old.flags != p.flags ||
			old.timeout != p.timeout || old.id != p.id || old.inline != p.inline ||
			p.inline && !slices.Equal(old.slots, p.slots) {
			v := sockLBLbService{Count: uint16(p.count), Flags: p.flags, RevNatId: p.id, AffinityTimeout: p.timeout}
			if p.inline {
				copy(v.Backends[:], p.slots)
			}
			masterKeys = append(masterKeys, serviceKey(w.key, 0))
			masterVals = append(masterVals, v)
		}
		if old != nil {
			for _, id := range old.slots {
				r.release(id)
			}
			for i := p.entries; i < old.entries; i++ {
				staleKeys = append(staleKeys, serviceKey(w.key, uint16(i+1)))
			}
			for _, id := range old.slots {
				// A backend that only turned terminating is not lost:
				// its sockets keep it.
				if b := r.beByID[id].key; id != 0 && !slices.Contains(p.slots, id) && !hasAddrPort(w.backends, b) {
					res.lost = append(res.lost, r.lost(p, w.key, id))
					if old.flags&FlagAffinity != 0 {
						lostPairs[[2]uint32{p.id, id}] = true
					}
				}
			}
		}
	}
	// 4. The last of what no program can reach, then wait for all of it.
	newBackends.flush()
	newRevNat.flush()
	newNames.flush()
	hiddenSlots.flush()
	if err := hw.wait(); err != nil {
		return res, err
	}
	res.writes += newBackends.n + hiddenSlots.n
	// 5. Slots of visible frontends (their backends exist now), then
	// master entries (the count last), then stale slots.
	if err := r.t.services.Put(slotKeys, slotVals); err != nil {
		return res, fmt.Errorf("write backend slots: %w", err)
	}
	if err := r.t.services.Put(masterKeys, masterVals); err != nil {
		return res, fmt.Errorf("write service entries: %w", err)
	}
	if err := r.t.services.Delete(staleKeys); err != nil {
		return res, fmt.Errorf("delete stale slots: %w", err)
	}
	res.writes += newRevNat.n + newNames.n + len(slotKeys) + len(masterKeys)
	res.deletes += len(staleKeys)
	// Maglev tables of the north-south frontends whose slots changed (old
	// backends stay in the backends map until step 5, so a table being
	// replaced never names a missing one).
	if r.t.maglev != nil {
		for i := range next {
			k, p, old := accepted[i].key, &next[i], olds[i]
			same := old != nil && old.maglev && old.id == p.id && slices.Equal(old.slots, p.slots) &&
				slices.Equal(old.ranges, p.ranges)
			switch {
			case northSouthKind(p.kind) && same:
				p.maglev = true
			case northSouthKind(p.kind):
				if err := r.t.maglev.Set(p.id, p.slots, r.backendNames(p.slots), p.ranges); err != nil {
					return res, fmt.Errorf("write Maglev table of %s: %w", k, err)
				}
				p.maglev = true
				res.writes++
			case old != nil && old.maglev:
				if err := r.t.maglev.Delete([]uint32{old.id}); err != nil {
					return res, fmt.Errorf("delete Maglev table of %s: %w", k, err)
				}
				res.deletes++
			}
		}
	}
	for i := range next {
		k, p := accepted[i].key, &next[i]
		if old := olds[i]; old != nil {
			r.used -= old.entries
			if old.hasMaster {
				r.used--
			}
		}
		r.used += p.entries + 1
		r.fronts[k] = p
	}

	// 6. Backends no frontend uses any more, and affinity entries that
	// point at a backend their service lost.
	var unused []uint32
	for _, id := range r.touched {
		if e := &r.beByID[id]; e.used && e.refs == 0 {
			unused = append(unused, id)
		}
	}
	r.touched = r.touched[:0]
	slices.Sort(unused)
	unused = slices.Compact(unused)
	if len(lostPairs) > 0 || len(goneServices) > 0 {
		var stale []sockLBLbAffinityKey
		err := r.t.affinity.Iterate(func(k sockLBLbAffinityKey, v sockLBLbAffinity) bool {
			if goneServices[k.RevNatId] || lostPairs[[2]uint32{k.RevNatId, v.BackendId}] {
				stale = append(stale, k)
			}
			return true
		})
		if err == nil {
			err = r.t.affinity.Delete(stale)
		}
		if err != nil {
			return res, fmt.Errorf("delete stale affinity entries: %w", err)
		}
		res.deletes += len(stale)
	}
	// An array entry is not deleted but marked free, keeping its
	// generation; the ID is reused only after a grace period.
	freed := make([]sockLBLbBackend, len(unused))
	for i, id := range unused {
		freed[i].Gen = r.beByID[id].gen
	}
	if err := r.t.backends.Put(unused, freed); err != nil {
		return res, fmt.Errorf("free unused backends: %w", err)
	}
	for _, id := range unused {
		e := &r.beByID[id]
		if r.beIDs[e.key] == id {
			delete(r.beIDs, e.key)
		}
		*e = backendRef{gen: e.gen}
	}
	r.ids.quarantine(unused)
	res.deletes += len(unused)
	slices.SortFunc(res.lost, func(a, b lostBackend) int {
		return cmp.Or(a.frontend.Compare(b.frontend), a.backend.Compare(b.backend))
	})
	if len(res.rejected) > 0 {
		return res, &dataplane.RejectedFrontends{Errs: res.rejected, Hint: "raise --bpf-lb-map-max or --bpf-lb-backends-max"}
	}
	return res, nil
}

// inlineBackends is how many backend IDs a master entry holds itself
// (LB_INLINE_BACKENDS).
const inlineBackends = len(sockLBLbService{}.Backends)

// slotEntries is how many slot entries a frontend with n backends has: none
// when its master entry holds them.
func slotEntries(n int) int {
	if n <= inlineBackends {
		return 0
	}
	return n
}

// parallelMin is the smallest sync (backends and frontends to write) whose
// hidden entries are written on a goroutine of their own: below it a
// goroutine costs more than it saves.
const parallelMin = 4096

// chunkSize is how many entries a chunker hands to the kernel at once.
const chunkSize = 4096

// hiddenWriter writes what no program can reach yet, chunk by chunk:
// synchronously, in the order given, or on two goroutines (lanes, one per
// pair of maps: two maps written at once), each in the order given to it.
// After a failed write nothing more is written; wait returns the first
// error.
type hiddenWriter struct {
	lanes []chan func(failed bool) error // nil: synchronous
	wg    sync.WaitGroup
	mu    sync.Mutex
	err   error
	// waited: wait has run (it is idempotent).
	waited bool
}

func newHiddenWriter(async bool) *hiddenWriter {
	w := &hiddenWriter{}
	if async {
		w.lanes = make([]chan func(bool) error, 2)
		for i := range w.lanes {
			lane := make(chan func(bool) error, 8)
			w.lanes[i] = lane
			w.wg.Go(func() {
				for fn := range lane {
					w.run(fn)
				}
			})
		}
	}
	return w
}

func (w *hiddenWriter) run(fn func(failed bool) error) {
	w.mu.Lock()
	failed := w.err != nil
	w.mu.Unlock()
	if err := fn(failed); err != nil {
		w.mu.Lock()
		if w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
	}
}

// do writes a chunk on lane (0 or 1).
func (w *hiddenWriter) do(lane int, fn func(failed bool) error) {
	if w.lanes != nil {
		w.lanes[lane] <- fn
		return
	}
	w.run(fn)
}

// wait returns once every chunk given is written (or skipped after a
// failure), with the first error.
func (w *hiddenWriter) wait() error {
	if w.lanes != nil && !w.waited {
		for _, l := range w.lanes {
			close(l)
		}
		w.wg.Wait()
	}
	w.waited = true
	return w.err
}

// chunker gathers entries for one table and hands them to a hiddenWriter
// chunkSize at a time. An asynchronous writer gets buffers of their own
// (at most chunkBuffers per chunker, recycled), a synchronous one the same
// buffer each time.
type chunker[K comparable, V any] struct {
	w    *hiddenWriter
	lane int
	t    table[K, V]
	what string
	keys []K
	vals []V
	// n: entries added.
	n int
	// free returns buffers the writer is done with; made: buffers made.
	free chan chunkBuf[K, V]
	made int
}

type chunkBuf[K comparable, V any] struct {
	keys []K
	vals []V
}

const chunkBuffers = 3

func newChunker[K comparable, V any](w *hiddenWriter, lane int, t table[K, V], what string) *chunker[K, V] {
	c := &chunker[K, V]{w: w, lane: lane, t: t, what: what}
	if w.lanes != nil {
		c.free = make(chan chunkBuf[K, V], chunkBuffers)
	}
	return c
}

func (c *chunker[K, V]) add(k K, v V) {
	if c.keys == nil && c.free != nil {
		c.buffer()
	}
	c.keys, c.vals = append(c.keys, k), append(c.vals, v)
	c.n++
	if len(c.keys) == chunkSize {
		c.flush()
	}
}

// buffer takes an empty buffer: a new one while fewer than chunkBuffers
// exist, else the next one the writer is done with.
func (c *chunker[K, V]) buffer() {
	if c.made < chunkBuffers {
		c.made++
		c.keys, c.vals = make([]K, 0, chunkSize), make([]V, 0, chunkSize)
		return
	}
	b := <-c.free
	c.keys, c.vals = b.keys[:0], b.vals[:0]
}

// flush hands what was added to the writer.
func (c *chunker[K, V]) flush() {
	if len(c.keys) == 0 {
		return
	}
	keys, vals := c.keys, c.vals
	c.w.do(c.lane, func(failed bool) error {
		var err error
		if !failed {
			if err = c.t.Put(keys, vals); err != nil {
				err = fmt.Errorf("%s: %w", c.what, err)
			}
		}
		if c.free != nil {
			c.free <- chunkBuf[K, V]{keys, vals}
		}
		return err
	})
	if c.free != nil {
		c.keys, c.vals = nil, nil
	} else {
		c.keys, c.vals = keys[:0], vals[:0]
	}
}

// hasAddrPort reports whether bs holds b's address and port (in any
// protocol or state).
func hasAddrPort(bs []backendKey, b backendKey) bool {
	for i := range bs {
		if bs[i].addr == b.addr && bs[i].port == b.port {
			return true
		}
	}
	return false
}

// backendNames names the backends of slots for the Maglev permutation.
func (r *reconciler) backendNames(slots []uint32) []string {
	out := make([]string, len(slots))
	for i, id := range slots {
		out[i] = r.beByID[id].key.String()
	}
	return out
}

// fillMaglev writes the Maglev table of every north-south frontend the
// mirror holds (after restore, before the programs attach).
func (r *reconciler) fillMaglev() error {
	for k, p := range r.fronts {
		if !northSouthKind(p.kind) || !p.hasMaster || p.id == 0 {
			continue
		}
		slots := p.slots[:min(len(p.slots), p.count)]
		p.ranges = r.t.maglev.Ranges(p.id)
		if err := r.t.maglev.Set(p.id, slots, r.backendNames(slots), p.ranges); err != nil {
			return fmt.Errorf("write Maglev table of %s: %w", k, err)
		}
		p.maglev = true
	}
	return nil
}

// release drops one reference to a backend ID.
func (r *reconciler) release(id uint32) {
	if id == 0 {
		return
	}
	if e := &r.beByID[id]; e.used {
		e.refs--
	}
	r.touched = append(r.touched, id)
}

// backendRef is a backend ID's key and the number of slots naming it, and
// the ID's generation (lb_backend.gen: how many backends it has held).
type backendRef struct {
	key  backendKey
	refs int32
	gen  uint32
	// used: the ID holds a backend, or a slot names it.
	used bool
}

// growIDs makes IDs up to id known to the mirror (none of them free).
func (r *reconciler) growIDs(id uint32) {
	for uint32(len(r.beByID)) <= id {
		r.beByID = append(r.beByID, backendRef{})
	}
	r.nextBe = max(r.nextBe, id+1)
}

// idsLeft is how many backend IDs can still be given out: free ones,
// waiting ones and those never used below the map's size.
func (r *reconciler) idsLeft() int {
	return r.ids.len() + max(0, r.maxBackends-int(r.nextBe)+1)
}

// allocID gives out the lowest free backend ID whose grace period is
// over, else a new one, else (the map is full up to its size) waits for
// the grace periods under way. The caller checked idsLeft. reused: the ID
// held a backend before.
func (r *reconciler) allocID() (id uint32, reused bool) {
	if id, ok := r.ids.take(false); ok {
		return id, true
	}
	if int(r.nextBe) <= r.maxBackends {
		id := r.nextBe
		r.growIDs(id)
		return id, r.beByID[id].gen != 0
	}
	id, _ = r.ids.take(true)
	return id, true
}

// idPool holds freed backend IDs. An ID freed by a sync may still be in
// use by a program that read a master entry naming it before that entry
// changed (and an array entry is rewritten in place, not replaced): it is
// given out again only after an RCU grace period that started after it
// was freed, when no such program run is left.
type idPool struct {
	// free: IDs past their grace period, highest first (taken from the
	// end: the lowest, so the array stays dense).
	free []uint32
	// waiting: IDs freed, each batch with its grace period under way.
	waiting []graceBatch
	// grace waits for an RCU grace period; nil: none is needed (no
	// program reads the tables, as in the unit tests).
	grace func()
}

type graceBatch struct {
	ids  []uint32
	done chan struct{}
}

func (p *idPool) reset() {
	p.free, p.waiting = nil, nil
}

func (p *idPool) len() int {
	n := len(p.free)
	for _, b := range p.waiting {
		n += len(b.ids)
	}
	return n
}

// quarantine starts a grace period for ids (already freed in the maps).
func (p *idPool) quarantine(ids []uint32) {
	if len(ids) == 0 {
		return
	}
	b := graceBatch{ids: slices.Clone(ids), done: make(chan struct{})}
	if p.grace == nil {
		close(b.done)
	} else {
		go func() {
			p.grace()
			close(b.done)
		}()
	}
	p.waiting = append(p.waiting, b)
}

// take returns the lowest free ID, moving the batches whose grace period
// is over (all of them, waiting for them, if wait) to the free list first.
func (p *idPool) take(wait bool) (uint32, bool) {
	p.collect(wait)
	n := len(p.free)
	if n == 0 {
		return 0, false
	}
	id := p.free[n-1]
	p.free = p.free[:n-1]
	return id, true
}

// collect moves the batches whose grace period is over (all, waiting for
// them, if wait) to the free list.
func (p *idPool) collect(wait bool) {
	if len(p.waiting) == 0 {
		return
	}
	moved := false
	kept := p.waiting[:0]
	for _, b := range p.waiting {
		if wait {
			<-b.done
		}
		select {
		case <-b.done:
			p.free = append(p.free, b.ids...)
			moved = true
		default:
			kept = append(kept, b)
		}
	}
	clear(p.waiting[len(kept):])
	p.waiting = kept
	if moved {
		slices.SortFunc(p.free, func(a, b uint32) int { return cmp.Compare(b, a) })
	}
}

func (r *reconciler) lost(p *programmed, k dataplane.FrontendKey, beID uint32) lostBackend {
	b := r.beByID[beID].key
	return lostBackend{serviceID: p.id, frontend: k, backend: b.addrPort(), terminateTCP: p.terminateTCP}
}

// errMapFull wraps a kernel E2BIG into the dataplane's ErrMapFull.
func errMapFull(name string, err error) error {
	return errors.Join(fmt.Errorf("map %s: %w", name, dataplane.ErrMapFull), err)
}
