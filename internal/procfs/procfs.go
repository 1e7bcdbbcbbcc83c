// Package procfs reads the two facts Waggle needs about a process from
// /proc/PID/stat: its state (to tell a zombie from a live process) and its
// start time (to tell the process Waggle started from a later one that
// reused its PID, and, as a wall-clock time, when a container a restarted
// kubelet did not start itself began). It signals nothing itself.
package procfs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat is what Waggle reads of /proc/PID/stat.
type Stat struct {
	// State is the one-letter state: R, S, D, Z (zombie), ...
	State byte
	// StartTime is when the process started, in clock ticks since boot.
	StartTime uint64
}

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	return parseStat(string(b))
}

// parseStat parses a stat line; the command name (field 2) may hold spaces
// and parentheses, so fields are counted from the last ')'.
func parseStat(s string) (Stat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, errors.New("parse /proc stat: no command field")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, errors.New("parse /proc stat: too few fields")
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("parse /proc stat start time: %w", err)
	}
	return Stat{State: f[0][0], StartTime: start}, nil
}

// Gone reports whether pid has exited: no such process, or a zombie.
func Gone(pid int) bool {
	st, err := ReadStat(pid)
	return err != nil || st.State == 'Z'
}
