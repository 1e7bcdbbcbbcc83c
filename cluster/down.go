package cluster

import (
	"io"
	"log/slog"
	"time"
)

// DownConfig is `waggle down`'s configuration.
type DownConfig struct {
	// DataDir is the data dir of the `waggle up` or `waggle join` to stop.
	DataDir string
	// Purge also removes everything it made, the data dir last.
	Purge bool
	// Grace is how long a process has after SIGTERM before SIGKILL
	// (default DefaultDownGrace).
	Grace time.Duration
	// Out receives one line per step.
	Out io.Writer
	// Log receives the components' own logs during the cleanup (nil:
	// discarded).
	Log *slog.Logger
}
