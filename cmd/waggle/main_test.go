package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os/exec"
	"testing"
)

// A command's own exit status (waggle lab exec) is passed through without a
// second message; other errors are printed once with the command's name.
func TestExitStatus(t *testing.T) {
	exitErr := func(code int) error {
		err := exec.Command("sh", "-c", fmt.Sprintf("exit %d", code)).Run()
		ee := (*exec.ExitError)(nil)
		if !errors.As(err, &ee) {
			t.Fatalf("sh -c 'exit %d': %v, want an *exec.ExitError", code, err)
		}
		return childExit(ee.ExitCode())
	}
	for _, tc := range []struct {
		name   string
		err    error
		code   int
		stderr string
	}{
		{"success", nil, 0, ""},
		{"help", fmt.Errorf("parse: %w", flag.ErrHelp), 0, ""},
		{"child's status", exitErr(3), 3, ""},
		{"a wrapped child's status", fmt.Errorf("run: %w", exitErr(42)), 42, ""},
		{"an error", errors.New("the lab has no \"x\""), 1, "waggle lab: the lab has no \"x\"\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if got := exitStatus(&out, "lab", tc.err); got != tc.code || out.String() != tc.stderr {
				t.Errorf("exitStatus(%v) = %d, stderr %q; want %d, %q", tc.err, got, out.String(), tc.code, tc.stderr)
			}
		})
	}
}
