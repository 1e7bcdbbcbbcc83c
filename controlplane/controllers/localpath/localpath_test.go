package localpath

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
	"github.com/waggle-io/waggle/internal/testutil"
)

// releasedVolume is a local-path volume whose claim is gone, on node-a
// (hostname label host-a).
func releasedVolume(name, path string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{annProvisionedBy: Provisioner}},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"host-a"}}},
			}}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased},
	}
}

// TestReleasedVolumeDirectoryIsRemovedByAHelperPodOnItsNode: a released
// Delete volume gets a helper pod on its node (by the node's name, found
// from the hostname label) that removes exactly its directory; the volume
// object goes only once the helper succeeded, then the helper goes. A
// failed helper leaves the volume, with a VolumeFailedDelete event, and is
// replaced; a directory this provisioner did not name is never removed.
func TestReleasedVolumeDirectoryIsRemovedByAHelperPodOnItsNode(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{hostnameLabel: "host-a"}}}
	ok := releasedVolume("pvc-1", "/var/lib/waggle/storage/pvc-1_default_data")
	failing := releasedVolume("pvc-2", "/var/lib/waggle/storage/pvc-2_default_logs")
	foreign := releasedVolume("pvc-3", "/etc")
	cs := ctrltest.NewClient(node, ok, failing, foreign)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t), Options{NoDefaultClass: true, HelperImage: "waggle.local/waggle-echo:dev"})
	ctx := ctrltest.Start(t, cs, f)
	go c.Run(ctx, 1)
	pods := cs.CoreV1().Pods(HelperNamespace)

	helper := func(pv string) *corev1.Pod {
		t.Helper()
		var p *corev1.Pod
		testutil.Eventually(t, 10*time.Second, func() error {
			var err error
			p, err = pods.Get(ctx, "local-path-delete-"+pv, metav1.GetOptions{})
			return err
		})
		return p
	}
	p := helper("pvc-1")
	if p.Spec.NodeName != "node-a" || p.Spec.RestartPolicy != corev1.RestartPolicyNever || p.Labels[HelperLabel] != "pvc-1" {
		t.Errorf("helper pod: node %q, restart %q, labels %v", p.Spec.NodeName, p.Spec.RestartPolicy, p.Labels)
	}
	if got := strings.Join(p.Spec.Containers[0].Command, " "); got != "/waggle-echo rm -r /parent/pvc-1_default_data" {
		t.Errorf("helper command %q", got)
	}
	if hp := p.Spec.Volumes[0].HostPath; hp == nil || hp.Path != "/var/lib/waggle/storage" {
		t.Errorf("helper mounts %+v, want the parent directory", p.Spec.Volumes[0])
	}
	if _, err := cs.CoreV1().PersistentVolumes().Get(ctx, "pvc-1", metav1.GetOptions{}); err != nil {
		t.Fatalf("the volume went before its directory was removed: %v", err)
	}
	setPhase := func(p *corev1.Pod, phase corev1.PodPhase, exit int32) {
		p.Status.Phase = phase
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "remove", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: "Error"}}}}
		if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setPhase(p, corev1.PodSucceeded, 0)
	gone := func(what string, get func() error) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() error {
			if err := get(); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s still there (%v)", what, err)
			}
			return nil
		})
	}
	gone("volume pvc-1", func() error {
		_, err := cs.CoreV1().PersistentVolumes().Get(ctx, "pvc-1", metav1.GetOptions{})
		return err
	})
	gone("helper of pvc-1", func() error { _, err := pods.Get(ctx, "local-path-delete-pvc-1", metav1.GetOptions{}); return err })

	// A failing helper: event, volume kept, helper replaced.
	first := helper("pvc-2")
	setPhase(first, corev1.PodFailed, 1)
	testutil.Eventually(t, 10*time.Second, func() error {
		evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == ReasonVolumeFailedDelete && e.InvolvedObject.Name == "pvc-2" && strings.Contains(e.Message, "exit code 1") {
				return nil
			}
		}
		return fmt.Errorf("no %s event for pvc-2", ReasonVolumeFailedDelete)
	})
	testutil.Eventually(t, 20*time.Second, func() error {
		p, err := pods.Get(ctx, "local-path-delete-pvc-2", metav1.GetOptions{})
		if err != nil || p.UID == first.UID {
			return fmt.Errorf("helper not replaced yet (%v)", err)
		}
		return nil
	})
	if _, err := cs.CoreV1().PersistentVolumes().Get(ctx, "pvc-2", metav1.GetOptions{}); err != nil {
		t.Fatalf("the volume went although its directory was not removed: %v", err)
	}

	// A path this provisioner did not name: the object goes, no helper.
	gone("volume pvc-3", func() error {
		_, err := cs.CoreV1().PersistentVolumes().Get(ctx, "pvc-3", metav1.GetOptions{})
		return err
	})
	if _, err := pods.Get(ctx, "local-path-delete-pvc-3", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a helper was made for a directory the provisioner does not own: %v", err)
	}
}
