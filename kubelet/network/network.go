// Package network gives each pod its network: a named network namespace
// (under /run/netns, so `ip netns` lists it) and an interface in it set up by
// the node's CNI plugin through containernetworking/cni's libcni, with the
// configuration list found in the CNI config dir. It also writes that
// configuration (CNI type "waggle") from the node's pod CIDR when none is
// there, and offers Hollow, the hollow node's in-memory address allocator.
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

// ErrNetNSBusy means a pod's network namespace could not be removed (it is
// still mounted or referenced somewhere): its address is kept, not released
// to another pod, until a later TearDown succeeds.
var ErrNetNSBusy = errors.New("network namespace cannot be removed")

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

// Configurer is a Manager whose configuration comes from the node's pod
// CIDR once it is known: the kubelet calls Configure when the Manager is not
// Ready and the Node has a pod CIDR. podCIDRs holds the node's primary pod
// CIDR first and, on a dual-stack node, one of the other family;
// clusterCIDRs the cluster's (none, one, or one per family). changed
// reports whether anything changed.
type Configurer interface {
	Configure(podCIDRs, clusterCIDRs []netip.Prefix) (changed bool, err error)
}

// Hollow is the hollow node's network (--runtime=hollow): addresses from the
// pod CIDR handed out in memory, no namespace, no interface. It is not Ready
// until it has a prefix (given to NewHollow or later to Configure).
type Hollow struct {
	mu     sync.Mutex
	prefix netip.Prefix
	used   map[netip.Addr]string
	next   netip.Addr
}

var _ Configurer = (*Hollow)(nil)

// NewHollow returns a hollow manager allocating from prefix (e.g. the node's
// pod CIDR); an invalid prefix leaves it unconfigured.
func NewHollow(prefix netip.Prefix) *Hollow {
	h := &Hollow{used: map[netip.Addr]string{}}
	h.Configure([]netip.Prefix{prefix}, nil)
	return h
}

// Configure implements Configurer: allocation continues from the new
// primary prefix (a hollow pod has one address).
func (h *Hollow) Configure(prefixes, _ []netip.Prefix) (bool, error) {
	if len(prefixes) == 0 || !prefixes[0].IsValid() {
		return false, nil
	}
	prefix := prefixes[0].Masked()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.prefix == prefix {
		return false, nil
	}
	h.prefix, h.next = prefix, prefix.Addr().Next().Next()
	return true, nil
}

// SetUp implements Manager.
func (h *Hollow) SetUp(_ context.Context, pod Pod) (Sandbox, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.prefix.IsValid() {
		return Sandbox{}, ErrNoConfig
	}
	for ip, uid := range h.used {
		if uid == pod.UID {
			return Sandbox{IPs: []string{ip.String()}, ContainerID: pod.UID}, nil
		}
	}
	start := h.next
	for {
		a := h.next
		h.next = h.next.Next()
		if !h.prefix.Contains(h.next) {
			h.next = h.prefix.Addr().Next().Next()
		}
		if _, taken := h.used[a]; !taken && h.prefix.Contains(a) {
			h.used[a] = pod.UID
			return Sandbox{IPs: []string{a.String()}, ContainerID: pod.UID}, nil
		}
		if h.next == start {
			return Sandbox{}, fmt.Errorf("hollow network: %s is exhausted", h.prefix)
		}
	}
}

// TearDown implements Manager.
func (h *Hollow) TearDown(_ context.Context, pod Pod, _ Sandbox) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ip, uid := range h.used {
		if uid == pod.UID {
			delete(h.used, ip)
		}
	}
	return nil
}

// Ready implements Manager.
func (h *Hollow) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.prefix.IsValid() {
		return ErrNoConfig
	}
	return nil
}

// InUse returns how many addresses are allocated.
func (h *Hollow) InUse() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.used) }
