package kubelet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

// Image garbage collection by disk usage, as upstream's realImageGCManager:
// every ImageGCPeriod (5 m) the images are listed and each remembered with
// when it was first seen and last used (by any container, running or
// exited, or an image volume of a pod on the node); when the image
// filesystem's usage reaches --image-gc-high-threshold, unused images
// first seen at least --image-minimum-gc-age ago are removed, least
// recently used first, until usage is down to --image-gc-low-threshold.
// Images the node cannot get back — every name under a node-local
// registry (waggle.local, --local-registries) — are pinned, never removed,
// as containerd's CRI pins its sandbox image.

// Upstream's Event reasons (pkg/kubelet/events).
const (
	EventFreeDiskSpaceFailed = "FreeDiskSpaceFailed"
	EventImageGCFailed       = "ImageGCFailed"
	EventInvalidDiskCapacity = "InvalidDiskCapacity"
)

type imageRecord struct {
	firstDetected time.Time
	lastUsed      time.Time
	size          int64
	pinned        bool
}

type imageGC struct {
	k *Kubelet

	mu      sync.Mutex
	records map[string]*imageRecord
}

func newImageGC(k *Kubelet) *imageGC {
	return &imageGC{k: k, records: map[string]*imageRecord{}}
}

func (g *imageGC) storage() (runtime.Storage, bool) {
	s, ok := g.k.rt.(runtime.Storage)
	return s, ok
}

// run collects every ImageGCPeriod until ctx ends, as upstream's
// StartGarbageCollection (a high threshold of 100 disables it); a second
// failure in a row is an ImageGCFailed event.
func (g *imageGC) run(ctx context.Context) {
	if _, ok := g.storage(); !ok || g.k.cfg.ImageGCHighThresholdPercent >= 100 {
		return
	}
	prevFailed := false
	for {
		if err := g.GarbageCollect(ctx); err != nil && ctx.Err() == nil {
			if prevFailed {
				g.k.log.Error("image garbage collection failed multiple times in a row", "err", err)
				g.k.nodeEvent(v1.EventTypeWarning, EventImageGCFailed, "%s", err.Error())
			} else {
				g.k.log.Warn("image garbage collection failed once", "err", err)
			}
			prevFailed = true
		} else {
			prevFailed = false
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(g.k.cfg.ImageGCPeriod):
		}
	}
}

// imagesInUse are the IDs of the images of every container the runtime has
// (exited ones included, as upstream) and of the image volumes of the pods
// with a worker.
func (g *imageGC) imagesInUse(images []runtime.Image) map[string]bool {
	k := g.k
	inUse := map[string]bool{}
	k.mu.Lock()
	for _, list := range k.snapshot {
		for _, c := range list {
			if c.ImageID != "" {
				inUse[c.ImageID] = true
			}
		}
	}
	ws := make([]*podWorker, 0, len(k.workers))
	for _, w := range k.workers {
		ws = append(ws, w)
	}
	k.mu.Unlock()
	byName := map[string]string{}
	for _, im := range images {
		for _, n := range im.RepoTags {
			byName[n] = im.ID
		}
	}
	use := func(ref string) {
		if n, err := runtime.NormalizeImage(ref); err == nil && byName[n] != "" {
			inUse[byName[n]] = true
		}
	}
	for _, w := range ws {
		pod, _ := w.snapshot()
		for _, vol := range pod.Spec.Volumes {
			if vol.Image != nil {
				use(vol.Image.Reference)
			}
		}
	}
	return inUse
}

// detect lists the images, records new ones and marks those in use.
func (g *imageGC) detect(ctx context.Context, now time.Time) (map[string]bool, error) {
	s, _ := g.storage()
	images, err := s.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	inUse := g.imagesInUse(images)
	g.mu.Lock()
	defer g.mu.Unlock()
	current := map[string]bool{}
	for _, im := range images {
		current[im.ID] = true
		r := g.records[im.ID]
		if r == nil {
			r = &imageRecord{firstDetected: now}
			g.records[im.ID] = r
		}
		if inUse[im.ID] {
			r.lastUsed = now
		}
		r.size = im.Size
		r.pinned = g.pinned(im)
	}
	for id := range g.records {
		if !current[id] {
			delete(g.records, id)
		}
	}
	return inUse, nil
}

// pinned: every name of the image is under a node-local registry.
func (g *imageGC) pinned(im runtime.Image) bool {
	if len(im.RepoTags) == 0 {
		return false
	}
	for _, n := range im.RepoTags {
		if !localOnlyRef(n, g.k.cfg.LocalRegistries) {
			return false
		}
	}
	return true
}

func localOnlyRef(ref string, others []string) bool {
	if runtime.LocalOnly(ref) {
		return true
	}
	for _, r := range others {
		if strings.HasPrefix(ref, r+"/") {
			return true
		}
	}
	return false
}

type evictionInfo struct {
	id string
	imageRecord
}

// inEvictionOrder is every unused, unpinned image, least recently used
// first (ties: first detected first).
func (g *imageGC) inEvictionOrder(ctx context.Context, now time.Time) ([]evictionInfo, error) {
	inUse, err := g.detect(ctx, now)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []evictionInfo
	for id, r := range g.records {
		if inUse[id] || r.pinned {
			continue
		}
		out = append(out, evictionInfo{id: id, imageRecord: *r})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].lastUsed.Equal(out[j].lastUsed) {
			return out[i].firstDetected.Before(out[j].firstDetected)
		}
		return out[i].lastUsed.Before(out[j].lastUsed)
	})
	return out, nil
}

// imageFs is the image filesystem's capacity and available bytes.
func (g *imageGC) imageFs(ctx context.Context) (capacity, available int64, err error) {
	dir := g.k.imageFsDir(ctx)
	if dir == "" {
		dir = g.k.cfg.RootDir
	}
	st := fsStats(dir, metav1.Now())
	if st == nil || st.CapacityBytes == nil || st.AvailableBytes == nil {
		return 0, 0, fmt.Errorf("statfs of the image filesystem (%s) failed", dir)
	}
	return int64(*st.CapacityBytes), int64(*st.AvailableBytes), nil //nolint:gosec // bytes fit
}

// GarbageCollect is upstream's GarbageCollect (without MaxAge): at or over
// the high threshold, free down to the low one; an FreeDiskSpaceFailed event
// when the unused images were not enough.
func (g *imageGC) GarbageCollect(ctx context.Context) error {
	now := time.Now()
	images, err := g.inEvictionOrder(ctx, now)
	if err != nil {
		return err
	}
	capacity, available, err := g.imageFs(ctx)
	if err != nil {
		return err
	}
	available = min(available, capacity)
	if capacity == 0 {
		err := errors.New("invalid capacity 0 on image filesystem")
		g.k.nodeEvent(v1.EventTypeWarning, EventInvalidDiskCapacity, "%s", err.Error())
		return err
	}
	usagePercent := 100 - int(available*100/capacity)
	high, low := g.k.cfg.ImageGCHighThresholdPercent, g.k.cfg.ImageGCLowThresholdPercent
	if usagePercent < high {
		return nil
	}
	amountToFree := capacity*int64(100-low)/100 - available
	g.k.log.Info("disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold",
		"usage", usagePercent, "highThreshold", high, "amountToFree", amountToFree, "lowThreshold", low)
	freed, err := g.freeSpace(ctx, amountToFree, now, images)
	if err != nil {
		return err
	}
	if freed < amountToFree {
		message := fmt.Sprintf("Insufficient free disk space on the node's image filesystem (%d%% of %s used). "+
			"Failed to free sufficient space by deleting unused images (freed %d bytes). "+
			"Investigate disk usage, as it could be used by active images, logs, volumes, or other data.",
			usagePercent, formatSize(capacity), freed)
		g.k.nodeEvent(v1.EventTypeWarning, EventFreeDiskSpaceFailed, "%s", message)
		return errors.New(message)
	}
	return nil
}

// DeleteUnusedImages removes every eligible unused image (node-level
// reclaim of the eviction manager).
func (g *imageGC) DeleteUnusedImages(ctx context.Context) error {
	if _, ok := g.storage(); !ok {
		return nil
	}
	now := time.Now()
	images, err := g.inEvictionOrder(ctx, now)
	if err != nil {
		return err
	}
	_, err = g.freeSpace(ctx, math.MaxInt64, now, images)
	return err
}

// freeSpace removes images in order, skipping those used now or younger
// than the minimum age, until bytesToFree are freed.
func (g *imageGC) freeSpace(ctx context.Context, bytesToFree int64, freeTime time.Time, images []evictionInfo) (int64, error) {
	s, _ := g.storage()
	var errs []error
	var freed int64
	for _, im := range images {
		if !im.lastUsed.Before(freeTime) && !im.lastUsed.IsZero() {
			continue
		}
		if freeTime.Sub(im.firstDetected) < g.k.cfg.ImageMinimumGCAge {
			continue
		}
		g.k.log.Info("removing image to free bytes", "imageID", im.id, "size", im.size)
		if err := s.RemoveImage(ctx, im.id); err != nil {
			errs = append(errs, err)
			continue
		}
		g.mu.Lock()
		delete(g.records, im.id)
		g.mu.Unlock()
		freed += im.size
		if freed >= bytesToFree {
			break
		}
	}
	if len(errs) > 0 {
		return freed, fmt.Errorf("wanted to free %d bytes, but freed %d bytes space with errors in image deletion: %w", bytesToFree, freed, errors.Join(errs...))
	}
	return freed, nil
}

// formatSize is upstream's human-readable size.
func formatSize(sizeBytes int64) string {
	const (
		KiB = 1024
		MiB = 1024 * KiB
		GiB = 1024 * MiB
		TiB = 1024 * GiB
	)
	size := float64(sizeBytes)
	switch {
	case size < KiB:
		return fmt.Sprintf("%d B", sizeBytes)
	case size < MiB:
		return fmt.Sprintf("%.1f KiB", size/KiB)
	case size < GiB:
		return fmt.Sprintf("%.1f MiB", size/MiB)
	case size < TiB:
		return fmt.Sprintf("%.1f GiB", size/GiB)
	}
	return fmt.Sprintf("%.1f TiB", size/TiB)
}
