// Package ktest holds the kubelet packages' shared integration fixtures: a
// private containerd daemon per test, and the waggle-echo image built from
// source and imported into it. It is for tests only.
package ktest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet/containerd"
	"github.com/waggle-io/waggle/kubelet/containerlog"
	"github.com/waggle-io/waggle/kubelet/images"
)

// RunLoggerIfAsked makes a test binary answer `container-logger` as the
// waggle binary does: the containerd runtime starts its own executable as a
// container's log writer, which in a test is the test binary. Call it first
// in TestMain; it exits when the binary was started as the logger.
func RunLoggerIfAsked() {
	if code := containerlog.Main(os.Args); code >= 0 {
		os.Exit(code)
	}
}

var (
	echoOnce sync.Once
	echoBin  []byte
	echoErr  error
)

// repoRoot is the module root, found from this file's path.
func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", "..")
}

// EchoBinary builds cmd/waggle-echo statically (once per test process).
func EchoBinary(t testing.TB) []byte {
	t.Helper()
	echoOnce.Do(func() {
		dir, err := os.MkdirTemp("", "waggle-echo-")
		if err != nil {
			echoErr = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "waggle-echo")
		cmd := exec.Command("go", "build", "-ldflags", "-s -w", "-o", out, "./cmd/waggle-echo")
		cmd.Dir = repoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			echoErr = &buildError{err: err, out: string(b)}
			return
		}
		echoBin, echoErr = os.ReadFile(out)
	})
	if echoErr != nil {
		t.Fatalf("build waggle-echo: %v", echoErr)
	}
	return echoBin
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// EchoArchive writes the waggle-echo OCI archive into a temp dir of t and
// returns its path.
func EchoArchive(t testing.TB) string {
	t.Helper()
	var buf bytes.Buffer
	if err := images.Build(&buf, images.EchoSpec("", EchoBinary(t))); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "waggle-echo.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Containerd is a private daemon for one test.
type Containerd struct {
	*containerd.Daemon
	Dir    string
	Client *ctrd.Client
}

// StartContainerd gates on root and the containerd and runc binaries, starts
// a private containerd under a short temp dir and stops it when t ends.
// Containers left in it are killed first.
func StartContainerd(t testing.TB) *Containerd {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "containerd")
	testutil.RequiresBinary(t, "runc")
	testutil.RequiresBinary(t, "containerd-shim-runc-v2")
	// Short: the socket path must fit a sockaddr_un. $TMPDIR when it is
	// short (e.g. /dev/shm on a host whose /tmp is full), else /tmp.
	base := "/tmp"
	if d := os.Getenv("TMPDIR"); d != "" && len(d) <= 16 {
		base = d
	}
	dir, err := os.MkdirTemp(base, "wctd")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := containerd.Start(ctx, containerd.Options{Dir: dir})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("start containerd: %v", err)
	}
	c := &Containerd{Daemon: d, Dir: dir}
	t.Cleanup(func() {
		if c.Client != nil {
			c.Client.Close()
		}
		// c.Daemon, not d: Restart replaces the daemon.
		KillAll(t, c.Daemon.Address())
		c.Daemon.Stop(context.Background())
		// A task created while KillAll ran leaves a shim behind.
		if err := containerd.KillShims(c.Daemon.Address()); err != nil {
			t.Errorf("containerd shims left behind: %v", err)
		}
		// Snapshots are overlay mounts under root; unmount whatever is left.
		exec.Command("sh", "-c", "grep -o ' "+dir+"[^ ]*' /proc/self/mounts | sort -r | xargs -r -n1 umount -l").Run()
		os.RemoveAll(dir)
	})
	cl, err := ctrd.New(d.Address(), ctrd.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("connect containerd: %v", err)
	}
	c.Client = cl
	return c
}

// Restart stops and starts the daemon in place (containers keep running).
func (c *Containerd) Restart(t testing.TB) {
	t.Helper()
	if c.Client != nil {
		c.Client.Close()
	}
	c.Daemon.Stop(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := containerd.Start(ctx, containerd.Options{Dir: c.Dir})
	if err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	c.Daemon = d
	cl, err := ctrd.New(d.Address(), ctrd.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("connect containerd: %v", err)
	}
	c.Client = cl
}

// KillAll kills and deletes every task and container in every namespace of
// the daemon at address (test cleanup).
func KillAll(t testing.TB, address string) {
	cl, err := ctrd.New(address, ctrd.WithTimeout(5*time.Second))
	if err != nil {
		return
	}
	defer cl.Close()
	bg := context.Background()
	nss, _ := cl.NamespaceService().List(bg)
	for _, ns := range nss {
		ctx := namespaces.WithNamespace(bg, ns)
		cs, _ := cl.Containers(ctx)
		for _, c := range cs {
			if task, err := c.Task(ctx, nil); err == nil {
				task.Kill(ctx, 9)
				wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if ch, err := task.Wait(wctx); err == nil {
					select {
					case <-ch:
					case <-wctx.Done():
					}
				}
				cancel()
				task.Delete(ctx, ctrd.WithProcessKill)
			}
			c.Delete(ctx, ctrd.WithSnapshotCleanup)
		}
	}
}

// ImportEcho imports the waggle-echo image into namespace ns of c.
func ImportEcho(t testing.TB, c *Containerd, ns string) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), ns)
	if _, err := images.ImportFile(ctx, c.Client, EchoArchive(t), ""); err != nil {
		t.Fatalf("import waggle-echo: %v", err)
	}
}
