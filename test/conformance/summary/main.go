// Command summary reads the conformance suite's JUnit report, prints the per-SIG table (run,
// passed, failed, skipped), compares every spec's result with the committed expectations file,
// and, asked to, rewrites that file from the run. It is the harness's bookkeeping (run.sh calls
// it); it does not run anything.
//
//	summary -junit R.xml -expectations E [-specs LIST] [-update] [-check] [-markdown]
//	        [-record -suite V -procs N -duration D -focus F -commit C] [-readme README.md]
//	summary -expectations E -readme README.md [-check-readme]
//
// The expectations file has one line per [Conformance] spec of the suite's version:
//
//	<result>\t<area>\t<spec full name>
//
// result is pass, fail, skip or notrun (not yet reached by a run); area is the issue area a
// failing spec belongs to (API, security, workloads, node, network), "-" for a passing one.
// A failure whose signature is known (the framework's wait for kube-root-ca.crt) gets that
// signature's area; otherwise an area already on the spec's line is kept, so a hand-triaged area
// survives updates, and a new failure gets the area of its topic or SIG (areaFor).
//
// The file's header records the runs behind it (-record, with -update): the last run of the
// whole set ("# full run: ...", its date, suite version, processes, duration and commit) and the
// last focused run that changed rows since ("# focused run: ..."). -readme rewrites the block
// between <!-- conformance-table --> and <!-- /conformance-table --> in a README from the
// expectations file alone (per SIG: passed/total, failed, skipped, not run; the full run's date,
// version and duration), so the README's table and the file always match; -check-readme only
// reports whether the block is current.
package main

import (
	"bufio"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

type testcase struct {
	Name    string    `xml:"name,attr"`
	Time    float64   `xml:"time,attr"`
	Status  string    `xml:"status,attr"`
	Skipped *struct{} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Body    string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
	} `xml:"error"`
}

type suites struct {
	Suites []struct {
		Cases []testcase `xml:"testcase"`
	} `xml:"testsuite"`
	Cases []testcase `xml:"testcase"` // a bare <testsuite> root
}

// expectation is one line of the expectations file.
type expectation struct {
	Result, Area string
}

func main() {
	junit := flag.String("junit", "", "the run's JUnit report (e2e.test --report-dir's junit_01.xml)")
	expFile := flag.String("expectations", "", "the expectations file")
	specsFile := flag.String("specs", "", "every [Conformance] spec of the suite, one full name a line (e2e.test --list-tests, filtered); with -update, lines for specs no longer in the suite are dropped")
	update := flag.Bool("update", false, "rewrite the expectations file: specs the run reached get its result, the rest keep theirs")
	check := flag.Bool("check", false, "exit 1 when a spec the expectations file marks pass did not pass")
	markdown := flag.Bool("markdown", false, "print the per-SIG table as Markdown (for the README)")
	var ri runInfo
	flag.BoolVar(&ri.Record, "record", false, "with -update: record this run (date, -suite, -procs, -duration, -focus, -commit) in the file's header")
	flag.StringVar(&ri.Suite, "suite", "", "the suite's version (v1.37.2)")
	flag.IntVar(&ri.Procs, "procs", 0, "the run's parallel ginkgo processes")
	flag.DurationVar(&ri.Duration, "duration", 0, "how long the suite ran")
	flag.StringVar(&ri.Focus, "focus", "", "the run's focus (empty: the whole [Conformance] set)")
	flag.StringVar(&ri.Commit, "commit", "", "the commit the run measured")
	flag.StringVar(&ri.Date, "date", time.Now().UTC().Format("2006-01-02"), "the run's date")
	readme := flag.String("readme", "", "rewrite this README's conformance table from the expectations file (after -update)")
	checkReadme := flag.Bool("check-readme", false, "with -readme: change nothing, exit 1 when the README's table does not match the expectations file")
	flag.Parse()
	err := run(*junit, *expFile, *specsFile, *update, *check, *markdown, os.Stdout, ri)
	if err == nil && *readme != "" {
		err = syncREADME(*readme, *expFile, *checkReadme)
		if err == nil && !*checkReadme {
			fmt.Printf("%s: conformance table written from %s\n", *readme, *expFile)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "summary:", err)
		os.Exit(1)
	}
}

var (
	trailingLabels = regexp.MustCompile(`\s+\[([^\[\]]*)\]$`)
	sigOf          = regexp.MustCompile(`^\[(sig-[a-z-]+)\]`)
)

// specName turns a JUnit test case name into the spec's full text: Ginkgo prefixes the leaf node
// type ("[It] ") and appends the spec's labels ("[sig-apps, Serial, Conformance]"). The spec's
// own text may end in bracketed tags too ("... [Conformance] [Serial]"), so only a last group
// that is the label list (it holds the Conformance label, and the [Conformance] tag is left
// before it) goes.
func specName(n string) string {
	n = strings.TrimSpace(strings.TrimPrefix(n, "[It] "))
	if m := trailingLabels.FindStringSubmatchIndex(n); m != nil {
		for _, l := range strings.Split(n[m[2]:m[3]], ", ") {
			if l == "Conformance" && isConformance(n[:m[0]]) {
				return n[:m[0]]
			}
		}
	}
	return n
}

// isConformance: the spec's text carries the [Conformance] tag.
func isConformance(spec string) bool { return strings.Contains(spec, "[Conformance]") }

func sig(spec string) string {
	if m := sigOf.FindStringSubmatch(spec); m != nil {
		return m[1]
	}
	return "other"
}

// areaFor is the issue area of a failing spec without a triaged area: by topic first, then by SIG.
func areaFor(spec string) string {
	s := strings.ToLower(spec)
	switch {
	case strings.Contains(s, "serviceaccount") || strings.Contains(s, "service account") || strings.Contains(s, "rbac") ||
		strings.Contains(s, "certificatesigningrequest") || strings.Contains(s, "subjectreview") || strings.Contains(s, "[sig-auth]"):
		return "security"
	case strings.Contains(s, "dns") || strings.Contains(s, "[sig-node]") || strings.Contains(s, "[sig-storage]"):
		return "node"
	case strings.Contains(s, "[sig-network]"):
		return "network"
	case strings.Contains(s, "[sig-apps]") || strings.Contains(s, "[sig-scheduling]"):
		return "workloads"
	}
	return "API"
}

// signatures are failures whose cause is known whatever the spec: the area of the fix.
var signatures = []struct{ where, area string }{
	// The framework waits 2 minutes for each test namespace's kube-root-ca.crt ConfigMap
	// (the root CA publisher, issue 14) before any spec body runs.
	{"test/e2e/framework/framework.go:382", "security"},
	// ... and for its default ServiceAccount.
	{"test/e2e/framework/framework.go:379", "security"},
}

// failureArea is the area a failure's signature names, or "".
func failureArea(c testcase) string {
	if c.Failure == nil {
		return ""
	}
	for _, s := range signatures {
		if strings.Contains(c.Failure.Body, s.where) {
			return s.area
		}
	}
	return ""
}

func readJUnit(path string) (map[string]testcase, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s suites
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cases := s.Cases
	for _, su := range s.Suites {
		cases = append(cases, su.Cases...)
	}
	out := map[string]testcase{}
	for _, c := range cases {
		n := specName(c.Name)
		if !isConformance(n) {
			continue // other specs, suite set-up nodes (BeforeSuite, AfterSuite)
		}
		if c.Status == "skipped" && c.Time == 0 {
			continue // not selected by this run's focus: it did not run at all
		}
		out[n] = c
	}
	return out, nil
}

func result(c testcase) string {
	switch {
	case c.Failure != nil || c.Error != nil || c.Status == "failed" || c.Status == "panicked" || c.Status == "timedout" || c.Status == "interrupted" || c.Status == "aborted":
		return "fail"
	case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
		return "skip"
	}
	return "pass"
}

func readExpectations(path string) (map[string]expectation, error) {
	out := map[string]expectation{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		t := sc.Text()
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		parts := strings.SplitN(t, "\t", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("%s:%d: want result<TAB>area<TAB>spec", path, line)
		}
		out[parts[2]] = expectation{Result: parts[0], Area: parts[1]}
	}
	return out, sc.Err()
}

func readSpecs(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}

type counts struct{ run, pass, fail, skip, total int }

func run(junit, expFile, specsFile string, update, check, markdown bool, out io.Writer, ri runInfo) error {
	if expFile == "" {
		return fmt.Errorf("-expectations is required")
	}
	got := map[string]testcase{} // no -junit: only (re)write the file's spec list
	if junit != "" {
		var err error
		if got, err = readJUnit(junit); err != nil {
			return err
		}
	}
	exp, err := readExpectations(expFile)
	if err != nil {
		return err
	}
	hdr, err := readHeader(expFile)
	if err != nil {
		return err
	}
	var all []string
	if specsFile != "" {
		if all, err = readSpecs(specsFile); err != nil {
			return err
		}
	} else {
		for n := range exp {
			all = append(all, n)
		}
	}
	known := map[string]bool{}
	for _, n := range all {
		known[n] = true
	}
	for n := range got {
		if !known[n] {
			all = append(all, n)
			known[n] = true
		}
	}
	sort.Strings(all)

	// The per-SIG table of this run (total: the suite's conformance specs of that SIG).
	bySIG := map[string]*counts{}
	var sigs []string
	at := func(s string) *counts {
		if bySIG[s] == nil {
			bySIG[s] = &counts{}
			sigs = append(sigs, s)
		}
		return bySIG[s]
	}
	var newlyPassing, newlyFailing, regressions []string
	for _, n := range all {
		c := at(sig(n))
		c.total++
		tc, ran := got[n]
		if !ran {
			continue
		}
		r := result(tc)
		switch r {
		case "pass":
			c.pass++
			c.run++
		case "fail":
			c.fail++
			c.run++
		case "skip":
			c.skip++
		}
		old := exp[n].Result
		switch {
		case r == "pass" && old != "pass":
			newlyPassing = append(newlyPassing, n)
		case r != "pass" && r != "skip" && old == "pass":
			newlyFailing = append(newlyFailing, n)
			regressions = append(regressions, n)
		case r == "fail" && old != "fail":
			newlyFailing = append(newlyFailing, n)
		}
	}
	sort.Strings(sigs)
	if junit == "" && !markdown {
		// No run to report: only the file was (re)written, or a README table is wanted.
		return finish(update, check, expFile, all, got, exp, hdr, ri, junit, out, nil)
	}
	var tot counts
	if markdown {
		fmt.Fprintln(out, "| SIG | passed / total | failed | not run |")
		fmt.Fprintln(out, "|---|---|---|---|")
	} else {
		fmt.Fprintf(out, "%-22s %5s %7s %7s %8s %6s\n", "SIG", "run", "passed", "failed", "skipped", "total")
	}
	for _, s := range sigs {
		c := bySIG[s]
		tot.run += c.run
		tot.pass += c.pass
		tot.fail += c.fail
		tot.skip += c.skip
		tot.total += c.total
		if markdown {
			fmt.Fprintf(out, "| %s | %d / %d | %d | %d |\n", s, c.pass, c.total, c.fail, c.total-c.run)
		} else {
			fmt.Fprintf(out, "%-22s %5d %7d %7d %8d %6d\n", s, c.run, c.pass, c.fail, c.skip, c.total)
		}
	}
	if markdown {
		fmt.Fprintf(out, "| **all** | **%d / %d** | %d | %d |\n", tot.pass, tot.total, tot.fail, tot.total-tot.run)
	} else {
		fmt.Fprintf(out, "%-22s %5d %7d %7d %8d %6d\n", "all", tot.run, tot.pass, tot.fail, tot.skip, tot.total)
	}

	if !markdown {
		fmt.Fprintf(out, "\nagainst %s: %d newly passing, %d newly failing (%d were expected to pass)\n", expFile, len(newlyPassing), len(newlyFailing), len(regressions))
		for _, n := range newlyPassing {
			fmt.Fprintf(out, "  + %s\n", n)
		}
		for _, n := range newlyFailing {
			fmt.Fprintf(out, "  - %s\n", n)
		}
	}

	return finish(update, check, expFile, all, got, exp, hdr, ri, junit, out, regressions)
}

// finish writes the expectations file (-update) and reports regressions (-check).
func finish(update, check bool, expFile string, all []string, got map[string]testcase, exp map[string]expectation,
	hdr header, ri runInfo, junit string, out io.Writer, regressions []string) error {
	if update {
		if ri.Record && junit != "" {
			hdr = ri.record(hdr)
		}
		if err := writeExpectations(expFile, all, got, exp, hdr); err != nil {
			return err
		}
		fmt.Fprintf(out, "updated %s\n", expFile)
	}
	if check && len(regressions) > 0 {
		return fmt.Errorf("%d spec(s) marked pass in %s did not pass:\n  %s", len(regressions), expFile, strings.Join(regressions, "\n  "))
	}
	return nil
}

// writeExpectations writes one line per spec of all (the suite's specs when -specs is given, so
// specs no longer in the suite drop out).
func writeExpectations(path string, all []string, got map[string]testcase, exp map[string]expectation, hdr header) error {
	var b strings.Builder
	b.WriteString("# The upstream conformance suite's [Conformance] specs and their last result on Waggle.\n")
	b.WriteString("# result<TAB>area<TAB>spec — result: pass | fail | skip | notrun; area: the issue area of a\n")
	b.WriteString("# spec that does not pass (API, security, workloads, node, network), - for one that passes.\n")
	b.WriteString("# Written by `make conformance UPDATE=1` (test/conformance/summary); areas may be edited by hand.\n")
	for _, k := range headerKeys {
		if v := hdr[k]; v != "" {
			fmt.Fprintf(&b, "# %s: %s\n", k, v)
		}
	}
	for _, n := range all {
		e, had := exp[n]
		if !had {
			e = expectation{Result: "notrun"}
		}
		tc, ran := got[n]
		if ran {
			e.Result = result(tc)
		}
		switch {
		case e.Result == "pass":
			e.Area = "-"
		case ran && failureArea(tc) != "":
			e.Area = failureArea(tc)
		case e.Area == "" || e.Area == "-":
			e.Area = areaFor(n)
		}
		fmt.Fprintf(&b, "%s\t%s\t%s\n", e.Result, e.Area, n)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
