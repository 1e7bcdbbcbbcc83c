package runtime

import (
	"context"
	"fmt"
	"sort"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/platforms"
)

var _ Storage = (*Containerd)(nil)

// ListImages implements Storage: the images of the kubelet's namespace,
// grouped by target digest (the ID containers record), each sized by its
// content in the store.
func (c *Containerd) ListImages(ctx context.Context) ([]Image, error) {
	ctx = c.ctx(ctx)
	imgs, err := c.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	byID := map[string]*Image{}
	var order []string
	for _, img := range imgs {
		id := img.Target.Digest.String()
		im := byID[id]
		if im == nil {
			img := img
			size, err := img.Size(ctx, c.client.ContentStore(), platforms.Default())
			if err != nil && !errdefs.IsNotFound(err) {
				return nil, fmt.Errorf("size of image %s: %w", img.Name, err)
			}
			im = &Image{ID: id, Size: size, CreatedAt: img.CreatedAt}
			byID[id] = im
			order = append(order, id)
		}
		im.RepoTags = append(im.RepoTags, img.Name)
		if img.CreatedAt.Before(im.CreatedAt) {
			im.CreatedAt = img.CreatedAt
		}
	}
	out := make([]Image, 0, len(order))
	for _, id := range order {
		sort.Strings(byID[id].RepoTags)
		out = append(out, *byID[id])
	}
	return out, nil
}

// RemoveImage implements Storage: every name whose target is id is
// deleted, the last one synchronously, so containerd's garbage collector
// has released the content and snapshots when it returns.
func (c *Containerd) RemoveImage(ctx context.Context, id string) error {
	ctx = c.ctx(ctx)
	// Forgotten now rather than at containerd's delete event.
	defer c.forgetImages()
	is := c.client.ImageService()
	imgs, err := is.List(ctx, fmt.Sprintf("target.digest==%s", id))
	if err != nil {
		return fmt.Errorf("list images of %s: %w", id, err)
	}
	for i, img := range imgs {
		var opts []images.DeleteOpt
		if i == len(imgs)-1 {
			opts = append(opts, images.SynchronousDelete())
		}
		if err := is.Delete(ctx, img.Name, opts...); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove image %s (%s): %w", img.Name, id, err)
		}
	}
	return nil
}

// ImageFsDir implements Storage: the root the snapshotter exports in
// containerd's introspection (e.g. <root>/io.containerd.snapshotter.v1.overlayfs).
func (c *Containerd) ImageFsDir(ctx context.Context) (string, error) {
	c.fsMu.Lock()
	defer c.fsMu.Unlock()
	if c.fsDir != "" {
		return c.fsDir, nil
	}
	resp, err := c.client.IntrospectionService().Plugins(c.ctx(ctx),
		[]string{fmt.Sprintf("type==io.containerd.snapshotter.v1,id==%s", c.opts.Snapshotter)})
	if err != nil {
		return "", fmt.Errorf("introspect snapshotter %s: %w", c.opts.Snapshotter, err)
	}
	for _, p := range resp.Plugins {
		if root := p.Exports["root"]; root != "" {
			c.fsDir = root
			return root, nil
		}
	}
	return "", fmt.Errorf("snapshotter %s exports no root directory", c.opts.Snapshotter)
}

// WritableLayerUsage implements Storage: the snapshotter's usage of the
// container's active snapshot (keyed by the container's ID).
func (c *Containerd) WritableLayerUsage(ctx context.Context, id string) (uint64, uint64, error) {
	u, err := c.client.SnapshotService(c.opts.Snapshotter).Usage(c.ctx(ctx), id)
	if err != nil {
		return 0, 0, fmt.Errorf("usage of the writable layer of %s: %w", id, err)
	}
	return uint64(max(u.Size, 0)), uint64(max(u.Inodes, 0)), nil //nolint:gosec // non-negative
}
