package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/waggle-io/waggle/dataplane/bench"
	"github.com/waggle-io/waggle/internal/cliflag"
	"github.com/waggle-io/waggle/internal/ops"
)

// runBench dispatches `waggle bench <what>`.
func runBench(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintf(os.Stderr, "Usage: waggle bench WHAT [flags]\n\n  dataplane   direct vs eBPF vs iptables ClusterIP: TCP_CRR, TCP_RR, UDP_RR at several service counts; eBPF programming time\n  policy      NetworkPolicy pod to pod, eBPF vs iptables: no programs vs no policy vs 1 vs 1,000 policies (TCP_CRR, TCP_RR); write-to-enforced latency\n")
		if len(args) == 0 {
			return fmt.Errorf("which benchmark? (dataplane)")
		}
		return nil
	}
	switch args[0] {
	case "dataplane":
		return runBenchDataplane(ctx, args[1:])
	case "policy":
		return runBenchPolicy(ctx, args[1:])
	}
	return fmt.Errorf("unknown benchmark %q (dataplane, policy)", args[0])
}

func runBenchPolicy(ctx context.Context, args []string) error {
	fs := cliflag.NewFlagSet("bench policy", "Measure NetworkPolicy enforcement pod to pod in network namespaces on this machine (needs root).")
	var cfg bench.PolicyConfig
	fs.DurationVar(&cfg.Duration, "duration", 1e9, "length of one measurement (one test, one path, one round)")
	fs.DurationVar(&cfg.Warmup, "warmup", 2e8, "warm-up before each measurement counts")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "interleaved rounds (no programs, no policy, 1 policy, many, ...)")
	fs.IntVar(&cfg.Clients, "clients", 4, "clients in parallel")
	fs.IntVar(&cfg.Policies, "policies", 1000, "policies selecting the measured server")
	fs.IntVar(&cfg.Pods, "pods", 5000, "pods (of other nodes, 5 per label set) whose identities are known")
	fs.IntVar(&cfg.LatencySamples, "write-samples", 200, "policy writes timed to enforcement")
	fs.StringVar(&cfg.Output, "output", "", "write the JSON report to this file")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	cfg.Out = os.Stdout
	_, err := bench.RunPolicy(ctx, cfg)
	return err
}

func runBenchDataplane(ctx context.Context, args []string) error {
	fs := cliflag.NewFlagSet("bench dataplane", "Measure the service dataplanes side by side in network namespaces on this machine (needs root).")
	var cfg bench.Config
	var counts, paths, tests, logLevel string
	fs.DurationVar(&cfg.Duration, "duration", 1e9, "length of one measurement (one test, one path, one round)")
	fs.DurationVar(&cfg.Warmup, "warmup", 2e8, "warm-up before each measurement counts")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "interleaved rounds (direct, ebpf, iptables, direct, ...)")
	fs.IntVar(&cfg.Clients, "clients", 4, "clients in parallel")
	fs.IntVar(&cfg.Backends, "backends", 4, "backends (echo servers) behind each service")
	fs.StringVar(&counts, "services", "1,1000,10000", "service counts to measure at, comma-separated")
	fs.StringVar(&paths, "paths", "ebpf,iptables", "paths to compare with direct: ebpf, iptables")
	fs.StringVar(&tests, "tests", "TCP_CRR,TCP_RR,UDP_RR", "tests to run, comma-separated")
	fs.IntVar(&cfg.ProgramServices, "program-services", 10000, "services for the eBPF programming benchmark (0 skips it)")
	fs.IntVar(&cfg.ProgramBackends, "program-backends", 10, "backends per service for the programming benchmark")
	fs.IntVar(&cfg.ProgramRounds, "program-rounds", 3, "rounds of the programming benchmark")
	fs.IntVar(&cfg.LatencySamples, "change-samples", 200, "endpoint changes timed at program-services services")
	fs.StringVar(&cfg.Output, "output", "", "write the JSON report to this file")
	fs.StringVar(&logLevel, "log-level", "warn", "progress log level: debug, info, warn, error")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	for _, c := range strings.Split(counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 || n > 65000 {
			return fmt.Errorf("--services %q: want counts between 1 and 65000", c)
		}
		cfg.ServiceCounts = append(cfg.ServiceCounts, n)
	}
	cfg.Paths = []string{}
	for _, p := range strings.Split(paths, ",") {
		if p = strings.TrimSpace(p); p != "" {
			cfg.Paths = append(cfg.Paths, p)
		}
	}
	tl, err := bench.ParseTests(tests)
	if err != nil {
		return fmt.Errorf("--tests: %w", err)
	}
	cfg.Tests = tl
	log, err := ops.NewLogger("bench", logLevel)
	if err != nil {
		return err
	}
	cfg.Log, cfg.Out = log, os.Stdout
	_, err = bench.Run(ctx, cfg)
	return err
}
