package procfs

import (
	"os"
	"testing"
	"time"
)

var testInitAt = time.Now()

// TestStartedAtIsTheProcessStart: for this test process, a moment before
// its package initialized (what a restarted kubelet reports as the start of
// a container it did not start itself).
func TestStartedAtIsTheProcessStart(t *testing.T) {
	got, err := StartedAt(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// USER_HZ ticks: 10 ms resolution; the process was started before
	// its packages initialized, and not long before.
	if got.After(testInitAt.Add(20*time.Millisecond)) || got.Before(testInitAt.Add(-time.Minute)) {
		t.Errorf("start time %s, package init at %s", got.Format(time.RFC3339Nano), testInitAt.Format(time.RFC3339Nano))
	}
	if _, err := StartedAt(0); err == nil {
		t.Error("no error for pid 0")
	}
}
