package runtime_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/namespaces"

	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/internal/ktest"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// The disk side of the containerd runtime, on a real containerd: images by
// ID with every name and a size, the snapshotter's root as the image
// filesystem, a container's writable layer usage, and removal of every name
// of an image.
func TestContainerdStorage(t *testing.T) {
	testutil.RequiresRoot(t)
	c := ktest.StartContainerd(t)
	ns := testutil.UniqueName("st")
	ktest.ImportEcho(t, c, ns)
	rt, err := runtime.NewContainerd(runtime.ContainerdOptions{Address: c.Address(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	ctx := context.Background()

	// A second image under two names (same content, one ID).
	spec := images.EchoSpec("docker.io/library/st-other:1", ktest.EchoBinary(t))
	spec.Files = append(spec.Files, images.File{Path: "/st-marker", Mode: 0o644, Data: []byte("other")})
	for _, name := range []string{"docker.io/library/st-other:1", "docker.io/library/st-other:alias"} {
		spec.Name = name
		var buf bytes.Buffer
		if err := images.Build(&buf, spec); err != nil {
			t.Fatal(err)
		}
		if _, err := images.Import(namespaces.WithNamespace(ctx, ns), c.Client, &buf, ""); err != nil {
			t.Fatal(err)
		}
	}
	list, err := rt.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var other runtime.Image
	for _, im := range list {
		if slices.Contains(im.RepoTags, "docker.io/library/st-other:1") {
			other = im
		}
		if im.Size <= 0 || im.ID == "" {
			t.Errorf("image %+v has no ID or size", im)
		}
	}
	if len(list) != 2 || !slices.Equal(other.RepoTags, []string{"docker.io/library/st-other:1", "docker.io/library/st-other:alias"}) {
		t.Fatalf("images = %+v, want the echo image and st-other with both names", list)
	}

	dir, err := rt.ImageFsDir(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || !filepath.IsAbs(dir) {
		t.Errorf("image fs dir %q: %v", dir, err)
	}

	id, err := rt.StartContainer(ctx, runtime.ContainerConfig{PodUID: "u1", PodNamespace: "ns", PodName: "p", Name: "c",
		Image: images.EchoImage, Command: []string{"/waggle-echo", "write", "/tmp/st-file", "some text"},
		LogPath: filepath.Join(t.TempDir(), "0.log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.StopContainer(ctx, id, 0)
		rt.RemoveContainer(ctx, id)
	})
	// The container writes a file into its writable layer.
	testutil.WaitFor(t, 10*time.Second, "the written file counted in the writable layer", func() bool {
		b, inodes, err := rt.WritableLayerUsage(ctx, id)
		return err == nil && b > 0 && inodes > 0
	})

	if err := rt.RemoveImage(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	if err := rt.RemoveImage(ctx, other.ID); err != nil {
		t.Errorf("removing a missing image: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "st-other gone", func() bool {
		list, err := rt.ListImages(ctx)
		return err == nil && len(list) == 1 && list[0].RepoTags[0] == images.EchoImage
	})
}
