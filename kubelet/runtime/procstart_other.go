//go:build !linux

package runtime

import (
	"fmt"
	"time"
)

// procStartTime is known on Linux only.
func procStartTime(pid uint32) (time.Time, error) {
	return time.Time{}, fmt.Errorf("process %d: start times are read on Linux only", pid)
}
