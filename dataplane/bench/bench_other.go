//go:build !linux

package bench

import (
	"context"
	"fmt"

	"github.com/waggle-io/waggle/dataplane"
)

// Run fails: the benchmark needs Linux network namespaces and eBPF.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	return nil, fmt.Errorf("waggle bench dataplane needs Linux: %w", dataplane.ErrNotSupported)
}

// RunPolicy fails: the benchmark needs Linux network namespaces and eBPF.
func RunPolicy(ctx context.Context, cfg PolicyConfig) (*PolicyReport, error) {
	return nil, fmt.Errorf("waggle bench policy needs Linux: %w", dataplane.ErrNotSupported)
}
