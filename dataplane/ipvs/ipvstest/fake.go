// Package ipvstest holds in-memory fakes of the IPVS backend's kernel edge
// (ipvs.Handle and ipvs.Link) for unit tests and the conformance suite. It
// is not for production use.
package ipvstest

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ipvs"
)

// FakeHandle is an in-memory IPVS for unit tests. Connect schedules a new
// connection the way the kernel would (round robin over real servers with a
// weight above zero, persistence by client address) and counts it as active
// on the chosen real server, so graceful termination can be tested. It
// serves tests only.
type FakeHandle struct {
	mu       sync.Mutex
	services map[dataplane.FrontendKey]*fakeService
	// Now is the persistence clock (default time.Now).
	Now func() time.Time
	// Calls counts mutating calls (to check that a repeated Sync does none).
	Calls int
}

type fakeService struct {
	vs      ipvs.VirtualServer
	dests   []ipvs.RealServer
	next    int
	persist map[netip.Addr]fakePersist
}

type fakePersist struct {
	rs   netip.AddrPort
	seen time.Time
}

// NewFakeHandle returns an empty fake.
func NewFakeHandle() *FakeHandle {
	return &FakeHandle{services: map[dataplane.FrontendKey]*fakeService{}}
}

var errExists = errors.New("file exists")
var errNoSuch = errors.New("no such process")

func (f *FakeHandle) Services() ([]ipvs.VirtualServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ipvs.VirtualServer
	for _, s := range f.services {
		out = append(out, s.vs)
	}
	return out, nil
}

func (f *FakeHandle) AddService(v ipvs.VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	if _, ok := f.services[v.Key()]; ok {
		return errExists
	}
	if !slices.Contains(ipvs.Schedulers, v.Scheduler) {
		return fmt.Errorf("scheduler %q: %w", v.Scheduler, errNoSuch)
	}
	f.services[v.Key()] = &fakeService{vs: v, persist: map[netip.Addr]fakePersist{}}
	return nil
}

func (f *FakeHandle) UpdateService(v ipvs.VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	s, ok := f.services[v.Key()]
	if !ok {
		return errNoSuch
	}
	s.vs = v
	return nil
}

func (f *FakeHandle) DelService(v ipvs.VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	delete(f.services, v.Key())
	return nil
}

func (f *FakeHandle) Destinations(v ipvs.VirtualServer) ([]ipvs.RealServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[v.Key()]
	if !ok {
		return nil, errNoSuch
	}
	return slices.Clone(s.dests), nil
}

func (f *FakeHandle) AddDestination(v ipvs.VirtualServer, r ipvs.RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	s, ok := f.services[v.Key()]
	if !ok {
		return errNoSuch
	}
	if r.Addr.Is4() != v.Addr.Is4() {
		return fmt.Errorf("real server %s of another family", r.AddrPort())
	}
	for _, d := range s.dests {
		if d.AddrPort() == r.AddrPort() {
			return errExists
		}
	}
	r.ActiveConns, r.InactiveConns = 0, 0
	s.dests = append(s.dests, r)
	return nil
}

func (f *FakeHandle) UpdateDestination(v ipvs.VirtualServer, r ipvs.RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	s, ok := f.services[v.Key()]
	if !ok {
		return errNoSuch
	}
	for i, d := range s.dests {
		if d.AddrPort() == r.AddrPort() {
			s.dests[i].Weight = r.Weight
			return nil
		}
	}
	return errNoSuch
}

func (f *FakeHandle) DelDestination(v ipvs.VirtualServer, r ipvs.RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	s, ok := f.services[v.Key()]
	if !ok {
		return errNoSuch
	}
	s.dests = slices.DeleteFunc(s.dests, func(d ipvs.RealServer) bool { return d.AddrPort() == r.AddrPort() })
	return nil
}

// ErrNoVirtualServer: Connect found no virtual server for the address.
var ErrNoVirtualServer = errors.New("fake ipvs: no virtual server")

// ErrNoRealServer: the virtual server has no real server with weight > 0.
var ErrNoRealServer = errors.New("fake ipvs: no usable real server")

// Connect schedules a new connection from client to key and returns the
// chosen real server, counting the connection as active on it.
func (f *FakeHandle) Connect(key dataplane.FrontendKey, client netip.Addr) (netip.AddrPort, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now
	if f.Now != nil {
		now = f.Now
	}
	s, ok := f.services[key]
	if !ok {
		return netip.AddrPort{}, ErrNoVirtualServer
	}
	if s.vs.Persistent {
		if p, ok := s.persist[client]; ok && now().Sub(p.seen) <= time.Duration(s.vs.Timeout)*time.Second {
			for i, d := range s.dests {
				if d.AddrPort() == p.rs {
					s.persist[client] = fakePersist{p.rs, now()}
					s.dests[i].ActiveConns++
					return p.rs, nil
				}
			}
		}
	}
	for range len(s.dests) {
		i := s.next % len(s.dests)
		s.next++
		if s.dests[i].Weight > 0 {
			s.dests[i].ActiveConns++
			if s.vs.Persistent {
				s.persist[client] = fakePersist{s.dests[i].AddrPort(), now()}
			}
			return s.dests[i].AddrPort(), nil
		}
	}
	return netip.AddrPort{}, ErrNoRealServer
}

// CloseAll ends every connection (counters back to zero).
func (f *FakeHandle) CloseAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.services {
		for i := range s.dests {
			s.dests[i].ActiveConns, s.dests[i].InactiveConns = 0, 0
		}
	}
}

// FakeLink is an in-memory dummy interface for unit tests.
type FakeLink struct {
	mu    sync.Mutex
	links map[string][]netip.Addr
}

// NewFakeLink returns a fake with no interfaces.
func NewFakeLink() *FakeLink { return &FakeLink{links: map[string][]netip.Addr{}} }

func (l *FakeLink) EnsureDummy(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.links[name]; !ok {
		l.links[name] = []netip.Addr{}
	}
	return nil
}

// Exists reports whether the interface exists.
func (l *FakeLink) Exists(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.links[name]
	return ok
}

func (l *FakeLink) Addrs(name string) ([]netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.links[name]), nil
}

func (l *FakeLink) AddAddr(name string, a netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	as, ok := l.links[name]
	if !ok {
		return fmt.Errorf("link %s not found", name)
	}
	if !slices.Contains(as, a) {
		l.links[name] = append(as, a)
	}
	return nil
}

func (l *FakeLink) DelAddr(name string, a netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.links[name] = slices.DeleteFunc(l.links[name], func(x netip.Addr) bool { return x == a })
	return nil
}

func (l *FakeLink) DeleteDummy(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.links, name)
	return nil
}
