package inspect

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	cebpf "github.com/cilium/ebpf"

	"github.com/waggle-io/waggle/dataplane/ebpf"
)

// inspector runs the commands on a source.
type inspector struct {
	src  source
	sys  system
	node string
}

// run runs cfg.Command (already validated by ParseArgs) and returns the
// result to render.
func (in *inspector) run(ctx context.Context, cfg Config) (any, error) {
	cmd := cfg.Command
	word := cmd[0]
	if _, ok := groups[word]; ok && len(cmd) > 1 {
		word += " " + cmd[1]
	}
	switch word {
	case "status":
		return in.status()
	case "lb list":
		return in.lbList()
	case "lb get":
		return in.lbGet(cmd[2])
	case "map list":
		return in.mapList()
	case "map dump":
		if cfg.Raw {
			return in.rawDump(cmd[2])
		}
		return in.dump(cmd[2])
	case "affinity list":
		return in.affinity()
	case "sockets":
		return in.sockets()
	case "explain":
		src, fe := "", cmd[1]
		if len(cmd) == 3 {
			src, fe = cmd[1], cmd[2]
		}
		return in.explain(src, fe)
	case "prog list":
		return in.progList(cfg.EnableStats)
	case "nodeport status", "nodeport ct", "nodeport maglev":
		return in.northSouth(cmd[1])
	}
	return nil, usageErr("unknown command %q", strings.Join(cmd, " "))
}

// StatusResult, the lists and the other results are rendered by render.go.

// FrontendList is `lb list`.
type FrontendList []Frontend

// FrontendDetail is `lb get` (one entry per protocol).
type FrontendDetail []Frontend

// MapList is `map list`.
type MapList []MapRow

// AffinityList is `affinity list`.
type AffinityList []AffinityRow

// SocketList is `sockets`.
type SocketList []SocketRow

// ProgramList is `prog list`.
type ProgramList []Program

func (in *inspector) programs() ([]Program, error) {
	infos, err := in.src.Programs()
	if err != nil {
		return nil, err
	}
	enabled := in.sys.StatsEnabled()
	bootNow, now := in.sys.Boottime(), in.sys.Now()
	out := make([]Program, 0, len(infos))
	for _, p := range infos {
		pr := Program{Name: p.Name, ID: p.ProgramID, LinkID: p.LinkID, Type: p.Type, AttachType: p.AttachType,
			CgroupID: p.CgroupID, AttachPoint: in.sys.CgroupPath(p.CgroupID), StatsEnabled: enabled,
			Runs: p.Runs, RunTime: p.RunTime}
		if pr.AttachPoint == "" {
			pr.AttachPoint = fmt.Sprintf("cgroup id %d", p.CgroupID)
		}
		if p.Loaded > 0 && bootNow >= p.Loaded {
			pr.Loaded = now.Add(-(bootNow - p.Loaded)).UTC().Truncate(time.Second)
		}
		if p.LinkPath != "" {
			pr.LinkPath = p.LinkPath
			pr.Attached = in.sys.PinTime(p.LinkPath).UTC().Truncate(time.Second)
		}
		out = append(out, pr)
	}
	slices.SortFunc(out, func(a, b Program) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

func (in *inspector) mapRows() ([]MapRow, error) {
	maps, err := in.src.Maps()
	if err != nil {
		return nil, err
	}
	out := make([]MapRow, 0, len(maps))
	for _, m := range maps {
		r := MapRow{Name: m.Name, Type: m.Type, KeySize: m.KeySize, ValueSize: m.ValueSize, Entries: m.Entries,
			MaxEntries: m.MaxEntries, Path: m.Path}
		// The backends array counts its used IDs (View.Maps): it fills.
		r.FixedSize = (m.Type == cebpf.Array.String() || m.Type == cebpf.PerCPUArray.String()) && m.Name != ebpf.MapBackends
		if m.MaxEntries > 0 && !r.FixedSize {
			r.Pressure = float64(int(float64(m.Entries)*10000/float64(m.MaxEntries))) / 100
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b MapRow) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

func (in *inspector) status() (*Status, error) {
	meta, err := in.src.Meta()
	if err != nil {
		return nil, err
	}
	st := &Status{Node: in.node, PinDir: in.src.Dir(), LayoutVersion: meta.LayoutVersion, Created: meta.Created}
	if st.Programs, err = in.programs(); err != nil {
		return nil, err
	}
	if st.Maps, err = in.mapRows(); err != nil {
		return nil, err
	}
	for _, m := range st.Maps {
		if w := m.warning(); w != "" {
			st.Warnings = append(st.Warnings, w)
		}
	}
	switch n := len(st.Programs); {
	case n == 0:
		st.Mode = "none (maps pinned, no program attached: connects are not load-balanced)"
	default:
		st.Mode = "ebpf"
	}
	svcs, err := in.src.Services()
	if err != nil {
		return nil, err
	}
	bes, err := in.src.Backends()
	if err != nil {
		return nil, err
	}
	st.Frontends, st.Backends = len(svcs), len(bes)
	counters, err := in.src.Counters()
	if err != nil {
		return nil, err
	}
	for _, s := range ebpf.Stats() {
		st.Events = append(st.Events, Event{Name: s.String(), Count: counters[s]})
	}
	return st, nil
}

func (in *inspector) frontends() ([]Frontend, error) {
	svcs, err := in.src.Services()
	if err != nil {
		return nil, err
	}
	bes, err := in.src.Backends()
	if err != nil {
		return nil, err
	}
	return frontendsOf(svcs, bes), nil
}

func (in *inspector) lbList() (FrontendList, error) {
	fs, err := in.frontends()
	return FrontendList(fs), err
}

// lookup finds the frontends at ap (of protocol p, or every protocol).
func (in *inspector) lookup(arg string) ([]Frontend, error) {
	ap, p, err := parseFrontend(arg)
	if err != nil {
		return nil, err
	}
	fs, err := in.frontends()
	if err != nil {
		return nil, err
	}
	var out []Frontend
	for _, f := range fs {
		if f.key.Addr == ap.Addr() && f.key.Port == ap.Port() && (p == "" || f.key.Protocol == p) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		what := ap.String()
		if p != "" {
			what += "/" + string(p)
		}
		return nil, fmt.Errorf("frontend %s is not in %s (%d frontends programmed; see waggle bpf lb list): %w",
			what, ebpf.MapServices, len(fs), ErrNotFound)
	}
	return out, nil
}

func (in *inspector) lbGet(arg string) (FrontendDetail, error) {
	fs, err := in.lookup(arg)
	return FrontendDetail(fs), err
}

func (in *inspector) mapList() (MapList, error) {
	rows, err := in.mapRows()
	return MapList(rows), err
}

// names maps service IDs to frontend and Service names.
func (in *inspector) names() (map[uint32]Frontend, error) {
	fs, err := in.frontends()
	if err != nil {
		return nil, err
	}
	out := map[uint32]Frontend{}
	for _, f := range fs {
		out[f.ID] = f
	}
	return out, nil
}

func (in *inspector) backendAddrs() (map[uint32]string, error) {
	bes, err := in.src.Backends()
	if err != nil {
		return nil, err
	}
	out := map[uint32]string{}
	for _, b := range bes {
		out[b.ID] = b.Backend.String()
	}
	return out, nil
}

func (in *inspector) affinity() (AffinityList, error) {
	entries, err := in.src.Affinity()
	if err != nil {
		return nil, err
	}
	names, err := in.names()
	if err != nil {
		return nil, err
	}
	bes, err := in.backendAddrs()
	if err != nil {
		return nil, err
	}
	now := in.sys.Monotonic()
	out := AffinityList{}
	for _, e := range entries {
		f, ok := names[e.ServiceID]
		r := AffinityRow{ServiceID: e.ServiceID, Frontend: "-", NetnsCookie: e.NetnsCookie, BackendID: e.BackendID,
			Backend: cmp.Or(bes[e.BackendID], "-"), Age: max(0, now-e.LastUsed)}
		r.State = "live"
		switch {
		case !ok:
			r.Expired, r.State = true, "service-gone" // never used again
		case r.Age > f.AffinityTimeout:
			r.Expired, r.State = true, "expired"
		case bes[e.BackendID] == "":
			r.State = StateBackendMissing
		}
		if ok {
			r.Frontend, r.Service = f.Frontend, f.Service
		}
		out = append(out, r)
	}
	return out, nil
}

func (in *inspector) sockets() (SocketList, error) {
	entries, err := in.src.ReverseSockets()
	if err != nil {
		return nil, err
	}
	k, v, err := in.src.RawEntries(ebpf.MapRevNat)
	if err != nil {
		return nil, err
	}
	revs, err := decodeRevNat(k, v)
	if err != nil {
		return nil, err
	}
	byID := map[uint32]netip.AddrPort{}
	for _, r := range revs {
		byID[r.ID] = r.Frontend
	}
	names, err := in.names()
	if err != nil {
		return nil, err
	}
	out := SocketList{}
	for _, e := range entries {
		r := SocketRow{Cookie: e.Cookie, Backend: e.Backend.String(), Frontend: e.Frontend.String(),
			ServiceID: e.ServiceID, State: "valid"}
		// As xlate_rev: the entry counts only while rev_nat still maps
		// its service ID to the same frontend.
		if fe, ok := byID[e.ServiceID]; !ok || fe != e.Frontend {
			r.State = "stale"
		}
		if f, ok := names[e.ServiceID]; ok && r.State == "valid" {
			r.Service = f.Service
		}
		out = append(out, r)
	}
	return out, nil
}

func (in *inspector) progList(window time.Duration) (ProgramList, error) {
	if window <= 0 {
		ps, err := in.programs()
		return ProgramList(ps), err
	}
	closer, err := in.sys.EnableStats()
	if err != nil {
		return nil, fmt.Errorf("enable BPF statistics (BPF_ENABLE_STATS needs Linux 5.8 and CAP_SYS_ADMIN): %w", err)
	}
	defer closer.Close()
	before, err := in.programs()
	if err != nil {
		return nil, err
	}
	if err := in.sys.Sleep(window); err != nil {
		return nil, err
	}
	after, err := in.programs()
	if err != nil {
		return nil, err
	}
	prev := map[uint32]Program{}
	for _, p := range before {
		prev[p.ID] = p
	}
	for i := range after {
		p := &after[i]
		p.StatsEnabled, p.Window = true, window
		if b, ok := prev[p.ID]; ok {
			p.Runs -= min(p.Runs, b.Runs)
			p.RunTime -= min(p.RunTime, b.RunTime)
		}
	}
	return ProgramList(after), nil
}

// Dump is a decoded `map dump`: Columns name the fields of each row.
type Dump struct {
	Map     string           `json:"map"`
	Columns []string         `json:"-"`
	Entries []map[string]any `json:"entries"`

	rows [][]string
}

func (d *Dump) add(cells ...any) {
	e := map[string]any{}
	row := make([]string, len(cells))
	for i, c := range cells {
		e[d.Columns[i]] = c
		row[i] = fmt.Sprint(c)
	}
	d.Entries = append(d.Entries, e)
	d.rows = append(d.rows, row)
}

func (in *inspector) dump(name string) (*Dump, error) {
	d := &Dump{Map: name, Entries: []map[string]any{}}
	switch name {
	case ebpf.MapServices:
		fs, err := in.src.Services()
		if err != nil {
			return nil, err
		}
		d.Columns = []string{"frontend", "slot", "backendID", "count", "flags", "serviceID", "affinityTimeoutSeconds"}
		for _, s := range fs {
			d.add(s.Frontend.String(), 0, 0, s.Count, fmt.Sprintf("%#x", s.Flags), s.ID, int(s.AffinityTimeout.Seconds()))
			for _, sl := range s.Slots {
				d.add(s.Frontend.String(), sl.Slot, sl.BackendID, 0, "0x0", s.ID, 0)
			}
		}
	case ebpf.MapBackends:
		bes, err := in.src.Backends()
		if err != nil {
			return nil, err
		}
		d.Columns = []string{"id", "backend", "protocol"}
		for _, b := range bes {
			d.add(b.ID, b.Backend.String(), string(b.Protocol))
		}
	case ebpf.MapRevNat:
		k, v, err := in.src.RawEntries(name)
		if err != nil {
			return nil, err
		}
		revs, err := decodeRevNat(k, v)
		if err != nil {
			return nil, err
		}
		d.Columns = []string{"id", "frontend"}
		for _, r := range revs {
			d.add(r.ID, r.Frontend.String()+"/"+protoString(r.Proto))
		}
	case ebpf.MapServiceNames:
		k, v, err := in.src.RawEntries(name)
		if err != nil {
			return nil, err
		}
		ns, err := decodeNames(k, v)
		if err != nil {
			return nil, err
		}
		d.Columns = []string{"id", "kind", "service"}
		for _, n := range ns {
			d.add(n.ID, n.Kind, n.Name)
		}
	case ebpf.MapAffinity:
		es, err := in.src.Affinity()
		if err != nil {
			return nil, err
		}
		d.Columns = []string{"netnsCookie", "serviceID", "backendID", "lastUsedMonotonicNanoseconds"}
		for _, e := range es {
			d.add(e.NetnsCookie, e.ServiceID, e.BackendID, int64(e.LastUsed))
		}
	case ebpf.MapReverseSockets:
		es, err := in.src.ReverseSockets()
		if err != nil {
			return nil, err
		}
		d.Columns = []string{"cookie", "backend", "frontend", "serviceID"}
		for _, e := range es {
			d.add(e.Cookie, e.Backend.String(), e.Frontend.String(), e.ServiceID)
		}
	case ebpf.MapMeta:
		m, err := in.src.Meta()
		if err != nil {
			return nil, err
		}
		d.Columns = []string{"magic", "layoutVersion", "created"}
		d.add(fmt.Sprintf("%#x", m.Magic), m.LayoutVersion, m.Created.UTC().Format(time.RFC3339))
	case ebpf.MapStats:
		c, err := in.src.Counters()
		if err != nil {
			return nil, err
		}
		d.Columns = []string{"index", "event", "count"}
		for _, s := range ebpf.Stats() {
			d.add(int(s), s.String(), c[s])
		}
	default:
		return nil, in.unknownMap(name)
	}
	return d, nil
}

func (in *inspector) unknownMap(name string) error {
	var names []string
	if maps, err := in.src.Maps(); err == nil {
		for _, m := range maps {
			names = append(names, m.Name)
		}
	}
	slices.Sort(names)
	return fmt.Errorf("no map %q (maps: %s): %w", name, strings.Join(names, ", "), ErrNotFound)
}

// RawDump is `map dump --raw`: bpftool's hex dump, keys sorted.
type RawDump struct {
	Map     string     `json:"map"`
	Entries []RawEntry `json:"entries"`
}

// RawEntry is one entry's bytes, as bpftool -j prints them ("0x0a").
type RawEntry struct {
	Key   hexBytes `json:"key"`
	Value hexBytes `json:"value"`
}

type hexBytes []byte

// MarshalJSON writes ["0x0a", ...] as bpftool -j does.
func (h hexBytes) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, c := range h {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "\"0x%02x\"", c)
	}
	b.WriteByte(']')
	return b.Bytes(), nil
}

func (in *inspector) rawDump(name string) (*RawDump, error) {
	if name == ebpf.MapStats {
		return nil, fmt.Errorf("%s is a per-CPU array: its raw bytes differ per CPU; use map dump %s (summed) or bpftool: %w",
			name, name, ErrUsage)
	}
	keys, values, err := in.src.RawEntries(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, in.unknownMap(name)
	}
	if err != nil {
		return nil, err
	}
	d := &RawDump{Map: name, Entries: []RawEntry{}}
	for i := range keys {
		d.Entries = append(d.Entries, RawEntry{Key: keys[i], Value: values[i]})
	}
	slices.SortFunc(d.Entries, func(a, b RawEntry) int { return bytes.Compare(a.Key, b.Key) })
	return d, nil
}
