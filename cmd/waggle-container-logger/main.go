// Command waggle-container-logger writes one container's output as a CRI
// log: `waggle-container-logger container-logger [--stdout FIFO --stderr
// FIFO] PATH`, the command line `waggle container-logger` answers too. The
// containerd shim starts one for every container (binary:// log URI), so it
// is its own small executable: starting the whole waggle binary (every
// Kubernetes and etcd package's init) cost ~60 ms of CPU per container,
// more than runc's own share of a start. The kubelet uses it when it sits
// beside the waggle executable (bin/, `make build`), else waggle itself.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/waggle-io/waggle/kubelet/containerlog"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != containerlog.LoggerCommand {
		fmt.Fprintf(os.Stderr, "usage: %s %s [--stdout FIFO --stderr FIFO] PATH\n", os.Args[0], containerlog.LoggerCommand)
		os.Exit(2)
	}
	cfg, err := containerlog.ParseLoggerArgs(os.Args[2:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// The shim sends SIGTERM once it closed the streams' write ends: what is
	// buffered is still copied (containerlog's drain grace).
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := containerlog.RunLogger(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
