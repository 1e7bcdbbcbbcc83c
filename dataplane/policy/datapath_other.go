//go:build !linux

package policy

import "log/slog"

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
