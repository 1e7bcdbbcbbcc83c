package kubelet

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/waggle-io/waggle/kubelet/network"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

func (k *Kubelet) kickRelist() {
	select {
	case k.relistKick <- struct{}{}:
	default:
	}
}

// relistLoop refreshes the runtime's view every SyncFrequency (or when
// kicked) and wakes the workers whose containers changed.
func (k *Kubelet) relistLoop(ctx context.Context) {
	t := time.NewTicker(k.cfg.SyncFrequency)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-k.relistKick:
		}
		k.relist(ctx)
	}
}

func sameContainers(a, b []runtime.Container) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]runtime.Container{}
	for _, c := range a {
		m[c.ID] = c
	}
	for _, c := range b {
		o, ok := m[c.ID]
		if !ok || o.State != c.State {
			return false
		}
	}
	return true
}

// relist lists the runtime's containers once. On failure the previous view
// is kept and workers pause (see runtimeErr), so that an unreachable
// containerd never looks like "no containers".
func (k *Kubelet) relist(ctx context.Context) {
	k.relistMu.Lock()
	defer k.relistMu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	listedAt := time.Now()
	list, err := k.rt.ListContainers(lctx)
	if err != nil {
		if ctx.Err() == nil {
			if p := k.runtimeErr.Load(); p == nil || *p == nil {
				k.log.Warn("runtime relist failed; pod workers wait", "err", err)
			}
			k.runtimeErr.Store(&err)
		}
		return
	}
	if p := k.runtimeErr.Load(); p != nil && *p != nil {
		k.log.Info("runtime reachable again")
	}
	var nilErr error
	k.runtimeErr.Store(&nilErr)
	snap := map[types.UID][]runtime.Container{}
	for _, c := range list {
		snap[types.UID(c.PodUID)] = append(snap[types.UID(c.PodUID)], c)
	}
	k.mu.Lock()
	old := k.snapshot
	k.snapshot, k.snapshotAt = snap, listedAt
	var changed []*podWorker
	var orphans []types.UID
	for uid, w := range k.workers {
		if !sameContainers(old[uid], snap[uid]) {
			changed = append(changed, w)
		}
	}
	if k.sourcesReady.Load() {
		for uid := range snap {
			if _, ok := k.workers[uid]; !ok {
				orphans = append(orphans, uid)
			}
		}
	}
	k.mu.Unlock()
	for _, w := range changed {
		w.poke()
	}
	if k.sourcesReady.Load() {
		k.cleanupOrphans(ctx, snap, orphans)
	}
}

// cleanupOrphans removes containers and sandboxes of pods no source knows.
func (k *Kubelet) cleanupOrphans(ctx context.Context, snap map[types.UID][]runtime.Container, orphans []types.UID) {
	for _, uid := range orphans {
		for _, c := range snap[uid] {
			k.log.Info("removing orphaned container", "pod", c.PodNamespace+"/"+c.PodName, "container", c.Name)
			k.rt.StopContainer(ctx, c.ID, 2*time.Second)
			k.rt.RemoveContainer(ctx, c.ID)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(k.cfg.RootDir, "pods"))
	for _, e := range ents {
		uid := types.UID(e.Name())
		k.mu.Lock()
		_, known := k.workers[uid]
		_, hasCtrs := snap[uid]
		k.mu.Unlock()
		if known || hasCtrs {
			continue
		}
		k.log.Info("removing orphaned pod sandbox", "pod", uid)
		if err := k.cleanupSandbox(ctx, uid, network.Pod{UID: string(uid)}); err != nil {
			k.log.Warn("remove orphaned sandbox", "pod", uid, "err", err)
		}
	}
	// Image volumes whose pod dir is gone already (a kubelet stopped
	// between the two) are released too. Only a stopped kubelet leaves
	// them (cleanupSandbox releases them before the dir goes), so the
	// runtime is asked once per start, not at every relist.
	if k.imageVolumesSwept.Load() {
		return
	}
	uids, err := k.rt.ImageMountPods(ctx)
	if err != nil {
		k.log.Warn("list image volumes", "err", err)
		return
	}
	k.imageVolumesSwept.Store(true)
	for _, u := range uids {
		uid := types.UID(u)
		k.mu.Lock()
		_, known := k.workers[uid]
		k.mu.Unlock()
		if _, err := os.Stat(k.podDir(uid)); known || err == nil {
			continue
		}
		k.log.Info("releasing orphaned image volumes", "pod", uid)
		if err := k.rt.UnmountImages(ctx, u); err != nil {
			k.log.Warn("release orphaned image volumes", "pod", uid, "err", err)
		}
	}
}
