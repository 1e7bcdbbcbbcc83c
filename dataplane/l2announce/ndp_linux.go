package l2announce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// IPv6 neighbour discovery (RFC 4861) for owned IPv6 LoadBalancer IPs: a
// neighbour solicitation for one is answered with a solicited neighbour
// advertisement from the device's MAC, and a takeover sends an unsolicited
// one (override set) to all nodes, which moves existing neighbour entries
// as a gratuitous ARP does.

const (
	ethPIPv6       = 0x86dd
	ipv6HdrLen     = 40
	icmpv6Proto    = 58
	ndpSolicit     = 135
	ndpAdvert      = 136
	ndpOptSrcLL    = 1
	ndpOptTargetLL = 2
	// naLen is a neighbour advertisement with the target link-layer option.
	naLen = 24 + 8
)

var allNodes = netip.MustParseAddr("ff02::1")

// ndpFilter passes only ICMPv6 neighbour solicitations without extension
// headers (next header 58 at byte 20 of the frame, ICMPv6 type 135 at byte
// 54) to the socket, so it does not copy every IPv6 frame of the device.
var ndpFilter = []unix.SockFilter{
	{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 14 + 6},
	{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: icmpv6Proto},
	{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 14 + ipv6HdrLen},
	{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: ndpSolicit},
	{Code: unix.BPF_RET | unix.BPF_K, K: 0xffff},
	{Code: unix.BPF_RET | unix.BPF_K, K: 0},
}

type ndpDev struct {
	name    string
	ifindex int
	mac     net.HardwareAddr
	fd      int
}

// openNDP opens the device's neighbour-solicitation socket (in the
// device's namespace): filtered, and receiving all multicast, since a
// solicitation goes to the target's solicited-node group, which a NIC
// filters unless someone joined it.
func openNDP(name string, ifc *net.Interface) (*ndpDev, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(ethPIPv6)))
	if err != nil {
		return nil, fmt.Errorf("NDP socket on %s: %w", name, err)
	}
	prog := unix.SockFprog{Len: uint16(len(ndpFilter)), Filter: &ndpFilter[0]}
	tv := unix.Timeval{Usec: 200000}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("NDP socket on %s: filter: %w", name, err)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("NDP socket on %s: %w", name, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(ethPIPv6), Ifindex: ifc.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind NDP socket to %s: %w", name, err)
	}
	mr := unix.PacketMreq{Ifindex: int32(ifc.Index), Type: unix.PACKET_MR_ALLMULTI}
	if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("NDP socket on %s: all-multicast: %w", name, err)
	}
	return &ndpDev{name: name, ifindex: ifc.Index, mac: ifc.HardwareAddr, fd: fd}, nil
}

// serve answers neighbour solicitations for owned IPs until done.
func (d *ndpDev) serve(owns func(netip.Addr) bool, cfg Config, done *atomic.Bool) {
	buf := make([]byte, 1500)
	for !done.Load() {
		n, from, err := unix.Recvfrom(d.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			return
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		target, src, dstMAC, ok := parseSolicitation(buf[:n])
		if !ok || !owns(target) {
			continue
		}
		if err := d.advertise(target, src, dstMAC, true); err != nil {
			cfg.Log.Warn("neighbour advertisement failed", "device", d.name, "ip", target.String(), "err", err)
		}
	}
}

// parseSolicitation validates a neighbour solicitation (RFC 4861 7.1.1:
// hop limit 255, code 0, the checksum, a unicast target; a solicitation
// from the unspecified address is answered to all nodes) and returns its
// target, where to answer (src), and the MAC to answer to.
func parseSolicitation(f []byte) (target, src netip.Addr, mac net.HardwareAddr, ok bool) {
	const ip, icmp = 14, 14 + ipv6HdrLen
	if len(f) < icmp+24 || binary.BigEndian.Uint16(f[12:]) != ethPIPv6 || f[ip]>>4 != 6 ||
		f[ip+6] != icmpv6Proto || f[ip+7] != 255 {
		return
	}
	plen := int(binary.BigEndian.Uint16(f[ip+4:]))
	if plen < 24 || icmp+plen > len(f) || f[icmp] != ndpSolicit || f[icmp+1] != 0 {
		return
	}
	src = netip.AddrFrom16([16]byte(f[ip+8 : ip+24]))
	dst := netip.AddrFrom16([16]byte(f[ip+24 : ip+40]))
	if icmpv6Checksum(src, dst, f[icmp:icmp+plen]) != 0 {
		return
	}
	target = netip.AddrFrom16([16]byte(f[icmp+8 : icmp+24]))
	if target.IsMulticast() {
		return
	}
	mac = net.HardwareAddr(append([]byte(nil), f[6:12]...))
	for o := f[icmp+24 : icmp+plen]; len(o) >= 8; {
		l := int(o[1]) * 8
		if l == 0 || l > len(o) {
			return
		}
		if o[0] == ndpOptSrcLL && l >= 8 {
			mac = net.HardwareAddr(append([]byte(nil), o[2:8]...))
		}
		o = o[l:]
	}
	if src.IsUnspecified() {
		src, mac = allNodes, net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	}
	return target, src, mac, true
}

// icmpv6Checksum is the ICMPv6 checksum of msg with the pseudo-header of
// src and dst: 0 for a message whose checksum field is right.
func icmpv6Checksum(src, dst netip.Addr, msg []byte) uint16 {
	var s uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			s += uint32(b[len(b)-1]) << 8
		}
	}
	a, b := src.As16(), dst.As16()
	add(a[:])
	add(b[:])
	s += uint32(len(msg)) + icmpv6Proto
	add(msg)
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// advertise sends a neighbour advertisement for target from the device's
// MAC: solicited (to the soliciting node) or unsolicited (to all nodes);
// override set either way, so the neighbour's entry moves to this node.
func (d *ndpDev) advertise(target, to netip.Addr, toMAC net.HardwareAddr, solicited bool) error {
	f := make([]byte, 14+ipv6HdrLen+naLen)
	copy(f[0:6], toMAC)
	copy(f[6:12], d.mac)
	binary.BigEndian.PutUint16(f[12:], ethPIPv6)
	ip := f[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], naLen)
	ip[6], ip[7] = icmpv6Proto, 255
	t, dst := target.As16(), to.As16()
	copy(ip[8:24], t[:])
	copy(ip[24:40], dst[:])
	na := ip[ipv6HdrLen:]
	na[0] = ndpAdvert
	na[4] = 0x20 // override
	if solicited && !to.IsMulticast() {
		na[4] |= 0x40
	}
	copy(na[8:24], t[:])
	na[24], na[25] = ndpOptTargetLL, 1
	copy(na[26:32], d.mac)
	binary.BigEndian.PutUint16(na[2:], icmpv6Checksum(target, to, na))
	var ll [8]byte
	copy(ll[:], toMAC)
	return unix.Sendto(d.fd, f, 0, &unix.SockaddrLinklayer{Protocol: htons(ethPIPv6), Ifindex: d.ifindex, Halen: 6, Addr: ll})
}

// unsolicited announces target to all nodes (on takeover).
func (d *ndpDev) unsolicited(target netip.Addr) error {
	return d.advertise(target, allNodes, net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, false)
}
