//go:build !linux

package policy

import (
	"context"
	"fmt"
)

// Run enforces NetworkPolicy on this node; off Linux it cannot.
func Run(ctx context.Context, cfg RunConfig) error {
	if cfg.Mode == ModeEBPF || cfg.Mode == ModeIPTables {
		return fmt.Errorf("--network-policy=%s: %w", cfg.Mode, ErrNotSupported)
	}
	return nil
}
