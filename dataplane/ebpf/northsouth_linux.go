package ebpf

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// northSouth is the loaded north-south half of a Backend.
type northSouth struct {
	cfg  NorthSouth
	objs *nodePortObjects
	mg   *maglevMaps
	devs []device
}

type device struct {
	name    string
	ifindex int
	addr    netip.Addr
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
	spec.Maps[MapNPMaglev].InnerMap.MaxEntries = uint32(cfg.MaglevTableSize)
	spec.Maps[MapNPMaglev].MaxEntries = uint32(b.cfg.MaxServices)
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
		// The conntrack or affinity LRU changed size: start them afresh
		// (established north-south flows fall back to Maglev, which picks
		// the same backend while the backends stay the same).
		b.log.Warn("north-south map sizes changed: recreating the conntrack and affinity maps")
		for _, n := range []string{MapNPConntrack, MapNPAffinity} {
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
	if err := writeDevices(objs.WaggleNpDevices, devs); err != nil {
		return err
	}
	mg := newMaglevMaps(objs.WaggleNpMaglev, cfg.MaglevTableSize)
	b.rec.t.maglev = mg
	if err := b.rec.fillMaglev(); err != nil {
		b.rec.t.maglev = nil
		mg.close()
		return err
	}
	b.np = &northSouth{cfg: cfg, objs: objs, mg: mg, devs: devs}
	if err := b.attachNorthSouth(); err != nil {
		b.rec.t.maglev = nil
		b.np = nil
		mg.close()
		return err
	}
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = fmt.Sprintf("%s(%s)", d.name, d.addr)
	}
	b.log.Info("eBPF north-south load balancing ready", "devices", strings.Join(names, ","),
		"maglevTableSize", cfg.MaglevTableSize, "snatPorts", fmt.Sprintf("%d-%d", cfg.SNATPortMin, cfg.SNATPortMax))
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
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
			if err != nil {
				return fmt.Errorf("north-south device %s: list addresses: %w", name, err)
			}
			d := device{name: name, ifindex: l.Attrs().Index}
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip.IsGlobalUnicast() {
					d.addr = ip
					break
				}
			}
			if !d.addr.IsValid() {
				return fmt.Errorf("north-south device %s has no IPv4 address to SNAT to", name)
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

func writeDevices(m *ebpf.Map, devs []device) error {
	want := map[uint32]bool{}
	for _, d := range devs {
		v := nodePortNpDevice{Addr4: ipv4Net(d.addr), Flags: 1}
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
// egress), replacing the program in a pinned link that still points at the
// same device, and detaches links of devices no longer configured.
func (b *Backend) attachNorthSouth() error {
	wanted := map[string]bool{}
	return inNetNS(b.np.cfg.NetNS, func() error {
		for _, d := range b.np.devs {
			for _, a := range []struct {
				dir  string
				prog *ebpf.Program
				at   ebpf.AttachType
			}{{"ingress", b.np.objs.WaggleNpIngress, ebpf.AttachTCXIngress}, {"egress", b.np.objs.WaggleNpEgress, ebpf.AttachTCXEgress}} {
				name := npLinkName(d.name, a.dir)
				wanted[name] = true
				path := filepath.Join(b.cfg.PinDir, LinkDir, name)
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
				if err != nil {
					return fmt.Errorf("attach north-south %s program to %s (tcx needs Linux 6.6+): %w", a.dir, d.name, err)
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
		return nil
	})
}

func (n *northSouth) close() {
	if n == nil {
		return
	}
	n.mg.close()
	n.objs.Close()
}

// maglevMaps writes Maglev tables into the map of maps: one inner array per
// distinct backend list, shared by every frontend with that list (a
// Service's NodePort, ExternalIP and LoadBalancer frontends share one), and
// replaced, never rewritten in place: the outer entry swaps atomically.
type maglevMaps struct {
	outer  *ebpf.Map
	size   int
	tables map[string]*sharedTable // by backend ID list
	byID   map[uint32]string
}

type sharedTable struct {
	m    *ebpf.Map
	refs int
}

func newMaglevMaps(outer *ebpf.Map, size int) *maglevMaps {
	return &maglevMaps{outer: outer, size: size, tables: map[string]*sharedTable{}, byID: map[uint32]string{}}
}

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
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "waggle_np_mgtab", Type: ebpf.Array, KeySize: 4, ValueSize: 4,
		MaxEntries: uint32(g.size)})
	if err != nil {
		return nil, "", fmt.Errorf("create Maglev table: %w", err)
	}
	if len(ids) > 0 {
		idx := Maglev(names, g.size)
		keys := make([]uint32, g.size)
		vals := make([]uint32, g.size)
		for i, b := range idx {
			keys[i], vals[i] = uint32(i), ids[b]
		}
		if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
			if !errors.Is(err, ebpf.ErrNotSupported) {
				m.Close()
				return nil, "", fmt.Errorf("fill Maglev table: %w", err)
			}
			for i := range keys {
				if err := m.Update(keys[i], vals[i], ebpf.UpdateAny); err != nil {
					m.Close()
					return nil, "", fmt.Errorf("fill Maglev table: %w", err)
				}
			}
		}
	}
	t := &sharedTable{m: m}
	g.tables[key] = t
	return t, key, nil
}

func (g *maglevMaps) Set(id uint32, ids []uint32, names []string) error {
	t, key, err := g.table(ids, names)
	if err != nil {
		return err
	}
	if old, ok := g.byID[id]; ok && old == key {
		return nil
	}
	if err := g.outer.Update(id, t.m, ebpf.UpdateAny); err != nil {
		if t.refs == 0 {
			t.m.Close()
			delete(g.tables, key)
		}
		if errors.Is(err, errE2BIG) {
			return errMapFull(MapNPMaglev, err)
		}
		return fmt.Errorf("map %s: update: %w", MapNPMaglev, err)
	}
	t.refs++
	g.release(id)
	g.byID[id] = key
	return nil
}

func (g *maglevMaps) Delete(ids []uint32) error {
	for _, id := range ids {
		if err := g.outer.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("map %s: delete: %w", MapNPMaglev, err)
		}
		g.release(id)
	}
	return nil
}

// release drops id's reference to its table (the kernel keeps an inner map
// alive while the outer map or a running program holds it).
func (g *maglevMaps) release(id uint32) {
	key, ok := g.byID[id]
	if !ok {
		return
	}
	delete(g.byID, id)
	if t := g.tables[key]; t != nil {
		t.refs--
		if t.refs <= 0 {
			t.m.Close()
			delete(g.tables, key)
		}
	}
}

func (g *maglevMaps) close() {
	for _, t := range g.tables {
		t.m.Close()
	}
	g.tables = map[string]*sharedTable{}
	g.byID = map[uint32]string{}
}

// removeNorthSouth detaches north-south programs a previous proxy left and
// removes their maps (north-south load balancing was turned off).
func removeNorthSouth(dir string) error {
	var errs []error
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

var npPinnedMaps = []string{MapNPConntrack, MapNPAffinity, MapNPDevices, MapNPConfig, MapNPStats}
