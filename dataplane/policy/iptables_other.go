//go:build !linux

package policy

import "log/slog"

// IPTablesConfig configures the iptables fallback datapath (Linux only).
type IPTablesConfig struct {
	NetNS string
	Log   *slog.Logger
}

// IPTables is the iptables fallback Datapath; elsewhere than Linux it
// cannot be made.
type IPTables struct{ Datapath }

// NewIPTables returns ErrNotSupported off Linux.
func NewIPTables(IPTablesConfig) (*IPTables, error) { return nil, ErrNotSupported }

// CleanupIPTables has nothing to remove off Linux.
func CleanupIPTables(string) error { return nil }

// OpenIPTablesView fails off Linux.
func OpenIPTablesView(string) (*IPTablesView, error) { return nil, ErrNotSupported }
