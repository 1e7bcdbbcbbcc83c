package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/waggle-io/waggle/internal/cgroupfs"
)

// writePodCgroup creates the cgroup path (a pod's, the parent of its
// containers' cgroups) and sets r there, as the kubelet's cgroupfs driver
// does: on cgroup v1 in the cpu and memory hierarchies, on a unified host
// in the v2 hierarchy (cpu and memory enabled down to it). A zero quota or
// memory limit is unlimited.
func writePodCgroup(path string, r Resources) error {
	shares, quota, period, mem := r.limits()
	cpu, v1cpu := cgroupfs.V1Controller("cpu")
	memory, v1mem := cgroupfs.V1Controller("memory")
	if v1cpu && v1mem {
		return errors.Join(
			writeCgroup(filepath.Join(cpu, path), "cpu.shares", strconv.FormatUint(shares, 10)),
			writeCgroup(filepath.Join(cpu, path), "cpu.cfs_period_us", strconv.FormatUint(period, 10)),
			writeCgroup(filepath.Join(cpu, path), "cpu.cfs_quota_us", strconv.FormatInt(quota, 10)),
			writeCgroup(filepath.Join(memory, path), "memory.limit_in_bytes", strconv.FormatInt(mem, 10)))
	}
	root, err := cgroupfs.V2Root()
	if err != nil {
		return fmt.Errorf("pod cgroup %s: no cgroup v1 cpu and memory hierarchies and %w", path, err)
	}
	// Each ancestor hands down what the hierarchy offers of cpu and memory
	// (runc does the same for the containers below); a controller the host
	// does not delegate is left alone, as runc leaves it.
	b, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	offered := strings.Fields(string(b))
	var enable []string
	for _, c := range []string{"cpu", "memory"} {
		if slices.Contains(offered, c) {
			enable = append(enable, "+"+c)
		}
	}
	dir := root
	for _, part := range strings.Split(strings.Trim(filepath.Clean(path), "/"), "/") {
		if len(enable) > 0 {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0); err != nil {
				return fmt.Errorf("enable %s in %s: %w", strings.Join(enable, " "), dir, err)
			}
		}
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
	}
	q, m := "max", "max"
	if quota > 0 {
		q = strconv.FormatInt(quota, 10)
	}
	if mem > 0 {
		m = strconv.FormatInt(mem, 10)
	}
	var errs []error
	if slices.Contains(offered, "cpu") {
		errs = append(errs,
			writeCgroup(dir, "cpu.weight", strconv.FormatUint(sharesToWeight(shares), 10)),
			writeCgroup(dir, "cpu.max", q+" "+strconv.FormatUint(period, 10)))
	}
	if slices.Contains(offered, "memory") {
		errs = append(errs, writeCgroup(dir, "memory.max", m))
	}
	return errors.Join(errs...)
}

// removePodCgroup removes the (empty) cgroup path in every hierarchy.
func removePodCgroup(path string) error {
	if path == "" || path == "/" {
		return nil
	}
	ms, err := cgroupfs.Hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range ms {
		if err := os.Remove(filepath.Join(m.Path, path)); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// limits are r as cgroup values: shares at least 2 (the kernel's minimum),
// the period defaulted to 100 ms, and -1 (unlimited) for an unset quota or
// memory limit.
func (r Resources) limits() (shares uint64, quota int64, period uint64, mem int64) {
	shares, quota, period, mem = max(r.CPUShares, 2), r.CPUQuota, r.CPUPeriod, r.MemoryLimit
	if period == 0 {
		period = 100000
	}
	if quota <= 0 {
		quota = -1
	}
	if mem <= 0 {
		mem = -1
	}
	return shares, quota, period, mem
}

// writeCgroup makes the cgroup dir and writes one of its files.
func writeCgroup(dir, file, value string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("cgroup %s: %w", file, err)
	}
	return nil
}

// sharesToWeight is runc's (and the kubelet's) conversion of cgroup v1 CPU
// shares [2, 262144] to a v2 weight [1, 10000].
func sharesToWeight(shares uint64) uint64 {
	return 1 + ((shares-2)*9999)/262142
}
