package main

import (
	"context"
	"os"

	"github.com/waggle-io/waggle/dataplane/ebpf/inspect"
)

// runBPF runs `waggle bpf`, the inspection CLI of the eBPF dataplane
// (inspect.Run); its errors carry the documented exit codes.
func runBPF(ctx context.Context, args []string) error {
	cfg, err := inspect.ParseArgs(args, os.Stderr)
	if err != nil {
		return err
	}
	cfg.Out = os.Stdout
	return inspect.Run(ctx, cfg)
}
