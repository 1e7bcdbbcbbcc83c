// Package ctrltest helps the controllers' unit tests: a client-go fake
// clientset that honours generateName (the real API server does; client-go's
// fake does not), informers started for the test's lifetime, and polling
// helpers. It is for unit tests only; integration tests use a real API
// server.
package ctrltest

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/retry"
)

// Client is a fake clientset that counts the watches informers opened and,
// as the API server, refuses stale writes with 409 Conflict and serves the
// status subresource (see versionedTracker).
type Client struct {
	*fake.Clientset
	watches *testutil.Watches
}

// NewClient returns a fake clientset seeded with objs whose creates fill in
// name from generateName and a UID, as the API server does.
func NewClient(objs ...runtime.Object) *Client {
	cs := &Client{Clientset: fake.NewSimpleClientset()}
	tr := newVersionedTracker(cs.Tracker())
	for _, o := range objs {
		if err := tr.Add(o); err != nil {
			panic(fmt.Sprintf("ctrltest: seeding %T: %v", o, err))
		}
	}
	// Every read and write goes through tr; watches stay on the tracker
	// underneath, which tr writes through.
	cs.ReactionChain = []k8stesting.Reactor{&k8stesting.SimpleReactor{Verb: "*", Resource: "*", Reaction: k8stesting.ObjectReaction(tr)}}
	cs.PrependReactor("update", "*", statusReactor(tr))
	cs.watches = testutil.TrackWatches(cs.Clientset)
	var n atomic.Int64
	cs.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok {
			return false, nil, nil
		}
		m, err := meta.Accessor(ca.GetObject())
		if err != nil {
			return false, nil, nil
		}
		i := n.Add(1)
		if m.GetName() == "" && m.GetGenerateName() != "" {
			m.SetName(fmt.Sprintf("%s%05d", m.GetGenerateName(), i))
		}
		if m.GetUID() == "" {
			m.SetUID(types.UID(fmt.Sprintf("uid-%d", i)))
		}
		return false, nil, nil
	})
	return cs
}

// Start starts the factory for the test's lifetime and waits for its caches
// and for every informer's watch: the fake clientset drops objects created
// between an informer's list and its watch, so nothing may be created
// before.
func Start(t testing.TB, cs *Client, f informers.SharedInformerFactory) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	f.Start(ctx.Done())
	synced := f.WaitForCacheSync(ctx.Done())
	for typ, ok := range synced {
		if !ok {
			t.Fatalf("cache for %v did not sync", typ)
		}
	}
	cs.watches.WaitOpen(t, len(synced), 10*time.Second)
	return ctx
}

// Update reads an object with get, changes it with mutate and writes it with
// update, retrying on 409 Conflict as a client of the API server must when
// a controller writes the same object concurrently. It returns what update
// stored.
func Update[T any](t testing.TB, get func() (T, error), mutate func(T), update func(T) (T, error)) T {
	t.Helper()
	var out T
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := get()
		if err != nil {
			return err
		}
		mutate(obj)
		out, err = update(obj)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Log is a logger that writes to the test log only when verbose.
func Log(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// Eventually polls cond until it returns nil or timeout passes, then fails
// with cond's last error.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	testutil.Eventually(t, timeout, cond)
}
