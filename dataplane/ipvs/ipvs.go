// Package ipvs is Waggle's IPVS proxy backend: a dataplane.State becomes one
// IPVS virtual server per frontend with a real server per endpoint (over
// netlink, with github.com/moby/ipvs), the ClusterIP, ExternalIP and
// LoadBalancer addresses bound to the dummy interface waggle-ipvs0, and a few
// iptables rules (chains WAGGLE-IPVS-*) that mark traffic for masquerade as
// kube-proxy's IPVS mode does and REJECT frontends without endpoints.
//
// Removed endpoints terminate gracefully: a TCP real server with connections
// gets weight 0 and is deleted by a later Sync once its connections are gone
// (or GracePeriod passed). Kernels without IPVS (Supported says why) cannot
// run it; its logic is tested against ipvstest.FakeHandle and FakeLink. It does not
// decide what to program: that is dataplane.Compute.
package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/iptables"
)

// DummyInterface is the interface the service addresses are bound to.
const DummyInterface = "waggle-ipvs0"

// Schedulers are the IPVS schedulers the kernel knows.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh"}

// ErrBadScheduler: --ipvs-scheduler names no IPVS scheduler.
var ErrBadScheduler = errors.New("unknown IPVS scheduler")

// VirtualServer is an IPVS service.
type VirtualServer struct {
	Addr      netip.Addr
	Port      uint16
	Protocol  dataplane.Protocol
	Scheduler string
	// Persistent with Timeout (seconds) is session affinity by client IP.
	Persistent bool
	Timeout    uint32
}

// Key is the virtual server's identity.
func (v VirtualServer) Key() dataplane.FrontendKey {
	return dataplane.FrontendKey{Addr: v.Addr, Port: v.Port, Protocol: v.Protocol}
}

// RealServer is an IPVS destination (always masquerade forwarding).
type RealServer struct {
	Addr   netip.Addr
	Port   uint16
	Weight int
	// Connection counters, as the kernel reports them.
	ActiveConns, InactiveConns int
}

// AddrPort returns the real server's address and port.
func (r RealServer) AddrPort() netip.AddrPort { return netip.AddrPortFrom(r.Addr, r.Port) }

// Handle is the IPVS edge: the netlink calls the backend makes.
type Handle interface {
	Services() ([]VirtualServer, error)
	AddService(VirtualServer) error
	UpdateService(VirtualServer) error
	DelService(VirtualServer) error
	Destinations(VirtualServer) ([]RealServer, error)
	AddDestination(VirtualServer, RealServer) error
	UpdateDestination(VirtualServer, RealServer) error
	DelDestination(VirtualServer, RealServer) error
}

// Link is the dummy interface edge.
type Link interface {
	// EnsureDummy creates the dummy interface if it is missing.
	EnsureDummy(name string) error
	// Addrs lists the addresses bound to it (none if it does not exist).
	Addrs(name string) ([]netip.Addr, error)
	AddAddr(name string, a netip.Addr) error
	DelAddr(name string, a netip.Addr) error
	// DeleteDummy removes the interface; a missing one is success.
	DeleteDummy(name string) error
}

// Config configures the backend.
type Config struct {
	// Scheduler is the IPVS scheduler (default rr).
	Scheduler string
	// NetNSPath, when set, programs that network namespace.
	NetNSPath string
	// Handle, Link and Runner replace the kernel (tests); nil means the real
	// ones.
	Handle Handle
	Link   Link
	Runner iptables.Runner
	// GracePeriod bounds how long a removed TCP real server with
	// connections is kept at weight 0 (default 15 minutes).
	GracePeriod time.Duration
	Log         *slog.Logger
	Now         func() time.Time
}

// Backend is the IPVS dataplane.Backend.
type Backend struct {
	cfg    Config
	handle Handle
	link   Link
	runner iptables.Runner
	log    *slog.Logger

	mu sync.Mutex
	// ours are the virtual servers this backend programmed (NodePort ones
	// are not on the dummy interface, so this is how they are recognised).
	ours map[dataplane.FrontendKey]bool
	// draining real servers and since when.
	draining map[drainKey]time.Time
	jumped   bool
}

type drainKey struct {
	vs dataplane.FrontendKey
	rs netip.AddrPort
}

// New returns an IPVS backend. With no Handle in cfg it opens the kernel's,
// which fails with dataplane.ErrNotSupported where IPVS is absent.
func New(cfg Config) (*Backend, error) {
	if cfg.Scheduler == "" {
		cfg.Scheduler = "rr"
	}
	if !slices.Contains(Schedulers, cfg.Scheduler) {
		return nil, fmt.Errorf("%w %q: want one of %s", ErrBadScheduler, cfg.Scheduler, strings.Join(Schedulers, ", "))
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.GracePeriod == 0 {
		cfg.GracePeriod = 15 * time.Minute
	}
	b := &Backend{cfg: cfg, handle: cfg.Handle, link: cfg.Link, runner: cfg.Runner, log: cfg.Log.With("backend", "ipvs"),
		ours: map[dataplane.FrontendKey]bool{}, draining: map[drainKey]time.Time{}}
	if b.runner == nil {
		b.runner = &iptables.ExecRunner{NetNSPath: cfg.NetNSPath}
	}
	if b.link == nil {
		l, err := newNetlinkLink(cfg.NetNSPath)
		if err != nil {
			return nil, err
		}
		b.link = l
	}
	if b.handle == nil {
		h, err := newNetlinkHandle(cfg.NetNSPath)
		if err != nil {
			return nil, err
		}
		b.handle = h
	}
	return b, nil
}

// Name implements dataplane.Backend.
func (b *Backend) Name() string { return "ipvs" }

func (b *Backend) desired(f dataplane.Frontend) VirtualServer {
	vs := VirtualServer{Addr: f.Addr, Port: f.Port, Protocol: f.Protocol, Scheduler: b.cfg.Scheduler}
	if f.AffinityTimeout > 0 {
		vs.Persistent = true
		vs.Timeout = uint32(max(f.AffinityTimeout/time.Second, 1))
	}
	return vs
}

// Sync implements dataplane.Backend. Order is make-before-break: virtual
// servers and new real servers first, then addresses bound, then what is no
// longer wanted drained or removed.
func (b *Backend) Sync(ctx context.Context, st *dataplane.State) error {
	if err := st.Validate(); err != nil {
		return fmt.Errorf("ipvs sync: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.link.EnsureDummy(DummyInterface); err != nil {
		return fmt.Errorf("ensure %s: %w", DummyInterface, err)
	}
	bound, err := b.link.Addrs(DummyInterface)
	if err != nil {
		return fmt.Errorf("list %s addresses: %w", DummyInterface, err)
	}
	current, err := b.handle.Services()
	if err != nil {
		return fmt.Errorf("list IPVS services: %w", err)
	}
	have := map[dataplane.FrontendKey]VirtualServer{}
	for _, vs := range current {
		have[vs.Key()] = vs
	}
	wantAddrs := map[netip.Addr]bool{}
	want := map[dataplane.FrontendKey]bool{}
	var errs []error
	for _, f := range st.Frontends {
		want[f.FrontendKey] = true
		if f.Kind != dataplane.NodePort {
			wantAddrs[f.Addr] = true
		}
		vs := b.desired(f)
		if old, ok := have[f.FrontendKey]; !ok {
			if err := b.handle.AddService(vs); err != nil {
				errs = append(errs, &dataplane.FrontendError{Frontend: f.FrontendKey, Service: f.Service, Err: fmt.Errorf("add virtual server: %w", err)})
				continue
			}
		} else if old != vs {
			if err := b.handle.UpdateService(vs); err != nil {
				errs = append(errs, &dataplane.FrontendError{Frontend: f.FrontendKey, Service: f.Service, Err: fmt.Errorf("update virtual server: %w", err)})
				continue
			}
		}
		b.ours[f.FrontendKey] = true
		if err := b.syncDestinations(vs, f); err != nil {
			errs = append(errs, &dataplane.FrontendError{Frontend: f.FrontendKey, Service: f.Service, Err: err})
		}
	}
	for a := range wantAddrs {
		if !slices.Contains(bound, a) {
			if err := b.link.AddAddr(DummyInterface, a); err != nil {
				errs = append(errs, fmt.Errorf("bind %s to %s: %w", a, DummyInterface, err))
			}
		}
	}
	for _, a := range bound {
		if !wantAddrs[a] {
			if err := b.link.DelAddr(DummyInterface, a); err != nil {
				errs = append(errs, fmt.Errorf("unbind %s from %s: %w", a, DummyInterface, err))
			}
		}
	}
	// Ours: what this process programmed, what sits on the dummy
	// interface, and (left by an earlier process) virtual servers on this
	// node's NodePort addresses.
	nodeAddrs := map[netip.Addr]bool{}
	for _, f := range st.Frontends {
		if f.Kind == dataplane.NodePort {
			nodeAddrs[f.Addr] = true
		}
	}
	for k, vs := range have {
		if want[k] || !(b.ours[k] || slices.Contains(bound, k.Addr) || nodeAddrs[k.Addr]) {
			continue
		}
		if err := b.handle.DelService(vs); err != nil {
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", k, err))
			continue
		}
		delete(b.ours, k)
		for d := range b.draining {
			if d.vs == k {
				delete(b.draining, d)
			}
		}
	}
	if err := b.syncRules(ctx, st); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (b *Backend) syncDestinations(vs VirtualServer, f dataplane.Frontend) error {
	cur, err := b.handle.Destinations(vs)
	if err != nil {
		return fmt.Errorf("list real servers: %w", err)
	}
	byAP := map[netip.AddrPort]RealServer{}
	for _, rs := range cur {
		byAP[rs.AddrPort()] = rs
	}
	wanted := map[netip.AddrPort]bool{}
	for _, e := range f.Endpoints {
		ap := e.AddrPort()
		wanted[ap] = true
		rs := RealServer{Addr: e.Addr, Port: e.Port, Weight: 1}
		old, ok := byAP[ap]
		switch {
		case !ok:
			if err := b.handle.AddDestination(vs, rs); err != nil {
				return fmt.Errorf("add real server %s: %w", ap, err)
			}
		case old.Weight != 1:
			if err := b.handle.UpdateDestination(vs, rs); err != nil {
				return fmt.Errorf("restore weight of real server %s: %w", ap, err)
			}
		}
		delete(b.draining, drainKey{f.FrontendKey, ap})
	}
	now := b.cfg.Now()
	for ap, rs := range byAP {
		if wanted[ap] {
			continue
		}
		dk := drainKey{f.FrontendKey, ap}
		since, draining := b.draining[dk]
		conns := rs.ActiveConns + rs.InactiveConns
		graceful := vs.Protocol == dataplane.TCP && conns > 0 && (!draining || now.Sub(since) < b.cfg.GracePeriod)
		if graceful {
			if !draining {
				b.draining[dk] = now
			}
			if rs.Weight != 0 {
				rs.Weight = 0
				if err := b.handle.UpdateDestination(vs, rs); err != nil {
					return fmt.Errorf("drain real server %s: %w", ap, err)
				}
				b.log.Debug("draining real server", "frontend", f.FrontendKey.String(), "endpoint", ap.String(), "connections", conns)
			}
			continue
		}
		if err := b.handle.DelDestination(vs, rs); err != nil {
			return fmt.Errorf("delete real server %s: %w", ap, err)
		}
		delete(b.draining, dk)
	}
	return nil
}

// Draining lists the real servers kept at weight 0 while their connections
// end.
func (b *Backend) Draining() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for k := range b.draining {
		out = append(out, k.vs.String()+" -> "+k.rs.String())
	}
	slices.Sort(out)
	return out
}

// Cleanup implements dataplane.Backend: it deletes the virtual servers on
// waggle-ipvs0's addresses and those this process programmed, the interface
// and the WAGGLE-IPVS-* rules.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	bound, err := b.link.Addrs(DummyInterface)
	if err != nil {
		errs = append(errs, err)
	}
	if b.handle != nil {
		current, err := b.handle.Services()
		if err != nil {
			errs = append(errs, fmt.Errorf("list IPVS services: %w", err))
		}
		for _, vs := range current {
			if b.ours[vs.Key()] || slices.Contains(bound, vs.Addr) {
				if err := b.handle.DelService(vs); err != nil {
					errs = append(errs, fmt.Errorf("delete virtual server %s: %w", vs.Key(), err))
				}
			}
		}
	}
	b.ours = map[dataplane.FrontendKey]bool{}
	b.draining = map[drainKey]time.Time{}
	if err := b.link.DeleteDummy(DummyInterface); err != nil {
		errs = append(errs, fmt.Errorf("delete %s: %w", DummyInterface, err))
	}
	if err := CleanupRules(ctx, b.runner); err != nil {
		errs = append(errs, err)
	}
	b.jumped = false
	return errors.Join(errs...)
}

// Dump renders what this backend programmed in the kernel (Dump of its
// handle and link).
func (b *Backend) Dump() (string, error) { return Dump(b.handle, b.link) }

// Dump renders the IPVS state like `ipvsadm -Ln` (sorted), then the dummy
// interface's addresses: what golden files show.
func Dump(h Handle, l Link) (string, error) {
	var sb strings.Builder
	vss, err := h.Services()
	if err != nil {
		return "", err
	}
	slices.SortFunc(vss, func(a, b VirtualServer) int { return a.Key().Compare(b.Key()) })
	for _, vs := range vss {
		fmt.Fprintf(&sb, "%s %s %s", vs.Protocol, netip.AddrPortFrom(vs.Addr, vs.Port), vs.Scheduler)
		if vs.Persistent {
			fmt.Fprintf(&sb, " persistent %d", vs.Timeout)
		}
		sb.WriteByte('\n')
		rss, err := h.Destinations(vs)
		if err != nil {
			return "", err
		}
		slices.SortFunc(rss, func(a, b RealServer) int { return a.AddrPort().Compare(b.AddrPort()) })
		for _, rs := range rss {
			fmt.Fprintf(&sb, "  -> %s Masq %d\n", rs.AddrPort(), rs.Weight)
		}
	}
	addrs, err := l.Addrs(DummyInterface)
	if err != nil {
		return "", err
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	fmt.Fprintf(&sb, "%s:", DummyInterface)
	for _, a := range addrs {
		fmt.Fprintf(&sb, " %s", a)
	}
	sb.WriteByte('\n')
	return sb.String(), nil
}

// Cleanup removes what an IPVS backend made on this node (or in
// cfg.NetNSPath), even where the kernel has no IPVS (then only the interface
// and the rules can exist).
func Cleanup(ctx context.Context, cfg Config) error {
	b := &Backend{cfg: cfg, handle: cfg.Handle, link: cfg.Link, runner: cfg.Runner, log: slog.Default(),
		ours: map[dataplane.FrontendKey]bool{}, draining: map[drainKey]time.Time{}}
	if b.runner == nil {
		b.runner = &iptables.ExecRunner{NetNSPath: cfg.NetNSPath}
	}
	if b.link == nil {
		l, err := newNetlinkLink(cfg.NetNSPath)
		if err != nil {
			return err
		}
		b.link = l
	}
	if b.handle == nil && Supported() == nil {
		h, err := newNetlinkHandle(cfg.NetNSPath)
		if err != nil {
			return err
		}
		b.handle = h
	}
	return b.Cleanup(ctx)
}
