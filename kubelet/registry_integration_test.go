package kubelet_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/remotes/docker"
	v1 "k8s.io/api/core/v1"

	"github.com/waggle-io/waggle/internal/testutil"
	wimages "github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/internal/ktest"
)

// startRegistry runs Debian's docker-registry (the CNCF distribution
// registry) on a free loopback port. `make deps` installs it; without it the
// test skips, and fails under WAGGLE_PRIVILEGED_TESTS=1.
func startRegistry(t *testing.T) string {
	t.Helper()
	registry := testutil.RequiresBinary(t, "docker-registry")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr)
	os.WriteFile(filepath.Join(dir, "config.yml"), []byte(cfg), 0o644)
	cmd := exec.Command(registry, "serve", filepath.Join(dir, "config.yml"))
	logf, _ := os.Create(filepath.Join(dir, "registry.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	registries[addr] = cmd
	t.Cleanup(func() { stopRegistry(t, addr); logf.Close() })
	waitFor(t, 20*time.Second, "registry up", func() (bool, string) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil, fmt.Sprint(err)
	})
	return addr
}

var registries = map[string]*exec.Cmd{}

func stopRegistry(t *testing.T, addr string) {
	if cmd, ok := registries[addr]; ok {
		cmd.Process.Kill()
		cmd.Wait()
		delete(registries, addr)
	}
}

func TestPullFromRegistryHonoursPullPolicy(t *testing.T) {
	testutil.RequiresRoot(t)
	addr := startRegistry(t)
	n := newNode(t, nil)
	ref := addr + "/waggle/echo:v1"

	// Push the echo image to the registry from another containerd
	// namespace, so the kubelet's namespace has to pull it.
	ctx := namespaces.WithNamespace(context.Background(), "pusher")
	if _, err := wimages.ImportFile(ctx, n.ctrd.Client, ktest.EchoArchive(t), ""); err != nil {
		t.Fatal(err)
	}
	src, err := n.ctrd.Client.ImageService().Get(ctx, wimages.EchoImage)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.ctrd.Client.ImageService().Create(ctx, images.Image{Name: ref, Target: src.Target}); err != nil {
		t.Fatal(err)
	}
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost))})
	if err := n.ctrd.Client.Push(ctx, ref, src.Target, containerd.WithResolver(resolver)); err != nil {
		t.Fatalf("push to the test registry: %v", err)
	}

	n.create(echoPod(n, "pulled", func(p *v1.Pod) {
		p.Spec.Containers[0].Image = ref
		p.Spec.Containers[0].ImagePullPolicy = v1.PullAlways
	}))
	p := n.waitPod("pulled", "running from the pulled image", 60*time.Second, runningReady)
	if p.Status.ContainerStatuses[0].ImageID == "" {
		t.Error("no image ID")
	}
	if _, err := n.ctrd.Client.GetImage(namespacesCtx(n), ref); err != nil {
		t.Errorf("pulled image not in the node's namespace: %v", err)
	}

	// Without the registry: IfNotPresent uses the local copy, Always fails
	// with ErrImagePull.
	{
		stopRegistry(t, addr)
		n.create(echoPod(n, "local", func(p *v1.Pod) {
			p.Spec.Containers[0].Image = ref
			p.Spec.Containers[0].ImagePullPolicy = v1.PullIfNotPresent
		}))
		n.waitPod("local", "running from the local copy", 60*time.Second, runningReady)
		n.create(echoPod(n, "always", func(p *v1.Pod) {
			p.Spec.Containers[0].Image = ref
			p.Spec.Containers[0].ImagePullPolicy = v1.PullAlways
		}))
		n.waitPod("always", "ErrImagePull or ImagePullBackOff", 60*time.Second, func(p *v1.Pod) bool {
			if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil {
				return false
			}
			r := p.Status.ContainerStatuses[0].State.Waiting.Reason
			return r == "ErrImagePull" || r == "ImagePullBackOff"
		})
	}
}
