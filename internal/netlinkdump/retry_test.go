package netlinkdump

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRetryRetriesInterruptedDumpsOnly(t *testing.T) {
	calls := 0
	v, err := Retry(func() (int, error) {
		calls++
		if calls < 3 {
			return 0, unix.EINTR // NLM_F_DUMP_INTR, as netlink v1.3.0 reports it
		}
		return 42, nil
	})
	if err != nil || v != 42 || calls != 3 {
		t.Fatalf("got %d, %v after %d calls; want 42 after 3", v, err, calls)
	}
	calls = 0
	if _, err := Retry(func() (int, error) { calls++; return 0, unix.EPERM }); !errors.Is(err, unix.EPERM) || calls != 1 {
		t.Fatalf("another error: %v after %d calls; want EPERM at once", err, calls)
	}
	calls = 0
	if _, err := Retry(func() (int, error) { calls++; return 0, unix.EINTR }); !errors.Is(err, unix.EINTR) || calls != Attempts {
		t.Fatalf("always interrupted: %v after %d calls; want EINTR after %d", err, calls, Attempts)
	}
}
