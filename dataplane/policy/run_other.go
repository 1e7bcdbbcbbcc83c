//go:build !linux

package policy

import (
	"context"
	"fmt"
)

// Run enforces NetworkPolicy on this node; off Linux it cannot.
func Run(ctx context.Context, cfg RunConfig) error {
	if cfg.Mode == ModeEBPF {
		return fmt.Errorf("--network-policy=ebpf: %w", ErrNotSupported)
	}
	return nil
}
