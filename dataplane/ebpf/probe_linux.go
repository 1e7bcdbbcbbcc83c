package ebpf

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"

	"github.com/waggle-io/waggle/internal/cgroupfs"
)

func probeKernel() error {
	if err := features.HaveProgramType(ebpf.CGroupSockAddr); err != nil {
		return fmt.Errorf("cgroup sock_addr programs: %w", err)
	}
	for _, h := range []asm.BuiltinFunc{asm.FnGetSocketCookie, asm.FnGetNetnsCookie, asm.FnSetRetval, asm.FnGetPrandomU32} {
		if err := features.HaveProgramHelper(ebpf.CGroupSockAddr, h); err != nil {
			return fmt.Errorf("helper %s for cgroup sock_addr programs: %w", h, err)
		}
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("kernel BTF: %w", err)
	}
	if _, err := cgroup2Root(); err != nil {
		return err
	}
	if _, err := os.Stat("/sys/fs/bpf"); err != nil {
		return fmt.Errorf("BPF filesystem mount point /sys/fs/bpf: %w", err)
	}
	return nil
}

// cgroup2Root returns the cgroup v2 mount point.
func cgroup2Root() (string, error) { return cgroupfs.V2Root() }
