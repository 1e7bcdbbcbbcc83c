package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/waggle-io/waggle/dataplane"
)

const procIPVS = "/proc/net/ip_vs"

func supported() error {
	if _, err := os.Stat(procIPVS); err == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, merr := exec.CommandContext(ctx, "modprobe", "ip_vs").CombinedOutput()
	if _, err := os.Stat(procIPVS); err == nil {
		return nil
	}
	why := fmt.Sprintf("modprobe ip_vs: %v %s", merr, out)
	if merr == nil {
		why = "modprobe ip_vs succeeded but " + procIPVS + " is still missing"
	}
	return fmt.Errorf("this kernel has no IPVS (no %s; %s); use --mode=ebpf or --mode=iptables: %w", procIPVS, why, dataplane.ErrNotSupported)
}

// netlinkHandle is the real Handle (github.com/moby/ipvs).
type netlinkHandle struct{ h *mobyipvs.Handle }

func newNetlinkHandle(nsPath string) (Handle, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	h, err := mobyipvs.New(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open IPVS netlink socket: %w", err)
	}
	// Masquerade through IPVS needs conntrack for its connections.
	_ = os.WriteFile("/proc/sys/net/ipv4/vs/conntrack", []byte("1"), 0o644)
	return &netlinkHandle{h: h}, nil
}

func protoNum(p dataplane.Protocol) uint16 {
	if p == dataplane.UDP {
		return syscall.IPPROTO_UDP
	}
	return syscall.IPPROTO_TCP
}

func family(a netip.Addr) uint16 {
	if a.Is4() {
		return syscall.AF_INET
	}
	return syscall.AF_INET6
}

func toMoby(v VirtualServer) *mobyipvs.Service {
	s := &mobyipvs.Service{
		Address: net.IP(v.Addr.AsSlice()), Port: v.Port, Protocol: protoNum(v.Protocol),
		SchedName: v.Scheduler, AddressFamily: family(v.Addr), Netmask: 0xffffffff,
	}
	if v.Addr.Is6() {
		s.Netmask = 128
	}
	if v.Persistent {
		s.Flags |= 0x1 // IP_VS_SVC_F_PERSISTENT
		s.Timeout = v.Timeout
	}
	return s
}

func fromMoby(s *mobyipvs.Service) VirtualServer {
	a, _ := netip.AddrFromSlice(s.Address)
	p := dataplane.TCP
	if s.Protocol == syscall.IPPROTO_UDP {
		p = dataplane.UDP
	}
	v := VirtualServer{Addr: a.Unmap(), Port: s.Port, Protocol: p, Scheduler: s.SchedName}
	if s.Flags&0x1 != 0 {
		v.Persistent, v.Timeout = true, s.Timeout
	}
	return v
}

func (n *netlinkHandle) Services() ([]VirtualServer, error) {
	ss, err := n.h.GetServices()
	if err != nil {
		return nil, err
	}
	var out []VirtualServer
	for _, s := range ss {
		if s.FWMark != 0 {
			continue
		}
		out = append(out, fromMoby(s))
	}
	return out, nil
}
func (n *netlinkHandle) AddService(v VirtualServer) error    { return n.h.NewService(toMoby(v)) }
func (n *netlinkHandle) UpdateService(v VirtualServer) error { return n.h.UpdateService(toMoby(v)) }
func (n *netlinkHandle) DelService(v VirtualServer) error {
	err := n.h.DelService(toMoby(v))
	if errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return err
}
func (n *netlinkHandle) Destinations(v VirtualServer) ([]RealServer, error) {
	ds, err := n.h.GetDestinations(toMoby(v))
	if err != nil {
		return nil, err
	}
	out := make([]RealServer, 0, len(ds))
	for _, d := range ds {
		a, _ := netip.AddrFromSlice(d.Address)
		out = append(out, RealServer{Addr: a.Unmap(), Port: d.Port, Weight: d.Weight, ActiveConns: d.ActiveConnections, InactiveConns: d.InactiveConnections})
	}
	return out, nil
}
func toDest(r RealServer) *mobyipvs.Destination {
	return &mobyipvs.Destination{Address: net.IP(r.Addr.AsSlice()), Port: r.Port, Weight: r.Weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq, AddressFamily: family(r.Addr)}
}
func (n *netlinkHandle) AddDestination(v VirtualServer, r RealServer) error {
	return n.h.NewDestination(toMoby(v), toDest(r))
}
func (n *netlinkHandle) UpdateDestination(v VirtualServer, r RealServer) error {
	return n.h.UpdateDestination(toMoby(v), toDest(r))
}
func (n *netlinkHandle) DelDestination(v VirtualServer, r RealServer) error {
	err := n.h.DelDestination(toMoby(v), toDest(r))
	if errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return err
}

// netlinkLink is the real Link (github.com/vishvananda/netlink).
type netlinkLink struct{ h *netlink.Handle }

func newNetlinkLink(nsPath string) (Link, error) {
	if nsPath == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
		return &netlinkLink{h: h}, nil
	}
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	return &netlinkLink{h: h}, nil
}

func (l *netlinkLink) EnsureDummy(name string) error {
	if _, err := l.h.LinkByName(name); err == nil {
		return nil
	}
	err := l.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}})
	if err != nil && !errors.Is(err, syscall.EEXIST) {
		return err
	}
	return nil
}

func (l *netlinkLink) Addrs(name string) ([]netip.Addr, error) {
	lk, err := l.h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, err
	}
	as, err := l.h.AddrList(lk, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.Unmap().IsLinkLocalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func hostAddr(a netip.Addr) *netlink.Addr {
	bits := 32
	if a.Is6() {
		bits = 128
	}
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, bits)}}
}

func (l *netlinkLink) AddAddr(name string, a netip.Addr) error {
	lk, err := l.h.LinkByName(name)
	if err != nil {
		return err
	}
	if err := l.h.AddrAdd(lk, hostAddr(a)); err != nil && !errors.Is(err, syscall.EEXIST) {
		return err
	}
	return nil
}

func (l *netlinkLink) DelAddr(name string, a netip.Addr) error {
	lk, err := l.h.LinkByName(name)
	if err != nil {
		return err
	}
	if err := l.h.AddrDel(lk, hostAddr(a)); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
		return err
	}
	return nil
}

func (l *netlinkLink) DeleteDummy(name string) error {
	lk, err := l.h.LinkByName(name)
	if err != nil {
		return nil // gone
	}
	return l.h.LinkDel(lk)
}
