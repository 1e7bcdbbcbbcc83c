package policy

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/waggle-io/waggle/cni"
)

// NetlinkLinks is the LinkSource of a network namespace (the node's): pod
// veths by the alias waggle-cni gives them, addresses from netlink, and
// link/address notifications.
type NetlinkLinks struct {
	// NetNS is the namespace's path; empty: the caller's.
	NetNS string
}

func (l NetlinkLinks) handle() (*netlink.Handle, netns.NsHandle, error) {
	if l.NetNS == "" {
		h, err := netlink.NewHandle()
		return h, netns.None(), err
	}
	nsh, err := netns.GetFromPath(l.NetNS)
	if err != nil {
		return nil, netns.None(), fmt.Errorf("open netns %s: %w", l.NetNS, err)
	}
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		nsh.Close()
		return nil, netns.None(), err
	}
	return h, nsh, nil
}

// Veths implements LinkSource.
func (l NetlinkLinks) Veths() (map[netip.Addr]uint32, error) {
	h, nsh, err := l.handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	defer nsh.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := map[netip.Addr]uint32{}
	for _, ln := range links {
		for _, a := range cni.ParseHostVethAlias(ln.Attrs().Alias) {
			out[a.Unmap()] = uint32(ln.Attrs().Index)
		}
	}
	return out, nil
}

// HostIPs implements LinkSource.
func (l NetlinkLinks) HostIPs() ([]netip.Addr, error) {
	h, nsh, err := l.handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	defer nsh.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// Watch implements LinkSource.
func (l NetlinkLinks) Watch(ctx context.Context, changed func()) error {
	done := make(chan struct{})
	defer close(done)
	links := make(chan netlink.LinkUpdate, 64)
	addrs := make(chan netlink.AddrUpdate, 64)
	var lo netlink.LinkSubscribeOptions
	var ao netlink.AddrSubscribeOptions
	if l.NetNS != "" {
		nsh, err := netns.GetFromPath(l.NetNS)
		if err != nil {
			return fmt.Errorf("open netns %s: %w", l.NetNS, err)
		}
		defer nsh.Close()
		lo.Namespace, ao.Namespace = &nsh, &nsh
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, lo); err != nil {
		return fmt.Errorf("subscribe to links: %w", err)
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, done, ao); err != nil {
		return fmt.Errorf("subscribe to addresses: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-links:
			if !ok {
				return fmt.Errorf("link subscription closed")
			}
		case _, ok := <-addrs:
			if !ok {
				return fmt.Errorf("address subscription closed")
			}
		}
		// Coalesce a burst.
		for drained := false; !drained; {
			select {
			case <-links:
			case <-addrs:
			default:
				drained = true
			}
		}
		changed()
	}
}
