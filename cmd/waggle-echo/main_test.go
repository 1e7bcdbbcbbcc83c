package main

import (
	"errors"
	"flag"
	"os/exec"
	"strings"
	"testing"
)

// waggle-echo --help lists the server's flags and every tool subcommand and
// exits 0, as a user trying the image expects.
func TestHelpListsEveryCommandAndExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := t.TempDir() + "/waggle-echo"
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v: %s", err, out)
	}
	for _, arg := range []string{"--help", "-h", "help"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil {
			t.Fatalf("waggle-echo %s: %v", arg, err)
		}
		for name := range tools {
			if !strings.Contains(string(out), name) {
				t.Errorf("waggle-echo %s does not list %q:\n%s", arg, name, out)
			}
		}
	}
	if err := serve([]string{"--no-such-flag"}); err == nil || errors.Is(err, flag.ErrHelp) {
		t.Fatalf("a bad flag: %v, want an error", err)
	}
}
