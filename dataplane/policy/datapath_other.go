//go:build !linux

package policy

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
)

// BPFConfig configures the eBPF datapath (Linux only).
type BPFConfig struct {
	PinDir        string
	NetNS         string
	MonitorAllows bool
	Log           *slog.Logger
}

// BPF is the eBPF Datapath; elsewhere than Linux it cannot be made.
type BPF struct{ Datapath }

// NewBPF returns ErrNotSupported off Linux.
func NewBPF(BPFConfig) (*BPF, error) { return nil, ErrNotSupported }

// Cleanup has nothing to remove off Linux.
func Cleanup(string) error { return nil }

// ErrNoState: no policy maps are pinned (off Linux: never any).
var ErrNoState = errors.New("no NetworkPolicy state pinned")

// OpenView fails off Linux.
func OpenView(string) (*View, error) { return nil, ErrNotSupported }

// View reads the pinned policy maps (Linux only).
type View struct{}

func (*View) Endpoints() ([]EndpointInfo, error)                { return nil, ErrNotSupported }
func (*View) FindEndpoint(string) (EndpointInfo, error)         { return EndpointInfo{}, ErrNotSupported }
func (*View) Rules(uint32) ([]RuleInfo, []PolicyCounter, error) { return nil, nil, ErrNotSupported }
func (*View) Explain(netip.Addr, netip.Addr, uint16, uint8) ([]Verdict, error) {
	return nil, ErrNotSupported
}
func (*View) Monitor(context.Context, string, func(Event)) error { return ErrNotSupported }
func (*View) Close() error                                       { return nil }
