package inspect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	cebpf "github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/internal/cgroupfs"
)

const bpffsRoot = "/sys/fs/bpf"

// openSource opens dir's pinned state, turning every way of failing into
// an error that says what is wrong and what to do.
func openSource(dir, node string) (closingSource, error) {
	if err := checkBPFFS(dir); err != nil {
		return nil, err
	}
	if _, err := os.Stat(dir); err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("no pinned state in %s%s: %w", dir, otherNodes(dir, node), ErrNoState)
		case errors.Is(err, fs.ErrPermission):
			return nil, permission(dir, err)
		}
		return nil, fmt.Errorf("pin directory: %w", err)
	}
	v, err := ebpf.OpenPinned(dir)
	switch {
	case errors.Is(err, ebpf.ErrNoPinnedState):
		return nil, fmt.Errorf("%s holds no Waggle maps%s: %w", dir, otherNodes(dir, node), ErrNoState)
	case errors.Is(err, ebpf.ErrLayoutMismatch):
		return nil, fmt.Errorf("%w (inspect it with the waggle binary of the proxy that wrote it)", err)
	case errors.Is(err, fs.ErrPermission):
		return nil, permission(dir, err)
	case err != nil:
		return nil, err
	}
	return v, nil
}

func permission(path string, err error) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s: %w: waggle bpf needs root to read pinned BPF objects (CAP_BPF and CAP_SYS_ADMIN; try sudo)", path, ErrPermission)
	}
	return fmt.Errorf("%s: %v: %w", path, err, ErrPermission)
}

// checkBPFFS fails with ErrNoState when dir does not lie on a BPF
// filesystem (the proxy mounts it on /sys/fs/bpf when it starts).
func checkBPFFS(dir string) error {
	p := filepath.Clean(dir)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			if st.Type == unix.BPF_FS_MAGIC {
				return nil
			}
			break
		}
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
			return permission(p, err)
		}
		if p == "/" || p == "." {
			break
		}
		p = filepath.Dir(p)
	}
	if rel, err := filepath.Rel(bpffsRoot, dir); err == nil && !strings.HasPrefix(rel, "..") {
		return fmt.Errorf("no BPF filesystem is mounted on %s, so nothing is pinned on this node "+
			"(the proxy mounts it when it starts in ebpf mode): %w", bpffsRoot, ErrNoState)
	}
	return fmt.Errorf("pin directory %s is not on a BPF filesystem: %w", dir, ErrNoState)
}

// otherNodes names the nodes that do have pinned state beside dir, as a
// hint for --node.
func otherNodes(dir, node string) string {
	if node == "" {
		return ""
	}
	entries, err := os.ReadDir(filepath.Dir(dir))
	if err != nil {
		return " (is the proxy running in ebpf mode on this node?)"
	}
	var nodes []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(filepath.Dir(dir), e.Name(), ebpf.MapMeta)); err == nil && e.Name() != node {
			nodes = append(nodes, e.Name())
		}
	}
	if len(nodes) == 0 {
		return " (is the proxy running in ebpf mode on this node?)"
	}
	slices.Sort(nodes)
	return fmt.Sprintf(" (node %q; pinned state exists for: %s — pick one with --node)", node, strings.Join(nodes, ", "))
}

// linuxSystem is the real machine.
type linuxSystem struct {
	ctx     context.Context
	cgroups map[uint64]string
}

func newSystem(ctx context.Context) system { return &linuxSystem{ctx: ctx} }

func (s *linuxSystem) Now() time.Time { return time.Now() }

func clock(id int32) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(id, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func (s *linuxSystem) Monotonic() time.Duration { return clock(unix.CLOCK_MONOTONIC) }
func (s *linuxSystem) Boottime() time.Duration  { return clock(unix.CLOCK_BOOTTIME) }

func cgroup2Root() string {
	root, _ := cgroupfs.V2Root()
	return root
}

// CgroupPath finds the cgroup v2 directory whose inode is id (a cgroup's
// ID on cgroup v2), walking the hierarchy once.
func (s *linuxSystem) CgroupPath(id uint64) string {
	if s.cgroups == nil {
		s.cgroups = map[uint64]string{}
		if root := cgroup2Root(); root != "" {
			filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				var st unix.Stat_t
				if unix.Stat(p, &st) == nil {
					s.cgroups[st.Ino] = p
				}
				return nil
			})
		}
	}
	return s.cgroups[id]
}

// NetnsCookie resolves SRC: cookie:N, pid:N, a path to a netns file, or a
// name in /run/netns.
func (s *linuxSystem) NetnsCookie(src string) (uint64, error) {
	path, err := netnsPath(src)
	if err != nil {
		return 0, err
	}
	if path == "" {
		return strconv.ParseUint(strings.TrimPrefix(src, "cookie:"), 10, 64)
	}
	var cookie uint64
	err = ns.WithNetNSPath(path, func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		var nse ns.NSPathNotExistErr
		if errors.As(err, &nse) || errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("client netns %q (%s): %v: %w", src, path, err, ErrNotFound)
		}
		if errors.Is(err, fs.ErrPermission) {
			return 0, fmt.Errorf("client netns %q: cannot open %s: %v: %w", src, path, err, ErrPermission)
		}
		return 0, fmt.Errorf("netns cookie of %s (SO_NETNS_COOKIE needs Linux 5.14): %w", path, err)
	}
	return cookie, nil
}

// netnsPath maps SRC to a netns file ("" for cookie:N).
func netnsPath(src string) (string, error) {
	if err := checkSource(src); err != nil {
		return "", err
	}
	switch {
	case strings.HasPrefix(src, "cookie:"):
		return "", nil
	case strings.HasPrefix(src, "pid:"):
		return "/proc/" + src[len("pid:"):] + "/ns/net", nil
	case strings.Contains(src, "/"):
		return src, nil
	}
	return filepath.Join("/run/netns", src), nil
}

func (s *linuxSystem) PinTime(path string) time.Time {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

func (s *linuxSystem) StatsEnabled() bool {
	b, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

func (s *linuxSystem) EnableStats() (io.Closer, error) {
	return cebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
}

func (s *linuxSystem) Sleep(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}
