package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSpecNameStripsLeafTypeAndLabels(t *testing.T) {
	const want = "[sig-apps] Deployment should run the lifecycle of a Deployment [Conformance]"
	for _, in := range []string{
		want,
		"[It] " + want,
		"[It] " + want + " [sig-apps, Conformance]",
	} {
		if got := specName(in); got != want {
			t.Errorf("specName(%q) = %q", in, got)
		}
	}
	const serial = "[sig-api-machinery] Namespaces should patch a Namespace [Conformance] [Serial]"
	if got := specName("[It] " + serial + " [sig-api-machinery, Serial, Conformance]"); got != serial {
		t.Errorf("specName(serial) = %q, want %q", got, serial)
	}
}

func TestRunComparesWithExpectationsAndUpdates(t *testing.T) {
	dir := t.TempDir()
	a := "[sig-apps] A should pass [Conformance]"
	b := "[sig-network] B used to pass [Conformance]"
	c := "[sig-node] C is not reached [Conformance]"
	d := "[sig-apps] D waits for kube-root-ca.crt [Conformance]"
	junit := filepath.Join(dir, "junit.xml")
	os.WriteFile(junit, []byte(`<testsuites><testsuite>
<testcase name="[It] `+a+` [Conformance, sig-apps]" status="passed"></testcase>
<testcase name="[It] `+b+`" status="failed"><failure message="boom"></failure></testcase>
<testcase name="[It] `+d+` [sig-apps, Conformance]" status="failed" time="120.1"><failure message="timed out waiting for the condition">[FAILED] timed out waiting for the condition&#xA;In [BeforeEach] at: /m/k8s.io/kubernetes@v1.37.2/test/e2e/framework/framework.go:382 @ 12/01/26&#xA;</failure></testcase>
<testcase name="[SynchronizedBeforeSuite]" status="passed"></testcase>
<testcase name="[It] `+c+` [sig-node, Conformance]" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
</testsuite></testsuites>`), 0o644)
	exp := filepath.Join(dir, "expectations.tsv")
	os.WriteFile(exp, []byte("fail\tworkloads\t"+a+"\npass\t-\t"+b+"\nnotrun\tnode\t"+c+"\n"), 0o644)
	specs := filepath.Join(dir, "specs.txt")
	os.WriteFile(specs, []byte(a+"\n"+b+"\n"+c+"\n"+d+"\n"), 0o644)

	var out strings.Builder
	err := run(junit, exp, specs, true, true, false, &out, runInfo{})
	if err == nil || !strings.Contains(err.Error(), b) {
		t.Fatalf("err = %v, want the regression of %q", err, b)
	}
	for _, w := range []string{"1 newly passing, 2 newly failing (1 were expected to pass)", "+ " + a, "- " + b} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
	got, _ := os.ReadFile(exp)
	for _, w := range []string{"pass\t-\t" + a, "fail\tnetwork\t" + b, "notrun\tnode\t" + c, "fail\tsecurity\t" + d} {
		if !strings.Contains(string(got), w+"\n") {
			t.Errorf("expectations lack %q:\n%s", w, got)
		}
	}
}

func TestRecordAndREADMETable(t *testing.T) {
	dir := t.TempDir()
	a := "[sig-apps] A passes [Conformance]"
	b := "[sig-apps] B fails [Conformance]"
	c := "[sig-node] C is not reached [Conformance]"
	junit := filepath.Join(dir, "junit.xml")
	os.WriteFile(junit, []byte(`<testsuites><testsuite>
<testcase name="[It] `+a+` [sig-apps, Conformance]" status="passed"></testcase>
<testcase name="[It] `+b+` [sig-apps, Conformance]" status="failed"><failure message="boom"></failure></testcase>
</testsuite></testsuites>`), 0o644)
	exp := filepath.Join(dir, "expectations.tsv")
	os.WriteFile(exp, []byte("# focused run: 2026-11-30 procs=2 commit=0ld focus=x\nnotrun\tworkloads\t"+a+"\nnotrun\tworkloads\t"+b+"\nnotrun\tnode\t"+c+"\n"), 0o644)
	readme := filepath.Join(dir, "README.md")
	os.WriteFile(readme, []byte("# X\n\nbefore\n"+tableBegin+"\nstale\n"+tableEnd+"\nafter\n"), 0o644)

	// A run of the whole set is recorded, and supersedes the older focused run.
	full := runInfo{Record: true, Suite: "v1.37.2", Procs: 5, Duration: 71*time.Minute + 3*time.Second + 400*time.Millisecond, Commit: "abc1234", Date: "2026-12-01"}
	if err := run(junit, exp, "", true, false, false, io.Discard, full); err != nil {
		t.Fatal(err)
	}
	if err := syncREADME(readme, exp, true); err == nil {
		t.Fatal("check-readme passed on a stale table")
	}
	if err := syncREADME(readme, exp, false); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(readme)
	for _, w := range []string{
		"# X\n\nbefore\n" + tableBegin + "\nMeasured 2026-12-01 with the v1.37.2 suite: the whole `[Conformance]` set on a fresh 3-node lab in 1h11m3s with 5 parallel processes",
		"| sig-apps | 1 / 2 | 1 | 0 | 0 |\n",
		"| sig-node | 0 / 1 | 0 | 0 | 1 |\n",
		"| **all** | **1 / 3** | 1 | 0 | 1 |\n" + tableEnd + "\nafter\n",
	} {
		if !strings.Contains(string(got), w) {
			t.Errorf("README lacks %q:\n%s", w, got)
		}
	}
	if strings.Contains(string(got), "focused") {
		t.Errorf("README still names the focused run a full run superseded:\n%s", got)
	}
	if err := syncREADME(readme, exp, true); err != nil {
		t.Errorf("check-readme right after a sync: %v", err)
	}

	// A later focused run keeps the full run's line and adds its own; an update without
	// -record (an older harness) keeps both.
	focused := runInfo{Record: true, Suite: "v1.37.2", Procs: 2, Duration: time.Minute, Commit: "def5678", Date: "2026-12-02", Focus: "sig-apps.*A passes"}
	if err := run(junit, exp, "", true, false, false, io.Discard, focused); err != nil {
		t.Fatal(err)
	}
	if err := run(junit, exp, "", true, false, false, io.Discard, runInfo{}); err != nil {
		t.Fatal(err)
	}
	h, _ := readHeader(exp)
	if want := "2026-12-01 procs=5 duration=1h11m3s commit=abc1234"; h["full run"] != want {
		t.Errorf("full run = %q, want %q", h["full run"], want)
	}
	if want := "2026-12-02 procs=2 duration=1m0s commit=def5678 focus=sig-apps.*A passes"; h["focused run"] != want {
		t.Errorf("focused run = %q, want %q", h["focused run"], want)
	}
	table, err := readmeTable(exp)
	if err != nil {
		t.Fatal(err)
	}
	if w := "the latest 2026-12-02 (`FOCUS='sig-apps.*A passes'`)"; !strings.Contains(table, w) {
		t.Errorf("table lacks %q:\n%s", w, table)
	}

	// No markers: a clear error, the README untouched.
	os.WriteFile(readme, []byte("no table\n"), 0o644)
	if err := syncREADME(readme, exp, false); err == nil || !strings.Contains(err.Error(), tableBegin) {
		t.Errorf("err = %v, want one naming the missing block", err)
	}
}

// The committed README's table is the one the committed expectations file gives.
func TestCommittedREADMEMatchesExpectations(t *testing.T) {
	if err := syncREADME("../../../README.md", "../expectations.tsv", true); err != nil {
		t.Error(err)
	}
}

// Every spec of the committed expectations file that does not pass names the issue area of its
// fix (API, security, workloads, node, network), and a passing one none: no unexplained failure.
func TestCommittedExpectationsHaveAreas(t *testing.T) {
	exp, err := readExpectations("../expectations.tsv")
	if err != nil {
		t.Fatal(err)
	}
	if len(exp) == 0 {
		t.Fatal("../expectations.tsv lists no spec")
	}
	areas := map[string]bool{"API": true, "security": true, "workloads": true, "node": true, "network": true}
	for spec, e := range exp {
		switch e.Result {
		case "pass":
			if e.Area != "-" {
				t.Errorf("%q passes but has area %q (want -)", spec, e.Area)
			}
		case "fail", "skip", "notrun":
			if !areas[e.Area] {
				t.Errorf("%q is %s with area %q: want one of API, security, workloads, node, network", spec, e.Result, e.Area)
			}
		default:
			t.Errorf("%q: result %q is none of pass, fail, skip, notrun", spec, e.Result)
		}
	}
}
