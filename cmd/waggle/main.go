// Command waggle is Waggle's one multi-call binary: every component of the
// cluster is a subcommand (`waggle apiserver`, `waggle kubelet`, ...), and
// `waggle up` runs them all on one machine.
//
// Each subcommand's file only parses flags into its component's config struct
// and calls that component's Run(ctx, cfg); the logic lives in the packages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/waggle-io/waggle/internal/version"
	"github.com/waggle-io/waggle/kubelet/containerlog"
)

// command is one subcommand of the binary.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

func commands() []command {
	return []command{
		{"up", "run a whole single-machine cluster in one process", runUp},
		{"down", "stop what up or join runs on this machine; --purge removes everything it made", runDown},
		{"apiserver", "run the Kubernetes-compatible API server", runAPIServer},
		{"scheduler", "run the scheduler", runScheduler},
		{"controller-manager", "run the controllers", runControllerManager},
		{"kubelet", "run the node agent", runKubelet},
		{"proxy", "run the service proxy (eBPF, iptables or IPVS)", runProxy},
		{"join", "join this machine to a running cluster as a node (bootstrap token, TLS bootstrap, kubelet and proxy)", runJoin},
		{"bpf", "inspect the eBPF dataplane's pinned maps and programs", runBPF},
		{"server", "manage the servers of an HA control plane (remove)", runServer},
		{"token", "manage bootstrap tokens that machines join with (create, list, delete)", runToken},
		{"images", "manage the node's container images (import)", runImages},
		{"lab", "run a multi-node lab on this machine (up, status, join, exec, stop, restart, down)", runLab},
		{"bench", "run Waggle's benchmarks (dataplane, apiserver, ...)", runBench},
		{"version", "print the version", runVersion},
	}
}

// hiddenCommands are run by Waggle itself, not listed in the usage.
func hiddenCommands() []command {
	return []command{
		{containerlog.LoggerCommand, "write a container's output as a CRI log (run by the containerd shim)", runContainerLogger},
	}
}

// exitCoder lets a command choose its process exit code (waggle bpf does).
type exitCoder interface{ ExitCode() int }

// childExit is the exit status of a command Waggle ran for the user (waggle
// lab exec), passed through as Waggle's own. The command has already said
// what went wrong, so nothing more is printed, as kubectl exec and ssh do.
type childExit int

func (c childExit) Error() string { return fmt.Sprintf("exit status %d", int(c)) }
func (c childExit) ExitCode() int { return int(c) }

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	// client-go and the other Kubernetes libraries log through klog: send
	// that through slog too, so a daemon's log has one format.
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(stderr, nil)).With("component", "client-go"))
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range append(commands(), hiddenCommands()...) {
		if c.name != args[0] {
			continue
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return exitStatus(stderr, c.name, c.run(ctx, args[1:]))
	}
	fmt.Fprintf(stderr, "waggle: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// exitStatus reports a command's error on stderr and returns the process's
// exit code.
func exitStatus(stderr io.Writer, name string, err error) int {
	var child childExit
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &child):
		return child.ExitCode()
	}
	fmt.Fprintf(stderr, "waggle %s: %v\n", name, err)
	var ec exitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: waggle COMMAND [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-20s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'waggle COMMAND --help' for a command's flags.\n")
}

func runVersion(_ context.Context, args []string) error {
	fmt.Println(version.String())
	return nil
}
