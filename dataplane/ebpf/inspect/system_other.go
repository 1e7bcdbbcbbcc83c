//go:build !linux

package inspect

import (
	"context"
	"fmt"

	"github.com/waggle-io/waggle/dataplane"
)

func openSource(dir, node string) (closingSource, error) {
	return nil, fmt.Errorf("waggle bpf reads Linux BPF objects: %w", dataplane.ErrNotSupported)
}

func newSystem(ctx context.Context) system { return nil }
