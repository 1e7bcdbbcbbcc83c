package main

import (
	"context"
	"time"

	"github.com/waggle-io/waggle/controlplane/scheduler"
	"github.com/waggle-io/waggle/internal/cliflag"
)

// runScheduler runs `waggle scheduler`.
func runScheduler(ctx context.Context, args []string) error {
	var cfg scheduler.Config
	fs := cliflag.NewFlagSet("scheduler", "Assign pending pods to nodes (kube-scheduler compatible), leader-elected.")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "path of the kubeconfig used to reach the API server")
	fs.StringVar(&cfg.Master, "master", "", "API server URL (overrides the kubeconfig's server)")
	fs.StringVar(&cfg.SchedulerName, "scheduler-name", scheduler.DefaultSchedulerName, "schedule only pods whose spec.schedulerName is this")
	fs.StringVar(&cfg.HealthAddr, "health-addr", "127.0.0.1:10259", "address serving /healthz, /readyz and /metrics (empty or 0: off)")
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
