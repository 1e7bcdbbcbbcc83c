package testutil

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
)

// Feature is a kernel capability a test may depend on.
type Feature string

// Kernel features known to the gates.
const (
	// CgroupSockAddr: BPF_PROG_TYPE_CGROUP_SOCK_ADDR programs (connect4 & co).
	CgroupSockAddr Feature = "cgroup-sock-addr"
	// BTF: kernel BTF at /sys/kernel/btf/vmlinux.
	BTF Feature = "btf"
	// Cgroup2: a cgroup v2 hierarchy (see Cgroup2Root).
	Cgroup2 Feature = "cgroup2"
	// IPVS: the IP virtual server. Optional: its gate always skips when absent.
	IPVS Feature = "ipvs"
)

// optional features are never required by WAGGLE_PRIVILEGED_TESTS: Waggle
// works without them and tests them for real only where a kernel has them.
var optional = map[Feature]bool{IPVS: true}

// RequiresKernelFeature skips t unless the running kernel has f. It implies
// RequiresRoot.
func RequiresKernelFeature(t testing.TB, f Feature) {
	t.Helper()
	RequiresRoot(t)
	err := probe(f)
	if err == nil {
		return
	}
	if optional[f] {
		t.Skipf("kernel feature %s is absent (optional for Waggle): %v", f, err)
	}
	unmet(t, "needs kernel feature %s: %v", f, err)
}

func probe(f Feature) error {
	switch f {
	case CgroupSockAddr:
		return features.HaveProgramType(ebpf.CGroupSockAddr)
	case BTF:
		_, err := os.Stat("/sys/kernel/btf/vmlinux")
		return err
	case Cgroup2:
		_, err := Cgroup2Root()
		return err
	case IPVS:
		if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
			return fmt.Errorf("no /proc/net/ip_vs: %w", err)
		}
		return nil
	}
	return errors.New("unknown feature")
}
