//go:build !linux

package cluster

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"
)

// DownConfig is `waggle down`'s configuration (see down_linux.go).
type DownConfig struct {
	DataDir string
	Purge   bool
	Grace   time.Duration
	Out     io.Writer
	Log     *slog.Logger
}

// Down needs Linux: a node's processes, network namespaces, cgroups and
// BPF objects are Linux's.
func Down(context.Context, DownConfig) error {
	return errors.New("waggle down needs Linux")
}
