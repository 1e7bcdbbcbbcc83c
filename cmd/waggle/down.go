package main

import (
	"context"
	"errors"
	"os"

	"github.com/waggle-io/waggle/cluster"
	"github.com/waggle-io/waggle/internal/cliflag"
	"github.com/waggle-io/waggle/internal/ops"
)

// runDown runs `waggle down`: it stops what `waggle up` or `waggle join`
// runs from a data dir and, with --purge, removes everything it made on
// this machine (cluster.Down), as k3s-killall.sh and k3s-uninstall.sh do.
func runDown(ctx context.Context, args []string) error {
	cfg := cluster.DownConfig{Out: os.Stdout}
	fs := cliflag.NewFlagSet("down", "Stop what `waggle up` or `waggle join` runs on this machine (its process and the pods' containers) and, with --purge, remove everything it made: pod network namespaces and cgroups, the CNI bridge, nft chain and routes, the proxy's rules and BPF links and pins, Waggle's containerd namespace and the data dir. Without --purge, `waggle up` resumes the same cluster.")
	fs.StringVar(&cfg.DataDir, "data-dir", cluster.Defaults().DataDir, "the data dir of the waggle up or join to stop")
	fs.BoolVar(&cfg.Purge, "purge", false, "also remove everything it made, the data dir (etcd, certificates, images) included")
	fs.DurationVar(&cfg.Grace, "timeout", cluster.DefaultDownGrace, "how long each process has to stop after SIGTERM before SIGKILL")
	logLevel := fs.String("log-level", "warn", "log level of the cleanup's own components: debug, info, warn or error")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("waggle down takes no arguments (flags only)")
	}
	if os.Geteuid() != 0 {
		return errors.New("waggle down needs root (processes, network namespaces, cgroups, BPF)")
	}
	log, err := ops.NewLogger("down", *logLevel)
	if err != nil {
		return err
	}
	cfg.Log = log
	// A ^C must not leave the cleanup half-done: the steps run to their
	// end (each is bounded by its own timeout).
	return cluster.Down(context.WithoutCancel(ctx), cfg)
}
