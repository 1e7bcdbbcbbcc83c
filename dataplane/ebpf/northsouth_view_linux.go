package ebpf

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// npMap opens one pinned north-south map (cached in the View).
func (v *View) npMap(name string) (*ebpf.Map, error) {
	if m := v.maps[name]; m != nil {
		return m, nil
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(v.dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", v.dir, ErrNoNorthSouth)
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", name, err)
	}
	v.maps[name] = m
	return m, nil
}

// LBMode returns the north-south load-balancing mode the programs run with
// (--bpf-lb-mode: snat, dsr or hybrid).
func (v *View) LBMode() (string, error) {
	m, err := v.npMap(MapNPLBMode)
	if err != nil {
		return "", err
	}
	var mode uint32
	if err := m.Lookup(uint32(0), &mode); err != nil {
		return "", fmt.Errorf("read %s: %w", MapNPLBMode, err)
	}
	return lbModeName(mode), nil
}

// NorthSouthStats returns the north-south counters by name, summed over CPUs.
func (v *View) NorthSouthStats() (map[string]uint64, error) {
	m, err := v.npMap(MapNPStats)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for i, name := range npStatNames {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("read %s: %w", MapNPStats, err)
		}
		for _, n := range per {
			out[name] += n
		}
	}
	return out, nil
}

func monotonicNow() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// Conntrack returns the north-south conntrack entries, live ones first.
func (v *View) Conntrack() ([]ConntrackEntry, error) {
	m, err := v.npMap(MapNPConntrack)
	if err != nil {
		return nil, err
	}
	now := monotonicNow()
	var out []ConntrackEntry
	err = iterate(m, MapNPConntrack, func(k nodePortNpCtKey, c nodePortNpCt) {
		e := ConntrackEntry{Direction: "original", Protocol: protoName(k.Proto),
			Src:       netip.AddrPortFrom(addrFrom16(k.Src), fromNet16(k.Sport)),
			Dst:       netip.AddrPortFrom(addrFrom16(k.Dst), fromNet16(k.Dport)),
			Addr:      netip.AddrPortFrom(addrFrom16(c.Addr), fromNet16(c.Port)),
			BackendID: c.BackendId, ServiceID: c.RevNatId, SNAT: c.Flags&1 != 0, Closing: c.Flags&2 != 0,
			Replied: c.Flags&4 != 0, DSR: c.Flags&8 != 0, Packets: c.Packets, ExpiresIn: time.Duration(c.ExpiresNs) - now}
		switch k.Dir {
		case 1:
			e.Direction = "reply"
		case 2:
			e.Direction = "client"
		}
		if e.Direction != "original" || e.SNAT {
			e.NAT = netip.AddrPortFrom(addrFrom16(c.Nat), fromNet16(c.NatPort))
		}
		out = append(out, e)
	})
	slices.SortFunc(out, func(a, b ConntrackEntry) int {
		return cmp.Or(cmp.Compare(b.ExpiresIn, a.ExpiresIn), a.Src.Compare(b.Src), cmp.Compare(a.Direction, b.Direction))
	})
	return out, err
}

// Devices returns the north-south devices with their SNAT addresses.
func (v *View) Devices() ([]DeviceEntry, error) {
	m, err := v.npMap(MapNPDevices)
	if err != nil {
		return nil, err
	}
	var out []DeviceEntry
	err = iterate(m, MapNPDevices, func(idx uint32, d nodePortNpDevice) {
		e := DeviceEntry{Ifindex: idx}
		if d.Addr4 != 0 {
			e.SNATAddr = netip.AddrFrom4([4]byte{byte(d.Addr4), byte(d.Addr4 >> 8), byte(d.Addr4 >> 16), byte(d.Addr4 >> 24)})
		}
		if a := netip.AddrFrom16(d.Addr6); !a.IsUnspecified() {
			e.SNATAddr6 = a
		}
		if d.Mac != [6]byte{} {
			e.MAC = net.HardwareAddr(d.Mac[:]).String()
		}
		switch {
		case d.Flags&npDevXDPNative != 0:
			e.XDP = AccelNative
		case d.Flags&npDevXDPGeneric != 0:
			e.XDP = AccelGeneric
		}
		if ifc, err := net.InterfaceByIndex(int(idx)); err == nil {
			e.Name = ifc.Name // in the caller's namespace: right when run in the node's
		}
		out = append(out, e)
	})
	slices.SortFunc(out, func(a, b DeviceEntry) int { return cmp.Compare(a.Ifindex, b.Ifindex) })
	return out, err
}

// Maglev returns each north-south frontend's Maglev table, summarized as
// entries per backend.
func (v *View) Maglev() ([]MaglevEntry, error) {
	svcMap, err := v.npMap(MapNPServices)
	if err != nil {
		return nil, err
	}
	tab, err := v.npMap(MapNPMaglev)
	if err != nil {
		return nil, err
	}
	cfgMap, err := v.npMap(MapNPConfig)
	if err != nil {
		return nil, err
	}
	var conf nodePortNpConfig
	if err := cfgMap.Lookup(uint32(0), &conf); err != nil {
		return nil, fmt.Errorf("read %s: %w", MapNPConfig, err)
	}
	svcs, err := v.Services()
	if err != nil {
		return nil, err
	}
	byID := map[uint32]Service{}
	for _, s := range svcs {
		byID[s.ID] = s
	}
	bes, err := v.Backends()
	if err != nil {
		return nil, err
	}
	beName := map[uint32]string{}
	for _, b := range bes {
		beName[b.ID] = b.Backend.String()
	}
	shares := map[uint32]map[string]int{} // by table
	err = iterate(tab, MapNPMaglev, func(k nodePortNpMaglevKey, c nodePortNpMaglevChunk) {
		sh := shares[k.Table]
		if sh == nil {
			sh = map[string]int{}
			shares[k.Table] = sh
		}
		for i, be := range c.Backend {
			if int(k.Chunk)*len(c.Backend)+i >= int(conf.MaglevSize) || be == 0 {
				continue
			}
			n := beName[be]
			if n == "" {
				n = fmt.Sprintf("id %d (missing)", be)
			}
			sh[n]++
		}
	})
	if err != nil {
		return nil, err
	}
	ranges := map[uint32][]netip.Prefix{}
	if src, err := v.npMap(MapNPSourceRanges); err == nil {
		err = iterate(src, MapNPSourceRanges, func(k nodePortNpSrcRangeKey, _ uint8) {
			if id, p, ok := decodeSrcRange(k); ok {
				ranges[id] = append(ranges[id], p)
			}
		})
		if err != nil {
			return nil, err
		}
	}
	var out []MaglevEntry
	err = iterate(svcMap, MapNPServices, func(id uint32, s nodePortNpSvc) {
		e := MaglevEntry{ServiceID: id, Table: s.Table, Size: int(conf.MaglevSize), Share: map[string]int{}}
		if s.Flags&NPSvcFlagSourceRanges != 0 {
			e.SourceRanges = ranges[id]
			slices.SortFunc(e.SourceRanges, comparePrefix)
		}
		if sv, ok := byID[id]; ok {
			e.Frontend, e.Name = sv.Address, sv.Name
		}
		for n, c := range shares[s.Table] {
			e.Share[n] = c
		}
		out = append(out, e)
	})
	slices.SortFunc(out, func(a, b MaglevEntry) int { return cmp.Compare(a.ServiceID, b.ServiceID) })
	return out, err
}

// NorthSouthTable returns the Maglev table ID of the frontend with service
// ID id (a point lookup; ok false: not a north-south frontend).
func (v *View) NorthSouthTable(id uint32) (table uint32, ok bool, err error) {
	m, err := v.npMap(MapNPServices)
	if err != nil {
		return 0, false, err
	}
	var s nodePortNpSvc
	if err := m.Lookup(id, &s); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("read %s: %w", MapNPServices, err)
	}
	return s.Table, true, nil
}
