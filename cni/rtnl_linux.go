package cni

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/cni/ipam"
)

// rtnl is one rtnetlink socket in one network namespace, for the requests
// of an ADD and a DEL. Each request is one round trip on the same socket,
// and every one names its link by name or index, so nothing lists the
// node's links or addresses (which grow with its pods).
type rtnl struct {
	sock *nl.NetlinkSocket
	h    map[int]*nl.SocketHandle
}

// openRtnl opens a socket in the calling thread's network namespace.
func openRtnl() (*rtnl, error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	return &rtnl{sock: s, h: map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}}, nil
}

// ns returns the network namespace of r's socket (SIOCGSKNS). The plugin
// finds its way back from a pod's namespace with it rather than with
// /proc/<pid>/task/<tid>/ns/net: the dentries such a path leaves under
// /proc/<pid> are walked and flushed when the process is reaped, in the
// runtime's wait, which then costs a few milliseconds of the kubelet's CPU
// per plugin run.
func (r *rtnl) ns() (netns.NsHandle, error) {
	fd, err := unix.IoctlRetInt(r.sock.GetFd(), unix.SIOCGSKNS)
	if err != nil {
		return netns.None(), fmt.Errorf("namespace of a netlink socket: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// openIn opens a socket in the namespace target; the calling thread's
// namespace must be r's.
func (r *rtnl) openIn(target netns.NsHandle) (*rtnl, error) {
	back, err := r.ns()
	if err != nil {
		return nil, err
	}
	defer back.Close()
	s, err := nl.GetNetlinkSocketAt(target, back, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	return &rtnl{sock: s, h: map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}}, nil
}

// doIn runs f with the calling thread switched into target, and back into
// r's namespace (which must be the calling thread's) afterwards. A thread
// that cannot switch back stays locked to the goroutine: the caller fails.
func (r *rtnl) doIn(target netns.NsHandle, f func() error) error {
	back, err := r.ns()
	if err != nil {
		return err
	}
	defer back.Close()
	runtime.LockOSThread()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := netns.Set(back); err != nil {
		return fmt.Errorf("switch back to the node's namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}

func (r *rtnl) Close() { r.sock.Close() }

func (r *rtnl) request(typ, flags int, data ...nl.NetlinkRequestData) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(typ, flags)
	req.Sockets = r.h
	for _, d := range data {
		req.AddData(d)
	}
	return req
}

func (r *rtnl) exec(typ, flags int, data ...nl.NetlinkRequestData) error {
	_, err := r.request(typ, flags|unix.NLM_F_ACK, data...).Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// link is what an ADD needs to know of a link.
type link struct {
	index  int
	up     bool
	kind   string
	mac    net.HardwareAddr
	master int
}

// errNoLink is a link that does not exist (ENODEV).
func isNoLink(err error) bool { return errors.Is(err, unix.ENODEV) }

// linkByName looks a link up by name: one request, no statistics.
func (r *rtnl) linkByName(name string) (link, error) {
	msgs, err := r.request(unix.RTM_GETLINK, 0,
		nl.NewIfInfomsg(unix.AF_UNSPEC),
		nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)),
		nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(rtextFilterSkipStats)),
	).Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return link{}, err
	}
	if len(msgs) != 1 || len(msgs[0]) < unix.SizeofIfInfomsg {
		return link{}, fmt.Errorf("link %s: unexpected reply", name)
	}
	ifi := nl.DeserializeIfInfomsg(msgs[0])
	l := link{index: int(ifi.Index), up: ifi.Flags&unix.IFF_UP != 0}
	attrs, err := nl.ParseRouteAttr(msgs[0][unix.SizeofIfInfomsg:])
	if err != nil {
		return link{}, fmt.Errorf("link %s: %w", name, err)
	}
	for _, a := range attrs {
		switch a.Attr.Type & nlaTypeMask {
		case unix.IFLA_ADDRESS:
			l.mac = net.HardwareAddr(append([]byte(nil), a.Value...))
		case unix.IFLA_MASTER:
			if len(a.Value) == 4 {
				l.master = int(native.Uint32(a.Value))
			}
		case unix.IFLA_LINKINFO:
			info, _ := nl.ParseRouteAttr(a.Value)
			for _, i := range info {
				if i.Attr.Type&nlaTypeMask == nl.IFLA_INFO_KIND {
					l.kind = string(bytes.TrimRight(i.Value, "\x00"))
				}
			}
		}
	}
	return l, nil
}

var native = nl.NativeEndian()

// veth is a veth pair to create from the host's side: the host end up and
// on the bridge, the peer moved into the pod's namespace (down: a veth
// cannot be set up before its peer exists, which is within the creation).
type veth struct {
	name   string
	mac    net.HardwareAddr
	master int
	mtu    int

	peerName string
	peerMAC  net.HardwareAddr
	peerNS   int // fd of the pod's netns
}

// addVeth creates the pair in one request: the kernel sets the host end up
// and enslaves it to the bridge, and moves the pod's end into the pod, as
// part of the same creation.
func (r *rtnl) addVeth(v veth) error {
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Flags, msg.Change = unix.IFF_UP, unix.IFF_UP
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	peer := info.AddRtAttr(nl.IFLA_INFO_DATA, nil).AddRtAttr(nl.VETH_INFO_PEER, nil)
	nl.NewIfInfomsgChild(peer, unix.AF_UNSPEC)
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(v.peerName))
	peer.AddRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(v.mtu)))
	peer.AddRtAttr(unix.IFLA_ADDRESS, v.peerMAC)
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(v.peerNS)))
	return r.exec(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL,
		msg,
		nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(v.name)),
		nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(v.mtu))),
		nl.NewRtAttr(unix.IFLA_ADDRESS, v.mac),
		nl.NewRtAttr(unix.IFLA_MASTER, nl.Uint32Attr(uint32(v.master))),
		info)
}

// setPort sets the alias of the bridge port name and its hairpin mode in
// one request.
func (r *rtnl) setPort(name, alias string, hairpin bool) error {
	data := []nl.NetlinkRequestData{
		nl.NewIfInfomsg(unix.AF_UNSPEC),
		nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)),
		nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(alias)),
	}
	if hairpin {
		info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
		info.AddRtAttr(nl.IFLA_INFO_SLAVE_KIND, nl.NonZeroTerminated("bridge"))
		info.AddRtAttr(nl.IFLA_INFO_SLAVE_DATA, nil).AddRtAttr(nl.IFLA_BRPORT_MODE, []byte{1})
		data = append(data, info)
	}
	return r.exec(unix.RTM_NEWLINK, 0, data...)
}

// setUp sets the link with index up.
func (r *rtnl) setUp(index int) error {
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	msg.Flags, msg.Change = unix.IFF_UP, unix.IFF_UP
	return r.exec(unix.RTM_NEWLINK, 0, msg)
}

// delLink deletes a link by name; a missing link is success.
func (r *rtnl) delLink(name string) error {
	err := r.exec(unix.RTM_DELLINK, 0, nl.NewIfInfomsg(unix.AF_UNSPEC), nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	if isNoLink(err) {
		return nil
	}
	return err
}

// addAddr adds p (an address with its prefix length) to the link with
// index. IPv6 addresses skip duplicate address detection: the IPAM lock
// already guarantees uniqueness.
func (r *rtnl) addAddr(index int, p netip.Prefix) error {
	a := p.Addr()
	fam := unix.AF_INET
	if a.Is6() {
		fam = unix.AF_INET6
	}
	msg := nl.NewIfAddrmsg(fam)
	msg.Index = uint32(index)
	msg.Prefixlen = uint8(p.Bits())
	data := []nl.NetlinkRequestData{msg,
		nl.NewRtAttr(unix.IFA_LOCAL, a.AsSlice()),
		nl.NewRtAttr(unix.IFA_ADDRESS, a.AsSlice()),
	}
	if a.Is4() && p.Bits() < 31 {
		data = append(data, nl.NewRtAttr(unix.IFA_BROADCAST, ipam.LastAddr(p).AsSlice()))
	}
	if a.Is6() {
		data = append(data, nl.NewRtAttr(unix.IFA_FLAGS, nl.Uint32Attr(unix.IFA_F_NODAD)))
	}
	return r.exec(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, data...)
}

// addDefaultRoute adds the default route of gw's family via gw on the link
// with index. Like CNI's ipam.ConfigureIface it does not insist on being
// the only one (no NLM_F_EXCL): a pod attached to a second network keeps
// both.
func (r *rtnl) addDefaultRoute(index int, gw netip.Addr) error {
	msg := nl.NewRtMsg()
	msg.Family = unix.AF_INET
	if gw.Is6() {
		msg.Family = unix.AF_INET6
	}
	return r.exec(unix.RTM_NEWROUTE, unix.NLM_F_CREATE,
		msg,
		nl.NewRtAttr(unix.RTA_GATEWAY, gw.AsSlice()),
		nl.NewRtAttr(unix.RTA_OIF, nl.Uint32Attr(uint32(index))))
}

const (
	// nlaTypeMask strips NLA_F_NESTED and NLA_F_NET_BYTEORDER off an
	// attribute type.
	nlaTypeMask = 0x3fff
	// rtextFilterSkipStats (RTEXT_FILTER_SKIP_STATS) leaves the statistics
	// out of a link reply.
	rtextFilterSkipStats = 1 << 3
)
