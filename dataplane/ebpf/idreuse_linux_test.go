package ebpf

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/waggle-io/waggle/dataplane"
)

// TestAStaleAffinityEntryNeverFollowsAReusedBackendID: backend IDs are
// reused, so an affinity entry that outlives its backend (written by a
// connect that read the service before a sync removed the backend, after
// the sync swept the entries) must not send its client to whatever backend
// — of another Service — takes the ID next. The entry names the backend's
// generation, which the reused ID no longer has: the client chooses among
// its own Service's backends again.
func TestAStaleAffinityEntryNeverFollowsAReusedBackendID(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(3, 8080, false)
	a := frontend("10.96.0.10:80", dataplane.TCP, bes[0])
	a.AffinityTimeout = time.Hour
	e.sync(state(a))
	if who, err := e.whoTCP(ap("10.96.0.10:80")); err != nil || who != bes[0] {
		t.Fatalf("first connect: %q, %v", who, err)
	}
	var k sockLBLbAffinityKey
	var stale sockLBLbAffinity
	n := 0
	e.b.rec.t.affinity.Iterate(func(key sockLBLbAffinityKey, v sockLBLbAffinity) bool { k, stale = key, v; n++; return true })
	if n != 1 || stale.BackendGen != 1 {
		t.Fatalf("%d affinity entries, the last %+v; want one naming generation 1", n, stale)
	}
	firstID := stale.BackendId

	// The Service moves to bes[1]; the sync frees bes[0]'s ID and deletes
	// the affinity entry. The entry comes back as a late connect writes it.
	a2 := frontend("10.96.0.10:80", dataplane.TCP, bes[1])
	a2.AffinityTimeout = time.Hour
	e.sync(state(a2))
	if err := e.b.objs.WaggleAffinity.Put(&k, &stale); err != nil {
		t.Fatal(err)
	}
	// Another Service's new backend takes the freed ID (after its grace
	// period).
	e.b.rec.ids.settle()
	e.sync(state(a2, frontend("10.96.0.11:80", dataplane.TCP, bes[2])))
	var be sockLBLbBackend
	if err := e.b.objs.WaggleBackends.Lookup(firstID, &be); err != nil || backendKeyOf(be).addrPort().String() != bes[2] || be.Gen != 2 {
		t.Fatalf("backend ID %d holds %+v, %v; want %s at generation 2 (the test needs the ID reused)", firstID, be, err, bes[2])
	}
	for i := range 20 {
		if who, err := e.whoTCP(ap("10.96.0.10:80")); err != nil || who != bes[1] {
			t.Fatalf("connect %d to 10.96.0.10:80: %q, %v; want its own backend %s, not another Service's", i, who, err, bes[1])
		}
	}
	var now sockLBLbAffinity
	if err := e.b.objs.WaggleAffinity.Lookup(&k, &now); err != nil || now.BackendGen == stale.BackendGen && now.BackendId == firstID {
		t.Errorf("affinity entry %+v, %v: still the stale one", now, err)
	}
}

// TestLayout2PinnedStateIsMigrated: a proxy finding layout 2's backends
// hash map converts it into the array (each backend at its ID, generation
// 1) and gives the affinity entries generation 1, while the programs
// already attached serve on: back-to-back connects during the migration
// all succeed, affinity still sticks, a sync of the same state writes
// nothing.
func TestLayout2PinnedStateIsMigrated(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(inlineBackends+4, 8080, false)
	sticky := frontend("10.96.0.12:80", dataplane.TCP, bes[:4]...)
	sticky.AffinityTimeout = time.Hour
	st := state(frontend("10.96.0.10:80", dataplane.TCP, bes[:2]...), frontend("10.96.0.11:80", dataplane.TCP, bes...),
		frontend("10.96.0.10:53", dataplane.UDP, bes[:3]...), sticky)
	e.sync(st)
	live := map[uint32]sockLBLbBackend{}
	e.b.rec.t.backends.Iterate(func(id uint32, v sockLBLbBackend) bool {
		if v.Proto != 0 {
			live[id] = v
		}
		return true
	})
	stuck, err := e.whoTCP(ap("10.96.0.12:80"))
	if err != nil {
		t.Fatal(err)
	}
	before, err := e.b.View().Services()
	if err != nil {
		t.Fatal(err)
	}
	stream, _, err := e.dialTCP(ap("10.96.0.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	e.b.Close()

	// Layout 2: a hash backends map of 20-byte values, affinity entries
	// without a generation, meta version 2.
	v2, err := ebpf.NewMap(&ebpf.MapSpec{Name: MapBackends, Type: ebpf.Hash, KeySize: 4, ValueSize: v2BackendSize,
		MaxEntries: uint32(e.cfg.MaxBackends), Flags: 1 /* BPF_F_NO_PREALLOC */})
	if err != nil {
		t.Fatal(err)
	}
	defer v2.Close()
	for id, v := range live {
		var raw [v2BackendSize]byte
		copy(raw[:16], v.Addr[:])
		raw[16], raw[17], raw[18], raw[19] = byte(v.Port), byte(v.Port>>8), v.Proto, v.Flags
		if err := v2.Put(id, raw); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(e.cfg.PinDir, MapBackends)
	replacePin(t, path, v2)
	aff, err := ebpf.LoadPinnedMap(filepath.Join(e.cfg.PinDir, MapAffinity), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer aff.Close()
	var ak sockLBLbAffinityKey
	var av sockLBLbAffinity
	naff := 0
	for it := aff.Iterate(); it.Next(&ak, &av); naff++ {
		av.BackendGen = 0
		if err := aff.Put(&ak, &av); err != nil {
			t.Fatal(err)
		}
	}
	if naff != 1 {
		t.Fatalf("%d affinity entries, want 1", naff)
	}
	setMetaLayout(t, e.cfg.PinDir, 2)

	// Connects go on, back to back, while the proxy migrates.
	stop, failed := make(chan struct{}), make(chan string, 1)
	connects := make(chan int)
	go func() {
		n := 0
		defer func() { connects <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if who, err := e.whoTCP(ap("10.96.0.11:80")); err != nil || !contains(bes, who) {
				failed <- who + " " + errString(err)
				return
			}
			n++
		}
	}()
	b, err := New(e.cfg)
	close(stop)
	n := <-connects
	if err != nil {
		t.Fatalf("New over layout 2: %v", err)
	}
	e.b = b
	select {
	case f := <-failed:
		t.Errorf("a connect during the migration failed: %s", f)
	default:
	}
	t.Logf("%d connects during the migration", n)
	if typ := b.objs.WaggleBackends.Type(); typ != ebpf.Array {
		t.Errorf("backends map after the migration: %s, want Array", typ)
	}
	if m := readMeta(t, e.cfg.PinDir); m.LayoutVersion != LayoutVersion {
		t.Errorf("pinned meta after the migration: %+v; want layout %d", m, LayoutVersion)
	}
	after, err := b.View().Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("services after the migration: %+v, want %+v", after, before)
	}
	for i := range before {
		if before[i].ID != after[i].ID || len(before[i].Slots) != len(after[i].Slots) {
			t.Errorf("service %s after the migration: %+v, want %+v", before[i].Address, after[i], before[i])
			continue
		}
		for j := range before[i].Slots {
			if before[i].Slots[j] != after[i].Slots[j] {
				t.Errorf("service %s slot %d after the migration: %+v, want %+v", before[i].Address, j+1, after[i].Slots[j], before[i].Slots[j])
			}
		}
	}
	if res, err := b.rec.sync(st); err != nil || res.writes+res.deletes != 0 {
		t.Errorf("sync after the migration: %d writes, %d deletes, %v; want none", res.writes, res.deletes, err)
	}
	for i := range 10 {
		if who, err := e.whoTCP(ap("10.96.0.12:80")); err != nil || who != stuck {
			t.Fatalf("connect %d under affinity after the migration: %q, %v; want %s", i, who, err, stuck)
		}
	}
	e.stillServes(t, "after the migration", bes, stream, "10.96.0.10:80", "10.96.0.11:80")
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// replacePin pins m at path in place of what is there.
func replacePin(t *testing.T, path string, m *ebpf.Map) {
	t.Helper()
	old, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Unpin(); err != nil {
		t.Fatal(err)
	}
	old.Close()
	if err := m.Pin(path); err != nil {
		t.Fatal(err)
	}
}

func setMetaLayout(t *testing.T, dir string, version uint32) {
	t.Helper()
	meta, err := ebpf.LoadPinnedMap(filepath.Join(dir, MapMeta), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	if err := meta.Update(uint32(0), sockLBLbMeta{Magic: Magic, LayoutVersion: version}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
}

func readMeta(t *testing.T, dir string) sockLBLbMeta {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, MapMeta), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var v sockLBLbMeta
	if err := m.Lookup(uint32(0), &v); err != nil {
		t.Fatal(err)
	}
	return v
}
