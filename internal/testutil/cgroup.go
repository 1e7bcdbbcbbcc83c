package testutil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/waggle-io/waggle/internal/cgroupfs"
)

// Cgroup2Root returns the mount point of the cgroup v2 hierarchy
// (/sys/fs/cgroup on unified hosts, /sys/fs/cgroup/unified on hybrid ones).
func Cgroup2Root() (string, error) { return cgroupfs.V2Root() }

// NewCgroup creates a fresh cgroup v2 directory for t and removes it when t
// ends (processes still in it are the test's own to stop first).
func NewCgroup(t testing.TB) string {
	t.Helper()
	RequiresKernelFeature(t, Cgroup2)
	root, _ := Cgroup2Root()
	dir := filepath.Join(root, UniqueName("waggle-test-"))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup %s: %v", dir, err)
		}
	})
	return dir
}
