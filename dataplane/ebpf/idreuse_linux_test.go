package ebpf

import (
	"testing"
	"time"

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

// TestNorthSouthStaleAffinityNeverFollowsAReusedBackendID: the same guard
// in nodeport.c — a north-south affinity entry (by client address) naming
// a freed backend ID is not followed to the backend of another NodePort
// that took the ID, but to a fresh choice among its own Service's. (With
// the generation check taken out it failed in 2 of 4 runs: the first
// connection does not always take the new-flow path.)
func TestNorthSouthStaleAffinityNeverFollowsAReusedBackendID(t *testing.T) {
	tp := newNSTopo(t)
	tp.start()
	f := nodePortFrontend("10.27.0.1", 30095, dataplane.TCP, false, "10.27.1.10:8080")
	f.AffinityTimeout = time.Hour
	tp.sync(f)
	c, pod, _, err := tp.dial("10.27.0.1:30095")
	if err != nil || pod != "10.27.1.10" {
		t.Fatalf("first connection: %s, %v", pod, err)
	}
	c.Close()
	aff := tp.backend.np.objs.WaggleNpAffinity
	var k nodePortNpAffinityKey
	var stale nodePortNpAffinity
	n := 0
	for it := aff.Iterate(); it.Next(&k, &stale); n++ {
	}
	if n != 1 || stale.BackendGen != 1 {
		t.Fatalf("%d north-south affinity entries, the last %+v; want one naming generation 1", n, stale)
	}
	// The Service moves to 10.27.1.11; the entry, swept or not, is put back.
	f2 := nodePortFrontend("10.27.0.1", 30095, dataplane.TCP, false, "10.27.1.11:8080")
	f2.AffinityTimeout = time.Hour
	tp.sync(f2)
	if err := aff.Put(&k, &stale); err != nil {
		t.Fatal(err)
	}
	tp.backend.rec.ids.settle()
	tp.sync(f2, nodePortFrontend("10.27.0.1", 30096, dataplane.TCP, false, "10.27.2.10:8080"))
	var be sockLBLbBackend
	if err := tp.backend.objs.WaggleBackends.Lookup(stale.BackendId, &be); err != nil ||
		backendKeyOf(be).addrPort().String() != "10.27.2.10:8080" || be.Gen != 2 {
		t.Fatalf("backend ID %d holds %+v, %v; want 10.27.2.10:8080 at generation 2 (the test needs the ID reused)", stale.BackendId, be, err)
	}
	for i := range 5 {
		c, pod, _, err := tp.dial("10.27.0.1:30095")
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if pod != "10.27.1.11" {
			t.Fatalf("connection %d to NodePort 30095 reached %s, want its own backend 10.27.1.11, not another Service's", i, pod)
		}
	}
}
