package leaderelect

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

// gate is an http.RoundTripper that holds every request while paused, as a
// process stopped by SIGSTOP (or cut off by the network) would.
type gate struct {
	next http.RoundTripper
	mu   sync.Mutex
	open chan struct{} // closed while not paused
	// gets counts the GETs that went through: an elector's attempts to
	// acquire a lease it does not hold (it renews its own without one).
	gets atomic.Int64
}

func newGate(next http.RoundTripper) *gate {
	g := &gate{next: next, open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) RoundTrip(r *http.Request) (*http.Response, error) {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	<-open
	if r.Method == http.MethodGet {
		g.gets.Add(1)
	}
	return g.next.RoundTrip(r)
}

func (g *gate) pause() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) resume() {
	g.mu.Lock()
	close(g.open)
	g.mu.Unlock()
}

func clientFor(t *testing.T, rc *rest.Config, g **gate) kubernetes.Interface {
	t.Helper()
	rc = rest.CopyConfig(rc)
	if g != nil {
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { *g = newGate(rt); return *g })
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func holder(t *testing.T, cs kubernetes.Interface) (string, *coordinationv1.Lease) {
	t.Helper()
	l, err := cs.CoordinationV1().Leases("kube-system").Get(context.Background(), "test-lease", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil {
		return "", l
	}
	return *l.Spec.HolderIdentity, l
}

func TestRealAPIServerFailover(t *testing.T) {
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	observer := clientFor(t, rc, nil)

	t.Run("cancelled leader hands over at once", func(t *testing.T) {
		cfgB := fastConfig("b")
		cfgB.LeaseDuration, cfgB.RenewDeadline = 30*time.Second, 20*time.Second
		ctxA, cancelA := context.WithCancel(context.Background())
		ctxB, cancelB := context.WithCancel(context.Background())
		defer cancelA()
		defer cancelB()
		leadA, doneA := runReal(ctxA, clientFor(t, rc, nil), fastConfig("a"))
		waitClosed(t, leadA, "a leads")
		var gB *gate
		leadB, doneB := runReal(ctxB, clientFor(t, rc, &gB), cfgB)
		// The marker: b has read the lease three times, so it has tried to
		// take it while a holds it.
		testutil.WaitFor(t, 30*time.Second, "b to try to acquire the lease", func() bool { return gB.gets.Load() >= 3 })
		if h, _ := holder(t, observer); h != "a" {
			t.Fatalf("holder = %q while a leads", h)
		}
		cancelA()
		if err := <-doneA; err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitClosed(t, leadB, "b leads after a released")
		t.Logf("hand-over after release took %v (b's lease duration is %v)", time.Since(start), cfgB.LeaseDuration)
		cancelB()
		<-doneB
	})

	t.Run("paused leader is replaced after the lease duration and its stale writes fail", func(t *testing.T) {
		var gA *gate
		csA := clientFor(t, rc, &gA)
		ctxA, cancelA := context.WithCancel(context.Background())
		ctxB, cancelB := context.WithCancel(context.Background())
		defer cancelA()
		defer cancelB()
		leadA, doneA := runReal(ctxA, csA, fastConfig("a2"))
		waitClosed(t, leadA, "a2 leads")
		_, staleLease := holder(t, observer)

		leadB, doneB := runReal(ctxB, clientFor(t, rc, nil), fastConfig("b2"))
		gA.pause() // a2 is frozen: it cannot renew, nor release
		waitClosed(t, leadB, "b2 takes over from the paused a2")
		if h, _ := holder(t, observer); h != "b2" {
			t.Fatalf("holder = %q, want b2", h)
		}

		// A write a2 prepared before its pause carries the old
		// resourceVersion: the API server refuses it.
		staleLease.Spec.HolderIdentity = ptr("a2")
		gA.resume()
		_, err := csA.CoordinationV1().Leases("kube-system").Update(context.Background(), staleLease, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			t.Fatalf("stale lease write: %v, want Conflict", err)
		}
		// And a2 notices it lost: its work stops and Run reports it.
		select {
		case err := <-doneA:
			if !errors.Is(err, ErrLeadershipLost) {
				t.Fatalf("a2's Run = %v, want ErrLeadershipLost", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("paused leader did not give up after resuming")
		}
		if h, _ := holder(t, observer); h != "b2" {
			t.Fatalf("holder = %q after a2 resumed, want b2", h)
		}
		cancelB()
		<-doneB
	})
}

func ptr[T any](v T) *T { return &v }

func runReal(ctx context.Context, cs kubernetes.Interface, cfg Config) (chan struct{}, chan error) {
	lead := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, quiet(), cs, cfg, func(ctx context.Context) {
			close(lead)
			<-ctx.Done()
		})
	}()
	return lead, done
}

func waitClosed(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out: %s", what)
	}
}
