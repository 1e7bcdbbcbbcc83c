package ebpf

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/waggle-io/waggle/dataplane"
)

// TestLayout1PinnedStateIsMigrated: a proxy finding layout 1's services map
// (16-byte values: a master entry and one slot entry per backend) converts
// it — small frontends' backends inline, large ones keeping their slot
// entries — stamps layout 2, and serves on: an established stream and new
// connects to both kinds of frontend work, the view shows the same slots
// and a sync of the same state writes nothing.
func TestLayout1PinnedStateIsMigrated(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(inlineBackends+4, 8080, false)
	st := state(frontend("10.96.0.10:80", dataplane.TCP, bes[:2]...), frontend("10.96.0.11:80", dataplane.TCP, bes...),
		frontend("10.96.0.10:53", dataplane.UDP, bes[:3]...))
	e.sync(st)
	before, stream := e.stopWithStream(t)

	// Replace the pinned services map and meta with layout 1's.
	path := filepath.Join(e.cfg.PinDir, MapServices)
	v1, err := ebpf.NewMap(&ebpf.MapSpec{Name: MapServices, Type: ebpf.Hash, KeySize: 24, ValueSize: v1ServiceSize,
		MaxEntries: uint32(e.cfg.MaxServices), Flags: 1 /* BPF_F_NO_PREALLOC */})
	if err != nil {
		t.Fatal(err)
	}
	defer v1.Close()
	type v1Service struct {
		BackendID       uint32
		Count           uint16
		Flags           uint16
		RevNatID        uint32
		AffinityTimeout uint32
	}
	for _, s := range before {
		k := serviceKey(s.Frontend, 0)
		if err := v1.Put(&k, &v1Service{Count: uint16(s.Count), Flags: s.Flags, RevNatID: s.ID,
			AffinityTimeout: uint32(s.AffinityTimeout / time.Second)}); err != nil {
			t.Fatal(err)
		}
		for _, sl := range s.Slots {
			k := serviceKey(s.Frontend, uint16(sl.Slot))
			if err := v1.Put(&k, &v1Service{BackendID: sl.BackendID, RevNatID: s.ID}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := v1.Pin(path); err != nil {
		t.Fatal(err)
	}
	meta, err := ebpf.LoadPinnedMap(filepath.Join(e.cfg.PinDir, MapMeta), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	if err := meta.Update(uint32(0), sockLBLbMeta{Magic: Magic, LayoutVersion: 1}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenPinned(e.cfg.PinDir); !errors.Is(err, ErrLayoutMismatch) {
		t.Errorf("OpenPinned over layout 1: %v, want ErrLayoutMismatch (the proxy converts it)", err)
	}

	b, err := New(e.cfg)
	if err != nil {
		t.Fatalf("New over layout 1: %v", err)
	}
	e.b = b
	var m sockLBLbMeta
	if err := meta.Lookup(uint32(0), &m); err != nil || m.LayoutVersion != 1 {
		t.Errorf("the replaced meta map was written: %+v, %v", m, err)
	}
	pinned, err := ebpf.LoadPinnedMap(filepath.Join(e.cfg.PinDir, MapMeta), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = pinned.Lookup(uint32(0), &m)
	pinned.Close()
	if err != nil || m.Magic != Magic || m.LayoutVersion != LayoutVersion {
		t.Errorf("pinned meta after the migration: %+v, %v; want layout %d", m, err, LayoutVersion)
	}
	after, err := b.View().Services()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(before, after, func(a, b Service) bool {
		return a.ID == b.ID && a.Count == b.Count && slices.Equal(a.Slots, b.Slots)
	}) {
		t.Errorf("services after the migration:\n%+v\nwant\n%+v", after, before)
	}
	entries := 0
	b.rec.t.services.Iterate(func(sockLBLbServiceKey, sockLBLbService) bool { entries++; return true })
	if want := 3 + inlineBackends + 4; entries != want {
		t.Errorf("%d services-map entries after the migration, want %d (3 masters, the large frontend's slots)", entries, want)
	}
	if res, err := b.rec.sync(st); err != nil || res.writes+res.deletes != 0 {
		t.Errorf("sync after the migration: %d writes, %d deletes, %v; want none", res.writes, res.deletes, err)
	}
	e.stillServes(t, "after the migration", bes, stream, "10.96.0.10:80", "10.96.0.11:80")
}

// stopWithStream returns the programmed services and a TCP stream open to
// 10.96.0.10:80, then closes the proxy, leaving the pinned state for the
// next one.
func (e *env) stopWithStream(t *testing.T) ([]Service, net.Conn) {
	t.Helper()
	before, err := e.b.View().Services()
	if err != nil {
		t.Fatal(err)
	}
	stream, _, err := e.dialTCP(ap("10.96.0.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Close() })
	e.b.Close()
	return before, stream
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
	before, stream := e.stopWithStream(t)

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
