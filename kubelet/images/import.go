package images

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd"
	"github.com/containerd/platforms"
)

// DefaultSnapshotter is the snapshotter images are unpacked for.
const DefaultSnapshotter = "overlayfs"

// Import reads an OCI image-layout or Docker archive from r into the image
// store of client (whose context must carry the containerd namespace),
// unpacks each image for the snapshotter, and returns the image names.
func Import(ctx context.Context, client *containerd.Client, r io.Reader, snapshotter string) ([]string, error) {
	if snapshotter == "" {
		snapshotter = DefaultSnapshotter
	}
	imgs, err := client.Import(ctx, r, containerd.WithImportPlatform(platforms.Default()))
	if err != nil {
		return nil, fmt.Errorf("import image archive: %w", err)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("import image archive: %w: it names no image (index.json needs an io.containerd.image.name or org.opencontainers.image.ref.name annotation)", ErrInvalidImage)
	}
	var names []string
	for _, img := range imgs {
		i := containerd.NewImage(client, img)
		if err := i.Unpack(ctx, snapshotter); err != nil {
			return names, fmt.Errorf("unpack image %s: %w", img.Name, err)
		}
		names = append(names, img.Name)
	}
	return names, nil
}

// ImportFile imports the archive at path.
func ImportFile(ctx context.Context, client *containerd.Client, path, snapshotter string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open image archive: %w", err)
	}
	defer f.Close()
	names, err := Import(ctx, client, f, snapshotter)
	if err != nil {
		return names, fmt.Errorf("%s: %w", path, err)
	}
	return names, nil
}

// ImportDir imports every *.tar (and *.oci) archive in dir, in name order,
// and returns the names of all imported images. A missing dir imports
// nothing.
func ImportDir(ctx context.Context, client *containerd.Client, dir, snapshotter string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image dir: %w", err)
	}
	var files []string
	for _, e := range ents {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".tar") || strings.HasSuffix(e.Name(), ".oci")) {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(files)
	var all []string
	for _, f := range files {
		names, err := ImportFile(ctx, client, f, snapshotter)
		if err != nil {
			return all, err
		}
		all = append(all, names...)
	}
	return all, nil
}
