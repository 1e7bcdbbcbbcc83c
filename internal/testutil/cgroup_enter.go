package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// EnterCgroup moves this test process into the cgroup v2 directory cg until t
// ends, then back to the cgroup it came from: cgroup socket programs attached
// to cg then see the test's own sockets.
func EnterCgroup(t testing.TB, cg string) {
	t.Helper()
	root, err := Cgroup2Root()
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	orig := root
	for _, line := range strings.Split(string(self), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			orig = filepath.Join(root, rest)
		}
	}
	pid := fmt.Sprint(os.Getpid())
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(pid), 0o644); err != nil {
		t.Fatalf("enter cgroup %s: %v", cg, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(orig, "cgroup.procs"), []byte(pid), 0o644); err != nil {
			t.Errorf("leave cgroup %s: %v", cg, err)
		}
	})
}
