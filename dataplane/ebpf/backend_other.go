//go:build !linux

package ebpf

import (
	"context"
	"fmt"
	"time"

	"github.com/waggle-io/waggle/dataplane"
)

var errOS = fmt.Errorf("the eBPF socket load balancer needs Linux: %w", dataplane.ErrNotSupported)

// Backend is the eBPF dataplane.Backend; it exists only on Linux.
type Backend struct{}

// New fails: eBPF needs Linux.
func New(cfg Config) (*Backend, error) { return nil, errOS }

// Supported reports that eBPF needs Linux.
func Supported() error { return errOS }

// CleanupPinned fails: there is no pinned state off Linux.
func CleanupPinned(dir string) error { return errOS }

func (b *Backend) Name() string                                   { return "ebpf" }
func (b *Backend) Sync(context.Context, *dataplane.State) error   { return errOS }
func (b *Backend) Apply(context.Context, *dataplane.Change) error { return errOS }
func (b *Backend) RequestFullSync()                               {}
func (b *Backend) WaitSocketsTerminated(context.Context) error    { return errOS }
func (b *Backend) Cleanup(context.Context) error                  { return errOS }
func (b *Backend) Close() error                                   { return nil }
func (b *Backend) View() *View                                    { return &View{} }

// View is the pinned-state view; it exists only on Linux.
type View struct{}

// OpenPinned fails: eBPF needs Linux.
func OpenPinned(dir string) (*View, error) { return nil, errOS }

func (v *View) Close() error                                        { return nil }
func (v *View) Dir() string                                         { return "" }
func (v *View) Meta() (Meta, error)                                 { return Meta{}, errOS }
func (v *View) Backends() ([]BackendEntry, error)                   { return nil, errOS }
func (v *View) Services() ([]Service, error)                        { return nil, errOS }
func (v *View) Affinity() ([]AffinityEntry, error)                  { return nil, errOS }
func (v *View) ReverseSockets() ([]ReverseSocketEntry, error)       { return nil, errOS }
func (v *View) Counters() (map[Stat]uint64, error)                  { return nil, errOS }
func (v *View) Maps() ([]MapInfo, error)                            { return nil, errOS }
func (v *View) RawEntries(name string) (k, val [][]byte, err error) { return nil, nil, errOS }
func (v *View) Explain(k dataplane.FrontendKey, netnsCookie uint64, now time.Duration) (Explanation, error) {
	return Explanation{}, errOS
}
func (v *View) Programs() ([]ProgramInfo, error) { return nil, errOS }
func (v *View) Frontend(k dataplane.FrontendKey) (Service, bool, error) {
	return Service{}, false, errOS
}
