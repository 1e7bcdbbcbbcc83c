package dataplane

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// timerClock is a fake clock that reports every timer the loop creates, so
// the test steps time only once the loop waits on it.
type timerClock struct {
	*clocktesting.FakeClock
	timers chan time.Duration
}

func (c *timerClock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d)
	c.timers <- d
	return t
}

type runnerHarness struct {
	t      *testing.T
	clk    *timerClock
	r      *SyncRunner
	runs   chan bool
	errs   chan error
	cancel func()
}

func newRunnerHarness(t *testing.T) *runnerHarness {
	h := &runnerHarness{t: t, runs: make(chan bool, 100), errs: make(chan error, 100)}
	h.clk = &timerClock{FakeClock: clocktesting.NewFakeClock(time.Unix(0, 0)), timers: make(chan time.Duration, 100)}
	h.r = NewSyncRunner(time.Second, time.Minute, func(_ context.Context, full bool) error {
		h.runs <- full
		select {
		case err := <-h.errs:
			return err
		default:
			return nil
		}
	})
	h.r.Clock = h.clk
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.r.Loop(ctx); close(done) }()
	h.cancel = func() { cancel(); <-done }
	t.Cleanup(h.cancel)
	h.timer(time.Minute) // the periodic timer
	return h
}

func (h *runnerHarness) timer(want time.Duration) {
	h.t.Helper()
	select {
	case d := <-h.clk.timers:
		if d != want {
			h.t.Fatalf("loop made a %s timer, want %s", d, want)
		}
	case <-time.After(10 * time.Second):
		h.t.Fatalf("loop made no %s timer", want)
	}
}

func (h *runnerHarness) run() bool {
	h.t.Helper()
	select {
	case full := <-h.runs:
		return full
	case <-time.After(10 * time.Second):
		h.t.Fatal("no run")
	}
	return false
}

func (h *runnerHarness) noRun() {
	h.t.Helper()
	select {
	case <-h.runs:
		h.t.Fatal("unexpected run")
	case <-time.After(50 * time.Millisecond):
	}
}

func TestSyncRunnerRunsOnFirstTrigger(t *testing.T) {
	h := newRunnerHarness(t)
	h.r.Trigger()
	if full := h.run(); full {
		t.Error("a triggered run was full")
	}
}

func TestSyncRunnerCoalescesTriggersWithinMinInterval(t *testing.T) {
	h := newRunnerHarness(t)
	h.r.Trigger()
	h.run()
	for range 20 {
		h.r.Trigger()
	}
	h.timer(time.Second) // waits out the min interval
	h.noRun()
	h.clk.Step(time.Second)
	h.run()
	h.noRun() // the twenty triggers gave one run
}

func TestSyncRunnerPeriodicRunIsFull(t *testing.T) {
	h := newRunnerHarness(t)
	h.clk.Step(time.Minute)
	if full := h.run(); !full {
		t.Error("periodic run was not full")
	}
}

func TestSyncRunnerRetriesFailedRun(t *testing.T) {
	h := newRunnerHarness(t)
	h.errs <- errors.New("injected")
	h.r.Trigger()
	h.run()
	h.timer(time.Second) // the retry backoff
	h.clk.Step(time.Second)
	if full := h.run(); full {
		t.Error("retry was a full run; the sync function decides what a retry rewrites")
	}
}
