// Package network gives each pod its network: a named network namespace
// (under /run/netns, so `ip netns` lists it) and an interface in it set up by
// the node's CNI plugin through containernetworking/cni's libcni, with the
// configuration list found in the CNI config dir. It also writes that
// configuration (CNI type "waggle") from the node's pod CIDR when none is
// there, and offers a fake that hands out addresses in memory for the hollow
// node.
//
// It is not the CNI plugin (cmd/waggle-cni, package cni) and not the
// cross-node route controller (cni/routes).
package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
)

// ErrNoConfig means the CNI config dir holds no network configuration yet.
var ErrNoConfig = errors.New("no CNI network configuration")

// Pod names a pod for its network.
type Pod struct {
	UID, Namespace, Name string
}

// Sandbox is a pod's network as set up: what must be kept (in the kubelet's
// state dir) to tear it down after a restart.
type Sandbox struct {
	// NetNS is the network namespace's path ("" for host-network pods).
	NetNS string `json:"netns"`
	// Name is the namespace's name under /run/netns.
	Name string `json:"name"`
	// IPs are the pod's addresses, IPv4 first.
	IPs []string `json:"ips"`
	// ContainerID is the ID given to CNI (its cache key).
	ContainerID string `json:"containerID"`
}

// Manager sets pods' networks up and tears them down.
type Manager interface {
	// SetUp creates the pod's network namespace and runs CNI ADD in it.
	SetUp(ctx context.Context, pod Pod) (Sandbox, error)
	// TearDown runs CNI DEL and removes the namespace. It is idempotent:
	// tearing down what is already gone succeeds.
	TearDown(ctx context.Context, pod Pod, sb Sandbox) error
	// Ready reports whether the manager can set up pods (a config exists).
	Ready() error
}

// Fake hands out addresses from a prefix in memory and creates no
// namespace: the hollow node's network.
type Fake struct {
	mu     sync.Mutex
	prefix netip.Prefix
	used   map[netip.Addr]string
	next   netip.Addr
}

// NewFake returns a fake manager allocating from prefix (e.g. the node's pod
// CIDR); an invalid prefix means 10.244.0.0/16.
func NewFake(prefix netip.Prefix) *Fake {
	if !prefix.IsValid() {
		prefix = netip.MustParsePrefix("10.244.0.0/16")
	}
	prefix = prefix.Masked()
	return &Fake{prefix: prefix, used: map[netip.Addr]string{}, next: prefix.Addr().Next().Next()}
}

// SetUp implements Manager.
func (f *Fake) SetUp(_ context.Context, pod Pod) (Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ip, uid := range f.used {
		if uid == pod.UID {
			return Sandbox{IPs: []string{ip.String()}, ContainerID: pod.UID}, nil
		}
	}
	start := f.next
	for {
		a := f.next
		f.next = f.next.Next()
		if !f.prefix.Contains(f.next) {
			f.next = f.prefix.Addr().Next().Next()
		}
		if _, taken := f.used[a]; !taken && f.prefix.Contains(a) {
			f.used[a] = pod.UID
			return Sandbox{IPs: []string{a.String()}, ContainerID: pod.UID}, nil
		}
		if f.next == start {
			return Sandbox{}, fmt.Errorf("fake network: %s is exhausted", f.prefix)
		}
	}
}

// TearDown implements Manager.
func (f *Fake) TearDown(_ context.Context, pod Pod, _ Sandbox) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ip, uid := range f.used {
		if uid == pod.UID {
			delete(f.used, ip)
		}
	}
	return nil
}

// Ready implements Manager.
func (f *Fake) Ready() error { return nil }

// InUse returns how many addresses are allocated.
func (f *Fake) InUse() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.used) }
