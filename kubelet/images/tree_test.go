package images_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/waggle-io/waggle/kubelet/images"
)

// layerEntries returns the tar headers of the one layer of an archive built
// by images.Build.
func layerEntries(t *testing.T, archive []byte) map[string]*tar.Header {
	t.Helper()
	files := readArchive(t, archive)
	var idx ocispec.Index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(files["blobs/sha256/"+idx.Manifests[0].Digest.Encoded()], &man); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(files["blobs/sha256/"+man.Layers[0].Digest.Encoded()]))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*tar.Header{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

func TestTreeFilesKeepsLinksModesAndMergesDirectories(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(a, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(a, "bin", "busybox"), []byte("#!busybox"), 0o755))
	must(os.Symlink("busybox", filepath.Join(a, "bin", "sh")))
	must(os.MkdirAll(filepath.Join(a, "tmp"), 0o755))
	must(os.Chmod(filepath.Join(a, "tmp"), os.ModeSticky|0o777))
	// A second tree sharing the bin directory, as two unpacked packages do.
	must(os.MkdirAll(filepath.Join(b, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(b, "bin", "agnhost"), []byte("#!agnhost"), 0o755))

	spec := images.Spec{Name: "example.test/tree:v1", User: "1000", StopSignal: "SIGQUIT"}
	for _, dir := range []string{a, b} {
		fl, err := images.TreeFiles(dir, "/")
		must(err)
		spec.Files = append(spec.Files, fl...)
	}
	var buf bytes.Buffer
	must(images.Build(&buf, spec))
	hdrs := layerEntries(t, buf.Bytes())
	if h := hdrs["bin/sh"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
		t.Errorf("bin/sh = %+v, want a symlink to busybox", h)
	}
	if h := hdrs["tmp/"]; h == nil || h.Mode&0o7777 != 0o1777 {
		t.Errorf("tmp/ = %+v, want mode 1777", h)
	}
	for _, f := range []string{"bin/busybox", "bin/agnhost"} {
		if h := hdrs[f]; h == nil || h.Typeflag != tar.TypeReg || h.Mode&0o777 != 0o755 {
			t.Errorf("%s = %+v, want an executable file", f, h)
		}
	}
}
