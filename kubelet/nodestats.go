package kubelet

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/kubernetes/pkg/kubelet/stats/pidlimit"

	"github.com/waggle-io/waggle/internal/cgroupfs"
)

// The node's own figures in /stats/summary come from the machine, as
// cAdvisor's root container does: CPU from the root cgroup (cpuacct.usage on
// cgroup v1, cpu.stat usage_usec on v2, /proc/stat otherwise), memory from
// the root memory cgroup on v1 and from /proc/meminfo on v2 (whose root has
// no memory.current), the filesystem from statfs of the kubelet's root dir.
// They are never the sum of the pods.

// nodeCPUNanos is the machine's cumulative CPU time in nanoseconds.
func nodeCPUNanos() (uint64, bool) {
	if m, ok := cgroupfs.V1Controller("cpuacct"); ok {
		if v, err := readUint(filepath.Join(m, "cpuacct.usage")); err == nil {
			return v, true
		}
	}
	if root, err := cgroupfs.V2Root(); err == nil {
		if kv, err := readKV(filepath.Join(root, "cpu.stat")); err == nil {
			if v, ok := kv["usage_usec"]; ok {
				return v * 1000, true
			}
		}
	}
	// /proc/stat's first line: user nice system idle iowait irq softirq
	// steal ..., in USER_HZ (100 on Linux) ticks.
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, false
	}
	var busy uint64
	for i, s := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, _ := strconv.ParseUint(s, 10, 64)
		busy += v
	}
	return busy * uint64(time.Second/100), true
}

// nodeMemory reads the machine's memory usage, working set (usage less
// inactive file pages, as the kubelet counts it), RSS, and page faults.
func nodeMemory() (*statsapi.MemoryStats, bool) {
	mi, err := readMeminfo()
	if err != nil {
		return nil, false
	}
	total := mi["MemTotal"]
	var usage, inactiveFile, rss, faults, major uint64
	if m, ok := cgroupfs.V1Controller("memory"); ok {
		u, err1 := readUint(filepath.Join(m, "memory.usage_in_bytes"))
		st, err2 := readKV(filepath.Join(m, "memory.stat"))
		if err1 == nil && err2 == nil {
			usage, inactiveFile, rss = u, st["total_inactive_file"], st["total_rss"]
			faults, major = st["total_pgfault"], st["total_pgmajfault"]
		}
	}
	if usage == 0 {
		// cgroup v2's root has no memory.current: usage from /proc/meminfo
		// and inactive_file from the root's memory.stat, as runc's
		// rootStatsFromMeminfo gives cAdvisor (meminfo's when absent).
		usage = total - mi["MemFree"]
		inactiveFile, rss = mi["Inactive(file)"], mi["AnonPages"]
		if root, err := cgroupfs.V2Root(); err == nil {
			if st, err := readKV(filepath.Join(root, "memory.stat")); err == nil {
				if v, ok := st["inactive_file"]; ok {
					inactiveFile = v
				}
			}
		}
		if vm, err := readKV("/proc/vmstat"); err == nil {
			faults, major = vm["pgfault"], vm["pgmajfault"]
		}
	}
	ws := usage
	if inactiveFile < ws {
		ws -= inactiveFile
	} else {
		ws = 0
	}
	var avail uint64
	if total > ws {
		avail = total - ws
	}
	return &statsapi.MemoryStats{UsageBytes: &usage, WorkingSetBytes: &ws, RSSBytes: &rss, AvailableBytes: &avail,
		PageFaults: &faults, MajorPageFaults: &major}, true
}

// fsStats is statfs of the filesystem holding dir (or its nearest existing
// parent).
func fsStats(dir string, now metav1.Time) *statsapi.FsStats {
	for dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = dirOf(dir)
	}
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return nil
	}
	bs := uint64(st.Bsize) //nolint:gosec // block sizes are positive
	capacity, avail := st.Blocks*bs, st.Bavail*bs
	used := (st.Blocks - st.Bfree) * bs
	inodes, free := st.Files, st.Ffree
	iused := inodes - free
	return &statsapi.FsStats{Time: now, AvailableBytes: &avail, CapacityBytes: &capacity, UsedBytes: &used,
		InodesFree: &free, Inodes: &inodes, InodesUsed: &iused}
}

// nodeRlimit is upstream's own figure (pkg/kubelet/stats/pidlimit): the
// lower of kernel.pid_max and kernel.threads-max, and the number of tasks
// (/proc/loadavg's total, else sysinfo's process count).
func nodeRlimit(now metav1.Time) *statsapi.RlimitStats {
	r, err := pidlimit.Stats()
	if err != nil || r == nil {
		return &statsapi.RlimitStats{Time: now}
	}
	r.Time = now
	return r
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// readKV reads "key value" lines (memory.stat, cpu.stat, /proc/vmstat).
func readKV(path string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]uint64{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, s.Err()
}

// readMeminfo reads /proc/meminfo in bytes.
func readMeminfo() (map[string]uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]uint64{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		n, err := strconv.ParseUint(fs[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fs) > 1 && fs[1] == "kB" {
			n *= 1024
		}
		out[k] = n
	}
	return out, s.Err()
}

// cpuRates turns cumulative CPU counters into usageNanoCores, as cAdvisor's
// housekeeping does: the rate over the last interval of at least a second
// between two reads of the same counter. Counters unseen for five minutes
// are forgotten.
type cpuRates struct {
	mu  sync.Mutex
	pts map[string]*cpuPoint
}

type cpuPoint struct {
	t    time.Time
	v    uint64
	rate *uint64
}

func (r *cpuRates) rate(key string, t time.Time, v uint64) *uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pts == nil {
		r.pts = map[string]*cpuPoint{}
	}
	p := r.pts[key]
	switch {
	case p == nil || v < p.v || t.Before(p.t):
		r.pts[key] = &cpuPoint{t: t, v: v}
		return nil
	case t.Sub(p.t) < time.Second:
		return p.rate
	}
	n := uint64(float64(v-p.v) / t.Sub(p.t).Seconds())
	r.pts[key] = &cpuPoint{t: t, v: v, rate: &n}
	for k, q := range r.pts {
		if t.Sub(q.t) > 5*time.Minute {
			delete(r.pts, k)
		}
	}
	return &n
}
