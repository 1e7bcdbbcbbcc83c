package runtime

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// userHZ is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on every
// Linux architecture).
const userHZ = 100

// procStartTime is when the kernel started process pid: field 22 of
// /proc/<pid>/stat, in ticks since boot (CLOCK_BOOTTIME).
func procStartTime(pid uint32) (time.Time, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, err
	}
	// The command (field 2) is in parentheses and may hold spaces: count
	// fields after its closing one (field 3 onwards).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, err
	}
	sinceBoot := time.Duration(ticks) * time.Second / userHZ
	return time.Now().Add(sinceBoot - time.Duration(ts.Nano())), nil
}
