package main

import (
	"context"

	"github.com/waggle-io/waggle/kubelet/containerlog"
)

// runContainerLogger runs `waggle container-logger [--stdout FIFO --stderr
// FIFO] PATH`. The containerd shim starts it for each container (binary://
// log URI, streams on fds 3 and 4); the kubelet starts it with FIFOs for a
// container with stdin. Its arguments are parsed by containerlog, which test
// binaries standing in for waggle share, and not read from WAGGLE_*
// variables: the shim clears the environment, and a logger the kubelet
// starts must not take the kubelet's.
func runContainerLogger(ctx context.Context, args []string) error {
	cfg, err := containerlog.ParseLoggerArgs(args)
	if err != nil {
		return err
	}
	return containerlog.RunLogger(ctx, cfg)
}
