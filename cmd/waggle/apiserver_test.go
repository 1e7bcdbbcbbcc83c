package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestLeaseReuseFlagRefusesUnderASecond: --lease-reuse-duration-seconds
// under 1 is a clear error of `waggle apiserver` and `waggle up` before
// anything is started, as kube-apiserver refuses it.
func TestLeaseReuseFlagRefusesUnderASecond(t *testing.T) {
	for _, args := range [][]string{
		{"apiserver", "--data-dir=" + t.TempDir(), "--lease-reuse-duration-seconds=0"},
		{"up", "--data-dir=" + t.TempDir(), "--lease-reuse-duration-seconds=-5"},
	} {
		var stderr bytes.Buffer
		if code := run(args, &stderr); code != 1 {
			t.Errorf("%v: exit code %d, want 1 (%s)", args, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), "--lease-reuse-duration-seconds") {
			t.Errorf("%v: stderr %q lacks --lease-reuse-duration-seconds", args, stderr.String())
		}
	}
}
