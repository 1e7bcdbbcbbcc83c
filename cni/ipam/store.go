// Package ipam is the address store of Waggle's CNI plugin: it hands out
// addresses from a node's pod CIDRs and keeps every allocation on disk, one
// file per address, under an exclusive flock so that concurrent plugin
// processes never share an address and a crash never leaves a half-written
// allocation behind.
//
// The layout is the one of the reference host-local plugin, so its tools and
// habits carry over: <dataDir>/<network>/<address> holds
// "<containerID>\r\n<ifname>", last_reserved_ip.<n> remembers where the
// round-robin scan of range n stopped, and "lock" is the lock file. Writes
// are atomic (a temporary file hard-linked into place), which host-local's
// are not. The store is address-family generic (net/netip).
//
// It is not an allocator of node pod CIDRs (the controller-manager does that)
// and it does not touch interfaces.
package ipam

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrExhausted: every usable address of the range is allocated.
	ErrExhausted = errors.New("address pool exhausted")
	// ErrInvalidRange: the range cannot hold any pod address.
	ErrInvalidRange = errors.New("invalid address range")
	// ErrInvalidKey: a container ID or interface name that cannot be stored.
	ErrInvalidKey = errors.New("invalid allocation key")
)

const (
	lockName     = "lock"
	lastIPPrefix = "last_reserved_ip."
	tmpPrefix    = ".tmp-"
	lineBreak    = "\r\n"
)

// Allocation is one address held by one container interface.
type Allocation struct {
	Addr        netip.Addr
	ContainerID string
	IfName      string
}

// Store is the allocation directory of one network. Its methods that read or
// write allocations must be called between Lock and Unlock; Lock takes an
// exclusive flock shared by every process using the same directory.
type Store struct {
	dir  string
	lock *os.File
}

// Open opens (creating it if needed) the store of network under dataDir.
func Open(dataDir, network string) (*Store, error) {
	if network == "" || strings.ContainsAny(network, `/\`) || network == "." || network == ".." {
		return nil, fmt.Errorf("network name %q: %w", network, ErrInvalidKey)
	}
	dir := filepath.Join(dataDir, network)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create IPAM directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open IPAM lock: %w", err)
	}
	return &Store{dir: dir, lock: f}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Close releases the lock file (and with it any lock still held).
func (s *Store) Close() error { return s.lock.Close() }

// Lock takes the store's exclusive lock, waiting for other holders, and
// removes temporary files a crashed writer may have left.
func (s *Store) Lock() error {
	if err := flock(s.lock); err != nil {
		return fmt.Errorf("lock IPAM store %s: %w", s.dir, err)
	}
	s.removeTemporaries()
	return nil
}

// Unlock releases the lock taken by Lock.
func (s *Store) Unlock() error {
	if err := funlock(s.lock); err != nil {
		return fmt.Errorf("unlock IPAM store %s: %w", s.dir, err)
	}
	return nil
}

func (s *Store) removeTemporaries() {
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			os.Remove(filepath.Join(s.dir, e.Name()))
		}
	}
}

// List returns every allocation of the store, ordered by address. Every
// ADD and DEL calls it (through Get), so it reads each allocation with as
// few system calls as it can: the directory is opened once and each file
// opened relative to it (see readAt).
func (s *Store) List() ([]Allocation, error) {
	d, err := os.Open(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list IPAM store: %w", err)
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("list IPAM store: %w", err)
	}
	var out []Allocation
	for _, e := range ents {
		addr, err := netip.ParseAddr(e.Name())
		if err != nil || !e.Type().IsRegular() {
			continue // lock, last_reserved_ip.*, foreign files
		}
		data, err := readAt(d, e.Name())
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("read allocation %s: %w", addr, err)
		}
		id, ifname, _ := strings.Cut(strings.TrimSpace(string(data)), lineBreak)
		out = append(out, Allocation{Addr: addr, ContainerID: strings.TrimSpace(id), IfName: strings.TrimSpace(ifname)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr.Less(out[j].Addr) })
	return out, nil
}

// Get returns the addresses held by containerID's interface ifname.
func (s *Store) Get(containerID, ifname string) ([]netip.Addr, error) {
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range all {
		if a.ContainerID == containerID && a.IfName == ifname {
			out = append(out, a.Addr)
		}
	}
	return out, nil
}

// Usable reports the first and last addresses of r that may go to pods: the
// network address and, for IPv4, the broadcast address are excluded, and so
// is the first host address (the gateway).
func Usable(r netip.Prefix) (first, last netip.Addr, err error) {
	if !r.IsValid() || r.Masked() != r {
		return first, last, fmt.Errorf("%s: %w: not a network address", r, ErrInvalidRange)
	}
	hostBits := r.Addr().BitLen() - r.Bits()
	if hostBits < 2 {
		return first, last, fmt.Errorf("%s: %w: too small for a gateway and a pod", r, ErrInvalidRange)
	}
	gw := r.Addr().Next()
	first = gw.Next()
	last = LastAddr(r)
	if r.Addr().Is4() {
		last = last.Prev() // broadcast
	}
	if last.Less(first) {
		return first, last, fmt.Errorf("%s: %w: too small for a gateway and a pod", r, ErrInvalidRange)
	}
	return first, last, nil
}

// Gateway is the gateway address of r: its first host address.
func Gateway(r netip.Prefix) netip.Addr { return r.Masked().Addr().Next() }

// LastAddr is the last address of r (for IPv4, its broadcast address).
func LastAddr(r netip.Prefix) netip.Addr {
	b := r.Masked().Addr().AsSlice()
	for i := r.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Allocate gives containerID's interface ifname an address from r (which is
// range number rangeID of the network). When that interface already holds an
// address of r, Allocate returns it again, so a repeated ADD is stable. The
// scan is round-robin from the last address handed out, so a released address
// is not reused at once.
func (s *Store) Allocate(containerID, ifname string, r netip.Prefix, rangeID int) (netip.Addr, error) {
	if err := validKey(containerID, ifname); err != nil {
		return netip.Addr{}, err
	}
	first, last, err := Usable(r)
	if err != nil {
		return netip.Addr{}, err
	}
	held, err := s.Get(containerID, ifname)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range held {
		if r.Contains(a) {
			return a, nil
		}
	}
	start := first
	if b, err := os.ReadFile(filepath.Join(s.dir, fmt.Sprintf("%s%d", lastIPPrefix, rangeID))); err == nil {
		if prev, err := netip.ParseAddr(strings.TrimSpace(string(b))); err == nil && !prev.Less(first) && prev.Less(last) {
			start = prev.Next()
		}
	}
	a := start
	for {
		ok, err := s.reserve(a, containerID, ifname)
		if err != nil {
			return netip.Addr{}, err
		}
		if ok {
			// Only a hint for the next scan: losing it loses nothing.
			_ = os.WriteFile(filepath.Join(s.dir, fmt.Sprintf("%s%d", lastIPPrefix, rangeID)), []byte(a.String()), 0o600)
			return a, nil
		}
		if a == last {
			a = first
		} else {
			a = a.Next()
		}
		if a == start {
			return netip.Addr{}, fmt.Errorf("range %s: %w", r, ErrExhausted)
		}
	}
}

// Free reports how many addresses of r are still free.
func (s *Store) Free(r netip.Prefix) (uint64, error) {
	first, last, err := Usable(r)
	if err != nil {
		return 0, err
	}
	all, err := s.List()
	if err != nil {
		return 0, err
	}
	var used uint64
	for _, a := range all {
		if r.Contains(a.Addr) {
			used++
		}
	}
	size := span(first, last)
	if used > size {
		return 0, nil
	}
	return size - used, nil
}

// span is the number of addresses from first to last inclusive, saturated
// at the largest uint64 (IPv6 ranges can be larger).
func span(first, last netip.Addr) uint64 {
	f, l := first.As16(), last.As16()
	var fhi, flo, hi, lo uint64
	for i := 0; i < 8; i++ {
		fhi, flo = fhi<<8|uint64(f[i]), flo<<8|uint64(f[i+8])
		hi, lo = hi<<8|uint64(l[i]), lo<<8|uint64(l[i+8])
	}
	dlo, dhi := lo-flo, hi-fhi
	if lo < flo {
		dhi--
	}
	if dhi != 0 || dlo == ^uint64(0) {
		return ^uint64(0)
	}
	return dlo + 1
}

// reserve writes the allocation file of a atomically; false means a is taken.
func (s *Store) reserve(a netip.Addr, containerID, ifname string) (bool, error) {
	final := filepath.Join(s.dir, a.String())
	if _, err := os.Lstat(final); err == nil {
		return false, nil
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(s.dir, tmpPrefix+hex.EncodeToString(rnd[:]))
	if err := os.WriteFile(tmp, []byte(containerID+lineBreak+ifname), 0o600); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("write allocation %s: %w", a, err)
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, final); err != nil {
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("commit allocation %s: %w", a, err)
	}
	return true, nil
}

// Release frees every address held by containerID's interface ifname and
// returns them. Releasing nothing is not an error.
func (s *Store) Release(containerID, ifname string) ([]netip.Addr, error) {
	held, err := s.Get(containerID, ifname)
	if err != nil {
		return nil, err
	}
	for _, a := range held {
		if err := s.ReleaseAddr(a); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// ReleaseAddr frees one address whoever holds it.
func (s *Store) ReleaseAddr(a netip.Addr) error {
	if err := os.Remove(filepath.Join(s.dir, a.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("release %s: %w", a, err)
	}
	return nil
}

func validKey(containerID, ifname string) error {
	if containerID == "" || ifname == "" {
		return fmt.Errorf("container ID %q, interface %q: %w: both are required", containerID, ifname, ErrInvalidKey)
	}
	if strings.ContainsAny(containerID, "\r\n") || strings.ContainsAny(ifname, "\r\n") {
		return fmt.Errorf("container ID %q, interface %q: %w: line breaks", containerID, ifname, ErrInvalidKey)
	}
	return nil
}
