package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"
)

// render writes v in format (table, json or yaml).
func render(w io.Writer, format string, v any) error {
	switch format {
	case FormatJSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Errorf("encode JSON: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case FormatYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode YAML: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	t, ok := v.(interface{ writeTable(io.Writer) })
	if !ok {
		return fmt.Errorf("no table output for %T", v)
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	t.writeTable(tw)
	return tw.Flush()
}

func row(w io.Writer, cells ...any) {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = fmt.Sprint(c)
	}
	fmt.Fprintln(w, strings.Join(s, "\t"))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func timeCell(t time.Time) string {
	if t.IsZero() || t.Unix() <= 0 {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func dur(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	return d.String()
}

func (s *Status) writeTable(w io.Writer) {
	row(w, "Node:", orDash(s.Node))
	row(w, "Pin dir:", s.PinDir)
	row(w, "Mode:", s.Mode)
	row(w, "Layout:", fmt.Sprintf("version %d, created %s", s.LayoutVersion, timeCell(s.Created)))
	row(w, "Frontends:", s.Frontends)
	row(w, "Backends:", s.Backends)
	fmt.Fprintln(w)
	row(w, "PROGRAM", "TYPE", "ATTACH TYPE", "ATTACH POINT", "ATTACHED", "LOADED")
	for _, p := range s.Programs {
		row(w, p.Name, p.Type, p.AttachType, p.AttachPoint, timeCell(p.Attached), timeCell(p.Loaded))
	}
	if len(s.Programs) == 0 {
		row(w, "(none attached)")
	}
	fmt.Fprintln(w)
	row(w, "MAP", "ENTRIES", "MAX", "PRESSURE")
	for _, m := range s.Maps {
		row(w, m.Name, m.Entries, m.MaxEntries, m.pressureCell())
	}
	fmt.Fprintln(w)
	row(w, "EVENT", "COUNT")
	for _, e := range s.Events {
		row(w, e.Name, e.Count)
	}
	if len(s.Warnings) > 0 {
		fmt.Fprintln(w)
		for _, x := range s.Warnings {
			fmt.Fprintln(w, "WARNING: "+x)
		}
	}
}

func pct(p float64) string { return strconv.FormatFloat(p, 'f', 2, 64) + "%" }

func (m MapRow) pressureCell() string {
	switch {
	case m.FixedSize:
		return "fixed"
	case m.warning() != "":
		return pct(m.Pressure) + " !"
	}
	return pct(m.Pressure)
}

func affinityCell(f Frontend) string {
	if f.AffinityTimeout == 0 {
		return "-"
	}
	return dur(f.AffinityTimeout)
}

func (l FrontendList) writeTable(w io.Writer) {
	row(w, "FRONTEND", "ID", "SERVICE", "KIND", "AFFINITY", "SLOT", "BACKEND-ID", "BACKEND", "STATE")
	for _, f := range l {
		head := []any{f.Frontend, f.ID, orDash(f.Service), orDash(f.Kind), affinityCell(f)}
		if len(f.Backends) == 0 {
			row(w, append(head, "-", "-", "-", "no backends (refuses)")...)
			continue
		}
		for i, b := range f.Backends {
			if i > 0 {
				head = []any{"", "", "", "", ""}
			}
			id := "-"
			if b.BackendID != 0 {
				id = strconv.FormatUint(uint64(b.BackendID), 10)
			}
			row(w, append(head, b.Slot, id, b.Backend, b.State)...)
		}
	}
}

func (l FrontendDetail) writeTable(w io.Writer) {
	for i, f := range l {
		if i > 0 {
			fmt.Fprintln(w)
		}
		row(w, "Frontend:", f.Frontend)
		row(w, "Service:", orDash(f.Service))
		row(w, "Namespace/name:", orDash(strings.Trim(f.Namespace+"/"+f.Name, "/")))
		row(w, "Port name:", orDash(f.PortName))
		row(w, "Kind:", orDash(f.Kind))
		row(w, "Service ID:", f.ID)
		row(w, "Flags:", orDash(strings.Join(f.Flags, ",")))
		row(w, "Affinity timeout:", affinityCell(f))
		row(w, "Backend slots:", f.Count)
		fmt.Fprintln(w)
		if len(f.Backends) == 0 {
			row(w, "(no backends: connections are refused)")
			continue
		}
		row(w, "SLOT", "BACKEND-ID", "BACKEND", "STATE")
		for _, b := range f.Backends {
			row(w, b.Slot, b.BackendID, b.Backend, b.State)
		}
	}
}

func (l MapList) writeTable(w io.Writer) {
	row(w, "NAME", "TYPE", "KEY", "VALUE", "ENTRIES", "MAX", "PRESSURE", "PINNED")
	for _, m := range l {
		row(w, m.Name, m.Type, fmt.Sprintf("%dB", m.KeySize), fmt.Sprintf("%dB", m.ValueSize), m.Entries, m.MaxEntries, m.pressureCell(), m.Path)
	}
}

func (l AffinityList) writeTable(w io.Writer) {
	row(w, "SERVICE-ID", "FRONTEND", "SERVICE", "NETNS-COOKIE", "BACKEND-ID", "BACKEND", "LAST USED", "STATE")
	for _, a := range l {
		row(w, a.ServiceID, a.Frontend, orDash(a.Service), a.NetnsCookie, a.BackendID, a.Backend,
			a.Age.Truncate(time.Second).String()+" ago", a.State)
	}
}

func (l SocketList) writeTable(w io.Writer) {
	row(w, "COOKIE", "BACKEND", "SHOWN AS", "SERVICE-ID", "SERVICE", "STATE")
	for _, s := range l {
		row(w, s.Cookie, s.Backend, s.Frontend, s.ServiceID, orDash(s.Service), s.State)
	}
}

func (l ProgramList) writeTable(w io.Writer) {
	row(w, "ID", "NAME", "TYPE", "ATTACH TYPE", "ATTACH POINT", "LINK", "ATTACHED", "LOADED", "RUNS", "RUN TIME", "AVG")
	for _, p := range l {
		runs, rt, avg := "-", "-", "-"
		if p.StatsEnabled {
			runs, rt = strconv.FormatUint(p.Runs, 10), dur(p.RunTime)
			if p.Runs > 0 {
				avg = dur(p.RunTime / time.Duration(p.Runs))
			}
		}
		row(w, p.ID, p.Name, p.Type, p.AttachType, p.AttachPoint, p.LinkID, timeCell(p.Attached), timeCell(p.Loaded), runs, rt, avg)
	}
	if len(l) > 0 && !l[0].StatsEnabled {
		fmt.Fprintln(w, "\nRun counts need BPF statistics: sysctl kernel.bpf_stats_enabled=1, or prog list --enable-stats 10s.")
	} else if len(l) > 0 && l[0].Window > 0 {
		fmt.Fprintf(w, "\nRuns counted during the %s window of --enable-stats.\n", l[0].Window)
	}
}

func (d *Dump) writeTable(w io.Writer) {
	cols := make([]any, len(d.Columns))
	for i, c := range d.Columns {
		cols[i] = strings.ToUpper(c)
	}
	row(w, cols...)
	for _, r := range d.rows {
		cells := make([]any, len(r))
		for i, c := range r {
			cells[i] = c
		}
		row(w, cells...)
	}
}

// writeTable prints the entries as bpftool map dump does (hex bytes; a
// long key or value on lines of 16 bytes), then the count.
func (d *RawDump) writeTable(w io.Writer) {
	for _, e := range d.Entries {
		if len(e.Key)+len(e.Value) <= 24 && max(len(e.Key), len(e.Value)) <= 16 {
			fmt.Fprintf(w, "key: %s  value: %s\n", hexLine(e.Key), hexLine(e.Value))
			continue
		}
		fmt.Fprintf(w, "key:\n%s\nvalue:\n%s\n", hexBlock(e.Key), hexBlock(e.Value))
	}
	fmt.Fprintf(w, "Found %d element", len(d.Entries))
	if len(d.Entries) != 1 {
		fmt.Fprint(w, "s")
	}
	fmt.Fprintln(w)
}

func hexLine(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 3*len(b))
	for i, c := range b {
		if i > 0 {
			out = append(out, ' ')
		}
		out = append(out, digits[c>>4], digits[c&0xf])
	}
	return string(out)
}

func hexBlock(b []byte) string {
	var lines []string
	for i := 0; i < len(b); i += 16 {
		chunk := b[i:min(i+16, len(b))]
		// bpftool separates groups of 8 bytes with two spaces.
		if len(chunk) > 8 {
			lines = append(lines, hexLine(chunk[:8])+"  "+hexLine(chunk[8:]))
		} else {
			lines = append(lines, hexLine(chunk))
		}
	}
	return strings.Join(lines, "\n")
}

func (e *Explanation) writeTable(w io.Writer) {
	svc := []string{}
	for _, s := range []string{e.Service, e.Kind} {
		if s != "" {
			svc = append(svc, s)
		}
	}
	svc = append(svc, fmt.Sprintf("service ID %d", e.ServiceID))
	row(w, "Frontend:", e.Frontend+" ("+strings.Join(svc, ", ")+")")
	row(w, "Client:", e.Client)
	row(w, "Verdict:", e.Verdict+": "+e.Summary)
	if len(e.Candidates) > 0 {
		fmt.Fprintln(w)
		row(w, "SLOT", "BACKEND-ID", "BACKEND", "CHANCE", "OUTCOME")
		for _, c := range e.Candidates {
			slot := "-"
			if c.Slot > 0 {
				slot = strconv.Itoa(c.Slot)
			}
			row(w, slot, c.BackendID, c.Backend, c.Probability, c.Outcome)
		}
	}
	fmt.Fprintln(w, "\nWhy:")
	for i, s := range e.Steps {
		fmt.Fprintf(w, "  %d. %s\n", i+1, s)
	}
}
