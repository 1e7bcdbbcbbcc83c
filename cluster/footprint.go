package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/waggle-io/waggle/internal/procfs"
	ctrdsup "github.com/waggle-io/waggle/kubelet/containerd"
)

// Footprint is what `waggle up` or `waggle join` runs and makes on this
// machine, recorded in <data-dir>/footprint.json as it starts (and again
// once its node's containerd is known), so that `waggle down` stops exactly
// that process and, with --purge, removes exactly what it made: the
// containerd namespace it used, its pods' network namespaces and cgroups,
// its CNI bridge and masquerade chain, its pinned BPF objects and the
// cgroup they are attached to. It is the PID file of the data dir too.
type Footprint struct {
	// Command is "up" or "join".
	Command string `json:"command"`
	// PID and StartTime (clock ticks since boot, /proc/PID/stat) identify
	// the running process; a reused PID has another start time.
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
	// Node is this machine's node part (nil: control plane only).
	Node *NodeFootprint `json:"node,omitempty"`
}

// NodeFootprint is what a node (kubelet and proxy) of up or join uses.
type NodeFootprint struct {
	Name string `json:"name"`
	// ContainerdAddress and ContainerdNamespace are where the pods'
	// containers are. ContainerdDir is set when Waggle supervises that
	// containerd itself (its root, state and socket are under it), with
	// the daemon's PID and start time.
	ContainerdAddress   string `json:"containerdAddress"`
	ContainerdNamespace string `json:"containerdNamespace"`
	ContainerdDir       string `json:"containerdDir,omitempty"`
	ContainerdPID       int    `json:"containerdPID,omitempty"`
	ContainerdStartTime uint64 `json:"containerdStartTime,omitempty"`
	KubeletRootDir      string `json:"kubeletRootDir"`
	CNIConfDir          string `json:"cniConfDir"`
	// CgroupRoot is the kubelet's parent of the pod cgroups (a cgroup
	// path, /waggle, or a path under a cgroup mount).
	CgroupRoot string `json:"cgroupRoot"`
	// BPFCgroupRoot is the cgroup v2 directory the proxy's eBPF programs
	// attach to ("": the cgroup v2 mount's root) and BPFPinDir where it
	// pins its maps and links ("": the default for the node name).
	BPFCgroupRoot string `json:"bpfCgroupRoot,omitempty"`
	BPFPinDir     string `json:"bpfPinDir,omitempty"`
}

// DefaultDownGrace is how long `waggle down` gives a process after SIGTERM
// before SIGKILL: the kubelet, the proxy and the API server shut down in
// order within it.
const DefaultDownGrace = 30 * time.Second

// FootprintPath is the footprint file of a data dir.
func FootprintPath(dataDir string) string { return filepath.Join(dataDir, "footprint.json") }

// ErrNoFootprint means the data dir has no footprint file.
var ErrNoFootprint = errors.New("no footprint")

// LoadFootprint reads the data dir's footprint (ErrNoFootprint if none).
func LoadFootprint(dataDir string) (*Footprint, error) {
	b, err := os.ReadFile(FootprintPath(dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoFootprint
	}
	if err != nil {
		return nil, err
	}
	var f Footprint
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("footprint %s: %w", FootprintPath(dataDir), err)
	}
	return &f, nil
}

// Save writes the footprint atomically into the data dir.
func (f *Footprint) Save(dataDir string) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp := FootprintPath(dataDir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("footprint: %w", err)
	}
	if err := os.Rename(tmp, FootprintPath(dataDir)); err != nil {
		return fmt.Errorf("footprint: %w", err)
	}
	return nil
}

// Running reports whether the recorded process still runs.
func (f *Footprint) Running() bool {
	if f.PID <= 0 {
		return false
	}
	st, err := procfs.ReadStat(f.PID)
	return err == nil && st.StartTime == f.StartTime && st.State != 'Z'
}

// ClaimDataDir records this process as the data dir's `waggle <command>`
// and returns its footprint (the node part is kept from the last run, for
// `waggle down --purge`, until the node starts again). It refuses a data
// dir whose recorded process still runs: two processes on one data dir
// would share etcd, the kubelet's state and the pods.
func ClaimDataDir(dataDir, command string) (*Footprint, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	old, err := LoadFootprint(dataDir)
	if err != nil && !errors.Is(err, ErrNoFootprint) {
		return nil, err
	}
	if old != nil && old.Running() && old.PID != os.Getpid() {
		return nil, fmt.Errorf("waggle %s already runs on %s (pid %d): stop it first (waggle down --data-dir %s)",
			old.Command, dataDir, old.PID, dataDir)
	}
	st, err := procfs.ReadStat(os.Getpid())
	if err != nil {
		return nil, err
	}
	f := &Footprint{Command: command, PID: os.Getpid(), StartTime: st.StartTime}
	if old != nil {
		f.Node = old.Node
	}
	return f, f.Save(dataDir)
}

// RecordNode records the node part of the footprint, replacing the last
// run's.
func (f *Footprint) RecordNode(dataDir string, n NodeFootprint) error {
	f.Node = &n
	return f.Save(dataDir)
}

// SetContainerd records the containerd a node uses: its address, and the
// daemon when Waggle supervises it (nil: a containerd Waggle did not start).
func (n *NodeFootprint) SetContainerd(addr string, d *ctrdsup.Daemon) {
	n.ContainerdAddress = addr
	if d == nil {
		return
	}
	n.ContainerdDir = filepath.Dir(d.Address())
	n.ContainerdPID = d.PID()
	if st, err := procfs.ReadStat(d.PID()); err == nil {
		n.ContainerdStartTime = st.StartTime
	}
}

// procPID is a live process (PID and start time).
type procPID struct {
	PID       int
	StartTime uint64
	Command   string
}

// findProcesses lists the live `waggle up` and `waggle join` processes
// whose --data-dir is dataDir (as given, or cleaned), by their command
// lines: the processes of a data dir that has no footprint (made before
// footprints were) or whose footprint is stale.
func findProcesses(dataDir string) []procPID {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := filepath.Clean(dataDir)
	var out []procPID
	for _, e := range entries {
		pid := 0
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		cmd, dir, ok := upOrJoin(argv)
		if !ok || filepath.Clean(dir) != want {
			continue
		}
		st, err := procfs.ReadStat(pid)
		if err != nil || st.State == 'Z' {
			continue
		}
		out = append(out, procPID{PID: pid, StartTime: st.StartTime, Command: cmd})
	}
	return out
}

// upOrJoin reports whether argv is `waggle up` or `waggle join` (the
// binary named waggle), and its --data-dir (the default when not given).
func upOrJoin(argv []string) (cmd, dataDir string, ok bool) {
	if len(argv) < 2 || filepath.Base(argv[0]) != "waggle" || (argv[1] != "up" && argv[1] != "join") {
		return "", "", false
	}
	dataDir = Defaults().DataDir
	for i := 2; i < len(argv); i++ {
		a := strings.TrimLeft(argv[i], "-")
		if !strings.HasPrefix(argv[i], "-") {
			continue
		}
		if v, found := strings.CutPrefix(a, "data-dir="); found {
			dataDir = v
		} else if a == "data-dir" && i+1 < len(argv) {
			dataDir = argv[i+1]
			i++
		}
	}
	return argv[1], dataDir, true
}
