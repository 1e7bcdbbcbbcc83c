package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestBPFExitCodesReachTheProcess: waggle bpf's errors choose the process
// exit code through main's exitCoder (2 usage, 3 no dataplane state).
func TestBPFExitCodesReachTheProcess(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"bad usage", []string{"bpf", "lb", "frob"}, 2, `"lb" needs one of`},
		{"unknown command", []string{"bpf", "frob"}, 2, "unknown command"},
		{"no state (not bpffs)", []string{"bpf", "status", "--pin-dir", t.TempDir()}, 3, "not on a BPF filesystem"},
		{"help", []string{"bpf", "--help"}, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(c.args, &stderr)
			if code != c.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, c.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.msg) {
				t.Errorf("stderr %q lacks %q", stderr.String(), c.msg)
			}
		})
	}
}
