package cni

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/cni/ipam"
	"github.com/waggle-io/waggle/internal/netlinkdump"
)

// Indexes of the interfaces in an ADD result.
const (
	ifBridge = iota
	ifHost
	ifPod
)

func ioError(format string, args ...any) *types.Error {
	return types.NewError(types.ErrIOFailure, fmt.Sprintf(format, args...), "")
}

func internalError(format string, args ...any) *types.Error {
	return types.NewError(types.ErrInternal, fmt.Sprintf(format, args...), "")
}

// Attach does the work of ADD: it allocates the container's addresses,
// creates the bridge if needed, the veth pair, configures the pod's end and
// masquerading, and returns the result. On any error everything it did for
// this container is undone (the node-wide bridge and rules stay).
//
// It is a node's most frequent network operation (one per pod), so it costs
// as few kernel round trips as it can: every request names its link, none
// lists the node's links or addresses (which grow with its pods); the veth
// pair is created from the host's side, up, on the bridge and with its
// peer in the pod, in one request; and nft runs only when the masquerade
// chain is not already as it should be.
func Attach(args *skel.CmdArgs) (_ *current.Result, _ *Config, err error) {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return nil, nil, err
	}
	if err := ValidateArgs(args.ContainerID, args.IfName); err != nil {
		return nil, nil, err
	}
	if args.Netns == "" {
		return nil, nil, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS is required for ADD", "")
	}
	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return nil, nil, types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("open pod netns %q: %v", args.Netns, err), "")
	}
	defer podNS.Close()
	host, err := openRtnl()
	if err != nil {
		return nil, nil, ioError("open a netlink socket: %v", err)
	}
	defer host.Close()

	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	// 1. Addresses.
	addrs, err := allocate(cfg, args.ContainerID, args.IfName)
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { _ = release(cfg, args.ContainerID, args.IfName) })
	v6 := slices.ContainsFunc(addrs, netip.Addr.Is6)

	// 2. The node's bridge.
	br, err := ensureBridge(host, cfg)
	if err != nil {
		return nil, nil, err
	}

	// 3. The veth pair, host end on the bridge, pod end in the pod.
	hostName := HostVethName(cfg.Name, args.ContainerID, args.IfName)
	v := veth{name: hostName, mac: hostVethMAC(hostName), master: br.index, mtu: cfg.MTU,
		// The pod's MAC follows from its address, so a reused address keeps
		// its MAC and neighbours' cached entries stay right.
		peerName: args.IfName, peerMAC: macFor(addrs[0]), peerNS: int(podNS.Fd())}
	err = host.addVeth(v)
	if errors.Is(err, unix.EEXIST) {
		// A leftover of an earlier attempt (the name is this attachment's)
		// goes, or the pod already has an interface of that name.
		if _, lerr := host.linkByName(hostName); lerr == nil {
			if err := host.delLink(hostName); err != nil {
				return nil, nil, ioError("remove stale veth %s: %v", hostName, err)
			}
			err = host.addVeth(v)
		}
	}
	if errors.Is(err, unix.EEXIST) {
		return nil, nil, types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("interface %s already exists in the pod's netns and is not Waggle's", args.IfName), "")
	}
	if err != nil {
		return nil, nil, ioError("create veth pair %s/%s: %v", args.IfName, hostName, err)
	}
	undo = append(undo, func() { _ = host.delLink(hostName) })
	if err := host.setPort(hostName, HostVethAlias(addrs), cfg.Hairpin); err != nil {
		return nil, nil, ioError("set the alias and hairpin mode of %s: %v", hostName, err)
	}

	// 4. The pod's end: addresses, routes.
	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			ifBridge: {Name: cfg.Bridge, Mac: br.mac.String()},
			ifHost:   {Name: hostName, Mac: v.mac.String()},
			ifPod:    {Name: args.IfName, Mac: v.peerMAC.String(), Sandbox: args.Netns},
		},
	}
	for i, a := range addrs {
		p := cfg.PodCIDRs[i]
		gw := ipam.Gateway(p)
		res.IPs = append(res.IPs, &current.IPConfig{
			Interface: current.Int(ifPod),
			Address:   net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(p.Bits(), a.BitLen())},
			Gateway:   gw.AsSlice(),
		})
		def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if a.Is6() {
			def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		res.Routes = append(res.Routes, &types.Route{
			Dst: net.IPNet{IP: def.Addr().AsSlice(), Mask: net.CIDRMask(0, a.BitLen())},
			GW:  gw.AsSlice(),
		})
	}
	if err := configurePod(host, podNS, cfg, args.IfName, addrs, v6); err != nil {
		return nil, nil, err
	}

	// 5. Node-wide forwarding and masquerading.
	if err := enableForwarding(addrs); err != nil {
		return nil, nil, ioError("enable IP forwarding: %v", err)
	}
	if cfg.Masquerade {
		if err := ensureMasquerade(cfg); err != nil {
			return nil, nil, err
		}
	}
	return res, cfg, nil
}

// configurePod gives the pod's interface its addresses, brings it up and
// adds the default routes via the gateways.
func configurePod(host *rtnl, podNS ns.NetNS, cfg *Config, ifName string, addrs []netip.Addr, v6 bool) error {
	pod, err := host.openIn(netns.NsHandle(podNS.Fd()))
	if err != nil {
		return ioError("open a netlink socket in the pod: %v", err)
	}
	defer pod.Close()
	l, err := pod.linkByName(ifName)
	if err != nil {
		return ioError("find %s in the pod: %v", ifName, err)
	}
	if v6 {
		// IPv6 on, and no duplicate address detection (also for the
		// link-local address): the IPAM lock already guarantees uniqueness,
		// and DAD would hold the pod's traffic for a second or two.
		err := host.doIn(netns.NsHandle(podNS.Fd()), func() error {
			for _, s := range []struct{ key, val string }{
				{"net/ipv6/conf/lo/disable_ipv6", "0"},
				{"net/ipv6/conf/" + ifName + "/disable_ipv6", "0"},
				{"net/ipv6/conf/" + ifName + "/accept_dad", "0"},
			} {
				if err := ensureSysctl(s.key, s.val); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return ioError("enable IPv6 on %s in the pod: %v", ifName, err)
		}
	}
	for i, a := range addrs {
		if err := pod.addAddr(l.index, netip.PrefixFrom(a, cfg.PodCIDRs[i].Bits())); err != nil {
			return ioError("add %s/%d to %s in the pod: %v", a, cfg.PodCIDRs[i].Bits(), ifName, err)
		}
	}
	if err := pod.setUp(l.index); err != nil {
		return ioError("set %s up in the pod: %v", ifName, err)
	}
	for i := range addrs {
		gw := ipam.Gateway(cfg.PodCIDRs[i])
		if err := pod.addDefaultRoute(l.index, gw); err != nil {
			return ioError("add the default route via %s in the pod: %v", gw, err)
		}
	}
	return nil
}

// ensureSysctl sets a sysctl (a path under /proc/sys, of the calling
// thread's network namespace) unless it already has the value.
func ensureSysctl(key, val string) error {
	p := "/proc/sys/" + key
	if b, err := os.ReadFile(p); err == nil && string(bytes.TrimSpace(b)) == val {
		return nil
	}
	return os.WriteFile(p, []byte(val), 0o644)
}

// enableForwarding turns on IP forwarding for the families of addrs (the
// node routes its pods' traffic); it reads before it writes.
func enableForwarding(addrs []netip.Addr) error {
	if slices.ContainsFunc(addrs, netip.Addr.Is4) {
		if err := ensureSysctl("net/ipv4/ip_forward", "1"); err != nil {
			return err
		}
	}
	if slices.ContainsFunc(addrs, netip.Addr.Is6) {
		if err := ensureSysctl("net/ipv6/conf/all/forwarding", "1"); err != nil {
			return err
		}
	}
	return nil
}

// allocate takes one address per pod CIDR under the store's lock.
func allocate(cfg *Config, containerID, ifName string) ([]netip.Addr, error) {
	st, err := ipam.Open(cfg.DataDir, cfg.Name)
	if err != nil {
		return nil, ioError("open IPAM store: %v", err)
	}
	defer st.Close()
	if err := st.Lock(); err != nil {
		return nil, ioError("%v", err)
	}
	defer st.Unlock()
	var out []netip.Addr
	for i, p := range cfg.PodCIDRs {
		a, err := st.Allocate(containerID, ifName, p, i)
		if err != nil {
			_, _ = st.Release(containerID, ifName)
			if errors.Is(err, ipam.ErrExhausted) {
				return nil, types.NewError(ErrCodePoolExhausted,
					fmt.Sprintf("no free address in podCIDR %s: every address is allocated", p),
					"release addresses of deleted pods (CNI DEL or GC) or give the node a larger podCIDR")
			}
			return nil, ioError("allocate an address from %s: %v", p, err)
		}
		out = append(out, a)
	}
	return out, nil
}

func release(cfg *Config, containerID, ifName string) error {
	st, err := ipam.Open(cfg.DataDir, cfg.Name)
	if err != nil {
		return ioError("open IPAM store: %v", err)
	}
	defer st.Close()
	if err := st.Lock(); err != nil {
		return ioError("%v", err)
	}
	defer st.Unlock()
	if _, err := st.Release(containerID, ifName); err != nil {
		return ioError("release addresses of %s/%s: %v", containerID, ifName, err)
	}
	return nil
}

// macFor derives a stable MAC from an address: locally administered 0a:58
// and the address's last four bytes. The bridge takes its gateway's, so the
// pods' neighbour entries for the gateway stay valid whatever ports come and
// go; a pod takes its own, so when its address is reused by a new pod the
// neighbours' cached entries (on the bridge, in other pods) stay valid
// instead of sending traffic to a MAC that is gone until they expire.
func macFor(a netip.Addr) net.HardwareAddr {
	b := a.AsSlice()
	b = b[len(b)-4:]
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}

// hostVethMAC is the MAC of a host veth: locally administered 0a:57 and
// four bytes of its (hashed) name, so that ADD knows it without asking.
func hostVethMAC(name string) net.HardwareAddr {
	h := sha256.Sum256([]byte(name))
	return net.HardwareAddr{0x0a, 0x57, h[0], h[1], h[2], h[3]}
}

// ensureBridge returns the node's bridge, creating it if missing (fixed MAC
// derived from the gateway), setting it up and adding the gateway addresses
// it lacks (an address already there is EEXIST: no listing needed).
func ensureBridge(host *rtnl, cfg *Config) (link, error) {
	l, err := host.linkByName(cfg.Bridge)
	if isNoLink(err) {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{
			Name: cfg.Bridge, MTU: cfg.MTU, TxQLen: -1,
			HardwareAddr: macFor(ipam.Gateway(cfg.PodCIDRs[0])),
		}}
		if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return link{}, ioError("create bridge %s: %v", cfg.Bridge, err)
		}
		l, err = host.linkByName(cfg.Bridge)
	}
	if err != nil {
		return link{}, ioError("look up bridge %s: %v", cfg.Bridge, err)
	}
	if l.kind != "bridge" {
		kind := l.kind
		if kind == "" {
			kind = "device"
		}
		return link{}, invalidConfig("%s exists and is a %s, not a bridge: choose another \"bridge\" name", cfg.Bridge, kind)
	}
	if !l.up {
		if err := host.setUp(l.index); err != nil {
			return link{}, ioError("set bridge %s up: %v", cfg.Bridge, err)
		}
	}
	for _, p := range cfg.PodCIDRs {
		gw := netip.PrefixFrom(ipam.Gateway(p), p.Bits())
		if err := host.addAddr(l.index, gw); err != nil && !errors.Is(err, unix.EEXIST) {
			return link{}, ioError("add gateway %s to %s: %v", gw, cfg.Bridge, err)
		}
	}
	return l, nil
}

// deleteLink deletes a link by name; a missing link is success.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil
		}
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) && !errors.Is(err, unix.ENODEV) {
		return err
	}
	return nil
}

// Del detaches the container: its veth pair goes (both ends) and its
// addresses are released. Anything already gone is success, so DEL may be
// repeated and cleans up after a crashed ADD.
func Del(args *skel.CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if err := ValidateArgs(args.ContainerID, args.IfName); err != nil {
		return err
	}
	host, err := openRtnl()
	if err != nil {
		return ioError("open a netlink socket: %v", err)
	}
	defer host.Close()
	hostName := HostVethName(cfg.Name, args.ContainerID, args.IfName)
	if err := host.delLink(hostName); err != nil {
		return ioError("delete veth %s: %v", hostName, err)
	}
	if args.Netns != "" {
		if err := delPodLink(host, args.Netns, args.IfName); err != nil {
			return err
		}
	}
	return release(cfg, args.ContainerID, args.IfName)
}

// delPodLink deletes the pod's interface if it is still there and a veth
// (its peer normally took it along); a netns that is gone is success.
func delPodLink(host *rtnl, path, ifName string) error {
	podNS, err := ns.GetNS(path)
	if err != nil {
		if errors.As(err, new(ns.NSPathNotExistErr)) || errors.As(err, new(ns.NSPathNotNSErr)) {
			return nil
		}
		return ioError("enter pod netns %s: %v", path, err)
	}
	defer podNS.Close()
	pod, err := host.openIn(netns.NsHandle(podNS.Fd()))
	if err != nil {
		return ioError("enter pod netns %s: %v", path, err)
	}
	defer pod.Close()
	l, err := pod.linkByName(ifName)
	if err != nil || l.kind != "veth" {
		return nil // gone with its peer, or not ours
	}
	if err := pod.delLink(ifName); err != nil {
		return ioError("delete %s in the pod: %v", ifName, err)
	}
	return nil
}

// Check verifies that an earlier ADD's result still holds: the addresses are
// allocated to the container, the bridge carries the gateways, the host veth
// is on the bridge, and the pod's interface has its addresses and routes.
func Check(args *skel.CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if err := ValidateArgs(args.ContainerID, args.IfName); err != nil {
		return err
	}
	if cfg.Net.RawPrevResult == nil {
		return invalidConfig("CHECK needs the prevResult of the ADD in the network config")
	}
	if err := version.ParsePrevResult(&cfg.Net.NetConf); err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode prevResult: %v", err), "")
	}
	prev, err := current.NewResultFromResult(cfg.Net.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("convert prevResult: %v", err), "")
	}

	st, err := ipam.Open(cfg.DataDir, cfg.Name)
	if err != nil {
		return ioError("open IPAM store: %v", err)
	}
	defer st.Close()
	if err := st.Lock(); err != nil {
		return ioError("%v", err)
	}
	held, err := st.Get(args.ContainerID, args.IfName)
	st.Unlock()
	if err != nil {
		return ioError("read IPAM store: %v", err)
	}
	for _, ipc := range prev.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		if !slices.Contains(held, a.Unmap()) {
			return internalError("address %s of %s/%s is not allocated to it in the IPAM store %s", a.Unmap(), args.ContainerID, args.IfName, st.Dir())
		}
	}

	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		return internalError("bridge %s: %v", cfg.Bridge, err)
	}
	brAddrs, err := netlinkdump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(br, netlink.FAMILY_ALL) })
	if err != nil {
		return ioError("list addresses of %s: %v", cfg.Bridge, err)
	}
	for _, p := range cfg.PodCIDRs {
		gw := ipam.Gateway(p)
		want := (&net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(p.Bits(), gw.BitLen())}).String()
		if !slices.ContainsFunc(brAddrs, func(a netlink.Addr) bool { return a.IPNet.String() == want }) {
			return internalError("bridge %s lacks the gateway address %s", cfg.Bridge, want)
		}
	}
	hostName := HostVethName(cfg.Name, args.ContainerID, args.IfName)
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		return internalError("host veth %s: %v", hostName, err)
	}
	if host.Attrs().MasterIndex != br.Attrs().Index {
		return internalError("host veth %s is not attached to bridge %s", hostName, cfg.Bridge)
	}
	var podIPs []*current.IPConfig
	for _, ipc := range prev.IPs {
		if ipc.Interface == nil || *ipc.Interface < 0 || *ipc.Interface >= len(prev.Interfaces) ||
			prev.Interfaces[*ipc.Interface].Name != args.IfName {
			continue
		}
		podIPs = append(podIPs, ipc)
	}
	err = ns.WithNetNSPath(args.Netns, func(ns.NetNS) error {
		l, err := netlink.LinkByName(args.IfName)
		if err != nil {
			return internalError("interface %s in the pod: %v", args.IfName, err)
		}
		if l.Attrs().MTU != cfg.MTU {
			return internalError("interface %s has MTU %d, the network wants %d", args.IfName, l.Attrs().MTU, cfg.MTU)
		}
		if err := checkPodAddrs(l, podIPs); err != nil {
			return internalError("pod interface %s: %v", args.IfName, err)
		}
		if err := checkRoutes(prev.Routes); err != nil {
			return internalError("pod routes: %v", err)
		}
		return nil
	})
	if err != nil {
		var te *types.Error
		if errors.As(err, &te) {
			return te
		}
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("enter pod netns %q: %v", args.Netns, err), "")
	}
	return nil
}

// GC releases every allocation and removes every host veth on the network's
// bridge that belongs to no attachment in cni.dev/valid-attachments.
func GC(args *skel.CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	valid := map[[2]string]bool{}
	vethOK := map[string]bool{}
	for _, a := range cfg.Net.ValidAttachments {
		valid[[2]string{a.ContainerID, a.IfName}] = true
		vethOK[HostVethName(cfg.Name, a.ContainerID, a.IfName)] = true
	}
	// Interfaces first: an address is released only once nothing uses it.
	if br, err := netlink.LinkByName(cfg.Bridge); err == nil {
		links, err := netlinkdump.Retry(netlink.LinkList)
		if err != nil {
			return ioError("list links: %v", err)
		}
		for _, l := range links {
			n := l.Attrs().Name
			if _, ok := l.(*netlink.Veth); !ok || l.Attrs().MasterIndex != br.Attrs().Index ||
				!strings.HasPrefix(n, "wv") || len(n) != 15 || vethOK[n] {
				continue
			}
			if err := deleteLink(n); err != nil {
				return ioError("delete stale veth %s: %v", n, err)
			}
		}
	}
	st, err := ipam.Open(cfg.DataDir, cfg.Name)
	if err != nil {
		return ioError("open IPAM store: %v", err)
	}
	defer st.Close()
	if err := st.Lock(); err != nil {
		return ioError("%v", err)
	}
	defer st.Unlock()
	all, err := st.List()
	if err != nil {
		return ioError("read IPAM store: %v", err)
	}
	for _, a := range all {
		if valid[[2]string{a.ContainerID, a.IfName}] {
			continue
		}
		if err := st.ReleaseAddr(a.Addr); err != nil {
			return ioError("%v", err)
		}
	}
	return nil
}

// Status reports whether the plugin could serve an ADD now: the IPAM store is
// usable and every pod CIDR has a free address.
func Status(args *skel.CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	st, err := ipam.Open(cfg.DataDir, cfg.Name)
	if err != nil {
		return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("IPAM store unusable: %v", err), "")
	}
	defer st.Close()
	if err := st.Lock(); err != nil {
		return types.NewError(ErrPluginNotAvailable, err.Error(), "")
	}
	defer st.Unlock()
	for _, p := range cfg.PodCIDRs {
		free, err := st.Free(p)
		if err != nil {
			return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("IPAM store unreadable: %v", err), "")
		}
		if free == 0 {
			return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("podCIDR %s has no free address", p), "")
		}
	}
	return nil
}

// checkPodAddrs verifies that l carries each address of ips and that a
// route to its prefix exists.
func checkPodAddrs(l netlink.Link, ips []*current.IPConfig) error {
	have, err := netlinkdump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	for _, ipc := range ips {
		want := netlink.Addr{IPNet: &ipc.Address}
		if !slices.ContainsFunc(have, func(a netlink.Addr) bool { return a.Equal(want) }) {
			return fmt.Errorf("address %s is missing", ipc.Address.String())
		}
		family := netlink.FAMILY_V6
		if ipc.Address.IP.To4() != nil {
			family = netlink.FAMILY_V4
		}
		dst := &net.IPNet{IP: ipc.Address.IP.Mask(ipc.Address.Mask), Mask: ipc.Address.Mask}
		rs, err := netlinkdump.Retry(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(family, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
		})
		if err != nil {
			return fmt.Errorf("list routes to %s: %w", dst, err)
		}
		if len(rs) == 0 {
			return fmt.Errorf("no route to %s", dst)
		}
	}
	return nil
}

// checkRoutes verifies that each route of an ADD result is in the routing
// table, with its gateway.
func checkRoutes(routes []*types.Route) error {
	for _, r := range routes {
		family := netlink.FAMILY_V6
		if r.Dst.IP.To4() != nil {
			family = netlink.FAMILY_V4
		}
		find, filter := &netlink.Route{Dst: &r.Dst, Gw: r.GW}, netlink.RT_FILTER_DST
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			find.Dst = nil // the kernel reports a default route without a destination
		}
		if r.GW != nil {
			filter |= netlink.RT_FILTER_GW
		}
		rs, err := netlinkdump.Retry(func() ([]netlink.Route, error) { return netlink.RouteListFiltered(family, find, filter) })
		if err != nil {
			return fmt.Errorf("list routes: %w", err)
		}
		if len(rs) == 0 {
			return fmt.Errorf("route %s via %s is missing", r.Dst.String(), r.GW)
		}
	}
	return nil
}
