package kubelet_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPersistentVolumeClaimMount: a pod's persistentVolumeClaim volume,
// bound to a local-path (hostPath) volume whose directory does not exist
// yet, is created by the kubelet (with the pod's fsGroup) and bind-mounted
// into the container, which writes into it; the data is on the host after
// the pod is gone. A pod of an unbound claim does not start and says why.
func TestPersistentVolumeClaimMount(t *testing.T) {
	n := newNode(t, nil)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pvc-wl_default_data")
	dirOrCreate := v1.HostPathDirectoryOrCreate
	if _, err := n.client.CoreV1().PersistentVolumes().Create(ctx, &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "wl-pv", Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "waggle.io/local-path"}},
		Spec: v1.PersistentVolumeSpec{
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeSource: v1.PersistentVolumeSource{HostPath: &v1.HostPathVolumeSource{Path: dir, Type: &dirOrCreate}},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.client.CoreV1().PersistentVolumes().Delete(ctx, "wl-pv", metav1.DeleteOptions{}) })
	claims := n.client.CoreV1().PersistentVolumeClaims("default")
	for _, name := range []string{"data", "unbound"} {
		if _, err := claims.Create(ctx, &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PersistentVolumeClaimSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources:   v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
		}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Bound as the binder would bind it.
	c, err := claims.Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Spec.VolumeName = "wl-pv"
	if c, err = claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Status.Phase = v1.ClaimBound
	if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	withClaim := func(claim string) func(*v1.Pod) {
		return func(p *v1.Pod) {
			gid := int64(4321)
			p.Spec.RestartPolicy = v1.RestartPolicyNever
			p.Spec.SecurityContext = &v1.PodSecurityContext{FSGroup: &gid}
			p.Spec.Volumes = []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
			c := &p.Spec.Containers[0]
			c.Command = []string{"/waggle-echo", "write", "/data/hello", "from the pod"}
			c.VolumeMounts = []v1.VolumeMount{{Name: "d", MountPath: "/data"}}
		}
	}
	n.create(echoPod(n, "writer", withClaim("data")))
	n.create(echoPod(n, "waiting", withClaim("unbound")))
	n.waitPod("writer", "succeeded", 60*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	b, err := os.ReadFile(filepath.Join(dir, "hello"))
	if err != nil || strings.TrimSpace(string(b)) != "from the pod" {
		t.Fatalf("the container's write is not in the volume: %v %q", err, b)
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if gid := st.Sys().(*syscall.Stat_t).Gid; gid != 4321 || st.Mode()&os.ModeSetgid == 0 || st.Mode().Perm() != 0o777 {
		t.Errorf("volume dir gid %d mode %v, want fsGroup 4321, setgid, 0777", gid, st.Mode())
	}
	// The pod of the unbound claim has had its attempt (after writer's, a
	// positive marker) and waits, saying why.
	n.waitPod("waiting", "pending on its unbound claim", 60*time.Second, func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodPending && podMessageHas(n, "waiting", "is not bound")
	})
	n.delete("writer")
	n.delete("waiting")
	n.waitGone("writer", 30*time.Second)
	n.waitGone("waiting", 30*time.Second)
	if _, err := os.Stat(filepath.Join(dir, "hello")); err != nil {
		t.Errorf("the volume's data went with the pod: %v", err)
	}
}

// podMessageHas reports whether an Event of the pod mentions s.
func podMessageHas(n *node, pod, s string) bool {
	evs, err := n.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return false
	}
	for _, e := range evs.Items {
		if strings.Contains(e.Message, s) {
			return true
		}
	}
	return false
}
