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
)

// Client is a fake clientset that counts the watches informers opened.
type Client struct {
	*fake.Clientset
	watches *testutil.Watches
}

// NewClient returns a fake clientset seeded with objs whose creates fill in
// name from generateName and a UID, as the API server does.
func NewClient(objs ...runtime.Object) *Client {
	cs := &Client{Clientset: fake.NewSimpleClientset(objs...)}
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
