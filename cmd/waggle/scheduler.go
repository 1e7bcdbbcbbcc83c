package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/waggle-io/waggle/controlplane/scheduler"
	"github.com/waggle-io/waggle/internal/cliflag"
	"github.com/waggle-io/waggle/internal/secureserving"
)

// runScheduler runs `waggle scheduler`.
func runScheduler(ctx context.Context, args []string) error {
	var cfg scheduler.Config
	fs := cliflag.NewFlagSet("scheduler", "Assign pending pods to nodes (kube-scheduler compatible), leader-elected.")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "path of the kubeconfig used to reach the API server")
	fs.StringVar(&cfg.Master, "master", "", "API server URL (overrides the kubeconfig's server)")
	fs.StringVar(&cfg.SchedulerName, "scheduler-name", scheduler.DefaultSchedulerName, "schedule only pods whose spec.schedulerName is this")
	cfg.SecureServing = secureserving.Defaults(scheduler.DefaultPort)
	cfg.SecureServing.AddFlags(fs)
	fs.Func("health-addr", "deprecated: host:port sets --bind-address and --secure-port (empty or 0: --secure-port=0)", func(v string) error {
		return healthAddr(&cfg.SecureServing, v)
	})
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	var qps float64
	fs.Float64Var(&qps, "kube-api-qps", 200, "queries per second to the API server")
	fs.IntVar(&cfg.Burst, "kube-api-burst", 400, "burst of queries to the API server")
	fs.IntVar(&cfg.Parallelism, "parallelism", 16, "goroutines filtering and scoring nodes")
	fs.DurationVar(&cfg.PodInitialBackoff, "pod-initial-backoff", time.Second, "back-off after a pod's first failed attempt")
	fs.DurationVar(&cfg.PodMaxBackoff, "pod-max-backoff", 10*time.Second, "longest back-off between a pod's attempts")
	cfg.LeaderElection.AddFlags(fs, "kube-scheduler")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	cfg.QPS = float32(qps)
	return scheduler.Run(ctx, cfg)
}

// healthAddr maps the scheduler's former plain-HTTP --health-addr onto
// the secure serving flags: the same address now serves HTTPS.
func healthAddr(o *secureserving.Options, v string) error {
	if v == "" || v == "0" {
		o.SecurePort = 0
		return nil
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("--health-addr %q: %w", v, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("--health-addr %q: bad port", v)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	o.BindAddress, o.SecurePort = host, p
	return nil
}
