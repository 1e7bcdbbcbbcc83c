package storage

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lease reuse, as kube-apiserver's storage: granting an etcd lease is a
// consensus round of its own, and every key written with a TTL (Events,
// the only kind with one) needs a lease, so writes close in time share
// one. The shared lease is granted for the TTL plus a reuse window; a write
// within the window takes it when the lease still outlives the write's TTL
// (so the key lives at least its TTL) by no more than the window (so no
// key outlives its TTL by more than the window).
const (
	// DefaultLeaseReuse is the longest window a lease is shared for
	// (kube-apiserver's --lease-reuse-duration-seconds default, 60 s).
	DefaultLeaseReuse = 60 * time.Second
	// leaseReuseShare caps the window at this share of the TTL (5 %, as
	// upstream), so short TTLs are not stretched by a whole minute.
	leaseReuseShare = 0.05
	// leaseMaxKeys is how many writes one lease serves before a new one
	// is granted (upstream's default), so the revocation that ends a
	// lease deletes a bounded number of keys in one transaction.
	leaseMaxKeys = 1000
)

// leaseManager hands out the lease of a write with a TTL, reusing the last
// one it granted when it fits. It is safe for concurrent use.
type leaseManager struct {
	lease clientv3.Lease
	// reuse is the longest reuse window; now is the clock (tests set it).
	reuse time.Duration
	now   func() time.Time

	mu sync.Mutex
	// id is the last lease granted, until expires (as this side saw it:
	// etcd started it no earlier than that); keys counts the writes given it.
	id      clientv3.LeaseID
	expires time.Time
	keys    int64
}

func newLeaseManager(l clientv3.Lease, reuse time.Duration) *leaseManager {
	if reuse <= 0 {
		reuse = DefaultLeaseReuse
	}
	return &leaseManager{lease: l, reuse: reuse, now: time.Now}
}

// ttlSeconds is a TTL in etcd's whole seconds, rounded up: a key never
// goes before the TTL asked for.
func ttlSeconds(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}

// window is the reuse window of leases for ttl seconds: the smaller of 5 %
// of the TTL and the configured reuse, in whole seconds.
func (m *leaseManager) window(ttl int64) int64 {
	return min(int64(leaseReuseShare*float64(ttl)), int64(m.reuse/time.Second))
}

// get returns a lease that keeps a key written now for at least ttl
// seconds and at most ttl plus the reuse window.
func (m *leaseManager) get(ctx context.Context, ttl int64) (clientv3.LeaseID, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	w := m.window(ttl)
	least := now.Add(time.Duration(ttl) * time.Second)
	most := least.Add(time.Duration(w) * time.Second)
	if m.id != 0 && least.Before(m.expires) && !m.expires.After(most) && m.keys < leaseMaxKeys {
		m.keys++
		return m.id, nil
	}
	resp, err := m.lease.Grant(ctx, ttl+w)
	if err != nil {
		return 0, err
	}
	m.id, m.expires, m.keys = resp.ID, most, 1
	return resp.ID, nil
}

// forget drops a lease etcd no longer knows (revoked, or expired while a
// clock stood still), so the next write is granted a fresh one.
func (m *leaseManager) forget(id clientv3.LeaseID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.id == id {
		m.id, m.keys = 0, 0
	}
}
