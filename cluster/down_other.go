//go:build !linux

package cluster

import (
	"context"
	"errors"
)

// Down needs Linux: a node's processes, network namespaces, cgroups and
// BPF objects are Linux's.
func Down(context.Context, DownConfig) error {
	return errors.New("waggle down needs Linux")
}
