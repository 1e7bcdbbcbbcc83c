// Package scheduler is `waggle scheduler`: it assigns pending pods whose
// spec.schedulerName is its own to nodes, as kube-scheduler does, talking
// only to the API server through informers.
//
// A scheduling attempt filters every node (NodeUnschedulable, NodeName,
// TaintToleration, NodeAffinity and nodeSelector, NodePorts,
// NodeResourcesFit, VolumeBinding through upstream's volume binder),
// scores the ones that fit (least-allocated, balanced
// allocation, preferred node affinity, PreferNoSchedule taints, spreading of
// one owner's pods), takes the highest total (ties round-robin), assumes the
// pod on that node in its cache and binds it through pods/binding in the
// background. A pod that fits nowhere gets PodScheduled=False/Unschedulable
// and a FailedScheduling event that counts the reasons per node group, and
// waits for a node or pod change (then back-off) before it is retried.
//
// It is not kube-scheduler's plugin framework: there are no extension
// points, profiles, preemption or inter-pod affinity plugins.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/waggle-io/waggle/internal/apiclient"
	"github.com/waggle-io/waggle/internal/leaderelect"
	"github.com/waggle-io/waggle/internal/ops"
	"github.com/waggle-io/waggle/internal/secureserving"
)

// DefaultPort is the scheduler's HTTPS health and metrics port, as
// kube-scheduler's.
const DefaultPort = 10259

// Config is `waggle scheduler`'s configuration, one field per flag.
type Config struct {
	// Kubeconfig is the path of the kubeconfig to reach the API server;
	// Master overrides its server URL. RestConfig, when set (`waggle up`,
	// tests), is used instead of both.
	Kubeconfig, Master string
	RestConfig         *rest.Config
	// SchedulerName is the spec.schedulerName served (default-scheduler).
	SchedulerName string
	// SecureServing is where /healthz, /livez, /readyz and /metrics are
	// served: HTTPS with delegated authentication and authorization, as
	// kube-scheduler serves port 10259 (SecurePort 0: off).
	SecureServing secureserving.Options
	// LogLevel is debug, info, warn or error; Log, when set, is used
	// instead of a logger built from it.
	LogLevel string
	Log      *slog.Logger
	// QPS and Burst limit the API client.
	QPS   float32
	Burst int
	// Parallelism is how many goroutines filter and score nodes.
	Parallelism int
	// PodInitialBackoff and PodMaxBackoff bound a failed pod's back-off.
	PodInitialBackoff, PodMaxBackoff time.Duration
	// LeaderElection elects one active scheduler among replicas.
	LeaderElection leaderelect.Config
}

// ErrConfig marks a configuration error.
var ErrConfig = errors.New("scheduler config")

// restConfig builds the API client configuration from RestConfig, or
// Kubeconfig and Master.
func (c Config) restConfig() (*rest.Config, error) {
	if c.RestConfig != nil {
		rc := rest.CopyConfig(c.RestConfig)
		if c.QPS > 0 {
			rc.QPS = c.QPS
		}
		if c.Burst > 0 {
			rc.Burst = c.Burst
		}
		if rc.ContentType == "" {
			apiclient.SetContentType(rc, apiclient.Protobuf)
		}
		return rc, nil
	}
	if c.Kubeconfig == "" && c.Master == "" {
		return nil, fmt.Errorf("%w: --kubeconfig (or --master) is required", ErrConfig)
	}
	rc, err := clientcmd.BuildConfigFromFlags(c.Master, c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%w: kubeconfig %q: %w", ErrConfig, c.Kubeconfig, err)
	}
	if c.QPS > 0 {
		rc.QPS = c.QPS
	}
	if c.Burst > 0 {
		rc.Burst = c.Burst
	}
	rc.UserAgent = "waggle-scheduler"
	// Protobuf, as kube-scheduler's clientConnection.contentType.
	apiclient.SetContentType(rc, apiclient.Protobuf)
	return rc, nil
}

// Run runs the scheduler until ctx ends: the HTTPS health and metrics
// server (delegated authentication and authorization) at once, the scheduling loop while this instance is the leader.
func Run(ctx context.Context, cfg Config) error {
	if cfg.LogLevel == "" {
		cfg.LogLevel = "info"
	}
	log := cfg.Log
	if log == nil {
		l, err := ops.NewLogger("scheduler", cfg.LogLevel)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		log = l
	}
	if err := cfg.LeaderElection.Validate(); err != nil {
		return err
	}
	rc, err := cfg.restConfig()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("API client: %w", err)
	}
	health := ops.NewHealth()
	var active atomic.Pointer[Scheduler]
	health.AddReadiness(ops.Check{Name: "scheduler", Func: func(context.Context) error {
		if s := active.Load(); s != nil && !s.Ready() {
			return errors.New("leading, but caches not synced yet")
		}
		return nil // leading and synced, or a standby ready to take over
	}})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv, err := secureserving.New(cfg.SecureServing, "kube-scheduler", rc, health.Handler(), log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	serveErr := make(chan error, 1)
	go func() {
		err := srv.Serve(ctx)
		if err != nil {
			cancel()
		}
		serveErr <- err
	}()

	// Leadership is held at most once per process: losing it ends Run with
	// ErrLeadershipLost, and the process is restarted, as Kubernetes does.
	var startErr error
	err = leaderelect.Run(ctx, log, cs, cfg.LeaderElection, func(ctx context.Context) {
		factory := informers.NewSharedInformerFactory(cs, 0)
		s, err := New(cs, factory, log, Options{
			SchedulerName: cfg.SchedulerName, Parallelism: cfg.Parallelism,
			PodInitialBackoff: cfg.PodInitialBackoff, PodMaxBackoff: cfg.PodMaxBackoff,
			Registerer: health.Registry,
		})
		if err != nil {
			startErr = err
			cancel()
			return
		}
		active.Store(s)
		s.Run(ctx)
		factory.Shutdown()
	})
	cancel()
	if serr := <-serveErr; serr != nil && err == nil {
		err = serr
	}
	return errors.Join(err, startErr)
}
