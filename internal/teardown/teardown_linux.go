// Package teardown holds the steps that take apart what Waggle made on a
// machine: stopping a process it started (by PID and start time, never by
// name), killing and removing a cgroup subtree, deleting a link, detaching
// the mounts below a directory, and deleting the containers of one
// containerd namespace. `waggle lab down` and `waggle down` are built from
// them; each step is idempotent (what is already gone is success).
package teardown

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/internal/cgroupfs"
	"github.com/waggle-io/waggle/internal/procfs"
)

// Alive reports whether pid is still the process that started at start
// (clock ticks since boot, /proc/PID/stat) and has not exited: a reused PID
// or a zombie is not.
func Alive(pid int, start uint64) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && st.StartTime == start && st.State != 'Z'
}

// Stop sends SIGTERM to the process, waits up to grace for it to exit,
// then sends SIGKILL and waits for it to go — each signal only while the
// PID is still the process that started at start. Every few seconds of
// waiting it writes a line to progress (nil: none). It returns an error
// only if the process outlives SIGKILL by 10 s (stuck in the kernel).
func Stop(pid int, start uint64, what string, grace time.Duration, progress io.Writer) error {
	if !Alive(pid, start) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	if waitGone(pid, start, what, grace, progress) {
		return nil
	}
	if progress != nil {
		fmt.Fprintf(progress, "  %s (pid %d) did not stop within %s: SIGKILL\n", what, pid, grace)
	}
	if Alive(pid, start) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if waitGone(pid, start, what, 10*time.Second, progress) {
		return nil
	}
	return fmt.Errorf("%s (pid %d) still runs after SIGKILL", what, pid)
}

// waitGone polls until the process is gone or timeout passes.
func waitGone(pid int, start uint64, what string, timeout time.Duration, progress io.Writer) bool {
	begin := time.Now()
	next := 5 * time.Second
	for time.Since(begin) < timeout {
		if !Alive(pid, start) {
			return true
		}
		if progress != nil && time.Since(begin) >= next {
			fmt.Fprintf(progress, "  waiting for %s (pid %d) to stop (%s)\n", what, pid, time.Since(begin).Round(time.Second))
			next += 5 * time.Second
		}
		time.Sleep(100 * time.Millisecond)
	}
	return !Alive(pid, start)
}

// KillCgroupTree kills every process in a cgroup subtree and waits for
// them to go: with cgroup.kill on cgroup v2, else (a v1 hierarchy) by
// SIGKILL to each process listed in the subtree's cgroup.procs. A missing
// cgroup is not an error.
func KillCgroupTree(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if b, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err == nil && strings.Contains(string(b), "populated 0") {
				return nil
			}
			time.Sleep(50 * time.Millisecond)
		}
		return fmt.Errorf("processes left in %s", dir)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := cgroupProcs(dir)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v left in %s", pids, dir)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cgroupProcs lists the processes of every cgroup in the subtree at dir.
func cgroupProcs(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			var pid int
			if _, err := fmt.Sscanf(f, "%d", &pid); err == nil && pid > 0 {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// RelativeCgroup returns the path of a cgroup relative to the cgroup
// hierarchies' roots: p is a cgroup path ("/waggle") or a directory under
// any cgroup mount ("/sys/fs/cgroup/unified/waggle").
func RelativeCgroup(p string) (string, error) {
	ms, err := cgroupfs.Mounts()
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if filepath.Clean(p) == m.Path {
			return "/", nil
		}
		if rel, ok := strings.CutPrefix(p, m.Path+"/"); ok {
			return filepath.Clean("/" + rel), nil
		}
	}
	return filepath.Clean("/" + p), nil
}

// CgroupDirs returns the directories of cgroup rel (RelativeCgroup) that
// exist, one per cgroup mount it is made in.
func CgroupDirs(rel string) ([]string, error) {
	ms, err := cgroupfs.Mounts()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		d := filepath.Join(m.Path, rel)
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
	}
	return out, nil
}

// RemoveCgroupEverywhere removes the cgroup directory with the same path
// relative to every cgroup mount (runc on a hybrid host also makes the v1
// controllers' directories), deepest first. dir is a path under any
// cgroup mount; a hierarchy's root is refused.
func RemoveCgroupEverywhere(dir string) error {
	rel, err := RelativeCgroup(dir)
	if err != nil {
		return err
	}
	if rel == "/" {
		return fmt.Errorf("refusing to remove cgroup %s: it is a hierarchy's root", dir)
	}
	dirs, err := CgroupDirs(rel)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		errs = append(errs, rmdirTree(d))
	}
	return errors.Join(errs...)
}

// rmdirTree removes a cgroup directory tree bottom-up (cgroup directories
// are removed with rmdir, not unlink).
func rmdirTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove cgroup %s: %w", d, err)
		}
	}
	return nil
}

// RemoveLink deletes a link if it is still there. A veth goes by itself a
// moment after its peer's namespace is removed (the kernel destroys the
// pair when the namespace is freed, asynchronously): found one instant and
// gone the next (ENODEV) is not an error.
func RemoveLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// UnmountUnder detaches every mount below dir (container root filesystems,
// pod network namespace bind mounts), deepest first.
func UnmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return err
	}
	var targets []string
	s := bufio.NewScanner(f)
	prefix := filepath.Clean(dir) + "/"
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && strings.HasPrefix(fields[1], prefix) {
			targets = append(targets, fields[1])
		}
	}
	f.Close()
	sort.Slice(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	var errs []error
	for _, t := range targets {
		if err := unix.Unmount(t, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// RemoveContainers kills the task of every container in containerd
// namespace ns (SIGKILL, waiting up to 10 s for each), then deletes the
// tasks and the containers with their snapshots, so no shim, mount or
// snapshot of the namespace stays. It returns how many containers it
// deleted. Other namespaces are not touched.
func RemoveContainers(ctx context.Context, c *containerd.Client, ns string) (int, error) {
	nctx := namespaces.WithNamespace(ctx, ns)
	ctrs, err := c.Containers(nctx)
	if err != nil {
		return 0, fmt.Errorf("list containers of namespace %s: %w", ns, err)
	}
	var errs []error
	n := 0
	for _, ctr := range ctrs {
		if task, err := ctr.Task(nctx, nil); err == nil {
			_ = task.Kill(nctx, syscall.SIGKILL)
			if ch, err := task.Wait(nctx); err == nil {
				select {
				case <-ch:
				case <-time.After(10 * time.Second):
				}
			}
			if _, err := task.Delete(nctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete task %s: %w", ctr.ID(), err))
			}
		}
		if err := ctr.Delete(nctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container %s: %w", ctr.ID(), err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
