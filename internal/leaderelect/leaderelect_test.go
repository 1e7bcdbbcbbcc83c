package leaderelect

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func fastConfig(id string) Config {
	return Config{
		Enabled: true, LeaseName: "test-lease", LeaseNamespace: "kube-system", Identity: id,
		LeaseDuration: 1500 * time.Millisecond, RenewDeadline: 1 * time.Second, RetryPeriod: 100 * time.Millisecond,
	}
}

func TestAddFlagsHasKubernetesDefaults(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.AddFlags(fs, "kube-scheduler")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	want := Config{Enabled: true, LeaseName: "kube-scheduler", LeaseNamespace: "kube-system",
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
	if c != want {
		t.Fatalf("defaults = %+v, want %+v", c, want)
	}
	if err := fs.Parse([]string{"--leader-elect=false", "--leader-elect-lease-duration=3s", "--leader-elect-resource-name=x", "--leader-elect-resource-namespace=y"}); err != nil {
		t.Fatal(err)
	}
	if c.Enabled || c.LeaseDuration != 3*time.Second || c.LeaseName != "x" || c.LeaseNamespace != "y" {
		t.Fatalf("parsed = %+v", c)
	}
}

func TestValidateRejectsConfigsThatCannotWork(t *testing.T) {
	ok := fastConfig("a")
	tests := []struct {
		name string
		mod  func(*Config)
		bad  bool
	}{
		{"fast config is fine", func(*Config) {}, false},
		{"disabled ignores everything", func(c *Config) { *c = Config{} }, false},
		{"empty lease name", func(c *Config) { c.LeaseName = "" }, true},
		{"empty namespace", func(c *Config) { c.LeaseNamespace = "" }, true},
		{"renew deadline equal to lease", func(c *Config) { c.RenewDeadline = c.LeaseDuration }, true},
		{"retry period too long for renew deadline", func(c *Config) { c.RetryPeriod = c.RenewDeadline }, true},
		{"zero retry period", func(c *Config) { c.RetryPeriod = 0 }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mod(&c)
			err := c.Validate()
			if tt.bad != (err != nil) {
				t.Fatalf("Validate() = %v, want error %v", err, tt.bad)
			}
			if tt.bad && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v is not ErrInvalidConfig", err)
			}
			if tt.bad {
				runErr := Run(context.Background(), quiet(), fake.NewClientset(), c, func(context.Context) { t.Error("work ran with a bad config") })
				if !errors.Is(runErr, ErrInvalidConfig) {
					t.Fatalf("Run = %v, want ErrInvalidConfig", runErr)
				}
			}
		})
	}
}

func TestDisabledRunsTheWorkDirectly(t *testing.T) {
	ran := false
	err := Run(context.Background(), quiet(), fake.NewClientset(), Config{}, func(context.Context) { ran = true })
	if err != nil || !ran {
		t.Fatalf("Run = %v, ran = %v", err, ran)
	}
}

// runAsync starts Run and reports when the work starts and when Run returns.
func runAsync(ctx context.Context, cs *fake.Clientset, cfg Config) (leading chan struct{}, done chan error, workStopped *atomic.Bool) {
	leading = make(chan struct{})
	done = make(chan error, 1)
	workStopped = &atomic.Bool{}
	go func() {
		done <- Run(ctx, quiet(), cs, cfg, func(ctx context.Context) {
			close(leading)
			<-ctx.Done()
			workStopped.Store(true)
		})
	}()
	return leading, done, workStopped
}

func TestCancelStopsWorkThenReleasesSoStandbyTakesOverAtOnce(t *testing.T) {
	cs := fake.NewClientset()
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	leadA, doneA, stoppedA := runAsync(ctxA, cs, fastConfig("a"))
	select {
	case <-leadA:
	case <-time.After(10 * time.Second):
		t.Fatal("a never became leader")
	}
	lease, err := cs.CoordinationV1().Leases("kube-system").Get(context.Background(), "test-lease", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "a" {
		t.Fatalf("lease after a leads: %v %+v", err, lease)
	}

	// A long lease for b: without the release b would wait a minute.
	cfgB := fastConfig("b")
	cfgB.LeaseDuration, cfgB.RenewDeadline = time.Minute, 30*time.Second
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	leadB, doneB, _ := runAsync(ctxB, cs, cfgB)
	select {
	case <-leadB:
		t.Fatal("b became leader while a holds the lease")
	case <-time.After(500 * time.Millisecond):
	}

	cancelA()
	if err := <-doneA; err != nil {
		t.Fatalf("a's Run = %v, want nil after cancel", err)
	}
	if !stoppedA.Load() {
		t.Fatal("Run returned before a's work stopped")
	}
	select {
	case <-leadB:
	case <-time.After(10 * time.Second):
		t.Fatal("b did not take over after a released the lease")
	}
	cancelB()
	if err := <-doneB; err != nil {
		t.Fatalf("b's Run = %v", err)
	}
}

func TestLostLeaseCancelsWorkAndReturnsErrLeadershipLost(t *testing.T) {
	cs := fake.NewClientset()
	var failing atomic.Bool
	cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failing.Load() {
			return true, nil, errors.New("apiserver unreachable")
		}
		return false, nil, nil
	})
	lead, done, stopped := runAsync(context.Background(), cs, fastConfig("a"))
	select {
	case <-lead:
	case <-time.After(10 * time.Second):
		t.Fatal("never became leader")
	}
	failing.Store(true)
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeadershipLost) {
			t.Fatalf("Run = %v, want ErrLeadershipLost", err)
		}
		if !stopped.Load() {
			t.Fatal("Run returned before the work stopped")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not notice the lost lease")
	}
}

func TestCancelWhileWaitingReturnsWithoutRunning(t *testing.T) {
	cs := fake.NewClientset()
	// Once a leads it renews with updates alone (client-go's optimistic
	// renewal), so a lease GET counted from then on is b's attempt to
	// acquire. The reactor goes in before any elector runs: the fake's
	// reactor chain may not change while it serves requests.
	var counting atomic.Bool
	var attempts atomic.Int64
	cs.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if counting.Load() {
			attempts.Add(1)
		}
		return false, nil, nil
	})
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	leadA, _, _ := runAsync(ctxA, cs, fastConfig("a"))
	<-leadA
	counting.Store(true)
	ctxB, cancelB := context.WithCancel(context.Background())
	leadB, doneB, _ := runAsync(ctxB, cs, fastConfig("b"))
	testutil.WaitFor(t, 30*time.Second, "b to try to acquire the lease", func() bool { return attempts.Load() >= 3 })
	cancelB()
	select {
	case err := <-doneB:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel while waiting")
	}
	select {
	case <-leadB:
		t.Fatal("b's work ran although it never led")
	default:
	}
}

func TestWorkThatEndsByItselfReleasesTheLease(t *testing.T) {
	cs := fake.NewClientset()
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), quiet(), cs, fastConfig("a"), func(context.Context) {}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the work ended")
	}
	l, err := cs.CoordinationV1().Leases("kube-system").Get(context.Background(), "test-lease", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
		t.Fatalf("lease still held by %q", *l.Spec.HolderIdentity)
	}
}
