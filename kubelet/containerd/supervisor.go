// Package containerd supervises a private containerd daemon: it writes a
// config whose root, state, socket and plugin directories all live under one
// given directory, starts `containerd` from PATH, waits until it serves, and
// stops it by PID. `waggle up` uses it when no containerd is running, and the
// kubelet's integration tests use it to get a daemon of their own.
//
// It is not the kubelet's container runtime (kubelet/runtime talks to any
// containerd, supervised here or not), and stopping the daemon never stops
// containers: their shims outlive containerd, as in production.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
)

// ErrNotReady is returned when the daemon does not serve in time.
var ErrNotReady = errors.New("containerd did not become ready")

// Options configure a supervised daemon.
type Options struct {
	// Dir holds root/, state/, the socket and the config. Required.
	Dir string
	// Binary is the containerd executable; "" means "containerd" from PATH.
	Binary string
	// ReadyTimeout bounds the wait for the socket to serve (default 30 s).
	ReadyTimeout time.Duration
	// Log receives the daemon's lifecycle events; nil discards them.
	Log *slog.Logger
}

// Daemon is a running containerd started by Start.
type Daemon struct {
	opts    Options
	cmd     *exec.Cmd
	logFile *os.File
	done    chan struct{}
	waitErr error
	mu      sync.Mutex
}

// Address returns the gRPC socket path a daemon in dir listens on.
func Address(dir string) string { return filepath.Join(dir, "containerd.sock") }

// Config returns the containerd config for a daemon under dir.
func Config(dir string) string {
	// The CRI plugin is disabled: the kubelet talks to containerd's own API.
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), Address(dir), Address(dir)+".ttrpc", filepath.Join(dir, "opt"))
}

// Start starts containerd and waits until its socket serves.
func Start(ctx context.Context, opts Options) (*Daemon, error) {
	if opts.Dir == "" {
		return nil, errors.New("containerd supervisor: Dir is required")
	}
	if opts.Binary == "" {
		opts.Binary = "containerd"
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	bin, err := exec.LookPath(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("find containerd: %w (install the containerd package)", err)
	}
	if len(Address(opts.Dir)) > 100 {
		return nil, fmt.Errorf("containerd socket path %q is too long for a unix socket: choose a shorter dir", Address(opts.Dir))
	}
	if err := os.MkdirAll(opts.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("containerd dir: %w", err)
	}
	cfg := filepath.Join(opts.Dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(Config(opts.Dir)), 0o644); err != nil {
		return nil, fmt.Errorf("write containerd config: %w", err)
	}
	logFile, err := os.OpenFile(filepath.Join(opts.Dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("containerd log: %w", err)
	}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so a terminal's ^C reaches the supervisor only;
	// the supervisor then stops the daemon in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	d := &Daemon{opts: opts, cmd: cmd, logFile: logFile, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		d.mu.Lock()
		d.waitErr = err
		d.mu.Unlock()
		close(d.done)
	}()
	opts.Log.Info("started containerd", "pid", cmd.Process.Pid, "address", Address(opts.Dir))
	if err := d.waitReady(ctx); err != nil {
		d.Stop(context.Background())
		return nil, err
	}
	return d, nil
}

func (d *Daemon) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	for {
		select {
		case <-d.done:
			return fmt.Errorf("%w: it exited (%v); see %s", ErrNotReady, d.waitErr, filepath.Join(d.opts.Dir, "containerd.log"))
		default:
		}
		if _, err := os.Stat(Address(d.opts.Dir)); err == nil {
			c, err := ctrd.New(Address(d.opts.Dir), ctrd.WithTimeout(2*time.Second))
			if err == nil {
				ok, err := c.IsServing(ctx)
				c.Close()
				if ok && err == nil {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w within %s: %v", ErrNotReady, d.opts.ReadyTimeout, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Address is the daemon's gRPC socket.
func (d *Daemon) Address() string { return Address(d.opts.Dir) }

// PID is the daemon's process id.
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Done is closed when the daemon exits.
func (d *Daemon) Done() <-chan struct{} { return d.done }

// Stop sends SIGTERM, waits up to 10 s (or until ctx ends), then SIGKILLs.
// Containers keep running: their shims are not containerd's children to
// stop. Stop is idempotent.
func (d *Daemon) Stop(ctx context.Context) error {
	select {
	case <-d.done:
		d.logFile.Close()
		return nil
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-d.done:
	case <-t.C:
		_ = d.cmd.Process.Kill()
		<-d.done
	case <-ctx.Done():
		_ = d.cmd.Process.Kill()
		<-d.done
	}
	d.logFile.Close()
	d.opts.Log.Info("stopped containerd", "pid", d.cmd.Process.Pid)
	return nil
}

// Log returns the tail of the daemon's log, for test failure messages.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(filepath.Join(d.opts.Dir, "containerd.log"))
	s := string(b)
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return strings.TrimSpace(s)
}
