package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	containerdimages "github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"

	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/internal/ktest"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// The runtime keeps the images it resolved (one lookup per image, not per
// container) only until containerd says an image changed: removed or
// retagged behind the kubelet's back, the next EnsureImage and
// StartContainer see containerd's state, not the kept one.
func TestContainerdImageCacheFollowsImageEvents(t *testing.T) {
	testutil.RequiresRoot(t)
	c := ktest.StartContainerd(t)
	ns := testutil.UniqueName("ic")
	ktest.ImportEcho(t, c, ns)
	rt, err := runtime.NewContainerd(runtime.ContainerdOptions{Address: c.Address(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	ctx := context.Background()
	nsCtx := namespaces.WithNamespace(ctx, ns)
	const name = "docker.io/library/ic-other:1"
	importAs := func(marker string) {
		t.Helper()
		spec := images.EchoSpec(name, ktest.EchoBinary(t))
		spec.Files = append(spec.Files, images.File{Path: "/ic-marker", Mode: 0o644, Data: []byte(marker)})
		var buf bytes.Buffer
		if err := images.Build(&buf, spec); err != nil {
			t.Fatal(err)
		}
		if _, err := images.Import(nsCtx, c.Client, &buf, ""); err != nil {
			t.Fatal(err)
		}
	}
	importAs("first")
	first, err := rt.EnsureImage(ctx, name, runtime.PullNever)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := rt.EnsureImage(ctx, name, runtime.PullNever); err != nil || again != first {
		t.Fatalf("second EnsureImage = %q, %v; want %q", again, err, first)
	}

	// Removed through containerd directly, not the runtime.
	if err := c.Client.ImageService().Delete(nsCtx, name, containerdimages.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "EnsureImage to see the image gone", func() bool {
		_, err := rt.EnsureImage(ctx, name, runtime.PullNever)
		return errors.Is(err, runtime.ErrImageNotFound)
	})
	if _, err := rt.StartContainer(ctx, runtime.ContainerConfig{PodUID: "u1", PodNamespace: "ns", PodName: "p", Name: "c",
		Image: name, Command: []string{"/waggle-echo", "sleep", "60"}}); !errors.Is(err, runtime.ErrImageNotFound) {
		t.Fatalf("StartContainer of a removed image: %v, want ErrImageNotFound", err)
	}

	// The name again, on other content: EnsureImage and the container
	// started from it say the new image.
	importAs("second")
	var second string
	testutil.WaitFor(t, 10*time.Second, "EnsureImage to see the new image", func() bool {
		second, err = rt.EnsureImage(ctx, name, runtime.PullNever)
		return err == nil
	})
	if second == first {
		t.Fatalf("image ID %s after retagging, the removed image's", second)
	}
	id, err := rt.StartContainer(ctx, runtime.ContainerConfig{PodUID: "u2", PodNamespace: "ns", PodName: "p2", Name: "c",
		Image: name, Command: []string{"/waggle-echo", "sleep", "60"}, LogPath: filepath.Join(t.TempDir(), "0.log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.StopContainer(ctx, id, 0)
		rt.RemoveContainer(ctx, id)
	})
	list, err := rt.ListContainers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ctr := range list {
		if ctr.ID == id {
			found = true
			if ctr.ImageID != second {
				t.Fatalf("container of the retagged image has image ID %s, want %s", ctr.ImageID, second)
			}
		}
	}
	if !found {
		t.Fatalf("container %s not listed", id)
	}
}
