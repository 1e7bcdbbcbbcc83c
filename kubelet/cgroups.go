package kubelet

import (
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

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
	ms, _ := cgroupfs.Hierarchies()
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Path)
	}
	return out
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

// podResources are the pod cgroup's settings, as upstream's
// ResourceConfigForPod computes them (with CFS quota enforced): shares from
// the pod's summed requests; for a Guaranteed pod the summed CPU and memory
// limits too, for a Burstable one each limit that every container (or the
// pod-level resources) declares; a BestEffort pod only the minimum shares.
func podResources(pod *v1.Pod) runtime.Resources {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	lims := resourcehelper.PodLimits(pod, resourcehelper.PodResourcesOptions{})
	cpuDeclared, memDeclared := true, true
	for c := range podutil.ContainerIter(&pod.Spec, podutil.InitContainers|podutil.Containers) {
		cpuDeclared = cpuDeclared && !c.Resources.Limits.Cpu().IsZero()
		memDeclared = memDeclared && !c.Resources.Limits.Memory().IsZero()
	}
	if pr := pod.Spec.Resources; pr != nil {
		cpuDeclared = cpuDeclared || !pr.Limits.Cpu().IsZero()
		memDeclared = memDeclared || !pr.Limits.Memory().IsZero()
	}
	r := runtime.Resources{CPUShares: milliToShares(reqs.Cpu().MilliValue()), CPUPeriod: 100000}
	quota := max(lims.Cpu().MilliValue()*100000/1000, 1000)
	switch qosClass(pod) {
	case v1.PodQOSGuaranteed:
		r.CPUQuota, r.MemoryLimit = quota, lims.Memory().Value()
	case v1.PodQOSBurstable:
		if cpuDeclared {
			r.CPUQuota = quota
		}
		if memDeclared {
			r.MemoryLimit = lims.Memory().Value()
		}
	default:
		r.CPUShares = milliToShares(0)
	}
	return r
}

// loosest is the larger of two cgroup settings, field by field (zero quota
// or memory limit: unlimited): what a pod cgroup holds while its
// containers move from one to the other.
func loosest(a, b runtime.Resources) runtime.Resources {
	out := runtime.Resources{CPUShares: max(a.CPUShares, b.CPUShares), CPUPeriod: max(a.CPUPeriod, b.CPUPeriod)}
	if a.CPUQuota > 0 && b.CPUQuota > 0 {
		out.CPUQuota = max(a.CPUQuota, b.CPUQuota)
	}
	if a.MemoryLimit > 0 && b.MemoryLimit > 0 {
		out.MemoryLimit = max(a.MemoryLimit, b.MemoryLimit)
	}
	return out
}

func milliToShares(m int64) uint64 {
	s := m * 1024 / 1000
	if s < 2 {
		s = 2
	}
	return uint64(s)
}
