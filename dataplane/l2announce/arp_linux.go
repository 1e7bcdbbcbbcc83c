package l2announce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

const (
	ethPARP   = 0x0806
	ethPIPv4  = 0x0800
	arpLen    = 28
	frameLen  = 14 + arpLen
	opRequest = 1
	opReply   = 2
)

// arpResponder holds two AF_PACKET sockets per device, answering ARP
// requests for owned IPv4 addresses and neighbour solicitations for owned
// IPv6 addresses (ndp_linux.go).
type arpResponder struct {
	devs []*arpDev
	ndp  []*ndpDev
	wg   sync.WaitGroup
	done atomic.Bool
}

type arpDev struct {
	name    string
	ifindex int
	mac     net.HardwareAddr
	fd      int
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func newResponder(cfg Config, owns func(netip.Addr) bool) (responder, error) {
	r := &arpResponder{}
	open := func() error {
		for _, name := range cfg.Devices {
			ifc, err := net.InterfaceByName(name)
			if err != nil {
				return fmt.Errorf("L2 announcement device %q: %w", name, err)
			}
			if len(ifc.HardwareAddr) != 6 {
				return fmt.Errorf("L2 announcement device %s has no Ethernet address", name)
			}
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(ethPARP)))
			if err != nil {
				return fmt.Errorf("ARP socket on %s: %w", name, err)
			}
			// A receive timeout lets the reader notice close (AF_PACKET
			// sockets cannot be shut down).
			tv := unix.Timeval{Usec: 200000}
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				unix.Close(fd)
				return fmt.Errorf("ARP socket on %s: %w", name, err)
			}
			if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(ethPARP), Ifindex: ifc.Index}); err != nil {
				unix.Close(fd)
				return fmt.Errorf("bind ARP socket to %s: %w", name, err)
			}
			r.devs = append(r.devs, &arpDev{name: name, ifindex: ifc.Index, mac: ifc.HardwareAddr, fd: fd})
			nd, err := openNDP(name, ifc)
			if err != nil {
				return err
			}
			r.ndp = append(r.ndp, nd)
		}
		return nil
	}
	var err error
	if cfg.NetNS != "" {
		err = ns.WithNetNSPath(cfg.NetNS, func(ns.NetNS) error { return open() })
	} else {
		err = open()
	}
	if err != nil {
		r.close()
		return nil, err
	}
	for _, d := range r.devs {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			d.serve(owns, cfg, &r.done)
		}()
	}
	for _, d := range r.ndp {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			d.serve(owns, cfg, &r.done)
		}()
	}
	return r, nil
}

// serve answers "who has IP? tell SPA" for owned IPs until the socket closes.
func (d *arpDev) serve(owns func(netip.Addr) bool, cfg Config, done *atomic.Bool) {
	buf := make([]byte, 1500)
	for !done.Load() {
		n, _, err := unix.Recvfrom(d.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			return
		}
		// AF_PACKET SOCK_RAW delivers the Ethernet header.
		if n < frameLen || binary.BigEndian.Uint16(buf[12:]) != ethPARP {
			continue
		}
		a := buf[14:]
		if binary.BigEndian.Uint16(a[0:]) != 1 || binary.BigEndian.Uint16(a[2:]) != ethPIPv4 || a[4] != 6 || a[5] != 4 ||
			binary.BigEndian.Uint16(a[6:]) != opRequest {
			continue
		}
		tpa := netip.AddrFrom4([4]byte(a[24:28]))
		if !owns(tpa) {
			continue
		}
		sha := net.HardwareAddr(append([]byte(nil), a[8:14]...))
		spa := [4]byte(a[14:18])
		if err := d.send(opReply, tpa, sha, spa); err != nil {
			cfg.Log.Warn("ARP reply failed", "device", d.name, "ip", tpa.String(), "err", err)
		}
	}
}

// send writes an ARP packet from (our MAC, ip) to (tha, tpa).
func (d *arpDev) send(op uint16, ip netip.Addr, tha net.HardwareAddr, tpa [4]byte) error {
	f := make([]byte, frameLen)
	dst := tha
	if op == opRequest { // gratuitous: broadcast
		dst = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	}
	copy(f[0:6], dst)
	copy(f[6:12], d.mac)
	binary.BigEndian.PutUint16(f[12:], ethPARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], ethPIPv4)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], op)
	copy(a[8:14], d.mac)
	ip4 := ip.As4()
	copy(a[14:18], ip4[:])
	if op == opReply {
		copy(a[18:24], tha)
	}
	copy(a[24:28], tpa[:])
	var ll [8]byte
	copy(ll[:], dst)
	return unix.Sendto(d.fd, f, 0, &unix.SockaddrLinklayer{Protocol: htons(ethPARP), Ifindex: d.ifindex, Halen: 6, Addr: ll})
}

// announce sends a gratuitous ARP request (SPA = TPA = ip) on every device,
// or for IPv6 an unsolicited neighbour advertisement.
func (r *arpResponder) announce(ip netip.Addr) error {
	var errs []error
	if ip.Is6() {
		for _, d := range r.ndp {
			if err := d.unsolicited(ip); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", d.name, err))
			}
		}
		return errors.Join(errs...)
	}
	for _, d := range r.devs {
		if err := d.send(opRequest, ip, nil, ip.As4()); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.name, err))
		}
	}
	return errors.Join(errs...)
}

func (r *arpResponder) close() error {
	r.done.Store(true)
	r.wg.Wait()
	for _, d := range r.devs {
		unix.Close(d.fd)
	}
	for _, d := range r.ndp {
		unix.Close(d.fd)
	}
	r.devs, r.ndp = nil, nil
	return nil
}
