package ebpf

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/internal/netlinkdump"
)

// northSouth is the loaded north-south half of a Backend.
type northSouth struct {
	cfg  NorthSouth
	objs *nodePortObjects
	mg   *maglevMaps
	devs []device
	// legacyTC: the kernel has no tcx, the programs are tc filters.
	legacyTC bool
}

type device struct {
	name    string
	ifindex int
	addr    netip.Addr       // IPv4 SNAT source (invalid: none)
	addr6   netip.Addr       // IPv6 SNAT source (invalid: none)
	mac     net.HardwareAddr // the device's MAC (np_device.mac: XDP serves only frames to it)
	kind    string           // netlink link type ("veth", "device", ...)
	xdp     string           // the XDP mode attached: AccelNative, AccelGeneric or empty
}

// loadNorthSouth loads bpf/nodeport.c against the socket load balancer's
// maps, fills its config, devices and (from the restored mirror) Maglev
// maps, and attaches it to the devices — or swaps it into their pinned
// links.
func (b *Backend) loadNorthSouth() (err error) {
	cfg := *b.cfg.NorthSouth
	devs, err := resolveDevices(cfg)
	if err != nil {
		return err
	}
	spec, err := loadNodePort()
	if err != nil {
		return err
	}
	spec.Maps[MapNPServices].MaxEntries = uint32(b.cfg.MaxServices)
	spec.Maps[MapNPMaglev].MaxEntries = uint32(min(1<<24, max(1<<16, b.cfg.MaxServices*maglevChunks(cfg.MaglevTableSize)/4)))
	spec.Maps[MapNPConntrack].MaxEntries = uint32(cfg.MaxConntrack)
	spec.Maps[MapNPAffinity].MaxEntries = uint32(b.cfg.MaxAffinity)
	shared := map[string]*ebpf.Map{
		MapServices: b.objs.WaggleServices, MapBackends: b.objs.WaggleBackends, MapRevNat: b.objs.WaggleRevNat,
		MapReverseSockets: b.objs.WaggleReverseSk, MapAffinity: b.objs.WaggleAffinity,
		MapServiceNames: b.objs.WaggleSvcNames, MapMeta: b.objs.WaggleMeta, MapStats: b.objs.WaggleStats,
	}
	repl := map[string]*ebpf.Map{}
	for name := range spec.Maps {
		if m := shared[name]; m != nil {
			repl[name] = m
			spec.Maps[name].MaxEntries = m.MaxEntries()
		}
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: b.cfg.PinDir}, MapReplacements: repl}
	objs := &nodePortObjects{}
	err = spec.LoadAndAssign(objs, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// A map changed size: start those afresh
		// (established north-south flows fall back to Maglev, which picks
		// the same backend while the backends stay the same).
		b.log.Warn("north-south map sizes changed: recreating the conntrack and affinity maps")
		// (np_device grew its IPv6 address in layout 2 and the device's MAC
		// in layout 3: the devices map is rewritten below anyway.)
		for _, n := range []string{MapNPConntrack, MapNPAffinity, MapNPServices, MapNPMaglev, MapNPStats, MapNPDevices, MapNPFragments} {
			os.Remove(filepath.Join(b.cfg.PinDir, n))
		}
		err = spec.LoadAndAssign(objs, opts)
	}
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load north-south eBPF programs: %+v", ve)
		}
		return fmt.Errorf("load north-south eBPF objects: %w", err)
	}
	defer func() {
		if err != nil {
			objs.Close()
		}
	}()
	conf := nodePortNpConfig{Magic: NPMagic, LayoutVersion: NPLayoutVersion, MaglevSize: uint32(cfg.MaglevTableSize),
		SnatMin: cfg.SNATPortMin, SnatMax: cfg.SNATPortMax}
	if err := objs.WaggleNpConfig.Update(uint32(0), &conf, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write %s: %w", MapNPConfig, err)
	}
	if err := objs.WaggleNpLbMode.Update(uint32(0), lbModeValue(cfg.LBMode), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write %s: %w", MapNPLBMode, err)
	}
	if err := writeDevices(objs.WaggleNpDevices, devs); err != nil {
		return err
	}
	mg, err := newMaglevMaps(objs.WaggleNpSvc, objs.WaggleNpMaglev, objs.WaggleNpSrcRanges, cfg.MaglevTableSize)
	if err != nil {
		return err
	}
	b.rec.t.maglev = mg
	// Rewrite every table under new IDs from the restored mirror (the
	// table size may have changed), then drop what the last proxy left.
	if err := b.rec.fillMaglev(); err != nil {
		b.rec.t.maglev = nil
		return err
	}
	if err := mg.dropStale(); err != nil {
		b.rec.t.maglev = nil
		return err
	}
	b.np = &northSouth{cfg: cfg, objs: objs, mg: mg, devs: devs}
	if err := b.attachNorthSouth(); err != nil {
		b.rec.t.maglev = nil
		b.np = nil
		return err
	}
	// The XDP modes chosen, for `waggle bpf nodeport status`.
	if err := writeDevices(objs.WaggleNpDevices, b.np.devs); err != nil {
		return err
	}
	names := make([]string, len(devs))
	for i, d := range b.np.devs {
		var as []string
		for _, a := range []netip.Addr{d.addr, d.addr6} {
			if a.IsValid() {
				as = append(as, a.String())
			}
		}
		names[i] = fmt.Sprintf("%s(%s", d.name, strings.Join(as, " "))
		if d.xdp != "" {
			names[i] += ", xdp " + d.xdp
		}
		names[i] += ")"
	}
	b.log.Info("eBPF north-south load balancing ready", "devices", strings.Join(names, ","),
		"lbMode", cfg.LBMode, "maglevTableSize", cfg.MaglevTableSize, "snatPorts", fmt.Sprintf("%d-%d", cfg.SNATPortMin, cfg.SNATPortMax))
	return nil
}

// inNetNS runs fn in the north-south network namespace.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
}

func resolveDevices(cfg NorthSouth) ([]device, error) {
	var out []device
	err := inNetNS(cfg.NetNS, func() error {
		for _, name := range cfg.Devices {
			l, err := netlink.LinkByName(name)
			if err != nil {
				where := "this network namespace"
				if cfg.NetNS != "" {
					where = cfg.NetNS
				}
				var have []string
				if ls, lerr := netlink.LinkList(); lerr == nil {
					for _, x := range ls {
						have = append(have, x.Attrs().Name)
					}
				}
				return fmt.Errorf("north-south device %q: no such interface in %s (have %s): %w",
					name, where, strings.Join(have, ", "), ErrNoDevice)
			}
			addrs, err := netlinkdump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(l, netlink.FAMILY_ALL) })
			if err != nil {
				return fmt.Errorf("north-south device %s: list addresses: %w", name, err)
			}
			d := device{name: name, ifindex: l.Attrs().Index, kind: l.Type(), mac: l.Attrs().HardwareAddr}
			d.addr, d.addr6 = snatAddrs(addrs)
			if !d.addr.IsValid() && !d.addr6.IsValid() {
				return fmt.Errorf("north-south device %s has no global IPv4 or IPv6 address to SNAT to", name)
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

// snatAddrs picks a device's SNAT sources: its first global unicast IPv4
// address, and its first global unicast IPv6 address (a ULA counts),
// preferring one that is neither tentative (duplicate address detection
// pending: right after boot) nor deprecated, but taking such a one rather
// than none (it becomes usable once DAD is done; the devices are resolved
// once, at start). An address whose DAD failed is never used.
func snatAddrs(addrs []netlink.Addr) (v4, v6 netip.Addr) {
	var v6Later netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		switch {
		case !ip.IsGlobalUnicast():
		case ip.Is4() && !v4.IsValid():
			v4 = ip
		case !ip.Is6() || v6.IsValid() || a.Flags&unix.IFA_F_DADFAILED != 0:
		case a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DEPRECATED) == 0:
			v6 = ip
		case !v6Later.IsValid():
			v6Later = ip
		}
	}
	if !v6.IsValid() {
		v6 = v6Later
	}
	return v4, v6
}

func writeDevices(m *ebpf.Map, devs []device) error {
	want := map[uint32]bool{}
	for _, d := range devs {
		v := nodePortNpDevice{Flags: npDevExternal}
		if d.addr.IsValid() {
			v.Addr4 = ipv4Net(d.addr)
		}
		if d.addr6.IsValid() {
			v.Addr6 = d.addr6.As16()
		}
		if len(d.mac) == len(v.Mac) {
			copy(v.Mac[:], d.mac)
		}
		switch d.xdp {
		case AccelNative:
			v.Flags |= npDevXDPNative
		case AccelGeneric:
			v.Flags |= npDevXDPGeneric
		}
		if err := m.Update(uint32(d.ifindex), &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write %s: %w", MapNPDevices, err)
		}
		want[uint32(d.ifindex)] = true
	}
	var k uint32
	var v nodePortNpDevice
	var stale []uint32
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	for _, k := range stale {
		m.Delete(k)
	}
	return it.Err()
}

// ipv4Net is a's bytes as the __be32 the programs compare with.
func ipv4Net(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func npLinkName(dev, dir string) string { return NPLinkPrefix + dev + "-" + dir }

// attachNorthSouth attaches the programs to every device (tcx ingress and
// egress, and XDP with Acceleration), replacing the program in a pinned
// link that still points at the same device, and detaches links of devices
// (or XDP) no longer configured.
func (b *Backend) attachNorthSouth() error {
	wanted := map[string]bool{}
	keepTC := map[tcFilterKey]bool{}
	return inNetNS(b.np.cfg.NetNS, func() error {
		for i := range b.np.devs {
			if err := b.attachXDP(&b.np.devs[i], wanted); err != nil {
				return err
			}
		}
		for _, d := range b.np.devs {
			for _, a := range []struct {
				dir  string
				prog *ebpf.Program
				at   ebpf.AttachType
			}{{"ingress", b.np.objs.WaggleNpIngress, ebpf.AttachTCXIngress}, {"egress", b.np.objs.WaggleNpEgress, ebpf.AttachTCXEgress}} {
				name := npLinkName(d.name, a.dir)
				path := filepath.Join(b.cfg.PinDir, LinkDir, name)
				if b.np.cfg.DisableTCX || b.np.legacyTC {
					if err := attachTCFilter(d.ifindex, a.dir, a.prog); err != nil {
						return fmt.Errorf("attach north-south %s program to %s as a tc filter: %w", a.dir, d.name, err)
					}
					keepTC[tcFilterKey{d.ifindex, a.dir}] = true
					continue
				}
				wanted[name] = true
				if old, err := link.LoadPinnedLink(path, nil); err == nil {
					info, ierr := old.Info()
					if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == d.ifindex {
						err = old.Update(a.prog)
						old.Close()
						if err != nil {
							return fmt.Errorf("replace %s in pinned link %s: %w", a.dir, path, err)
						}
						continue
					}
					old.Unpin()
					old.Close()
				}
				l, err := link.AttachTCX(link.TCXOptions{Interface: d.ifindex, Program: a.prog, Attach: a.at})
				if errors.Is(err, ebpf.ErrNotSupported) {
					// Before Linux 6.6: the same programs as clsact
					// filters, as Cilium attaches them there.
					b.log.Info("tcx is not supported by this kernel (Linux 6.6+): north-south programs attached as tc clsact filters", "device", d.name)
					b.np.legacyTC = true
					delete(wanted, name)
					if err := attachTCFilter(d.ifindex, a.dir, a.prog); err != nil {
						return fmt.Errorf("attach north-south %s program to %s as a tc filter: %w", a.dir, d.name, err)
					}
					keepTC[tcFilterKey{d.ifindex, a.dir}] = true
					continue
				}
				if err != nil {
					return fmt.Errorf("attach north-south %s program to %s: %w", a.dir, d.name, err)
				}
				err = l.Pin(path)
				l.Close()
				if err != nil {
					return fmt.Errorf("pin link %s: %w", path, err)
				}
			}
		}
		links, _ := filepath.Glob(filepath.Join(b.cfg.PinDir, LinkDir, NPLinkPrefix+"*"))
		for _, p := range links {
			if wanted[filepath.Base(p)] {
				continue
			}
			if l, err := link.LoadPinnedLink(p, nil); err == nil {
				l.Detach()
				l.Close()
			}
			os.Remove(p)
			b.log.Info("north-south device no longer configured: detached", "link", filepath.Base(p))
		}
		return detachTCFilters(keepTC)
	})
}

// Legacy tc attachment (kernels without tcx, or DisableTCX): each program
// is a cls_bpf filter in direct-action mode on the device's clsact qdisc,
// at a fixed priority and handle with a waggle name, so a restart replaces
// it in place (no gap) and cleanup finds it. The programs' return codes
// are the same for both hooks (TC_ACT_OK is TCX_PASS, TC_ACT_UNSPEC
// TCX_NEXT, TC_ACT_SHOT TCX_DROP, TC_ACT_REDIRECT TCX_REDIRECT).
const (
	tcFilterPriority = 3085 // a preference of our own, before a filter added at tc's default (49152)
	tcFilterHandle   = 1
	tcFilterPrefix   = "waggle_np_"
)

type tcFilterKey struct {
	ifindex int
	dir     string
}

func tcFilter(ifindex int, dir string) *netlink.BpfFilter {
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if dir == "egress" {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	return &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: parent,
		Handle: tcFilterHandle, Priority: tcFilterPriority, Protocol: unix.ETH_P_ALL},
		Name: tcFilterPrefix + dir, DirectAction: true}
}

// attachTCFilter puts prog on the device's clsact qdisc (made if missing),
// replacing the filter a previous run left.
func attachTCFilter(ifindex int, dir string, prog *ebpf.Program) error {
	q := &netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("clsact qdisc: %w", err)
	}
	f := tcFilter(ifindex, dir)
	f.Fd = prog.FD()
	return netlink.FilterReplace(f)
}

// detachTCFilters removes the waggle north-south tc filters of this network
// namespace except keep's (nil: all of them).
func detachTCFilters(keep map[tcFilterKey]bool) error {
	links, err := netlinkdump.Retry(netlink.LinkList)
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range links {
		for _, dir := range []string{"ingress", "egress"} {
			want := tcFilter(l.Attrs().Index, dir)
			filters, err := netlink.FilterList(l, want.Parent)
			if err != nil {
				continue // no clsact qdisc
			}
			for _, f := range filters {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok || !strings.HasPrefix(bf.Name, tcFilterPrefix) || keep[tcFilterKey{l.Attrs().Index, dir}] {
					continue
				}
				if err := netlink.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("remove tc filter %s on %s: %w", bf.Name, l.Attrs().Name, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// xdpLinkDir names a device's XDP link: np-<device>-xdp.
const xdpLinkDir = "xdp"

// attachXDP attaches the XDP ingress program to d in the mode
// Acceleration asks for (or swaps it into d's pinned link when that is in
// the same mode), records the mode in d.xdp and logs the choice, as the
// proxy mode's. Runs in the devices' network namespace.
func (b *Backend) attachXDP(d *device, wanted map[string]bool) error {
	accel := b.np.cfg.Acceleration
	if accel == "" || accel == AccelDisabled {
		return nil
	}
	name := npLinkName(d.name, xdpLinkDir)
	wanted[name] = true
	path := filepath.Join(b.cfg.PinDir, LinkDir, name)
	mode, why := accel, "asked for (--bpf-lb-acceleration="+accel+")"
	if accel == AccelBestEffort {
		mode, why = AccelNative, "the driver supports native XDP"
		if d.kind == "veth" {
			// A veth's native XDP transmits (XDP_TX, redirects) only to
			// a peer that runs XDP itself (AttachPeerXDP), which is not
			// this proxy's to decide: to any other peer the packets are
			// lost.
			mode, why = AccelGeneric, "veth: native XDP can only transmit to a peer that runs XDP"
		}
	}
	prog := b.np.objs.WaggleNpXdp
	if old, err := link.LoadPinnedLink(path, nil); err == nil {
		info, ierr := old.Info()
		if ierr == nil && info.XDP() != nil && int(info.XDP().Ifindex) == d.ifindex && xdpAttachMode(d.ifindex) == mode {
			err = old.Update(prog)
			old.Close()
			if err != nil {
				return fmt.Errorf("replace the XDP program in pinned link %s: %w", path, err)
			}
			d.xdp = mode
			b.log.Info("north-south XDP acceleration selected", "device", d.name, "mode", mode, "why", why)
			return nil
		}
		// Another device or mode: the tc programs serve everything
		// until the new attachment is in place.
		old.Detach()
		old.Unpin()
		old.Close()
	}
	flags := link.XDPGenericMode
	if mode == AccelNative {
		flags = link.XDPDriverMode
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: d.ifindex, Flags: flags})
	if err != nil && accel == AccelBestEffort && mode == AccelNative {
		mode, why = AccelGeneric, fmt.Sprintf("native XDP not supported by the driver (%v)", err)
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: d.ifindex, Flags: link.XDPGenericMode})
	}
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("attach the north-south XDP program (%s) to %s: another XDP program is attached to it (ip link show %s): %w", mode, d.name, d.name, err)
	}
	if err != nil {
		return fmt.Errorf("attach the north-south XDP program (%s) to %s: %w", mode, d.name, err)
	}
	err = l.Pin(path)
	if err != nil {
		l.Close()
		return fmt.Errorf("pin link %s: %w", path, err)
	}
	l.Close()
	d.xdp = mode
	b.log.Info("north-south XDP acceleration selected", "device", d.name, "mode", mode, "why", why)
	return nil
}

// xdpAttachMode is the mode of the XDP program attached to ifindex
// (AccelNative, AccelGeneric, or empty), as the kernel reports it.
func xdpAttachMode(ifindex int) string {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil || l.Attrs().Xdp == nil || !l.Attrs().Xdp.Attached {
		return ""
	}
	switch l.Attrs().Xdp.AttachMode {
	case 1: // XDP_ATTACHED_DRV
		return AccelNative
	case 2: // XDP_ATTACHED_SKB
		return AccelGeneric
	}
	return ""
}

// AttachPeerXDP attaches, in native mode, an XDP program that passes every
// frame to the device ifindex (in the calling thread's network namespace)
// and returns its link (Close detaches it). It is for a veth's peer: a
// veth's native XDP transmits (XDP_TX, redirects) to its peer only when the
// peer runs XDP itself. Without, the frames are dropped (the veth's
// tx_dropped); with GRO on the peer, which gives it NAPI too, the kernel
// (6.18) takes them (xdp:xdp_bulk_tx reports them sent) but the peer
// does not deliver them. On a NIC nothing of the kind is needed.
func AttachPeerXDP(ifindex int) (link.Link, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "waggle_xdp_pass", Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	if err != nil {
		return nil, fmt.Errorf("load the XDP_PASS program: %w", err)
	}
	defer prog.Close() // the link holds it
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPDriverMode})
	if err != nil {
		return nil, fmt.Errorf("attach XDP_PASS to ifindex %d: %w", ifindex, err)
	}
	return l, nil
}

func (n *northSouth) close() {
	if n == nil {
		return
	}
	n.mg.close()
	n.objs.Close()
}

// maglevMaps writes Maglev tables: one table per distinct backend list,
// shared by every frontend with that list (a Service's NodePorts,
// ExternalIPs and LoadBalancer IPs), in chunks of NP_MAGLEV_CHUNK entries of
// waggle_np_maglev. A changed list gets a table under a new ID, written
// before waggle_np_svc points at it (one atomic entry update); the old table
// goes once no frontend uses it. Plain hash maps, not a map of maps: every
// update of a map of maps waits for an RCU grace period (~10 ms here), which
// made 10,000 frontends take two minutes.
type maglevMaps struct {
	svc, tab *ebpf.Map
	// src: loadBalancerSourceRanges; ranges mirrors it by service ID.
	src    *ebpf.Map
	ranges map[uint32][]netip.Prefix
	size   int
	tables map[string]*sharedTable // by backend ID list
	byID   map[uint32]string       // service ID -> table key
	nextID uint32
	// stale: table IDs and service IDs found at start, not yet rewritten.
	staleTables map[uint32]int
	staleSvcs   map[uint32]bool
}

type sharedTable struct {
	id   uint32 // 0: the empty table (no chunks)
	refs int
}

const maglevChunk = 256

func maglevChunks(m int) int { return (m + maglevChunk - 1) / maglevChunk }

func newMaglevMaps(svc, tab, src *ebpf.Map, size int) (*maglevMaps, error) {
	g := &maglevMaps{svc: svc, tab: tab, src: src, size: size, tables: map[string]*sharedTable{}, byID: map[uint32]string{},
		nextID: 1, staleTables: map[uint32]int{}, staleSvcs: map[uint32]bool{}, ranges: map[uint32][]netip.Prefix{}}
	var rk nodePortNpSrcRangeKey
	var rv uint8
	rit := src.Iterate()
	for rit.Next(&rk, &rv) {
		if id, p, ok := decodeSrcRange(rk); ok {
			g.ranges[id] = append(g.ranges[id], p)
		}
	}
	if err := rit.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", MapNPSourceRanges, err)
	}
	for id, ps := range g.ranges {
		slices.SortFunc(ps, comparePrefix)
		g.ranges[id] = ps
	}
	var k nodePortNpMaglevKey
	var v nodePortNpMaglevChunk
	it := tab.Iterate()
	for it.Next(&k, &v) {
		g.staleTables[k.Table] = max(g.staleTables[k.Table], int(k.Chunk)+1)
		g.nextID = max(g.nextID, k.Table+1)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", MapNPMaglev, err)
	}
	var id uint32
	var sv nodePortNpSvc
	it = svc.Iterate()
	for it.Next(&id, &sv) {
		g.staleSvcs[id] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", MapNPServices, err)
	}
	return g, nil
}

// dropStale removes the service entries and tables the previous proxy left
// that fillMaglev did not rewrite.
func (g *maglevMaps) dropStale() error {
	var svcs []uint32
	for id := range g.staleSvcs {
		if _, ok := g.byID[id]; !ok {
			svcs = append(svcs, id)
		}
	}
	if err := (mapTable[uint32, nodePortNpSvc]{MapNPServices, g.svc}).Delete(svcs); err != nil {
		return err
	}
	for id, n := range g.staleTables {
		if err := g.deleteTable(id, n); err != nil {
			return err
		}
	}
	g.staleSvcs, g.staleTables = map[uint32]bool{}, map[uint32]int{}
	for id := range g.ranges {
		if _, ok := g.byID[id]; !ok {
			if err := g.setRanges(id, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// srcRangeKey is the LPM key of prefix p of service id: the ID's 32 bits
// (big-endian, as the trie compares bytes) then the IPv6 or IPv4-mapped
// address.
func srcRangeKey(id uint32, p netip.Prefix) nodePortNpSrcRangeKey {
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	// As16 of an IPv4 address is its IPv4-mapped form.
	return nodePortNpSrcRangeKey{Prefixlen: uint32(32 + bits), RevNatId: htonl(id), Addr: p.Addr().As16()}
}

func decodeSrcRange(k nodePortNpSrcRangeKey) (uint32, netip.Prefix, bool) {
	if k.Prefixlen < 32 || k.Prefixlen > 32+128 {
		return 0, netip.Prefix{}, false
	}
	a := netip.AddrFrom16(k.Addr)
	bits := int(k.Prefixlen) - 32
	if a.Is4In6() && bits >= 96 {
		a, bits = a.Unmap(), bits-96
	}
	return htonl(k.RevNatId), netip.PrefixFrom(a, bits), true
}

func htonl(v uint32) uint32 { return bits.ReverseBytes32(v) }

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// addRanges writes the entries of want that id lacks.
func (g *maglevMaps) addRanges(id uint32, want []netip.Prefix) error {
	var keys []nodePortNpSrcRangeKey
	for _, p := range want {
		if !slices.Contains(g.ranges[id], p) {
			keys = append(keys, srcRangeKey(id, p))
		}
	}
	vals := make([]uint8, len(keys))
	for i := range vals {
		vals[i] = 1
	}
	return (mapTable[nodePortNpSrcRangeKey, uint8]{MapNPSourceRanges, g.src}).Put(keys, vals)
}

// setRanges makes id's entries in the source-range trie equal to want:
// additions, then deletions (Set flips NP_SVC_F_SRC_RANGES in between, so a
// new flow is never checked against a half-written list).
func (g *maglevMaps) setRanges(id uint32, want []netip.Prefix) error {
	if err := g.addRanges(id, want); err != nil {
		return err
	}
	var keys []nodePortNpSrcRangeKey
	for _, p := range g.ranges[id] {
		if !slices.Contains(want, p) {
			keys = append(keys, srcRangeKey(id, p))
		}
	}
	if err := (mapTable[nodePortNpSrcRangeKey, uint8]{MapNPSourceRanges, g.src}).Delete(keys); err != nil {
		return err
	}
	if len(want) == 0 {
		delete(g.ranges, id)
	} else {
		g.ranges[id] = slices.Clone(want)
	}
	return nil
}

func (g *maglevMaps) Ranges(id uint32) []netip.Prefix { return slices.Clone(g.ranges[id]) }

func tableKey(ids []uint32) string {
	var sb strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&sb, "%d,", id)
	}
	return sb.String()
}

func (g *maglevMaps) table(ids []uint32, names []string) (*sharedTable, string, error) {
	key := tableKey(ids)
	if t := g.tables[key]; t != nil {
		return t, key, nil
	}
	t := &sharedTable{}
	if len(ids) > 0 {
		t.id = g.nextID
		g.nextID++
		idx := Maglev(names, g.size)
		n := maglevChunks(g.size)
		keys := make([]nodePortNpMaglevKey, n)
		vals := make([]nodePortNpMaglevChunk, n)
		for i, b := range idx {
			vals[i/maglevChunk].Backend[i%maglevChunk] = ids[b]
		}
		for c := range keys {
			keys[c] = nodePortNpMaglevKey{Table: t.id, Chunk: uint32(c)}
		}
		if err := (mapTable[nodePortNpMaglevKey, nodePortNpMaglevChunk]{MapNPMaglev, g.tab}).Put(keys, vals); err != nil {
			g.deleteTable(t.id, n)
			return nil, "", err
		}
	}
	g.tables[key] = t
	return t, key, nil
}

func (g *maglevMaps) deleteTable(id uint32, chunks int) error {
	keys := make([]nodePortNpMaglevKey, chunks)
	for c := range keys {
		keys[c] = nodePortNpMaglevKey{Table: id, Chunk: uint32(c)}
	}
	return (mapTable[nodePortNpMaglevKey, nodePortNpMaglevChunk]{MapNPMaglev, g.tab}).Delete(keys)
}

func (g *maglevMaps) Set(id uint32, ids []uint32, names []string, ranges []netip.Prefix) error {
	t, key, err := g.table(ids, names)
	if err != nil {
		return err
	}
	if old, ok := g.byID[id]; ok && old == key && slices.Equal(g.ranges[id], ranges) {
		return nil
	}
	// New source ranges before the flag that makes the program read them;
	// ranges no longer wanted after it.
	var flags uint32
	if len(ranges) > 0 {
		flags = NPSvcFlagSourceRanges
	}
	err = g.addRanges(id, ranges)
	if err == nil {
		err = (mapTable[uint32, nodePortNpSvc]{MapNPServices, g.svc}).Put([]uint32{id}, []nodePortNpSvc{{Table: t.id, Flags: flags}})
	}
	if err != nil {
		if t.refs == 0 {
			g.drop(key, t)
		}
		return err
	}
	t.refs++
	g.release(id)
	g.byID[id] = key
	return g.setRanges(id, ranges)
}

func (g *maglevMaps) Delete(ids []uint32) error {
	if err := (mapTable[uint32, nodePortNpSvc]{MapNPServices, g.svc}).Delete(ids); err != nil {
		return err
	}
	for _, id := range ids {
		g.release(id)
		if err := g.setRanges(id, nil); err != nil {
			return err
		}
	}
	return nil
}

// release drops id's reference to its table; a table nobody uses is
// deleted (the frontends now point elsewhere).
func (g *maglevMaps) release(id uint32) {
	key, ok := g.byID[id]
	if !ok {
		return
	}
	delete(g.byID, id)
	if t := g.tables[key]; t != nil {
		t.refs--
		if t.refs <= 0 {
			g.drop(key, t)
		}
	}
}

func (g *maglevMaps) drop(key string, t *sharedTable) {
	delete(g.tables, key)
	if t.id != 0 {
		g.deleteTable(t.id, maglevChunks(g.size))
	}
}

func (g *maglevMaps) close() {}

// removeNorthSouth detaches north-south programs a previous proxy left and
// removes their maps (north-south load balancing was turned off).
func removeNorthSouth(dir string) error {
	errs := []error{detachTCFilters(nil)}
	links, _ := filepath.Glob(filepath.Join(dir, LinkDir, NPLinkPrefix+"*"))
	for _, p := range links {
		if l, err := link.LoadPinnedLink(p, nil); err == nil {
			if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
				errs = append(errs, fmt.Errorf("detach %s: %w", filepath.Base(p), err))
			}
			l.Close()
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, n := range npPinnedMaps {
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

var npPinnedMaps = []string{MapNPConntrack, MapNPAffinity, MapNPDevices, MapNPConfig, MapNPStats, MapNPServices, MapNPMaglev,
	MapNPSourceRanges, MapNPFragments, MapNPLBMode}
