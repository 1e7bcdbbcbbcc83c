package inspect

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/waggle-io/waggle/dataplane/ebpf"
)

// northSouthReader is the part of the View the nodeport commands read.
type northSouthReader interface {
	Conntrack() ([]ebpf.ConntrackEntry, error)
	Maglev() ([]ebpf.MaglevEntry, error)
	Devices() ([]ebpf.DeviceEntry, error)
	NorthSouthStats() (map[string]uint64, error)
}

// ConntrackList is `nodeport ct`.
type ConntrackList []ebpf.ConntrackEntry

// MaglevList is `nodeport maglev`.
type MaglevList []ebpf.MaglevEntry

// NorthSouthStatus is `nodeport status`: devices and counters.
type NorthSouthStatus struct {
	// LBMode is --bpf-lb-mode (snat, dsr, hybrid; empty: not known).
	LBMode   string             `json:"lbMode,omitempty"`
	Devices  []ebpf.DeviceEntry `json:"devices"`
	Counters map[string]uint64  `json:"counters"`
}

func (in *inspector) northSouth(sub string) (any, error) {
	r, ok := in.src.(northSouthReader)
	if !ok {
		return nil, fmt.Errorf("this source has no north-south maps: %w", ErrNoState)
	}
	var res any
	var err error
	switch sub {
	case "ct":
		var l []ebpf.ConntrackEntry
		l, err = r.Conntrack()
		res = ConntrackList(l)
	case "maglev":
		var l []ebpf.MaglevEntry
		l, err = r.Maglev()
		res = MaglevList(l)
	case "status":
		st := &NorthSouthStatus{}
		if st.Devices, err = r.Devices(); err == nil {
			st.Counters, err = r.NorthSouthStats()
		}
		if m, ok := in.src.(interface{ LBMode() (string, error) }); ok && err == nil {
			// (maps pinned by a proxy before DSR have no mode: left empty)
			if mode, merr := m.LBMode(); merr == nil {
				st.LBMode = mode
			}
		}
		res = st
	}
	if errors.Is(err, ebpf.ErrNoNorthSouth) {
		return nil, fmt.Errorf("%v (start the proxy with --nodeport-devices): %w", err, ErrNoState)
	}
	return res, err
}

func (l ConntrackList) writeTable(w io.Writer) {
	row(w, "DIR", "PROTO", "SRC", "DST", "TRANSLATED", "NAT", "SVC", "BACKEND", "FLAGS", "PACKETS", "EXPIRES")
	for _, e := range l {
		var flags []string
		for _, f := range []struct {
			on   bool
			name string
		}{{e.SNAT, "snat"}, {e.DSR, "dsr"}, {e.Replied, "replied"}, {e.Closing, "closing"}} {
			if f.on {
				flags = append(flags, f.name)
			}
		}
		nat := "-"
		if e.NAT.IsValid() && e.NAT.Port() != 0 {
			nat = e.NAT.String()
		}
		be := "-"
		if e.BackendID != 0 {
			be = fmt.Sprint(e.BackendID)
		}
		exp := e.ExpiresIn.Truncate(time.Second).String()
		if e.ExpiresIn <= 0 {
			exp = "expired"
		}
		row(w, e.Direction, e.Protocol, e.Src, e.Dst, e.Addr, nat, e.ServiceID, be, orDash(strings.Join(flags, ",")), e.Packets, exp)
	}
}

func (l MaglevList) writeTable(w io.Writer) {
	row(w, "SVC", "FRONTEND", "SERVICE", "SIZE", "BACKEND", "ENTRIES", "SHARE")
	for _, e := range l {
		names := make([]string, 0, len(e.Share))
		for n := range e.Share {
			names = append(names, n)
		}
		slices.Sort(names)
		if len(names) == 0 {
			row(w, e.ServiceID, orDash(e.Frontend), orDash(e.Name), e.Size, "(none)", 0, "-")
		}
		for i, n := range names {
			if i == 0 {
				row(w, e.ServiceID, orDash(e.Frontend), orDash(e.Name), e.Size, n, e.Share[n], fmt.Sprintf("%.1f%%", 100*float64(e.Share[n])/float64(e.Size)))
			} else {
				row(w, "", "", "", "", n, e.Share[n], fmt.Sprintf("%.1f%%", 100*float64(e.Share[n])/float64(e.Size)))
			}
		}
		if len(e.SourceRanges) > 0 {
			rs := make([]string, len(e.SourceRanges))
			for i, r := range e.SourceRanges {
				rs[i] = r.String()
			}
			row(w, "", "", "sources: "+strings.Join(rs, ","), "", "", "", "")
		}
	}
}

func (s *NorthSouthStatus) writeTable(w io.Writer) {
	if s.LBMode != "" {
		row(w, "MODE", s.LBMode)
		row(w)
	}
	row(w, "IFINDEX", "DEVICE", "MAC", "SNAT ADDRESS", "XDP")
	for _, d := range s.Devices {
		xdp := d.XDP
		if xdp == "" {
			xdp = "off (tc only)"
		}
		var as []string
		for _, a := range []netip.Addr{d.SNATAddr, d.SNATAddr6} {
			if a.IsValid() {
				as = append(as, a.String())
			}
		}
		row(w, d.Ifindex, orDash(d.Name), orDash(d.MAC), orDash(strings.Join(as, " ")), xdp)
	}
	row(w)
	row(w, "COUNTER", "VALUE")
	for _, n := range ebpf.NorthSouthStatNames() {
		row(w, n, s.Counters[n])
	}
}
