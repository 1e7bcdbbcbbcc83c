package testutil

import (
	"fmt"
	"testing"
	"time"
)

// Eventually polls cond every 20 ms until it returns nil, failing t with
// cond's last error after timeout. Use it where the state has no event to
// wait for (an API server read, a kernel map); the timeout only bounds a
// hang, so make it generous.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond) // the poll interval, not a guess at timing
	}
}

// WaitFor is Eventually for a condition that is true or false: it fails t
// with "timed out waiting for <what>".
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	Eventually(t, timeout, func() error {
		if cond() {
			return nil
		}
		return fmt.Errorf("waiting for %s", what)
	})
}
