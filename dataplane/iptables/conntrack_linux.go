package iptables

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// deleteUDPFlows deletes, over netlink, the UDP conntrack entries whose
// original destination is orig and whose reply source is endpoint (what
// `conntrack -D -p udp --orig-dst --orig-port-dst --reply-src` matches), in
// the network namespace at nsPath ("" = this one). None is success.
func deleteUDPFlows(nsPath string, fam Family, orig netip.AddrPort, endpoint netip.Addr) error {
	h := &netlink.Handle{}
	if nsPath != "" {
		nsh, err := netns.GetFromPath(nsPath)
		if err != nil {
			return fmt.Errorf("open netns %s: %w", nsPath, err)
		}
		defer nsh.Close()
		if h, err = netlink.NewHandleAt(nsh, unix.NETLINK_NETFILTER); err != nil {
			return fmt.Errorf("netlink in netns %s: %w", nsPath, err)
		}
		defer h.Close()
	}
	f := &netlink.ConntrackFilter{}
	if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
		return err
	}
	if err := f.AddIP(netlink.ConntrackOrigDstIP, net.IP(orig.Addr().AsSlice())); err != nil {
		return err
	}
	if err := f.AddPort(netlink.ConntrackOrigDstPort, orig.Port()); err != nil {
		return err
	}
	if err := f.AddIP(netlink.ConntrackReplySrcIP, net.IP(endpoint.AsSlice())); err != nil {
		return err
	}
	family := netlink.InetFamily(unix.AF_INET)
	if fam == IPv6 {
		family = unix.AF_INET6
	}
	if _, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, family, f); err != nil {
		return fmt.Errorf("delete UDP conntrack entries to %s via %s: %w", orig, endpoint, err)
	}
	return nil
}
