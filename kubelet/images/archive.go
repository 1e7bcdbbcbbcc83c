// Package images builds and imports the node's container images without
// Docker: it writes OCI image-layout archives (index.json, manifest, config
// and gzipped tar layers, all content-addressed) that both `waggle images
// import` and containerd's `ctr images import` accept, and it imports such
// archives (or Docker-style ones) into containerd's image store and unpacks
// them for the snapshotter.
//
// It is not a registry client: pulling from a registry is the container
// runtime's job (kubelet/runtime).
package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/containerd/containerd/images"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ErrInvalidImage marks an image description that cannot be built.
var ErrInvalidImage = errors.New("invalid image")

// File is one regular file, directory or symbolic link of an image's single
// layer.
type File struct {
	// Path inside the image, e.g. "/waggle-echo" (leading slash optional).
	Path string
	// Mode is the permission bits (0o755 for an executable), with the
	// setuid, setgid and sticky bits where wanted (0o1777 for /tmp).
	Mode int64
	// Dir makes this a directory; Data is then ignored. The same directory
	// may be given more than once (trees merged from several packages).
	Dir bool
	// Link makes this a symbolic link to Link; Data is then ignored.
	Link string
	// UID and GID own the entry (0: root).
	UID, GID int
	Data     []byte
}

// Spec describes an image to build.
type Spec struct {
	// Name is the full reference, e.g. "waggle.local/waggle-echo:dev".
	Name string
	// Files make up the image's one layer.
	Files []File
	// Entrypoint, Cmd, Env, WorkingDir and ExposedPorts ("8080/tcp") go into
	// the image config.
	Entrypoint   []string
	Cmd          []string
	Env          []string
	WorkingDir   string
	ExposedPorts []string
	// User ("1000", "nginx", "1000:50000") and StopSignal ("SIGQUIT") go
	// into the image config too.
	User, StopSignal string
	// OS and Architecture default to linux and amd64.
	OS, Architecture string
}

// epoch is the fixed timestamp of every file and of the image, so that the
// same input gives the same digests.
var epoch = time.Unix(0, 0).UTC()

// Build writes spec as an OCI image-layout tar archive to w. The output is
// deterministic: the same spec gives byte-identical archives.
func Build(w io.Writer, spec Spec) error {
	if spec.Name == "" || strings.ContainsAny(spec.Name, " \t\n") {
		return fmt.Errorf("%w: name %q", ErrInvalidImage, spec.Name)
	}
	if spec.OS == "" {
		spec.OS = "linux"
	}
	if spec.Architecture == "" {
		spec.Architecture = "amd64"
	}
	layer, diffID, err := buildLayer(spec.Files)
	if err != nil {
		return err
	}
	layerDesc := descriptor(ocispec.MediaTypeImageLayerGzip, layer)

	cfg := ocispec.Image{
		Created:  &epoch,
		Platform: ocispec.Platform{OS: spec.OS, Architecture: spec.Architecture},
		Config: ocispec.ImageConfig{
			Entrypoint: spec.Entrypoint,
			Cmd:        spec.Cmd,
			Env:        spec.Env,
			WorkingDir: spec.WorkingDir,
			User:       spec.User,
			StopSignal: spec.StopSignal,
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	}
	if len(spec.ExposedPorts) > 0 {
		cfg.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range spec.ExposedPorts {
			cfg.Config.ExposedPorts[p] = struct{}{}
		}
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode image config: %w", err)
	}
	cfgDesc := descriptor(ocispec.MediaTypeImageConfig, cfgJSON)

	manifest := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    cfgDesc,
		Layers:    []ocispec.Descriptor{layerDesc},
	}
	manJSON, err := json.Marshal(manifest)
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	manDesc := descriptor(ocispec.MediaTypeImageManifest, manJSON)
	manDesc.Platform = &ocispec.Platform{OS: spec.OS, Architecture: spec.Architecture}
	manDesc.Annotations = map[string]string{
		images.AnnotationImageName: spec.Name,
		ocispec.AnnotationRefName:  refName(spec.Name),
	}
	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manDesc},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return fmt.Errorf("encode index: %w", err)
	}
	layout, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})

	tw := tar.NewWriter(w)
	put := func(name string, data []byte) error {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir, Format: tar.FormatPAX})
	}
	blob := func(d ocispec.Descriptor, data []byte) error {
		return put("blobs/sha256/"+d.Digest.Encoded(), data)
	}
	for _, step := range []func() error{
		func() error { return put(ocispec.ImageLayoutFile, layout) },
		func() error { return dir("blobs/") },
		func() error { return dir("blobs/sha256/") },
		func() error { return blob(layerDesc, layer) },
		func() error { return blob(cfgDesc, cfgJSON) },
		func() error { return blob(manDesc, manJSON) },
		func() error { return put(ocispec.ImageIndexFile, indexJSON) },
		tw.Close,
	} {
		if err := step(); err != nil {
			return fmt.Errorf("write image archive: %w", err)
		}
	}
	return nil
}

// refName is the tag part of a reference ("dev" of "x/y:dev"), which is what
// org.opencontainers.image.ref.name conventionally holds.
func refName(name string) string {
	last := name[strings.LastIndex(name, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		return last[i+1:]
	}
	return "latest"
}

func descriptor(mediaType string, data []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
}

// buildLayer returns the gzipped layer and the digest of its uncompressed tar
// (the diff ID). Parent directories are added as needed.
func buildLayer(files []File) (gz []byte, diffID digest.Digest, err error) {
	entries := map[string]File{}
	for _, f := range files {
		p := strings.TrimPrefix(path.Clean("/"+f.Path), "/")
		if p == "" || p == "." {
			return nil, "", fmt.Errorf("%w: file path %q", ErrInvalidImage, f.Path)
		}
		if old, dup := entries[p]; dup {
			if old.Dir && f.Dir {
				f.Path = p
				entries[p] = f // the later (explicit) mode and owner win
				continue
			}
			return nil, "", fmt.Errorf("%w: file %q given twice", ErrInvalidImage, f.Path)
		}
		f.Path = p
		entries[p] = f
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if e, ok := entries[d]; ok && !e.Dir {
				// A file below a symbolic link would land wherever the
				// link points when unpacked: refuse it as well.
				return nil, "", fmt.Errorf("%w: %q is a file and a directory", ErrInvalidImage, d)
			}
			if _, ok := entries[d]; !ok {
				entries[d] = File{Path: d, Dir: true, Mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)

	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, n := range names {
		f := entries[n]
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
			if f.Dir {
				mode = 0o755
			}
		}
		hdr := &tar.Header{Name: n, Mode: mode, Uid: f.UID, Gid: f.GID, ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(f.Data)), Format: tar.FormatPAX}
		switch {
		case f.Dir:
			hdr.Name += "/"
			hdr.Typeflag = tar.TypeDir
			hdr.Size = 0
		case f.Link != "":
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = f.Link
			hdr.Mode = 0o777
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, "", fmt.Errorf("layer %s: %w", n, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, "", fmt.Errorf("layer %s: %w", n, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	diffID = digest.Digest(fmt.Sprintf("sha256:%x", sha256.Sum256(raw.Bytes())))
	var out bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
	// A zero ModTime and no name keep the gzip header deterministic.
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return out.Bytes(), diffID, nil
}

// EchoImage is the reference of the project's own workload image.
const EchoImage = "waggle.local/waggle-echo:dev"

// EchoSpec returns the Spec of the waggle-echo image around the static
// binary bin.
func EchoSpec(name string, bin []byte) Spec {
	if name == "" {
		name = EchoImage
	}
	return Spec{
		Name: name,
		Files: []File{
			{Path: "/waggle-echo", Mode: 0o755, Data: bin},
			{Path: "/tmp", Dir: true, Mode: 0o1777},
			{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/:/waggle-echo\nnobody:x:65534:65534:nobody:/:/waggle-echo\n")},
			{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		},
		Entrypoint:   []string{"/waggle-echo"},
		Env:          []string{"PATH=/"},
		ExposedPorts: []string{"8080/tcp", "9000/tcp", "9000/udp"},
	}
}
