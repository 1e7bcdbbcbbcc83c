package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/namespaces"

	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet/containerlog"
	"github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/internal/ktest"
	"github.com/waggle-io/waggle/kubelet/runtime"
	"github.com/waggle-io/waggle/kubelet/runtime/runtimetest"
)

// TestMain lets this test binary be the containers' log writer, as the
// containerd runtime starts its own executable for that.
func TestMain(m *testing.M) {
	ktest.RunLoggerIfAsked()
	os.Exit(m.Run())
}

// runtimes returns the implementations under test: the fake always, the
// containerd one when privileged tests can run.
func runtimes(t *testing.T) map[string]runtime.Runtime {
	fake := runtimetest.NewFake(images.EchoImage)
	// The fake runs nothing; it answers `waggle-echo exit N` as the image would.
	fake.ExecFunc = func(_ runtime.Container, cmd []string) int {
		if len(cmd) == 3 && cmd[1] == "exit" {
			n, _ := strconv.Atoi(cmd[2])
			return n
		}
		return 0
	}
	out := map[string]runtime.Runtime{"fake": fake}
	if testing.Short() {
		return out
	}
	testutil.RequiresRoot(t)
	c := ktest.StartContainerd(t)
	ns := testutil.UniqueName("rt")
	ktest.ImportEcho(t, c, ns)
	rt, err := runtime.NewContainerd(runtime.ContainerdOptions{Address: c.Address(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	out["containerd"] = rt
	return out
}

func find(t *testing.T, rt runtime.Runtime, id string) runtime.Container {
	t.Helper()
	list, err := rt.ListContainers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		if c.ID == id {
			return c
		}
	}
	return runtime.Container{}
}

// TestRuntimeConformance runs the same behaviour against every runtime.
func TestRuntimeConformance(t *testing.T) {
	for name, rt := range runtimes(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			if _, err := rt.EnsureImage(ctx, images.EchoImage, runtime.PullNever); err != nil {
				t.Fatalf("present image with PullNever: %v", err)
			}
			if _, err := rt.EnsureImage(ctx, "example.invalid/absent:v1", runtime.PullNever); !errors.Is(err, runtime.ErrImageNotFound) {
				t.Errorf("absent image with PullNever: err = %v, want ErrImageNotFound", err)
			}
			logPath := filepath.Join(t.TempDir(), "0.log")
			cfg := runtime.ContainerConfig{PodUID: "u1", PodNamespace: "ns", PodName: "p", Name: "c", Attempt: 2,
				Image: images.EchoImage, Command: []string{"/waggle-echo", "log", "2"}, Env: []string{"A=b"},
				LogPath: logPath}
			if name == "containerd" {
				cfg.Command = []string{"/waggle-echo", "log", "2"}
			}
			id, err := rt.StartContainer(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			c := find(t, rt, id)
			if c.State != runtime.StateRunning || c.PodUID != "u1" || c.Name != "c" || c.Attempt != 2 || c.LogPath != logPath {
				t.Errorf("listed = %+v", c)
			}
			var out bytes.Buffer
			code, err := rt.Exec(ctx, id, []string{"/waggle-echo", "exit", "5"}, runtime.ExecOptions{Stdout: &out})
			if err != nil || code != 5 {
				t.Errorf("exec exit 5: code %d err %v", code, err)
			}
			if name == "containerd" {
				out.Reset()
				if code, err := rt.Exec(ctx, id, []string{"/waggle-echo", "stdin-echo"}, runtime.ExecOptions{Stdin: strings.NewReader("abc"), Stdout: &out}); err != nil || code != 0 || out.String() != "abc" {
					t.Errorf("exec stdin-echo: %d %v %q", code, err, out.String())
				}
				// Upstream's CRI spec: no tmpfs of containerd's default spec on /run.
				out.Reset()
				if code, err := rt.Exec(ctx, id, []string{"/waggle-echo", "cat", "/proc/self/mounts"}, runtime.ExecOptions{Stdout: &out}); err != nil || code != 0 {
					t.Errorf("cat /proc/self/mounts: %d %v", code, err)
				}
				for _, l := range strings.Split(out.String(), "\n") {
					if f := strings.Fields(l); len(f) > 1 && f[1] == "/run" {
						t.Errorf("a mount on /run: %s", l)
					}
				}
				if _, err := rt.Stats(ctx, id); err != nil {
					t.Errorf("stats: %v", err)
				}
				testutil.WaitFor(t, 5*time.Second, "line 2 in the log", func() bool {
					b, _ := os.ReadFile(logPath)
					return strings.Contains(string(b), "line 2")
				})
				// The shim's logger writes CRI records: stamped, by stream.
				b, _ := os.ReadFile(logPath)
				if first, err := containerlog.Parse(bytes.SplitAfter(b, []byte("\n"))[0]); err != nil || first.Stream != containerlog.Stdout || string(first.Content) != "line 1" {
					t.Errorf("log file = %q: first record %+v, %v", b, first, err)
				}
				var logged bytes.Buffer
				if err := containerlog.Read(ctx, logPath, containerlog.Options{TailLines: -1}, &logged, &logged, nil); err != nil || !strings.Contains(logged.String(), "line 1\nline 2\n") {
					t.Errorf("log = %q, %v", logged.String(), err)
				}
			}
			if err := rt.StopContainer(ctx, id, time.Second); err != nil {
				t.Fatal(err)
			}
			if err := rt.StopContainer(ctx, id, time.Second); err != nil {
				t.Errorf("second stop: %v", err)
			}
			c = find(t, rt, id)
			if c.State != runtime.StateExited && c.State != runtime.StateUnknown {
				t.Errorf("after stop: %+v", c)
			}
			if _, err := rt.Exec(ctx, id, []string{"/waggle-echo", "env"}, runtime.ExecOptions{}); err == nil {
				t.Error("exec in a stopped container succeeded")
			}
			if err := rt.RemoveContainer(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := rt.RemoveContainer(ctx, id); err != nil {
				t.Errorf("second remove: %v", err)
			}
			if c := find(t, rt, id); c.ID != "" {
				t.Errorf("removed container still listed: %+v", c)
			}
		})
	}
}

func TestNormalizeImage(t *testing.T) {
	for in, want := range map[string]string{
		"nginx":                        "docker.io/library/nginx:latest",
		"waggle.local/waggle-echo:dev": "waggle.local/waggle-echo:dev",
		"127.0.0.1:5000/a/b:v1":        "127.0.0.1:5000/a/b:v1",
	} {
		if got, err := runtime.NormalizeImage(in); err != nil || got != want {
			t.Errorf("NormalizeImage(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := runtime.NormalizeImage("UPPER/Case"); err == nil {
		t.Error("invalid reference accepted")
	}
}

func TestLocalOnlyImages(t *testing.T) {
	for ref, want := range map[string]bool{
		"waggle.local/waggle-echo:dev":   true,
		"waggle.local/waggle-echo":       true,
		"docker.io/library/busybox:1.36": false,
		"registry.example/waggle.local":  false,
		"localhost:5000/app:v1":          false,
	} {
		if got := runtime.LocalOnly(ref); got != want {
			t.Errorf("LocalOnly(%q) = %v, want %v", ref, got, want)
		}
	}
}

// TestLocalRegistriesAreNeverPulled: with LocalRegistries, an image of
// such a registry imported on the node is its copy even under
// imagePullPolicy Always (no registry is asked: none is reachable here),
// and a missing one is refused at once as waggle.local's are.
func TestLocalRegistriesAreNeverPulled(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd runtime runs in the privileged tier (not -short)")
	}
	testutil.RequiresRoot(t)
	c := ktest.StartContainerd(t)
	ns := testutil.UniqueName("rt")
	ctx := namespaces.WithNamespace(context.Background(), ns)
	const ref = "registry.k8s.io/e2e-test-images/waggle-echo:1.0"
	var buf bytes.Buffer
	if err := images.Build(&buf, images.EchoSpec(ref, ktest.EchoBinary(t))); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Import(ctx, c.Client, &buf, ""); err != nil {
		t.Fatal(err)
	}
	rt, err := runtime.NewContainerd(runtime.ContainerdOptions{Address: c.Address(), Namespace: ns, LocalRegistries: []string{"registry.k8s.io"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	if _, err := rt.EnsureImage(context.Background(), ref, runtime.PullAlways); err != nil {
		t.Errorf("imported image of a local registry with PullAlways: %v", err)
	}
	_, err = rt.EnsureImage(context.Background(), "registry.k8s.io/e2e-test-images/absent:1.0", runtime.PullAlways)
	if err == nil || !errors.Is(err, runtime.ErrNotFound) || !strings.Contains(err.Error(), "never looked up in DNS") {
		t.Errorf("missing image of a local registry: err = %v, want the local-only refusal", err)
	}
}

// TestMissingLocalImageIsNeverPulled: a waggle.local image that is not on
// the node (here a missing tag, defaulting to :latest and so to
// imagePullPolicy Always) fails at once, without a registry or DNS lookup.
func TestMissingLocalImageIsNeverPulled(t *testing.T) {
	rt, ok := runtimes(t)["containerd"]
	if !ok {
		t.Skip("containerd runtime runs in the privileged tier (not -short)")
	}
	for _, policy := range []runtime.PullPolicy{runtime.PullAlways, runtime.PullIfNotPresent} {
		_, err := rt.EnsureImage(context.Background(), "waggle.local/waggle-echo", policy)
		if err == nil || !errors.Is(err, runtime.ErrNotFound) || !strings.Contains(err.Error(), "never looked up in DNS") {
			t.Errorf("policy %v: err = %v, want the local-only refusal", policy, err)
		}
	}
	// The present image with PullAlways is the node's copy, not a pull.
	if _, err := rt.EnsureImage(context.Background(), images.EchoImage, runtime.PullAlways); err != nil {
		t.Errorf("present local image with PullAlways: %v", err)
	}
}

// TestContainerdStdinContainerLogs: a container with stdin takes its input
// from the stdin FIFO and its output still reaches a CRI log, through the
// FIFO logger the runtime starts (the shim's binary logging passes no stdin).
func TestContainerdStdinContainerLogs(t *testing.T) {
	rt, ok := runtimes(t)["containerd"]
	if !ok {
		t.Skip("needs containerd (privileged tests)")
	}
	ctx := context.Background()
	logPath := filepath.Join(t.TempDir(), "0.log")
	id, err := rt.StartContainer(ctx, runtime.ContainerConfig{PodUID: "u2", PodNamespace: "ns", PodName: "p", Name: "in",
		Image: images.EchoImage, Command: []string{"/waggle-echo", "stdin-echo"}, LogPath: logPath, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.RemoveContainer(ctx, id)
	defer rt.StopContainer(ctx, id, 0)
	fifo, err := os.OpenFile(runtime.StdinPath(logPath), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fifo.Close()
	if _, err := fifo.Write([]byte("hello through stdin\n")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		var logged bytes.Buffer
		containerlog.Read(ctx, logPath, containerlog.Options{TailLines: -1}, &logged, nil, nil)
		if logged.String() != "hello through stdin\n" {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("stdout in the log = %q (file %q)", logged.String(), b)
		}
		return nil
	})
}

// TestContainerdStartTimeSurvivesARestartedKubelet: containerd keeps no
// start time of a container's task, and the runtime writes none at the
// start (one metadata write per container fewer): a runtime that did not
// start a running container (a restarted kubelet) reports its process's
// start time, and the exit record keeps the start time for every later
// runtime.
func TestContainerdStartTimeSurvivesARestartedKubelet(t *testing.T) {
	testutil.RequiresRoot(t) // skipped in -short
	c, ns := ktest.StartContainerd(t), testutil.UniqueName("rt")
	ktest.ImportEcho(t, c, ns)
	open := func() *runtime.Containerd {
		rt, err := runtime.NewContainerd(runtime.ContainerdOptions{Address: c.Address(), Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		return rt
	}
	ctx := context.Background()
	first := open()
	if _, err := first.EnsureImage(ctx, images.EchoImage, runtime.PullNever); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	id, err := first.StartContainer(ctx, runtime.ContainerConfig{PodUID: "u1", PodNamespace: "ns", PodName: "p", Name: "c",
		Image: images.EchoImage, Command: []string{"/waggle-echo", "log", "2"}})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	started := find(t, first, id).StartedAt
	if started.Before(before) || started.After(after) {
		t.Errorf("startedAt %s, not within the start (%s to %s)", started, before, after)
	}
	// A restarted kubelet: the process's start time, which the kernel
	// noted when runc created it, a moment before the start returned.
	second := open()
	if got := find(t, second, id).StartedAt; got.Before(before.Add(-20*time.Millisecond)) || got.After(started) {
		t.Errorf("restarted runtime: startedAt %s, want between %s and %s", got, before, started)
	}
	if err := first.StopContainer(ctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the exit recorded", func() bool { return find(t, first, id).State == runtime.StateExited })
	for name, rt := range map[string]runtime.Runtime{"first": first, "second": second, "third": open()} {
		if got := find(t, rt, id); !got.StartedAt.Equal(started) {
			t.Errorf("%s runtime after the exit: startedAt %s, want %s", name, got.StartedAt, started)
		}
	}
	if err := first.RemoveContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
}
