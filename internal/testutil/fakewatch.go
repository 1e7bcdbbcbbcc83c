package testutil

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
)

// FakeClientset is what TrackWatches needs of a client-go fake clientset
// (kubernetes/fake.Clientset and its kin).
type FakeClientset interface {
	PrependWatchReactor(resource string, reaction k8stesting.WatchReactionFunc)
	Tracker() k8stesting.ObjectTracker
}

// Watches counts the watches a fake clientset has open.
type Watches struct {
	opened atomic.Int32
	signal chan struct{}
}

// TrackWatches opens every watch of cs itself, on cs's tracker, exactly as
// the fake's default reactor does, and counts it once it is open. The fake
// tracker drops objects created between an informer's LIST and its WATCH,
// so tests create objects only after WaitOpen: with the watch opened inside
// the reactor, "counted" means "open", and no sleep is needed.
func TrackWatches(cs FakeClientset) *Watches {
	w := &Watches{signal: make(chan struct{}, 1)}
	cs.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		wi, err := cs.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		w.opened.Add(1)
		select {
		case w.signal <- struct{}{}:
		default:
		}
		return true, wi, nil
	})
	return w
}

// Opened is the number of watches opened so far.
func (w *Watches) Opened() int { return int(w.opened.Load()) }

// WaitOpen waits until at least n watches are open, failing t after timeout.
func (w *Watches) WaitOpen(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for w.Opened() < n {
		select {
		case <-w.signal:
		case <-deadline.C:
			t.Fatal(fmt.Sprintf("%d of %d informer watches opened in %v", w.Opened(), n, timeout))
		}
	}
}
