package images_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/containerd/containerd/namespaces"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/internal/ktest"
)

func readArchive(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		files[h.Name] = data
	}
}

func TestBuildIsDeterministicOCILayout(t *testing.T) {
	spec := images.EchoSpec("example.test/echo:v1", []byte("#!fake binary"))
	var a, b bytes.Buffer
	if err := images.Build(&a, spec); err != nil {
		t.Fatal(err)
	}
	if err := images.Build(&b, spec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two builds of the same spec differ")
	}
	files := readArchive(t, a.Bytes())
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %s", files["oci-layout"])
	}
	var idx ocispec.Index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(idx.Manifests))
	}
	m := idx.Manifests[0]
	if m.Annotations["io.containerd.image.name"] != "example.test/echo:v1" || m.Annotations[ocispec.AnnotationRefName] != "v1" {
		t.Errorf("annotations = %v", m.Annotations)
	}
	// Every descriptor points at a blob of the right size.
	var man ocispec.Manifest
	if err := json.Unmarshal(files["blobs/sha256/"+m.Digest.Encoded()], &man); err != nil {
		t.Fatalf("manifest blob: %v", err)
	}
	for _, d := range append([]ocispec.Descriptor{man.Config}, man.Layers...) {
		blob, ok := files["blobs/sha256/"+d.Digest.Encoded()]
		if !ok || int64(len(blob)) != d.Size {
			t.Errorf("blob %s: present %v, size %d want %d", d.Digest, ok, len(blob), d.Size)
		}
	}
}

func TestBuildRejectsBadSpecs(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec images.Spec
	}{
		{"empty name", images.Spec{Files: []images.File{{Path: "/a"}}}},
		{"name with space", images.Spec{Name: "a b"}},
		{"duplicate file", images.Spec{Name: "x", Files: []images.File{{Path: "/a"}, {Path: "a"}}}},
		{"file used as dir", images.Spec{Name: "x", Files: []images.File{{Path: "/a"}, {Path: "/a/b"}}}},
		{"root path", images.Spec{Name: "x", Files: []images.File{{Path: "/"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := images.Build(&buf, tc.spec)
			if !errors.Is(err, images.ErrInvalidImage) {
				t.Fatalf("err = %v, want ErrInvalidImage", err)
			}
			if buf.Len() != 0 {
				t.Errorf("wrote %d bytes for an invalid spec", buf.Len())
			}
		})
	}
}

func TestImportIntoContainerdAndCtr(t *testing.T) {
	c := ktest.StartContainerd(t)
	archive := ktest.EchoArchive(t)
	ctx := namespaces.WithNamespace(context.Background(), "waggle-test")
	names, err := images.ImportFile(ctx, c.Client, archive, "")
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if len(names) != 1 || names[0] != images.EchoImage {
		t.Fatalf("imported %v, want [%s]", names, images.EchoImage)
	}
	img, err := c.Client.GetImage(ctx, images.EchoImage)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := img.IsUnpacked(ctx, images.DefaultSnapshotter); err != nil || !ok {
		t.Errorf("image unpacked = %v, %v", ok, err)
	}
	// containerd's own CLI accepts the same archive.
	ctr := exec.Command("ctr", "--address", c.Address(), "-n", "ctr-test", "images", "import", archive)
	if out, err := ctr.CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v: %s", err, out)
	}
	out, err := exec.Command("ctr", "--address", c.Address(), "-n", "ctr-test", "images", "ls", "-q").CombinedOutput()
	if err != nil || !strings.Contains(string(out), images.EchoImage) {
		t.Fatalf("ctr images ls: %v: %s", err, out)
	}
}

func TestImportRejectsGarbage(t *testing.T) {
	c := ktest.StartContainerd(t)
	ctx := namespaces.WithNamespace(context.Background(), "waggle-test")
	if _, err := images.Import(ctx, c.Client, strings.NewReader("not a tar archive"), ""); err == nil {
		t.Fatal("importing garbage succeeded")
	}
	imgs, _ := c.Client.ListImages(ctx)
	if len(imgs) != 0 {
		t.Errorf("garbage import left %d images", len(imgs))
	}
}
