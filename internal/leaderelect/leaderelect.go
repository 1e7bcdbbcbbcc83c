// Package leaderelect runs a component's work only while it holds a Lease in
// the API server, so that several replicas of the scheduler or the
// controller-manager can run side by side with one of them active. It wraps
// client-go's leaderelection with a coordination.k8s.io/v1 Lease lock, the
// flags Kubernetes components use (--leader-elect, --leader-elect-lease-duration,
// ...), and an orderly hand-over: on cancel the work is stopped first and the
// Lease released after, so the next leader never overlaps with this one.
//
// It is not a general distributed lock: a leader that is paused for longer
// than the lease can still believe it leads for a moment, which is why every
// write that matters goes through the API server's optimistic concurrency
// (resourceVersion) rather than trusting leadership alone.
package leaderelect

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	kptr "k8s.io/utils/ptr"
)

// Defaults, as in Kubernetes' components.
const (
	DefaultLeaseDuration  = 15 * time.Second
	DefaultRenewDeadline  = 10 * time.Second
	DefaultRetryPeriod    = 2 * time.Second
	DefaultLeaseNamespace = "kube-system"
)

var (
	// ErrInvalidConfig is returned for a configuration that cannot work
	// (empty lease name, renew deadline not shorter than the lease, ...).
	ErrInvalidConfig = errors.New("invalid leader election config")
	// ErrLeadershipLost is returned by Run when this instance held the Lease
	// and could not renew it before the renew deadline. A component should
	// exit on it (as Kubernetes' components do) and be restarted.
	ErrLeadershipLost = errors.New("leader election lost")
)

// Config says whether and how to elect a leader.
type Config struct {
	// Enabled turns leader election on. Off, Run simply runs the work.
	Enabled bool
	// LeaseName and LeaseNamespace name the Lease object.
	LeaseName, LeaseNamespace string
	// Identity is this instance's holder identity; empty means
	// "<hostname>_<random uuid>".
	Identity string
	// LeaseDuration is how long non-leaders wait after the last observed
	// renewal before taking over; RenewDeadline how long the leader keeps
	// retrying a renewal before giving up; RetryPeriod the pause between
	// tries. LeaseDuration > RenewDeadline > 1.2 × RetryPeriod.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// AddFlags registers the --leader-elect* flags on fs with Kubernetes'
// defaults, the Lease named defaultLeaseName in kube-system.
func (c *Config) AddFlags(fs *flag.FlagSet, defaultLeaseName string) {
	fs.BoolVar(&c.Enabled, "leader-elect", true, "run only while holding the leader Lease, so several replicas can run")
	fs.DurationVar(&c.LeaseDuration, "leader-elect-lease-duration", DefaultLeaseDuration, "how long non-leaders wait after the last renewal before taking over")
	fs.DurationVar(&c.RenewDeadline, "leader-elect-renew-deadline", DefaultRenewDeadline, "how long the leader retries renewing before it gives up leading")
	fs.DurationVar(&c.RetryPeriod, "leader-elect-retry-period", DefaultRetryPeriod, "pause between attempts to acquire or renew the Lease")
	fs.StringVar(&c.LeaseName, "leader-elect-resource-name", defaultLeaseName, "name of the Lease used for leader election")
	fs.StringVar(&c.LeaseNamespace, "leader-elect-resource-namespace", DefaultLeaseNamespace, "namespace of the Lease used for leader election")
}

// Validate reports whether c can be used by Run.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if c.LeaseName == "" {
		errs = append(errs, errors.New("lease name is empty (--leader-elect-resource-name)"))
	}
	if c.LeaseNamespace == "" {
		errs = append(errs, errors.New("lease namespace is empty (--leader-elect-resource-namespace)"))
	}
	if c.RetryPeriod <= 0 {
		errs = append(errs, fmt.Errorf("retry period %v must be positive", c.RetryPeriod))
	}
	if c.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(c.RetryPeriod)) {
		errs = append(errs, fmt.Errorf("renew deadline %v must exceed %.1f × retry period %v", c.RenewDeadline, leaderelection.JitterFactor, c.RetryPeriod))
	}
	if c.LeaseDuration <= c.RenewDeadline {
		errs = append(errs, fmt.Errorf("lease duration %v must exceed renew deadline %v", c.LeaseDuration, c.RenewDeadline))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// DefaultIdentity returns "<hostname>_<uuid>", unique per process start.
func DefaultIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return host + "_" + string(uuid.NewUUID())
}

// Run calls run while this instance holds the Lease, and returns:
//   - nil once ctx is cancelled, after run has returned and the Lease has
//     been released (so a standby takes over at once, not after the lease
//     duration);
//   - nil once run returns by itself, after releasing the Lease;
//   - ErrLeadershipLost if the Lease could not be renewed in time, after run
//     (whose context is then cancelled) has returned;
//   - an error wrapping ErrInvalidConfig for a bad cfg.
//
// With cfg.Enabled false, Run just calls run(ctx) and returns nil. run must
// return soon after its context is cancelled.
func Run(ctx context.Context, log *slog.Logger, cs kubernetes.Interface, cfg Config, run func(ctx context.Context)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if !cfg.Enabled {
		run(ctx)
		return nil
	}
	if cfg.Identity == "" {
		cfg.Identity = DefaultIdentity()
	}
	log = log.With("lease", cfg.LeaseNamespace+"/"+cfg.LeaseName, "identity", cfg.Identity)

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metaFor(cfg),
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}

	// The elector runs on its own context, cancelled only after run has
	// stopped, so the Lease is released strictly after the work ends.
	electCtx, electCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer electCancel()

	var (
		mu       sync.Mutex
		started  bool
		finished bool // run returned on its own, still leading
		runDone  = make(chan struct{})
	)
	callbacks := leaderelection.LeaderCallbacks{
		OnStartedLeading: func(leadCtx context.Context) {
			mu.Lock()
			if ctx.Err() != nil { // cancelled while acquiring: do not start
				mu.Unlock()
				close(runDone)
				electCancel()
				return
			}
			started = true
			mu.Unlock()
			log.Info("became leader")
			workCtx, cancel := context.WithCancel(leadCtx)
			stop := context.AfterFunc(ctx, cancel)
			defer stop()
			defer cancel()
			defer close(runDone)
			run(workCtx)
			if leadCtx.Err() == nil && ctx.Err() == nil {
				// The work ended by itself: give the lease up for a standby.
				mu.Lock()
				finished = true
				mu.Unlock()
				electCancel()
			}
		},
		OnStoppedLeading: func() {},
		OnNewLeader: func(identity string) {
			if identity != cfg.Identity {
				log.Info("leader is another instance", "leader", identity)
			}
		},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: cfg.LeaseDuration,
		RenewDeadline: cfg.RenewDeadline,
		RetryPeriod:   cfg.RetryPeriod,
		Callbacks:     callbacks,
		// Released by release below, not by the elector: client-go 0.37's
		// release re-reads the Lease and then trusts its own cached view
		// of who holds it, so a leader that was paused past the lease
		// duration would wipe out its successor's Lease on the way out.
		ReleaseOnCancel: false,
		Name:            cfg.LeaseName,
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}

	// On cancel: stop the work (its context follows ctx), wait for it, then
	// let the elector release the Lease.
	stopWatch := context.AfterFunc(ctx, func() {
		mu.Lock()
		s := started
		mu.Unlock()
		if s {
			<-runDone
		}
		electCancel()
	})
	defer stopWatch()

	log.Info("waiting to acquire the leader lease")
	le.Run(electCtx)

	mu.Lock()
	s := started
	mu.Unlock()
	if s {
		<-runDone
	}
	mu.Lock()
	f := finished
	mu.Unlock()
	if f || ctx.Err() != nil {
		if s {
			if err := release(cs, cfg); err != nil {
				log.Warn("could not release the leader lease; a standby takes over after the lease duration", "err", err)
			}
		}
		if f {
			log.Info("work ended, released the lease")
		} else {
			log.Info("stopped leading and released the lease")
		}
		return nil
	}
	log.Error("lost the leader lease")
	return fmt.Errorf("%w: lease %s/%s could not be renewed within %v", ErrLeadershipLost, cfg.LeaseNamespace, cfg.LeaseName, cfg.RenewDeadline)
}

// release gives the Lease up if, as stored now, this instance holds it: its
// holder is cleared and its duration cut to one second (as client-go's
// release does), written against the resourceVersion just read, so a
// successor that took the Lease meanwhile is never overwritten.
func release(cs kubernetes.Interface, cfg Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.RenewDeadline)
	defer cancel()
	leases := cs.CoordinationV1().Leases(cfg.LeaseNamespace)
	for {
		l, err := leases.Get(ctx, cfg.LeaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != cfg.Identity {
			return nil // someone else holds it now
		}
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity = nil
		l.Spec.LeaseDurationSeconds = kptr.To[int32](1)
		l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

func metaFor(cfg Config) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: cfg.LeaseName, Namespace: cfg.LeaseNamespace}
}
