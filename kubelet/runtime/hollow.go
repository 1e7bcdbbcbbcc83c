package runtime

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"
)

// Hollow is the hollow node's runtime (--runtime=hollow, as kubemark's
// hollow kubelet): containers are records in memory, running from the
// moment they are started until they are stopped, and nothing is executed.
// It lets one machine carry hundreds of nodes for control-plane scale
// tests. Every image is present except under imagePullPolicy Never, where
// only images pulled before count.
type Hollow struct {
	mu         sync.Mutex
	containers map[string]*Container
	podCgroups map[string]Resources
	images     map[string]bool
	// imageMounts: pod UID → target → image.
	imageMounts map[string]map[string]string
	next        int
}

var _ Runtime = (*Hollow)(nil)

// NewHollow returns a hollow runtime whose image store holds images.
func NewHollow(images ...string) *Hollow {
	h := &Hollow{containers: map[string]*Container{}, images: map[string]bool{}, imageMounts: map[string]map[string]string{}}
	for _, i := range images {
		h.images[i] = true
	}
	return h
}

// Version implements Runtime.
func (h *Hollow) Version(context.Context) (string, string, error) { return "hollow", "0.0.0", nil }

// EnsureImage implements Runtime.
func (h *Hollow) EnsureImage(_ context.Context, image string, policy PullPolicy) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.images[image] {
		if policy == PullNever {
			return "", fmt.Errorf("%w: %s (imagePullPolicy is Never)", ErrImageNotFound, image)
		}
		h.images[image] = true
	}
	return "sha256:hollow-" + image, nil
}

// StartContainer implements Runtime.
func (h *Hollow) StartContainer(_ context.Context, cfg ContainerConfig) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	id := fmt.Sprintf("hollow%06d", h.next)
	now := time.Now()
	h.containers[id] = &Container{
		ID: id, PodUID: cfg.PodUID, PodName: cfg.PodName, PodNamespace: cfg.PodNamespace,
		Name: cfg.Name, Attempt: cfg.Attempt, Init: cfg.Init, Image: cfg.Image, ImageID: "sha256:hollow-" + cfg.Image,
		State: StateRunning, PID: uint32(1000 + h.next), CreatedAt: now, StartedAt: now, LogPath: cfg.LogPath,
		ResourcesRecord: cfg.ResourcesRecord, StdinOnce: cfg.Stdin && cfg.StdinOnce,
	}
	return id, nil
}

// SetPodCgroup implements Runtime: a hollow node only records it.
func (h *Hollow) SetPodCgroup(_ context.Context, path string, r Resources) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.podCgroups == nil {
		h.podCgroups = map[string]Resources{}
	}
	h.podCgroups[path] = r
	return nil
}

// RemovePodCgroup implements Runtime: the record goes.
func (h *Hollow) RemovePodCgroup(_ context.Context, path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.podCgroups, path)
	return nil
}

// PodCgroup returns what SetPodCgroup last set for path.
func (h *Hollow) PodCgroup(path string) (Resources, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.podCgroups[path]
	return r, ok
}

// UpdateResources implements Runtime: a hollow container keeps the record.
func (h *Hollow) UpdateResources(_ context.Context, id string, _ Resources, record string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.containers[id]
	if !ok {
		return fmt.Errorf("container %s: %w", id, ErrNotFound)
	}
	if c.State != StateRunning {
		return fmt.Errorf("container %s is not running", id)
	}
	c.ResourcesRecord = record
	return nil
}

// Exit ends a running container with code and reason, as if its process
// had ended (a hollow node's containers otherwise run until stopped).
func (h *Hollow) Exit(id string, code int32, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.containers[id]; ok && c.State == StateRunning {
		c.State, c.ExitCode, c.Reason, c.FinishedAt = StateExited, code, reason, time.Now()
	}
}

// StopContainer implements Runtime.
func (h *Hollow) StopContainer(_ context.Context, id string, _ time.Duration) error {
	h.Exit(id, 137, "Error")
	return nil
}

// RemoveContainer implements Runtime.
func (h *Hollow) RemoveContainer(_ context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.containers, id)
	return nil
}

// ListContainers implements Runtime.
func (h *Hollow) ListContainers(context.Context) ([]Container, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Container, 0, len(h.containers))
	for _, c := range h.containers {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Get returns container id as recorded.
func (h *Hollow) Get(id string) (Container, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.containers[id]
	if !ok {
		return Container{}, false
	}
	return *c, true
}

// Exec implements Runtime: a hollow container runs nothing, so every
// command "succeeds" with exit code 0 and no output.
func (h *Hollow) Exec(_ context.Context, id string, _ []string, _ ExecOptions) (int, error) {
	if c, ok := h.Get(id); !ok || c.State != StateRunning {
		return -1, fmt.Errorf("%w: running container %s", ErrNotFound, id)
	}
	return 0, nil
}

// Stats implements Runtime with small constant figures.
// StdinDone implements Runtime: hollow containers read no stdin.
func (h *Hollow) StdinDone(context.Context, string) error { return nil }

func (h *Hollow) Stats(_ context.Context, id string) (*ContainerStats, error) {
	if _, ok := h.Get(id); !ok {
		return nil, fmt.Errorf("%w: container %s", ErrNotFound, id)
	}
	return &ContainerStats{Time: time.Now(), CPUUsageNanos: 1e6, MemoryUsage: 4 << 20, MemoryWorkingSet: 4 << 20}, nil
}

// Close implements Runtime.
func (h *Hollow) Close() error { return nil }

// MountImage implements Runtime: a hollow container reads no files, so an
// image volume is only recorded.
func (h *Hollow) MountImage(_ context.Context, podUID, image, target string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.imageMounts[podUID] == nil {
		h.imageMounts[podUID] = map[string]string{}
	}
	h.imageMounts[podUID][target] = image
	return nil
}

// UnmountImages implements Runtime.
func (h *Hollow) UnmountImages(_ context.Context, podUID string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.imageMounts, podUID)
	return nil
}

// ImageMountPods implements Runtime.
func (h *Hollow) ImageMountPods(context.Context) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.imageMounts)), nil
}

// ImageMounts returns the image mounted at each target for the pod.
func (h *Hollow) ImageMounts(podUID string) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.imageMounts[podUID])
}
