package cni

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ip"
	plipam "github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

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
	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		return nil, nil, internalError("open host netns: %v", err)
	}
	defer hostNS.Close()

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

	// 2. The node's bridge.
	br, err := ensureBridge(cfg)
	if err != nil {
		return nil, nil, err
	}

	// 3. The veth pair; leftovers of an earlier attempt go first.
	hostName := HostVethName(cfg.Name, args.ContainerID, args.IfName)
	if err := deleteLink(hostName); err != nil {
		return nil, nil, ioError("remove stale veth %s: %v", hostName, err)
	}
	var podIface net.Interface
	err = podNS.Do(func(ns.NetNS) error {
		if l, err := netlink.LinkByName(args.IfName); err == nil {
			return types.NewError(types.ErrInvalidEnvironmentVariables,
				fmt.Sprintf("interface %s already exists in the pod's netns (type %s) and is not Waggle's", args.IfName, l.Type()), "")
		}
		// The pod's MAC follows from its address, so a reused address keeps
		// its MAC and neighbours' cached entries stay right.
		_, cont, err := ip.SetupVethWithName(args.IfName, hostName, cfg.MTU, macFor(addrs[0]).String(), hostNS)
		if err != nil {
			return ioError("create veth pair %s/%s: %v", args.IfName, hostName, err)
		}
		podIface = cont
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { _ = deleteLink(hostName) })
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		return nil, nil, ioError("find host veth %s: %v", hostName, err)
	}
	if err := netlink.LinkSetMaster(host, br); err != nil {
		return nil, nil, ioError("attach %s to bridge %s: %v", hostName, cfg.Bridge, err)
	}
	if cfg.Hairpin {
		if err := netlink.LinkSetHairpin(host, true); err != nil {
			return nil, nil, ioError("hairpin mode on %s: %v", hostName, err)
		}
	}
	if err := netlink.LinkSetAlias(host, HostVethAlias(addrs)); err != nil {
		return nil, nil, ioError("set the alias of %s: %v", hostName, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, nil, ioError("set %s up: %v", hostName, err)
	}

	// 4. The pod's end: addresses, routes.
	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			ifBridge: {Name: cfg.Bridge, Mac: br.Attrs().HardwareAddr.String()},
			ifHost:   {Name: hostName, Mac: host.Attrs().HardwareAddr.String()},
			ifPod:    {Name: args.IfName, Mac: podIface.HardwareAddr.String(), Sandbox: args.Netns},
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
	err = podNS.Do(func(ns.NetNS) error {
		if slices.ContainsFunc(addrs, netip.Addr.Is6) {
			// The IPAM lock already guarantees uniqueness: skip duplicate
			// address detection, which would hold ADD for a second or two.
			_, _ = sysctl.Sysctl("net/ipv6/conf/"+args.IfName+"/accept_dad", "0")
		}
		if err := plipam.ConfigureIface(args.IfName, res); err != nil {
			return ioError("configure %s in the pod: %v", args.IfName, err)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}

	// 5. Node-wide forwarding and masquerading.
	if err := ip.EnableForward(res.IPs); err != nil {
		return nil, nil, ioError("enable IP forwarding: %v", err)
	}
	if cfg.Masquerade {
		if err := ensureMasquerade(cfg); err != nil {
			return nil, nil, err
		}
	}
	return res, cfg, nil
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

func ensureBridge(cfg *Config) (netlink.Link, error) {
	l, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		if !errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil, ioError("look up bridge %s: %v", cfg.Bridge, err)
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{
			Name: cfg.Bridge, MTU: cfg.MTU, TxQLen: -1,
			HardwareAddr: macFor(ipam.Gateway(cfg.PodCIDRs[0])),
		}}
		if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, ioError("create bridge %s: %v", cfg.Bridge, err)
		}
		if l, err = netlink.LinkByName(cfg.Bridge); err != nil {
			return nil, ioError("look up bridge %s: %v", cfg.Bridge, err)
		}
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return nil, invalidConfig("%s exists and is a %s, not a bridge: choose another \"bridge\" name", cfg.Bridge, l.Type())
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, ioError("set bridge %s up: %v", cfg.Bridge, err)
		}
	}
	have, err := netlinkdump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, ioError("list addresses of %s: %v", cfg.Bridge, err)
	}
	for _, p := range cfg.PodCIDRs {
		gw := ipam.Gateway(p)
		want := &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(p.Bits(), gw.BitLen())}
		if slices.ContainsFunc(have, func(a netlink.Addr) bool { return a.IPNet.String() == want.String() }) {
			continue
		}
		a := &netlink.Addr{IPNet: want}
		if gw.Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, ioError("add gateway %s to %s: %v", want, cfg.Bridge, err)
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

func masqChain(network string) string { return "masq-" + network }

// masqueradeRules are the rules of the network's chain.
func masqueradeRules(cfg *Config) []string {
	var out []string
	for _, p := range cfg.PodCIDRs {
		fam, mcast := "ip", "224.0.0.0/4"
		if p.Addr().Is6() {
			fam, mcast = "ip6", "ff00::/8"
		}
		inside := p
		if cc, ok := cfg.ClusterCIDRFor(p); ok {
			inside = cc
		}
		out = append(out, knftables.Concat(fam, "saddr", p, fam, "daddr", "!=", inside, fam, "daddr", "!=", mcast, "masquerade"))
	}
	return out
}

// ensureMasquerade writes the network's chain in Waggle's table with one
// `nft -f -` transaction: idempotent and atomic (the chain is flushed and
// refilled in the same transaction). One exec per ADD: knftables.New would
// add two probing execs, tripling the cost of an ADD.
func ensureMasquerade(cfg *Config) error {
	chain := masqChain(cfg.Name)
	var b strings.Builder
	fmt.Fprintf(&b, "add table inet %s { comment \"pod masquerading of waggle-cni\" ; }\n", MasqueradeTable)
	fmt.Fprintf(&b, "add chain inet %s %s { type nat hook postrouting priority srcnat ; comment \"masquerade pods of network %s leaving the cluster CIDR\" ; }\n",
		MasqueradeTable, chain, cfg.Name)
	fmt.Fprintf(&b, "flush chain inet %s %s\n", MasqueradeTable, chain)
	for _, r := range masqueradeRules(cfg) {
		fmt.Fprintf(&b, "add rule inet %s %s %s\n", MasqueradeTable, chain, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nft, err := exec.LookPath("nft")
	if err != nil {
		return types.NewError(ErrPluginNotAvailable, "nft is not installed: masquerading needs nftables 1.0.1 or later",
			"install nftables or set \"masquerade\": false")
	}
	cmd := exec.CommandContext(ctx, nft, "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return ioError("write masquerade rules (nft table inet %s): %v: %s", MasqueradeTable, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// RemoveMasquerade deletes the network's chain from Waggle's table (and the
// table once it is empty). A missing chain is success.
func RemoveMasquerade(network string) error {
	nft, err := knftables.New(knftables.InetFamily, MasqueradeTable)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	chains, err := nft.List(ctx, "chains")
	if err != nil {
		if knftables.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("list chains of %s: %w", MasqueradeTable, err)
	}
	tx := nft.NewTransaction()
	if slices.Contains(chains, masqChain(network)) {
		tx.Delete(&knftables.Chain{Name: masqChain(network)})
	}
	if len(chains) == 0 || (len(chains) == 1 && chains[0] == masqChain(network)) {
		tx.Delete(&knftables.Table{})
	}
	if tx.NumOperations() == 0 {
		return nil
	}
	if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("remove masquerade chain of %s: %w", network, err)
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
	hostName := HostVethName(cfg.Name, args.ContainerID, args.IfName)
	if err := deleteLink(hostName); err != nil {
		return ioError("delete veth %s: %v", hostName, err)
	}
	if args.Netns != "" {
		err := ns.WithNetNSPath(args.Netns, func(ns.NetNS) error {
			l, err := netlink.LinkByName(args.IfName)
			if err != nil {
				return nil // gone with its peer
			}
			if _, ok := l.(*netlink.Veth); !ok {
				return nil // not ours
			}
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				return ioError("delete %s in the pod: %v", args.IfName, err)
			}
			return nil
		})
		if err != nil && !errors.As(err, new(ns.NSPathNotExistErr)) && !errors.As(err, new(ns.NSPathNotNSErr)) {
			var te *types.Error
			if errors.As(err, &te) {
				return te
			}
			return ioError("enter pod netns %s: %v", args.Netns, err)
		}
	}
	return release(cfg, args.ContainerID, args.IfName)
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
		if err := ip.ValidateExpectedInterfaceIPs(args.IfName, podIPs); err != nil {
			return internalError("pod interface %s: %v", args.IfName, err)
		}
		if err := ip.ValidateExpectedRoute(prev.Routes); err != nil {
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
