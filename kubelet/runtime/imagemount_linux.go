package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/image-spec/identity"
	"golang.org/x/sys/unix"
)

// Image volumes on containerd, as containerd's CRI mounts them: a snapshot
// of the image's unpacked layer chain (here a read-only View, which needs no
// upper directory) under a lease per pod, so containerd's garbage collector
// keeps it while the pod lives even if the image is removed, mounted on the
// host at the target the kubelet names; the kubelet bind-mounts that
// read-only into the containers. The snapshot's labels name the pod and the
// target, so the mounts of a pod can be found and released after a
// restart.

// LabelMountTarget is the host path an image volume's snapshot is mounted on.
const LabelMountTarget = "waggle.io/mount-target"

func imageLeaseID(podUID string) string { return "waggle-image-volumes-" + podUID }

func imageSnapshotKey(target string) string { return "waggle-image-volume:" + target }

// MountImage implements Runtime.
func (c *Containerd) MountImage(ctx context.Context, podUID, image, target string) error {
	if mounted, err := mountinfo.Mounted(target); err == nil && mounted {
		return nil
	}
	ctx = c.ctx(ctx)
	ref, err := NormalizeImage(image)
	if err != nil {
		return err
	}
	img, err := c.client.GetImage(ctx, ref)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("%w: %s", ErrImageNotFound, ref)
		}
		return fmt.Errorf("image %s: %w", ref, err)
	}
	ls := c.client.LeasesService()
	_, err = ls.Create(ctx, leases.WithID(imageLeaseID(podUID)), leases.WithLabels(map[string]string{LabelPodUID: podUID}))
	if err != nil && !errdefs.IsAlreadyExists(err) {
		return fmt.Errorf("lease for the image volumes of pod %s: %w", podUID, err)
	}
	ctx = leases.WithLease(ctx, imageLeaseID(podUID))
	if ok, _ := img.IsUnpacked(ctx, c.opts.Snapshotter); !ok {
		if err := img.Unpack(ctx, c.opts.Snapshotter); err != nil {
			return fmt.Errorf("unpack image %s: %w", ref, err)
		}
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return fmt.Errorf("layers of image %s: %w", ref, err)
	}
	sn := c.client.SnapshotService(c.opts.Snapshotter)
	key := imageSnapshotKey(target)
	mounts, err := sn.View(ctx, key, identity.ChainID(diffIDs).String(),
		snapshots.WithLabels(map[string]string{LabelPodUID: podUID, LabelMountTarget: target}))
	if errdefs.IsAlreadyExists(err) {
		mounts, err = sn.Mounts(ctx, key)
	}
	if err != nil {
		return fmt.Errorf("snapshot of image %s: %w", ref, err)
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return errors.Join(fmt.Errorf("image volume dir: %w", err), sn.Remove(ctx, key))
	}
	if err := mount.All(mounts, target); err != nil {
		return errors.Join(fmt.Errorf("mount image %s on %s: %w", ref, target, err), sn.Remove(ctx, key))
	}
	return nil
}

// UnmountImages implements Runtime: unmount, remove the snapshot and its
// mount point, then the pod's lease.
func (c *Containerd) UnmountImages(ctx context.Context, podUID string) error {
	ctx = c.ctx(ctx)
	sn := c.client.SnapshotService(c.opts.Snapshotter)
	var views []snapshots.Info
	err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		views = append(views, info)
		return nil
	}, fmt.Sprintf(`labels.%q==%q`, LabelPodUID, podUID))
	if err != nil {
		return fmt.Errorf("image volume snapshots of pod %s: %w", podUID, err)
	}
	for _, v := range views {
		target := v.Labels[LabelMountTarget]
		if target != "" {
			if err := mount.UnmountAll(target, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount image volume %s: %w", target, err)
			}
		}
		if err := sn.Remove(ctx, v.Name); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove image volume snapshot %s: %w", v.Name, err)
		}
		if target != "" {
			if err := os.Remove(target); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("remove image volume dir: %w", err)
			}
		}
	}
	err = c.client.LeasesService().Delete(ctx, leases.Lease{ID: imageLeaseID(podUID)})
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("lease of the image volumes of pod %s: %w", podUID, err)
	}
	return nil
}

// ImageMountPods implements Runtime, from the pods' leases.
func (c *Containerd) ImageMountPods(ctx context.Context) ([]string, error) {
	ls, err := c.client.LeasesService().List(c.ctx(ctx), fmt.Sprintf(`labels.%q`, LabelPodUID))
	if err != nil {
		return nil, fmt.Errorf("list image volume leases: %w", err)
	}
	out := make([]string, 0, len(ls))
	for _, l := range ls {
		out = append(out, l.Labels[LabelPodUID])
	}
	return out, nil
}
