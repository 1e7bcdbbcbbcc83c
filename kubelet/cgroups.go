package kubelet

import (
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/waggle-io/waggle/internal/cgroupfs"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// podCgroup is the pod's cgroup path under root ("pod<uid>", cgroupfs
// style, as the kubelet's cgroupfs driver names it).
func podCgroup(root string, uid types.UID) string {
	return filepath.Join(cgroupPath(root), "pod"+strings.ReplaceAll(string(uid), "-", "_"))
}

// cgroupPath accepts a cgroup path ("/waggle/n1") or a filesystem path under
// a cgroup mount ("/sys/fs/cgroup/unified/waggle/n1") and returns the former.
func cgroupPath(root string) string {
	for _, m := range cgroupMountPoints() {
		if rel, ok := strings.CutPrefix(root, m+"/"); ok {
			return "/" + rel
		}
	}
	if !strings.HasPrefix(root, "/") {
		root = "/" + root
	}
	return filepath.Clean(root)
}

// cgroupMountPoints lists every cgroup (v1 and v2) mount point.
func cgroupMountPoints() []string {
	ms, _ := cgroupfs.Mounts()
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Path)
	}
	return out
}

// removeCgroup removes a pod's (empty) cgroup in every hierarchy. Its
// container cgroups are gone already: runc removes them with the task.
func removeCgroup(path string) {
	if path == "" || path == "/" {
		return
	}
	for _, m := range cgroupMountPoints() {
		os.Remove(filepath.Join(m, path))
	}
}

// applyResources maps requests and limits to CPU shares, CFS quota and the
// memory limit, as the kubelet's cgroup manager does.
func applyResources(cfg *runtime.ContainerConfig, r v1.ResourceRequirements) {
	req, hasReq := r.Requests[v1.ResourceCPU]
	lim, hasLim := r.Limits[v1.ResourceCPU]
	switch {
	case hasReq:
		cfg.CPUShares = milliToShares(req.MilliValue())
	case hasLim:
		cfg.CPUShares = milliToShares(lim.MilliValue())
	default:
		// No CPU asked for: the minimum, as upstream (not the cgroup's
		// default 1024, which would outweigh every container that asks).
		cfg.CPUShares = milliToShares(0)
	}
	if hasLim {
		cfg.CPUPeriod = 100000
		q := lim.MilliValue() * 100000 / 1000
		if q < 1000 {
			q = 1000
		}
		cfg.CPUQuota = q
	}
	if m, ok := r.Limits[v1.ResourceMemory]; ok {
		cfg.MemoryLimit = m.Value()
	}
}

func milliToShares(m int64) uint64 {
	s := m * 1024 / 1000
	if s < 2 {
		s = 2
	}
	return uint64(s)
}
