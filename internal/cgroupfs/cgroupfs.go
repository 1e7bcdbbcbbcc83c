// Package cgroupfs tells which cgroup hierarchies this host has mounted: the
// cgroup v2 hierarchy (at /sys/fs/cgroup on unified hosts, at
// /sys/fs/cgroup/unified on hybrid ones) and, on hybrid hosts, the v1
// controllers beside it. Every part of Waggle that places or finds cgroups
// asks it instead of parsing /proc/self/mounts itself.
//
// It only reads the mount table: it creates, moves and removes no cgroup.
package cgroupfs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
)

// ErrNoV2 means no cgroup v2 hierarchy is mounted.
var ErrNoV2 = errors.New("no cgroup v2 hierarchy mounted")

// Mount is one mounted cgroup hierarchy.
type Mount struct {
	// Path is the mount point.
	Path string
	// V2 is set for the unified (cgroup2) hierarchy.
	V2 bool
	// Controllers are a v1 hierarchy's controllers (cpu, memory, ...).
	Controllers []string
}

// Mounts lists every mounted cgroup hierarchy, v2 and v1, in mount order.
func Mounts() ([]Mount, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, fmt.Errorf("read the mount table: %w", err)
	}
	defer f.Close()
	return parse(f)
}

// known is the mount table's cgroup hierarchies as Hierarchies first read
// them.
var known struct {
	sync.Mutex
	ms []Mount
	ok bool
}

// Hierarchies is Mounts read once per process (the first read that
// succeeds), what V2Root and V1Controller look in: hierarchies are mounted
// at boot and stay, as runc's and the kubelet's cgroup managers assume
// (they too look once), while the mount table around them grows and
// shrinks with every container's rootfs and network namespace. Reading it
// for every pod put the kernel's mount-table walk on the start path.
// Callers get a copy. Code that must see the table as it is now (teardown)
// calls Mounts.
func Hierarchies() ([]Mount, error) {
	known.Lock()
	defer known.Unlock()
	if !known.ok {
		ms, err := Mounts()
		if err != nil {
			return nil, err
		}
		known.ms, known.ok = ms, true
	}
	out := make([]Mount, len(known.ms))
	for i, m := range known.ms {
		m.Controllers = slices.Clone(m.Controllers)
		out[i] = m
	}
	return out, nil
}

var v1Controllers = []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "hugetlb", "net_cls", "net_prio", "perf_event", "rdma", "misc"}

func parse(r io.Reader) ([]Mount, error) {
	var out []Mount
	s := bufio.NewScanner(r)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 4 {
			continue
		}
		switch f[2] {
		case "cgroup2":
			out = append(out, Mount{Path: f[1], V2: true})
		case "cgroup":
			m := Mount{Path: f[1]}
			for _, o := range strings.Split(f[3], ",") {
				if slices.Contains(v1Controllers, o) {
					m.Controllers = append(m.Controllers, o)
				}
			}
			out = append(out, m)
		}
	}
	return out, s.Err()
}

// V2Root returns the cgroup v2 mount point (see Hierarchies), or ErrNoV2.
func V2Root() (string, error) {
	ms, err := Hierarchies()
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.V2 {
			return m.Path, nil
		}
	}
	return "", ErrNoV2
}

// V1Controller returns the mount point of a v1 controller ("memory"), if a
// v1 hierarchy carries it (see Hierarchies).
func V1Controller(name string) (string, bool) {
	ms, err := Hierarchies()
	if err != nil {
		return "", false
	}
	for _, m := range ms {
		if slices.Contains(m.Controllers, name) {
			return m.Path, true
		}
	}
	return "", false
}
