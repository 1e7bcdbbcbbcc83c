package procfs

import (
	"time"

	"golang.org/x/sys/unix"
)

// userHZ is the unit of /proc/PID/stat's times (USER_HZ, 100 on every
// Linux architecture).
const userHZ = 100

// StartedAt is when the kernel started process pid, as a wall-clock time:
// its start in ticks since boot (CLOCK_BOOTTIME) set against that clock now,
// to the tick (10 ms).
func StartedAt(pid int) (time.Time, error) {
	st, err := ReadStat(pid)
	if err != nil {
		return time.Time{}, err
	}
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &now); err != nil {
		return time.Time{}, err
	}
	sinceBoot := time.Duration(st.StartTime) * time.Second / userHZ
	return time.Now().Add(sinceBoot - time.Duration(now.Nano())), nil
}
