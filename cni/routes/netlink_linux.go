package routes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/internal/netlinkdump"
)

// NewNetlink returns the kernel Dataplane of the calling thread's network
// namespace.
func NewNetlink() Dataplane { return netlinkDP{} }

type netlinkDP struct{}

func toIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func fromIP(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func linkName(idx int) string {
	if idx == 0 {
		return ""
	}
	l, err := netlink.LinkByIndex(idx)
	if err != nil {
		return ""
	}
	return l.Attrs().Name
}

func (netlinkDP) Routes() ([]Route, error) {
	rs, err := netlinkdump.Retry(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, err
	}
	var out []Route
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		rt := Route{Dst: netip.PrefixFrom(fromIP(r.Dst.IP), ones), Gw: fromIP(r.Gw), OnLink: r.Flags&unix.RTNH_F_ONLINK != 0}
		if rt.OnLink {
			// host-gw routes leave the device to the kernel; only onlink (VXLAN)
			// routes name it.
			rt.Dev = linkName(r.LinkIndex)
		}
		out = append(out, rt)
	}
	return out, nil
}

func (netlinkDP) toNetlink(r Route) (*netlink.Route, error) {
	nr := &netlink.Route{Dst: toIPNet(r.Dst), Gw: r.Gw.AsSlice(), Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if r.Dev != "" {
		l, err := netlink.LinkByName(r.Dev)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", r.Dev, err)
		}
		nr.LinkIndex = l.Attrs().Index
	}
	if r.OnLink {
		nr.Flags = unix.RTNH_F_ONLINK
	}
	return nr, nil
}

func (d netlinkDP) ReplaceRoute(r Route) error {
	nr, err := d.toNetlink(r)
	if err != nil {
		return err
	}
	if err := netlink.RouteReplace(nr); err != nil {
		if errors.Is(err, unix.ENETUNREACH) {
			return fmt.Errorf("%w: %s is not on a directly connected network of this node (use vxlan mode)", ErrUnreachable, r.Gw)
		}
		return err
	}
	return nil
}

func (d netlinkDP) DeleteRoute(r Route) error {
	nr := &netlink.Route{Dst: toIPNet(r.Dst), Gw: r.Gw.AsSlice(), Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if err := netlink.RouteDel(nr); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

func (netlinkDP) EnsureVXLAN(v VXLANDevice) error {
	want := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: v.Name, MTU: v.MTU, HardwareAddr: v.MAC},
		VxlanId:   v.VNI, SrcAddr: v.Local.AsSlice(), Port: v.Port, Learning: false,
	}
	l, err := netlink.LinkByName(v.Name)
	if err == nil {
		have, ok := l.(*netlink.Vxlan)
		if !ok || have.VxlanId != v.VNI || have.Port != v.Port || !have.SrcAddr.Equal(want.SrcAddr) || have.Learning {
			// Not ours, or of another configuration: recreate.
			if err := netlink.LinkDel(l); err != nil {
				return fmt.Errorf("delete mismatched %s: %w", v.Name, err)
			}
			l = nil
		}
	} else if !errors.As(err, new(netlink.LinkNotFoundError)) {
		return err
	}
	if l == nil {
		if err := netlink.LinkAdd(want); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create: %w", err)
		}
		if l, err = netlink.LinkByName(v.Name); err != nil {
			return err
		}
	}
	if l.Attrs().MTU != v.MTU {
		if err := netlink.LinkSetMTU(l, v.MTU); err != nil {
			return fmt.Errorf("set MTU: %w", err)
		}
	}
	if l.Attrs().HardwareAddr.String() != v.MAC.String() {
		if err := netlink.LinkSetHardwareAddr(l, v.MAC); err != nil {
			return fmt.Errorf("set MAC: %w", err)
		}
	}
	have, err := netlinkdump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return err
	}
	wantAddr := map[string]bool{}
	for _, p := range v.Addrs {
		wantAddr[toIPNet(p).String()] = true
		a := &netlink.Addr{IPNet: toIPNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrReplace(l, a); err != nil {
			return fmt.Errorf("address %s: %w", p, err)
		}
	}
	for _, a := range have {
		if a.IP.IsLinkLocalUnicast() || wantAddr[a.IPNet.String()] {
			continue
		}
		if err := netlink.AddrDel(l, &a); err != nil {
			return fmt.Errorf("remove stale address %s: %w", a.IPNet, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
	}
	return nil
}

func (netlinkDP) DeleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil
		}
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return err
	}
	return nil
}

func link(dev string) (netlink.Link, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", dev, err)
	}
	return l, nil
}

func (netlinkDP) Neighbors(dev string) ([]Neighbor, error) {
	l, err := link(dev)
	if err != nil {
		return nil, err
	}
	ns, err := netlinkdump.Retry(func() ([]netlink.Neigh, error) { return netlink.NeighList(l.Attrs().Index, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, err
	}
	var out []Neighbor
	for _, n := range ns {
		if n.State&netlink.NUD_PERMANENT == 0 || n.IP == nil || n.Family == unix.AF_BRIDGE {
			continue
		}
		out = append(out, Neighbor{IP: fromIP(n.IP), MAC: n.HardwareAddr.String()})
	}
	return out, nil
}

func neigh(l netlink.Link, n Neighbor) (*netlink.Neigh, error) {
	mac, err := net.ParseMAC(n.MAC)
	if err != nil {
		return nil, err
	}
	fam := netlink.FAMILY_V4
	if n.IP.Is6() {
		fam = netlink.FAMILY_V6
	}
	return &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT, IP: n.IP.AsSlice(), HardwareAddr: mac}, nil
}

func (netlinkDP) SetNeighbor(dev string, n Neighbor) error {
	return neighOp(dev, func(l netlink.Link) (*netlink.Neigh, error) { return neigh(l, n) }, netlink.NeighSet)
}

func (netlinkDP) DeleteNeighbor(dev string, n Neighbor) error {
	return neighOp(dev, func(l netlink.Link) (*netlink.Neigh, error) { return neigh(l, n) }, neighDel)
}

// neighOp builds a neighbour (or FDB) entry on dev and applies op to it.
func neighOp(dev string, build func(netlink.Link) (*netlink.Neigh, error), op func(*netlink.Neigh) error) error {
	l, err := link(dev)
	if err != nil {
		return err
	}
	n, err := build(l)
	if err != nil {
		return err
	}
	return op(n)
}

// neighDel deletes an entry; one already gone is not an error.
func neighDel(n *netlink.Neigh) error {
	if err := netlink.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

func (netlinkDP) FDB(dev string) ([]FDBEntry, error) {
	l, err := link(dev)
	if err != nil {
		return nil, err
	}
	ns, err := netlinkdump.Retry(func() ([]netlink.Neigh, error) { return netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE) })
	if err != nil {
		return nil, err
	}
	var out []FDBEntry
	for _, n := range ns {
		if n.IP == nil || n.HardwareAddr == nil {
			continue
		}
		out = append(out, FDBEntry{MAC: n.HardwareAddr.String(), Dst: fromIP(n.IP)})
	}
	return out, nil
}

func fdb(l netlink.Link, e FDBEntry) (*netlink.Neigh, error) {
	mac, err := net.ParseMAC(e.MAC)
	if err != nil {
		return nil, err
	}
	return &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT, IP: e.Dst.AsSlice(), HardwareAddr: mac}, nil
}

func (netlinkDP) SetFDB(dev string, e FDBEntry) error {
	return neighOp(dev, func(l netlink.Link) (*netlink.Neigh, error) { return fdb(l, e) }, netlink.NeighSet)
}

func (netlinkDP) DeleteFDB(dev string, e FDBEntry) error {
	return neighOp(dev, func(l netlink.Link) (*netlink.Neigh, error) { return fdb(l, e) }, neighDel)
}
