//go:build !linux

package procfs

import (
	"fmt"
	"time"
)

// StartedAt is known on Linux only.
func StartedAt(pid int) (time.Time, error) {
	return time.Time{}, fmt.Errorf("process %d: start times are read on Linux only", pid)
}
