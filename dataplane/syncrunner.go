package dataplane

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// SyncRunner runs a sync function with bounded frequency, like kube-proxy's
// BoundedFrequencyRunner: a Trigger runs it soon, but never sooner than
// MinInterval after the previous run (triggers in between coalesce into one
// run), and it runs at least every MaxInterval anyway — that periodic run is
// a full resync (full=true) that repairs drift. A failed run is retried with
// exponential backoff from MinInterval (at least one second) up to
// MaxInterval; Fn decides what a retry does (the proxy retries only what
// failed, or everything after an error not confined to frontends).
//
// MinInterval 0 (the proxy's choice for backends that program changes
// incrementally) runs every trigger at once; triggers that arrive while a
// run is in progress coalesce into the next run, so batching happens only
// under bursts.
type SyncRunner struct {
	MinInterval, MaxInterval time.Duration
	// Fn is the sync. full is set for periodic runs.
	Fn    func(ctx context.Context, full bool) error
	Clock clock.WithTicker

	trigger chan struct{}
}

// NewSyncRunner returns a runner on the real clock.
func NewSyncRunner(minInterval, maxInterval time.Duration, fn func(context.Context, bool) error) *SyncRunner {
	return &SyncRunner{MinInterval: minInterval, MaxInterval: maxInterval, Fn: fn, Clock: clock.RealClock{}, trigger: make(chan struct{}, 1)}
}

// Trigger asks for a run soon. It never blocks.
func (r *SyncRunner) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Loop runs until ctx ends. The first run happens on the first Trigger (or
// after MaxInterval).
func (r *SyncRunner) Loop(ctx context.Context) {
	if r.trigger == nil {
		r.trigger = make(chan struct{}, 1)
	}
	maxI := r.MaxInterval
	if maxI <= 0 {
		maxI = time.Hour
	}
	periodic := r.Clock.NewTimer(maxI)
	defer periodic.Stop()
	var retry clock.Timer
	var retryC <-chan time.Time
	var lastRun time.Time
	backoff := time.Duration(0)
	for {
		full := false
		select {
		case <-ctx.Done():
			return
		case <-r.trigger:
		case <-periodic.C():
			full = true
		case <-retryC:
			retryC = nil
		}
		if !lastRun.IsZero() {
			if wait := r.MinInterval - r.Clock.Since(lastRun); wait > 0 {
				t := r.Clock.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C():
				}
			}
		}
		// This run covers every trigger that arrived so far.
		select {
		case <-r.trigger:
		default:
		}
		lastRun = r.Clock.Now()
		err := r.Fn(ctx, full)
		if !periodic.Stop() {
			select {
			case <-periodic.C():
			default:
			}
		}
		periodic.Reset(maxI)
		if retry != nil {
			retry.Stop()
			retry, retryC = nil, nil
		}
		if err != nil {
			switch {
			case backoff == 0:
				backoff = max(r.MinInterval, time.Second)
			default:
				backoff = min(2*backoff, maxI)
			}
			retry = r.Clock.NewTimer(backoff)
			retryC = retry.C()
		} else {
			backoff = 0
		}
	}
}
