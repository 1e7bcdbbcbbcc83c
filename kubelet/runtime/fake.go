package runtime

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Fake is an in-memory Runtime: containers are running as soon as they are
// started and stay so until stopped or told to exit. It backs unit tests and
// the hollow node (--runtime=fake); it runs nothing.
type Fake struct {
	mu         sync.Mutex
	containers map[string]*Container
	images     map[string]bool
	next       int
	// ExecFunc answers Exec (nil: exit code 0 for every command).
	ExecFunc func(c Container, cmd []string) int
	// StartErr, when set, makes StartContainer fail for that container name.
	StartErr map[string]error
}

var _ Runtime = (*Fake)(nil)

// NewFake returns an empty fake runtime whose image store already holds
// images (every pull succeeds unless the name contains "notfound").
func NewFake(images ...string) *Fake {
	f := &Fake{containers: map[string]*Container{}, images: map[string]bool{}}
	for _, i := range images {
		f.images[i] = true
	}
	return f
}

// Version implements Runtime.
func (f *Fake) Version(context.Context) (string, string, error) { return "fake", "0.0.0", nil }

// EnsureImage implements Runtime.
func (f *Fake) EnsureImage(_ context.Context, image string, policy PullPolicy) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.images[image] {
		if policy == PullNever {
			return "", fmt.Errorf("%w: %s (imagePullPolicy is Never)", ErrImageNotFound, image)
		}
		if strings.Contains(image, "notfound") {
			return "", fmt.Errorf("pull image %s: %w", image, ErrNotFound)
		}
		f.images[image] = true
	}
	return "sha256:fake-" + image, nil
}

// StartContainer implements Runtime.
func (f *Fake) StartContainer(_ context.Context, cfg ContainerConfig) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.StartErr[cfg.Name]; err != nil {
		return "", err
	}
	f.next++
	id := fmt.Sprintf("fake%06d", f.next)
	now := time.Now()
	f.containers[id] = &Container{
		ID: id, PodUID: cfg.PodUID, PodName: cfg.PodName, PodNamespace: cfg.PodNamespace,
		Name: cfg.Name, Attempt: cfg.Attempt, Init: cfg.Init, Image: cfg.Image, ImageID: "sha256:fake-" + cfg.Image,
		State: StateRunning, PID: uint32(1000 + f.next), CreatedAt: now, StartedAt: now, LogPath: cfg.LogPath,
	}
	return id, nil
}

// Exit makes a running container exit with code and reason, as if its
// process ended.
func (f *Fake) Exit(id string, code int32, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.containers[id]; ok && c.State == StateRunning {
		c.State, c.ExitCode, c.Reason, c.FinishedAt = StateExited, code, reason, time.Now()
	}
}

// StopContainer implements Runtime.
func (f *Fake) StopContainer(_ context.Context, id string, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.containers[id]; ok && c.State == StateRunning {
		c.State, c.ExitCode, c.Reason, c.FinishedAt = StateExited, 137, "Error", time.Now()
	}
	return nil
}

// RemoveContainer implements Runtime.
func (f *Fake) RemoveContainer(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.containers, id)
	return nil
}

// ListContainers implements Runtime.
func (f *Fake) ListContainers(context.Context) ([]Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Container, 0, len(f.containers))
	for _, c := range f.containers {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Exec implements Runtime.
func (f *Fake) Exec(_ context.Context, id string, cmd []string, _ ExecOptions) (int, error) {
	f.mu.Lock()
	c, ok := f.containers[id]
	var cc Container
	if ok {
		cc = *c
	}
	fn := f.ExecFunc
	f.mu.Unlock()
	if !ok || cc.State != StateRunning {
		return -1, fmt.Errorf("%w: running container %s", ErrNotFound, id)
	}
	if fn == nil {
		return 0, nil
	}
	return fn(cc, cmd), nil
}

// Stats implements Runtime.
func (f *Fake) Stats(_ context.Context, id string) (*ContainerStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.containers[id]; !ok {
		return nil, fmt.Errorf("%w: container %s", ErrNotFound, id)
	}
	return &ContainerStats{Time: time.Now(), CPUUsageNanos: 1e6, MemoryUsage: 4 << 20, MemoryWorkingSet: 4 << 20}, nil
}

// Close implements Runtime.
func (f *Fake) Close() error { return nil }
