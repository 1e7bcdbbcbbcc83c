package ebpf

import (
	"errors"
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
