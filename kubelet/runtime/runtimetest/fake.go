// Package runtimetest holds the test double of the kubelet's container
// runtime: a hollow runtime whose containers tests can make exit, whose
// exec answers are scripted, and whose starts and pulls can be made to
// fail. It serves tests only; no production package imports it.
package runtimetest

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

// Fake is runtime.Hollow with hooks for tests.
type Fake struct {
	*runtime.Hollow
	// ExecFunc answers Exec (nil: exit code 0 for every command).
	ExecFunc func(c runtime.Container, cmd []string) int
	// StartErr, when set, makes StartContainer fail for that container name.
	StartErr map[string]error

	mu      sync.Mutex
	configs map[string]runtime.ContainerConfig
}

var _ runtime.Runtime = (*Fake)(nil)

// NewFake returns an empty fake whose image store holds images; a pull of
// an image whose name contains "notfound" fails with ErrNotFound.
func NewFake(images ...string) *Fake {
	return &Fake{Hollow: runtime.NewHollow(images...)}
}

// Version implements runtime.Runtime.
func (f *Fake) Version(context.Context) (string, string, error) { return "fake", "0.0.0", nil }

// EnsureImage implements runtime.Runtime.
func (f *Fake) EnsureImage(ctx context.Context, image string, policy runtime.PullPolicy) (string, error) {
	if strings.Contains(image, "notfound") && policy != runtime.PullNever {
		return "", fmt.Errorf("pull image %s: %w", image, runtime.ErrNotFound)
	}
	return f.Hollow.EnsureImage(ctx, image, policy)
}

// StartContainer implements runtime.Runtime.
func (f *Fake) StartContainer(ctx context.Context, cfg runtime.ContainerConfig) (string, error) {
	if err := f.StartErr[cfg.Name]; err != nil {
		return "", err
	}
	id, err := f.Hollow.StartContainer(ctx, cfg)
	if err == nil {
		f.mu.Lock()
		if f.configs == nil {
			f.configs = map[string]runtime.ContainerConfig{}
		}
		f.configs[id] = cfg
		f.mu.Unlock()
	}
	return id, err
}

// Config returns what the container was started with.
func (f *Fake) Config(id string) (runtime.ContainerConfig, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.configs[id]
	return c, ok
}

// Exec implements runtime.Runtime through ExecFunc.
func (f *Fake) Exec(ctx context.Context, id string, cmd []string, o runtime.ExecOptions) (int, error) {
	code, err := f.Hollow.Exec(ctx, id, cmd, o)
	if err != nil || f.ExecFunc == nil {
		return code, err
	}
	c, _ := f.Get(id)
	return f.ExecFunc(c, cmd), nil
}
