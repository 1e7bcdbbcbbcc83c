package containerd

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/waggle-io/waggle/internal/procfs"
)

// KillShims kills the containerd shims (and so their containers) that were
// started by the daemon listening on address, which it finds by their
// -address argument. Shims outlive containerd by design; this is the last
// step of tearing down a daemon Waggle started itself (tests, the lab) after
// its tasks were deleted through the API, for what a crash or a race left.
// It never touches another daemon's shims.
func KillShims(address string) error {
	pids, err := shimsOf(address)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if pids, err = shimsOf(address); err != nil || len(pids) == 0 {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("shims of %s still running: %v", address, pids)
}

// shimsOf lists the PIDs of the live shims whose -address is address.
func shimsOf(address string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if isShimOf(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), address) && !procfs.Gone(pid) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func isShimOf(argv []string, address string) bool {
	if len(argv) == 0 || !strings.HasPrefix(filepath.Base(argv[0]), "containerd-shim") {
		return false
	}
	for i := 1; i < len(argv)-1; i++ {
		if argv[i] == "-address" || argv[i] == "--address" {
			return argv[i+1] == address
		}
	}
	return false
}
