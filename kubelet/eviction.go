package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/waggle-io/waggle/internal/cgroupfs"
	"github.com/waggle-io/waggle/kubelet/internal/eviction"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// Node pressure and eviction (upstream's eviction manager, package
// kubelet/internal/eviction): the signals come from the kubelet's own stats
// summary (nodestats.go: the root cgroup and /proc, statfs of the root dir
// and of containerd's snapshotter root), the manager runs every
// EvictionMonitoringInterval, its conditions go into the node status
// (fillStatus), its admission into admitLocked, and an eviction is handed
// to the pod's worker (evictPod), which stops the containers and fails the
// pod with reason Evicted.

// The node condition events, as upstream's nodestatus setters record them.
const (
	EventNodeHasSufficientMemory   = "NodeHasSufficientMemory"
	EventNodeHasInsufficientMemory = "NodeHasInsufficientMemory"
	EventNodeHasNoDiskPressure     = "NodeHasNoDiskPressure"
	EventNodeHasDiskPressure       = "NodeHasDiskPressure"
	EventNodeHasSufficientPID      = "NodeHasSufficientPID"
	EventNodeHasInsufficientPID    = "NodeHasInsufficientPID"
)

// pressureConditions are upstream's three setters: condition, whether the
// manager reports it, and the reasons, messages and events either way.
func (k *Kubelet) pressureConditions() []pressureCondition {
	return []pressureCondition{
		{v1.NodeMemoryPressure, k.eviction.IsUnderMemoryPressure(),
			"KubeletHasInsufficientMemory", "kubelet has insufficient memory available", EventNodeHasInsufficientMemory,
			"KubeletHasSufficientMemory", "kubelet has sufficient memory available", EventNodeHasSufficientMemory},
		{v1.NodeDiskPressure, k.eviction.IsUnderDiskPressure(),
			"KubeletHasDiskPressure", "kubelet has disk pressure", EventNodeHasDiskPressure,
			"KubeletHasNoDiskPressure", "kubelet has no disk pressure", EventNodeHasNoDiskPressure},
		{v1.NodePIDPressure, k.eviction.IsUnderPIDPressure(),
			"KubeletHasInsufficientPID", "kubelet has insufficient PID available", EventNodeHasInsufficientPID,
			"KubeletHasSufficientPID", "kubelet has sufficient PID available", EventNodeHasSufficientPID},
	}
}

type pressureCondition struct {
	typ                                 v1.NodeConditionType
	pressure                            bool
	trueReason, trueMessage, trueEvent  string
	falseReason, falseMessage, falseEvt string
}

// condition is the node condition and, when its status changes (or it is
// new), the event to record.
func (p pressureCondition) condition(old *v1.NodeCondition) (v1.NodeCondition, string) {
	c := v1.NodeCondition{Type: p.typ, Status: v1.ConditionFalse, Reason: p.falseReason, Message: p.falseMessage}
	event := p.falseEvt
	if p.pressure {
		c.Status, c.Reason, c.Message, event = v1.ConditionTrue, p.trueReason, p.trueMessage, p.trueEvent
	}
	if old != nil && old.Status == c.Status {
		event = ""
	}
	return c, event
}

// startEviction builds the eviction manager and image garbage collector
// (the thresholds were checked by Validate) and runs their loops until ctx
// ends; wg tracks them.
func (k *Kubelet) startEviction(ctx context.Context, wg *sync.WaitGroup) {
	th, _ := eviction.ParseThresholdConfig(k.cfg.EvictionHard, k.cfg.EvictionSoft, k.cfg.EvictionSoftGracePeriod, k.cfg.EvictionMinimumReclaim)
	k.imageGC = newImageGC(k)
	k.eviction = eviction.NewManager(eviction.Config{
		Thresholds:               th,
		PressureTransitionPeriod: k.cfg.EvictionPressureTransitionPeriod,
		MaxPodGracePeriodSeconds: int64(k.cfg.EvictionMaxPodGracePeriod),
		DedicatedImageFs:         k.dedicatedImageFs(ctx),
	}, eviction.Deps{
		Summary:     (*provider)(k),
		ImageGC:     k.imageGC,
		ContainerGC: containerGC{k},
		Kill:        k.evictPod,
		Recorder:    k.recorder,
		NodeRef:     k.nodeRef(),
		Log:         k.log,
		Evictions:   k.metrics.evictions,
		StatsAge:    k.metrics.evictionStatsAge,
	})
	// A first look before the node registers, so its first status is true.
	if _, err := k.eviction.Synchronize(ctx, nil); err != nil {
		k.log.Warn("eviction manager: first look", "err", err)
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		k.eviction.Run(ctx, k.cfg.EvictionMonitoringInterval, k.activePods, k.podCleanedUp)
	}()
	go func() { defer wg.Done(); k.imageGC.run(ctx) }()
}

// dedicatedImageFs reports whether the runtime's images live on another
// filesystem than the kubelet's root dir.
func (k *Kubelet) dedicatedImageFs(ctx context.Context) bool {
	dir := k.imageFsDir(ctx)
	if dir == "" {
		return false
	}
	var a, b syscall.Stat_t
	if syscall.Stat(existingDir(k.cfg.RootDir), &a) != nil || syscall.Stat(existingDir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

// imageFsDir is the runtime's image filesystem directory ("" when the
// runtime has none or cannot say).
func (k *Kubelet) imageFsDir(ctx context.Context) string {
	s, ok := k.rt.(runtime.Storage)
	if !ok {
		return ""
	}
	dir, err := s.ImageFsDir(ctx)
	if err != nil {
		k.log.Debug("image filesystem", "err", err)
		return ""
	}
	return dir
}

func existingDir(dir string) string {
	for dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = dirOf(dir)
	}
	return dir
}

// activePods are the pods the manager may evict: those with a worker that
// are not rejected, not terminal and not being deleted.
func (k *Kubelet) activePods() []*v1.Pod {
	k.mu.Lock()
	ws := make([]*podWorker, 0, len(k.workers))
	for _, w := range k.workers {
		if w.rejected == nil {
			ws = append(ws, w)
		}
	}
	k.mu.Unlock()
	var out []*v1.Pod
	for _, w := range ws {
		if w.evict.Load() != nil {
			continue
		}
		pod, gone := w.snapshot()
		if gone || pod.DeletionTimestamp != nil || isTerminalPhase(pod.Status.Phase) {
			continue
		}
		out = append(out, pod)
	}
	return out
}

// podCleanedUp: none of the pod's containers runs any more.
func (k *Kubelet) podCleanedUp(p *v1.Pod) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.snapshot[p.UID] {
		if c.State == runtime.StateRunning || c.State == runtime.StateCreated {
			return false
		}
	}
	return true
}

// evictRequest is an eviction handed to a pod worker.
type evictRequest struct {
	grace     time.Duration
	message   string
	condition v1.PodCondition
}

// evictPod is the manager's KillPodFunc: the pod's worker stops its
// containers within grace and fails it with reason Evicted.
func (k *Kubelet) evictPod(pod *v1.Pod, graceSeconds int64, message string, cond *v1.PodCondition) error {
	k.mu.Lock()
	w := k.workers[pod.UID]
	k.mu.Unlock()
	if w == nil {
		return fmt.Errorf("pod %s/%s has no worker", pod.Namespace, pod.Name)
	}
	req := &evictRequest{grace: time.Duration(max(graceSeconds, 0)) * time.Second, message: message}
	if cond != nil {
		req.condition = *cond
	}
	w.evict.CompareAndSwap(nil, req)
	w.poke()
	return nil
}

// nodeRef is the node as upstream's kubelet refers to it in events.
func (k *Kubelet) nodeRef() *v1.ObjectReference {
	return &v1.ObjectReference{Kind: "Node", Name: k.cfg.NodeName, UID: types.UID(k.cfg.NodeName)}
}

// containerGC is node-level reclaim of dead containers for disk pressure:
// every exited container that is not its container's newest attempt (the
// one a pod's status reads), as upstream's DeleteAllUnusedContainers keeps
// none but what the status needs. Containers of pods without a worker are
// the relist's orphans and go there.
type containerGC struct{ k *Kubelet }

func (g containerGC) DeleteAllUnusedContainers(ctx context.Context) error {
	k := g.k
	k.mu.Lock()
	var dead []runtime.Container
	for _, list := range k.snapshot {
		for _, l := range byName(list) {
			for _, c := range l[1:] {
				if c.State == runtime.StateExited {
					dead = append(dead, c)
				}
			}
		}
	}
	k.mu.Unlock()
	var errs []string
	for _, c := range dead {
		if err := k.rt.RemoveContainer(ctx, c.ID); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(dead) > 0 {
		k.log.Info("removed dead containers to reclaim disk", "count", len(dead)-len(errs))
		k.kickRelist()
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove dead containers: %s", strings.Join(errs, "; "))
	}
	return nil
}

// podDiskStats fills a container's writable layer and log usage and the
// pod's process count, for disk and PID ranking.
func (k *Kubelet) podDiskStats(ctx context.Context, c runtime.Container, cs *statsapi.ContainerStats) {
	if s, ok := k.rt.(runtime.Storage); ok {
		if b, n, err := k.layerUsage.get(ctx, s, c.ID, time.Now()); err == nil {
			cs.Rootfs = &statsapi.FsStats{Time: cs.StartTime, UsedBytes: &b, InodesUsed: &n}
		}
	}
	if c.LogPath != "" {
		if fi, err := os.Stat(c.LogPath); err == nil {
			b, n := uint64(fi.Size()), uint64(1) //nolint:gosec // sizes are non-negative
			cs.Logs = &statsapi.FsStats{Time: cs.StartTime, UsedBytes: &b, InodesUsed: &n}
		}
	}
}

// podProcesses counts the processes of a pod's cgroup (pids.current).
func (k *Kubelet) podProcesses(uid types.UID) *statsapi.ProcessStats {
	root, err := cgroupfs.V2Root()
	path := ""
	if err == nil {
		path = filepath.Join(root, podCgroup(k.cfg.CgroupRoot, uid), "pids.current")
	} else if m, ok := cgroupfs.V1Controller("pids"); ok {
		path = filepath.Join(m, podCgroup(k.cfg.CgroupRoot, uid), "pids.current")
	}
	if path == "" {
		return nil
	}
	n, err := readUint(path)
	if err != nil {
		return nil
	}
	return &statsapi.ProcessStats{ProcessCount: &n}
}

// layerUsageTTL is how long a measured writable layer's usage is reused:
// measuring walks the layer (containerd's snapshot Usage), and the summary
// is built every 10 s for the eviction manager, so each container's layer is
// walked at most once a minute, as cAdvisor's disk-usage housekeeping does.
const layerUsageTTL = time.Minute

// layerUsageCache remembers each container's last writable-layer usage.
type layerUsageCache struct {
	mu sync.Mutex
	m  map[string]layerUsage
}

type layerUsage struct {
	bytes, inodes uint64
	at            time.Time
}

func (c *layerUsageCache) get(ctx context.Context, s runtime.Storage, id string, now time.Time) (bytes, inodes uint64, err error) {
	c.mu.Lock()
	u, ok := c.m[id]
	c.mu.Unlock()
	if ok && now.Sub(u.at) < layerUsageTTL {
		return u.bytes, u.inodes, nil
	}
	if bytes, inodes, err = s.WritableLayerUsage(ctx, id); err != nil {
		return 0, 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]layerUsage{}
	}
	// Entries of containers long gone are dropped as new ones come.
	for other, o := range c.m {
		if now.Sub(o.at) > 10*layerUsageTTL {
			delete(c.m, other)
		}
	}
	c.m[id] = layerUsage{bytes: bytes, inodes: inodes, at: now}
	return bytes, inodes, nil
}
