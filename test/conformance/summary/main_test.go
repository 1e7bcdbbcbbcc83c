package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	err := run(junit, exp, specs, true, true, false, &out)
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
