package storage

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// grantedTTL is the TTL etcd granted lease id.
func grantedTTL(t *testing.T, s *Store, id clientv3.LeaseID) int64 {
	t.Helper()
	resp, err := s.Client().TimeToLive(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return resp.GrantedTTL
}

func TestLeaseManagerReusesALeaseWithinTheWindow(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	m := newLeaseManager(s.Client().Lease, 0)
	clock := time.Unix(1_000_000, 0)
	m.now = func() time.Time { return clock }

	// An hour's TTL: the window is the whole reuse (60 s < 5 % of 3600 s),
	// and the lease is granted for both.
	first, err := m.get(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	if got := grantedTTL(t, s, first); got != 3660 {
		t.Fatalf("granted TTL %d, want 3600 + the 60 s window", got)
	}
	clock = clock.Add(59 * time.Second)
	if id, err := m.get(ctx, 3600); err != nil || id != first {
		t.Fatalf("write 59 s later got lease %x (%v), want the first one %x", id, err, first)
	}
	// Past the window the first lease no longer outlives the TTL.
	clock = clock.Add(2 * time.Second)
	second, err := m.get(ctx, 3600)
	if err != nil || second == first {
		t.Fatalf("write 61 s later got lease %x (%v), want a new one", second, err)
	}
	// A shorter TTL does not take a lease that outlives it by more than
	// its window (5 % of 600 s).
	short, err := m.get(ctx, 600)
	if err != nil || short == second {
		t.Fatalf("600 s TTL got lease %x (%v), want one of its own", short, err)
	}
	if got := grantedTTL(t, s, short); got != 630 {
		t.Fatalf("granted TTL %d, want 600 + 5 %%", got)
	}
	// Short TTLs get no window: every write its own lease.
	a, errA := m.get(ctx, 2)
	b, errB := m.get(ctx, 2)
	if errA != nil || errB != nil || a == b {
		t.Fatalf("2 s TTLs got leases %x, %x (%v, %v), want two", a, b, errA, errB)
	}
	// One lease serves at most leaseMaxKeys writes.
	clock = clock.Add(time.Hour)
	shared, err := m.get(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < leaseMaxKeys; i++ {
		if id, err := m.get(ctx, 3600); err != nil || id != shared {
			t.Fatalf("write %d got lease %x (%v), want %x", i+1, id, err, shared)
		}
	}
	if id, err := m.get(ctx, 3600); err != nil || id == shared {
		t.Fatalf("write %d got lease %x (%v), want a new one", leaseMaxKeys+1, id, err)
	}
}

// leaseOf is the lease etcd holds key under (0: none).
func leaseOf(t *testing.T, s *Store, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := s.Client().Get(context.Background(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %v %v", key, resp, err)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

func TestWritesWithTTLExpireAndWatchersSeeTheDeletion(t *testing.T) {
	s := openStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	from, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	events, _ := s.Watch(ctx, "/registry/events/", from+1)

	const key = "/registry/events/ns/e"
	rev, err := s.Create(ctx, key, podJSON("e"), WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	created := leaseOf(t, s, key)
	if created == 0 || grantedTTL(t, s, created) != 2 {
		t.Fatalf("created under lease %x, want one of 2 s", created)
	}
	// An update sets the lifetime anew, under a lease of its own (a 2 s
	// TTL has no reuse window).
	if _, _, err := s.OptimisticPut(ctx, key, podJSON("e2"), rev, WithTTL(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if updated := leaseOf(t, s, key); updated == 0 || updated == created {
		t.Fatalf("updated under lease %x, want a new one (created under %x)", updated, created)
	}
	// Writes without a TTL attach no lease, and take a key's away.
	for _, k := range []string{"/registry/events/ns/kept", "/registry/configmaps/ns/c"} {
		if _, err := s.Create(ctx, k, podJSON("k")); err != nil {
			t.Fatal(err)
		}
		if id := leaseOf(t, s, k); id != 0 {
			t.Fatalf("%s is under lease %x", k, id)
		}
	}
	rev, err = s.Create(ctx, "/registry/events/ns/untimed", podJSON("u"), WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.OptimisticPut(ctx, "/registry/events/ns/untimed", podJSON("u2"), rev); err != nil {
		t.Fatal(err)
	}
	if id := leaseOf(t, s, "/registry/events/ns/untimed"); id != 0 {
		t.Fatalf("a write without TTL left lease %x", id)
	}

	deadline := time.After(30 * time.Second) // bounds a hang only
	for {
		select {
		case b, ok := <-events:
			if !ok {
				t.Fatal("watch ended")
			}
			for _, ev := range b.Events {
				if ev.Delete && ev.KV.Key == key {
					if ev.PrevKV == nil || string(ev.PrevKV.Value) != string(podJSON("e2")) {
						t.Fatalf("deletion's previous value %+v, want the update", ev.PrevKV)
					}
					if _, _, err := s.Get(ctx, "/registry/events/ns/kept"); err != nil {
						t.Fatalf("a key without TTL went: %v", err)
					}
					return
				}
				if ev.Delete {
					t.Fatalf("%s deleted", ev.KV.Key)
				}
			}
		case <-deadline:
			t.Fatal("the key with a 2 s TTL is still there after 30 s")
		}
	}
}

func TestWriteWithTTLRecoversFromARevokedSharedLease(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	if _, err := s.Create(ctx, "/registry/events/ns/a", podJSON("a"), WithTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	shared := leaseOf(t, s, "/registry/events/ns/a")
	if _, err := s.Client().Revoke(ctx, shared); err != nil {
		t.Fatal(err)
	}
	// The manager still holds the revoked lease as reusable.
	if _, err := s.Create(ctx, "/registry/events/ns/b", podJSON("b"), WithTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if id := leaseOf(t, s, "/registry/events/ns/b"); id == 0 || id == shared {
		t.Fatalf("written under lease %x, want a new one (revoked %x)", id, shared)
	}
}
