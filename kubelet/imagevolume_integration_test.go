package kubelet_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
	"github.com/moby/sys/mountinfo"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/waggle-io/waggle/kubelet"
	"github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// dataImage is the image the image volume test mounts: files only.
const dataImage = "waggle.local/image-volume-data:v1"

// TestImageVolume: a pod's image volume (KEP-4639, pullPolicy Always as
// the conformance spec's) is the image's file system, read-only in the
// container, at its mountPath and through a subPath; the mount and its
// containerd snapshot and lease survive a kubelet restart without a second
// mount, and are gone once the pod is, also when it was deleted while the
// kubelet was down.
func TestImageVolume(t *testing.T) {
	n := newNode(t, func(c *kubelet.Config) {
		var buf bytes.Buffer
		err := images.Build(&buf, images.Spec{Name: dataImage, Files: []images.File{
			{Path: "/data.json", Mode: 0o644, Data: []byte(`{"image": "kitten.jpg"}`)},
			{Path: "/etc/os-release", Mode: 0o644, Data: []byte("NAME=\"Image volume test\"\n")},
			{Path: "/sub/dir/inner.txt", Mode: 0o644, Data: []byte("inside the subPath\n")},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.ImageDir, "data.tar"), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	n.create(echoPod(n, "iv", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{{Name: "vol", VolumeSource: v1.VolumeSource{
			Image: &v1.ImageVolumeSource{Reference: dataImage, PullPolicy: v1.PullAlways}}}}
		p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{
			{Name: "vol", MountPath: "/volume"},
			{Name: "vol", MountPath: "/sub", SubPath: "sub/dir"},
		}
	}))
	p := n.waitPod("iv", "running", 60*time.Second, runningReady)
	uid := string(p.UID)
	for path, want := range map[string]string{"/volume/data.json": "kitten.jpg", "/volume/etc/os-release": "Image volume test", "/sub/inner.txt": "inside the subPath"} {
		out, stderr, err := n.exec("iv", "echo", true, "", "/waggle-echo", "cat", path)
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("cat %s: %q %q %v, want %q", path, out, stderr, err, want)
		}
	}
	if _, _, err := n.exec("iv", "echo", true, "", "/waggle-echo", "write", "/volume/new", "x"); err == nil {
		t.Error("wrote into the image volume: it must be read-only")
	}

	// A kubelet restart adopts the mount (the container keeps running,
	// nothing is mounted twice).
	before := n.imageVolumeState(uid)
	if before.mounts != 1 || before.snapshots != 1 || before.leases != 1 {
		t.Fatalf("image volume state of the running pod: %+v, want one mount, snapshot and lease", before)
	}
	n.stop()
	n.start()
	// The API still says Running: the marker is an exec the new kubelet
	// serves (once it has relisted the container).
	waitFor(t, 60*time.Second, "the volume read after a kubelet restart", func() (bool, string) {
		out, stderr, err := n.exec("iv", "echo", true, "", "/waggle-echo", "cat", "/volume/data.json")
		return err == nil && strings.Contains(out, "kitten.jpg"), fmt.Sprintf("%q %q %v", out, stderr, err)
	})
	if after := n.imageVolumeState(uid); after != before {
		t.Errorf("image volume state %+v after a restart, was %+v", after, before)
	}

	// Deleted while the kubelet is down: the restarted kubelet releases it.
	n.stop()
	if err := n.client.CoreV1().Pods("default").Delete(context.Background(), "iv", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	n.start()
	waitFor(t, 60*time.Second, "image volume and pod dir released", func() (bool, string) {
		s := n.imageVolumeState(uid)
		_, err := os.Stat(filepath.Join(n.cfg.RootDir, "pods", uid))
		return s == (imageVolumeState{}) && os.IsNotExist(err), fmt.Sprintf("%+v, pod dir: %v", s, err)
	})
}

// TestImageVolumeOfMissingImage: an image volume whose image cannot be had
// (pullPolicy Never) keeps its container waiting, as upstream.
func TestImageVolumeOfMissingImage(t *testing.T) {
	n := newNode(t, nil)
	n.create(echoPod(n, "ivmissing", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{{Name: "vol", VolumeSource: v1.VolumeSource{
			Image: &v1.ImageVolumeSource{Reference: "waggle.local/absent:v1", PullPolicy: v1.PullNever}}}}
		p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "vol", MountPath: "/volume"}}
	}))
	n.waitPod("ivmissing", "waiting on its image volume", 60*time.Second, func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "ErrImageNeverPull"
	})
}

// imageVolumeState counts what a pod's image volumes hold: mounts under
// its dir, containerd snapshots labelled with it, its lease.
type imageVolumeState struct{ mounts, snapshots, leases int }

func (n *node) imageVolumeState(uid string) imageVolumeState {
	n.t.Helper()
	var s imageVolumeState
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Join(n.cfg.RootDir, "pods", uid)))
	if err != nil {
		n.t.Fatal(err)
	}
	s.mounts = len(ms)
	ctx := namespaces.WithNamespace(context.Background(), n.cfg.ContainerdNamespace)
	err = n.ctrd.Client.SnapshotService("overlayfs").Walk(ctx, func(context.Context, snapshots.Info) error {
		s.snapshots++
		return nil
	}, fmt.Sprintf(`labels.%q==%q`, runtime.LabelPodUID, uid))
	if err != nil {
		n.t.Fatal(err)
	}
	ls, err := n.ctrd.Client.LeasesService().List(ctx, fmt.Sprintf(`labels.%q==%q`, runtime.LabelPodUID, uid))
	if err != nil {
		n.t.Fatal(err)
	}
	s.leases = len(ls)
	return s
}
