package nodeipam

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"sync"
)

var (
	// ErrCIDRSetFull is returned when every node CIDR is in use.
	ErrCIDRSetFull = errors.New("no node CIDR left in the cluster CIDR")
	// ErrOutOfRange is returned for a CIDR that is not a node-sized subnet of
	// the cluster CIDR.
	ErrOutOfRange = errors.New("CIDR is not a node subnet of the cluster CIDR")
	// ErrInvalidCIDR is returned for an unusable cluster CIDR or mask.
	ErrInvalidCIDR = errors.New("invalid cluster CIDR or node mask")
)

// maxSubnetBits caps how many node subnets one cluster CIDR splits into
// (2^16, as Kubernetes' allocator does).
const maxSubnetBits = 16

// CIDRSet hands out the node-sized subnets of a cluster CIDR, each at most
// once, lowest free first after the last one handed out.
type CIDRSet struct {
	mu      sync.Mutex
	cluster netip.Prefix
	mask    int
	count   int
	used    []bool
	inUse   int
	next    int
}

// NewCIDRSet splits cluster into subnets of the given mask size.
func NewCIDRSet(cluster netip.Prefix, mask int) (*CIDRSet, error) {
	if !cluster.IsValid() {
		return nil, fmt.Errorf("%w: cluster CIDR is not set", ErrInvalidCIDR)
	}
	cluster = cluster.Masked()
	bits := mask - cluster.Bits()
	switch {
	case mask > cluster.Addr().BitLen():
		return nil, fmt.Errorf("%w: node mask /%d is longer than an address", ErrInvalidCIDR, mask)
	case bits < 0:
		return nil, fmt.Errorf("%w: node mask /%d is shorter than the cluster CIDR %s", ErrInvalidCIDR, mask, cluster)
	case bits > maxSubnetBits:
		return nil, fmt.Errorf("%w: cluster CIDR %s split into /%d gives 2^%d subnets, more than 2^%d", ErrInvalidCIDR, cluster, mask, bits, maxSubnetBits)
	}
	n := 1 << bits
	return &CIDRSet{cluster: cluster, mask: mask, count: n, used: make([]bool, n)}, nil
}

// subnet returns the i-th node subnet.
func (s *CIDRSet) subnet(i int) netip.Prefix {
	base := new(big.Int).SetBytes(s.cluster.Addr().AsSlice())
	off := new(big.Int).Lsh(big.NewInt(int64(i)), uint(s.cluster.Addr().BitLen()-s.mask))
	b := base.Add(base, off).FillBytes(make([]byte, s.cluster.Addr().BitLen()/8))
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, s.mask)
}

// index returns the index of a node subnet, or ErrOutOfRange.
func (s *CIDRSet) index(p netip.Prefix) (int, error) {
	if p.Bits() != s.mask || !s.cluster.Contains(p.Addr()) || p.Masked() != p {
		return 0, fmt.Errorf("%w: %s (cluster %s, node mask /%d)", ErrOutOfRange, p, s.cluster, s.mask)
	}
	base := new(big.Int).SetBytes(s.cluster.Addr().AsSlice())
	a := new(big.Int).SetBytes(p.Addr().AsSlice())
	off := a.Sub(a, base)
	return int(off.Rsh(off, uint(s.cluster.Addr().BitLen()-s.mask)).Int64()), nil
}

// Allocate hands out a free node subnet.
func (s *CIDRSet) Allocate() (netip.Prefix, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inUse == s.count {
		return netip.Prefix{}, fmt.Errorf("%w: all %d subnets of %s are in use", ErrCIDRSetFull, s.count, s.cluster)
	}
	for k := 0; k < s.count; k++ {
		i := (s.next + k) % s.count
		if !s.used[i] {
			s.used[i] = true
			s.inUse++
			s.next = (i + 1) % s.count
			return s.subnet(i), nil
		}
	}
	return netip.Prefix{}, ErrCIDRSetFull
}

// Occupy marks p as in use (a node that already has it). It reports whether
// p was free before.
func (s *CIDRSet) Occupy(p netip.Prefix) (bool, error) {
	i, err := s.index(p)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used[i] {
		return false, nil
	}
	s.used[i] = true
	s.inUse++
	return true, nil
}

// Release frees p; releasing a free subnet does nothing.
func (s *CIDRSet) Release(p netip.Prefix) error {
	i, err := s.index(p)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used[i] {
		s.used[i] = false
		s.inUse--
	}
	return nil
}

// InUse returns how many subnets are handed out, and how many there are.
func (s *CIDRSet) InUse() (used, total int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse, s.count
}
