//go:build !linux

package runtime

import (
	"context"
	"fmt"
)

// MountImage implements Runtime: image volumes are mounted on Linux only.
func (c *Containerd) MountImage(_ context.Context, _, image, _ string) error {
	return fmt.Errorf("%w: image volume %s: image volumes are mounted on Linux only", ErrNotSupported, image)
}

// UnmountImages implements Runtime: there is nothing to release.
func (c *Containerd) UnmountImages(context.Context, string) error { return nil }

// ImageMountPods implements Runtime: there are none.
func (c *Containerd) ImageMountPods(context.Context) ([]string, error) { return nil, nil }
