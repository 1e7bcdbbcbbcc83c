package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// header is the expectations file's record of the runs behind it: "# <key>: <value>" lines.
type header map[string]string

// headerKeys, in the order they are written.
var headerKeys = []string{"suite", "full run", "focused run"}

func readHeader(path string) (header, error) {
	h := header{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return h, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		t, ok := strings.CutPrefix(sc.Text(), "# ")
		if !ok {
			continue
		}
		for _, k := range headerKeys {
			if v, ok := strings.CutPrefix(t, k+": "); ok {
				h[k] = v
			}
		}
	}
	return h, sc.Err()
}

// runInfo describes the run being recorded (-record).
type runInfo struct {
	Record   bool
	Suite    string
	Procs    int
	Duration time.Duration
	Focus    string
	Commit   string
	Date     string
}

// record returns h with this run recorded: a run of the whole set replaces the "full run" line
// (and the "focused run" one, which it supersedes); a focused run replaces the "focused run" line.
//
//	full run: 2026-12-01 procs=5 duration=71m3s commit=abc1234
//	focused run: 2026-12-02 procs=2 duration=1m2s commit=def5678 focus=sig-apps.*Deployment
func (ri runInfo) record(h header) header {
	out := header{}
	for k, v := range h {
		out[k] = v
	}
	if ri.Suite != "" {
		out["suite"] = ri.Suite
	}
	v := ri.Date
	if ri.Procs > 0 {
		v += fmt.Sprintf(" procs=%d", ri.Procs)
	}
	if ri.Duration > 0 {
		v += " duration=" + ri.Duration.Round(time.Second).String()
	}
	if ri.Commit != "" {
		v += " commit=" + ri.Commit
	}
	if ri.Focus == "" {
		out["full run"] = v
		delete(out, "focused run")
	} else {
		out["focused run"] = v + " focus=" + ri.Focus
	}
	return out
}

// runFields parses a recorded run: its date and its key=value fields (focus= takes the rest).
func runFields(v string) (date string, f map[string]string) {
	f = map[string]string{}
	if i := strings.Index(v, " focus="); i >= 0 {
		f["focus"] = v[i+len(" focus="):]
		v = v[:i]
	}
	parts := strings.Fields(v)
	if len(parts) == 0 {
		return "", f
	}
	for _, p := range parts[1:] {
		if k, val, ok := strings.Cut(p, "="); ok {
			f[k] = val
		}
	}
	return parts[0], f
}

const (
	tableBegin = "<!-- conformance-table -->"
	tableEnd   = "<!-- /conformance-table -->"
)

// readmeTable is the README's block (between the markers, exclusive) for an expectations file.
func readmeTable(expFile string) (string, error) {
	exp, err := readExpectations(expFile)
	if err != nil {
		return "", err
	}
	h, err := readHeader(expFile)
	if err != nil {
		return "", err
	}
	type row struct{ pass, fail, skip, notrun, total int }
	rows := map[string]*row{}
	var tot row
	for n, e := range exp {
		s := sig(n)
		if rows[s] == nil {
			rows[s] = &row{}
		}
		for _, r := range []*row{rows[s], &tot} {
			r.total++
			switch e.Result {
			case "pass":
				r.pass++
			case "fail":
				r.fail++
			case "skip":
				r.skip++
			default:
				r.notrun++
			}
		}
	}
	sigs := make([]string, 0, len(rows))
	for s := range rows {
		sigs = append(sigs, s)
	}
	sort.Strings(sigs)

	var b strings.Builder
	suite := "the " + h["suite"] + " suite"
	if h["suite"] == "" {
		suite = "a suite version not recorded yet"
	}
	if date, f := runFields(h["full run"]); date != "" {
		fmt.Fprintf(&b, "Measured %s with %s: the whole `[Conformance]` set on a fresh 3-node lab", date, suite)
		if f["duration"] != "" {
			fmt.Fprintf(&b, " in %s", f["duration"])
		}
		if f["procs"] != "" {
			fmt.Fprintf(&b, " with %s parallel processes (`make conformance PARALLEL=%s UPDATE=1`)", f["procs"], f["procs"])
		}
		if f["commit"] != "" {
			fmt.Fprintf(&b, " at %s", f["commit"])
		}
		b.WriteString(".")
	} else {
		fmt.Fprintf(&b, "Measured with %s by focused runs only (no run of the whole set recorded yet).", suite)
	}
	if date, f := runFields(h["focused run"]); date != "" {
		fmt.Fprintf(&b, " Rows changed since by focused runs (`make conformance FOCUS=... UPDATE=1`), the latest %s (`FOCUS='%s'`).", date, f["focus"])
	}
	b.WriteString(" Generated from [expectations.tsv](test/conformance/expectations.tsv) (`make conformance-readme`);" +
		" \"not run\": specs no recorded run has reached.\n\n")
	b.WriteString("| SIG | passed / total | failed | skipped | not run |\n|---|---|---|---|---|\n")
	for _, s := range sigs {
		r := rows[s]
		fmt.Fprintf(&b, "| %s | %d / %d | %d | %d | %d |\n", s, r.pass, r.total, r.fail, r.skip, r.notrun)
	}
	fmt.Fprintf(&b, "| **all** | **%d / %d** | %d | %d | %d |\n", tot.pass, tot.total, tot.fail, tot.skip, tot.notrun)
	return b.String(), nil
}

// syncREADME rewrites (or, with check, only compares) the README's conformance table.
func syncREADME(readme, expFile string, check bool) error {
	old, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	i := bytes.Index(old, []byte(tableBegin+"\n"))
	j := bytes.Index(old, []byte(tableEnd))
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s ... %s block", readme, tableBegin, tableEnd)
	}
	table, err := readmeTable(expFile)
	if err != nil {
		return err
	}
	start := i + len(tableBegin) + 1
	if string(old[start:j]) == table {
		return nil
	}
	if check {
		return fmt.Errorf("%s: the conformance table does not match %s (run make conformance-readme)", readme, expFile)
	}
	var b bytes.Buffer
	b.Write(old[:start])
	b.WriteString(table)
	b.Write(old[j:])
	tmp := readme + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, readme)
}
