package ebpf

import (
	"testing"

	"github.com/waggle-io/waggle/dataplane"
)

// settle waits for every grace period under way and frees its IDs.
func (p *idPool) settle() { p.collect(true) }

// backendIDs returns the ID and generation of each backend address:port in
// the fake backends array.
func backendIDs(f *fakeMaps) map[string][2]uint32 {
	out := map[string][2]uint32{}
	for id, v := range f.backends.m {
		out[backendKeyOf(v).addrPort().String()] = [2]uint32{id, v.Gen}
	}
	return out
}

// TestFreedBackendIDsAreReusedLowestFirstAfterAGracePeriod: a backend ID
// freed by a sync is given out again only once a grace period that began
// after it was freed is over (a program may still be reading its entry),
// then lowest first, with the next generation; a map full up to its size
// waits for the grace period instead of refusing.
func TestFreedBackendIDsAreReusedLowestFirstAfterAGracePeriod(t *testing.T) {
	f := newFakeMaps(1024, 5)
	release := make(chan struct{})
	r := newReconciler(f.tables(), 1024, 5).withGrace(func() { <-release })
	f.check = func() {
		if err := consistent(f.tables()); err != nil {
			t.Fatalf("after %d operations: %v", f.ops, err)
		}
	}
	sync := func(eps ...string) map[string][2]uint32 {
		t.Helper()
		if _, err := r.sync(sorted(fe("10.96.0.10:80", dataplane.TCP, eps...))); err != nil {
			t.Fatal(err)
		}
		return backendIDs(f)
	}
	ids := sync("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80")
	if ids["10.0.0.1:80"] != [2]uint32{1, 1} || ids["10.0.0.3:80"] != [2]uint32{3, 1} {
		t.Fatalf("first IDs %v, want 1..3 of generation 1", ids)
	}
	// 1 and 2 are freed at the end of this sync: 4 is new.
	ids = sync("10.0.0.3:80", "10.0.0.4:80")
	if ids["10.0.0.4:80"][0] != 4 {
		t.Fatalf("IDs %v: the new backend took a freed ID in the sync that freed it", ids)
	}
	for _, id := range []uint32{1, 2} {
		if v, ok := f.backends.free[id]; !ok || v.Gen != 1 || v.Proto != 0 {
			t.Errorf("freed ID %d: entry %+v, %v; want free, generation 1 kept", id, v, ok)
		}
	}
	// The grace period is not over: 5, not 1.
	ids = sync("10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80")
	if ids["10.0.0.5:80"][0] != 5 {
		t.Fatalf("IDs %v: a freed ID was reused before its grace period ended", ids)
	}
	// The array is full up to its size (5): the next new backend waits
	// for the grace period, then takes the lowest freed ID.
	done := make(chan map[string][2]uint32)
	go func() { done <- sync("10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80", "10.0.0.6:80") }()
	close(release)
	ids = <-done
	if ids["10.0.0.6:80"] != [2]uint32{1, 2} {
		t.Fatalf("IDs %v: want 10.0.0.6:80 at the lowest freed ID, 1, generation 2", ids)
	}
	r.ids.settle()
	ids = sync("10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80", "10.0.0.6:80", "10.0.0.7:80")
	if ids["10.0.0.7:80"] != [2]uint32{2, 2} {
		t.Fatalf("IDs %v: want 10.0.0.7:80 at ID 2, generation 2", ids)
	}
	// Nothing is left: a sixth backend does not fit.
	if _, err := r.sync(sorted(fe("10.96.0.10:80", dataplane.TCP, "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80",
		"10.0.0.6:80", "10.0.0.7:80", "10.0.0.8:80"))); err == nil {
		t.Error("a sixth backend in a backends map of 5 was accepted")
	}
}

// TestRestoreKeepsGenerationsAndQuarantinesFreeIDs: a restarted proxy
// reads every ID's generation from the array, so a reused ID gets a
// generation no stale affinity entry can hold, and it treats the free IDs
// as just freed (a grace period first).
func TestRestoreKeepsGenerationsAndQuarantinesFreeIDs(t *testing.T) {
	f := newFakeMaps(1024, 1024)
	r := newReconciler(f.tables(), 1024, 1024)
	st := func(eps ...string) *dataplane.State { return sorted(fe("10.96.0.10:80", dataplane.TCP, eps...)) }
	for _, eps := range [][]string{{"10.0.0.1:80", "10.0.0.2:80"}, {"10.0.0.2:80"}, {"10.0.0.2:80", "10.0.0.3:80"}} {
		if _, err := r.sync(st(eps...)); err != nil {
			t.Fatal(err)
		}
	}
	// ID 1 held 10.0.0.1 (generation 1), then 10.0.0.3 (generation 2).
	if got := backendIDs(f)["10.0.0.3:80"]; got != [2]uint32{1, 2} {
		t.Fatalf("10.0.0.3:80 at %v, want ID 1 generation 2", got)
	}
	if _, err := r.sync(st("10.0.0.2:80")); err != nil {
		t.Fatal(err)
	}
	held := false
	restarted := newReconciler(f.tables(), 1024, 1024).withGrace(func() {
		held = true
	})
	if err := restarted.restore(); err != nil {
		t.Fatal(err)
	}
	if restarted.ids.len() != 1 || len(restarted.ids.free) != 0 {
		t.Fatalf("restored pool: %d IDs, %d of them free at once; want 1 waiting", restarted.ids.len(), len(restarted.ids.free))
	}
	restarted.ids.settle()
	if !held {
		t.Error("the restored free ID skipped its grace period")
	}
	if _, err := restarted.sync(st("10.0.0.2:80", "10.0.0.4:80")); err != nil {
		t.Fatal(err)
	}
	if got := backendIDs(f)["10.0.0.4:80"]; got != [2]uint32{1, 3} {
		t.Errorf("10.0.0.4:80 at %v, want ID 1 generation 3", got)
	}
}
