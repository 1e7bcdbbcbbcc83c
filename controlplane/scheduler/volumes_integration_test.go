package scheduler

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRealAPIServerVolumeBinding: upstream's VolumeBinding semantics. A
// pod whose claim is bound to a volume pinned to one node (node affinity
// on kubernetes.io/hostname, as a local-path volume is) goes to that
// node; a pod whose WaitForFirstConsumer claim still has to be
// provisioned gets its node written on the claim
// (volume.kubernetes.io/selected-node) before it is bound.
func TestRealAPIServerVolumeBinding(t *testing.T) {
	c := startReal(t)
	ctx := context.Background()
	c.create(t, newNode("wl-a"), newNode("wl-b"), newNode("wl-c"))
	c.waitNodes(t, 3)
	claims := c.cs.CoreV1().PersistentVolumeClaims("default")
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	if _, err := c.cs.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "wl-local"},
		Provisioner: "waggle.io/local-path", VolumeBindingMode: &wffc}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := "wl-local"
	claim := func(name, volume string) {
		t.Helper()
		pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PersistentVolumeClaimSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, StorageClassName: &class, VolumeName: volume,
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
		}}
		out, err := claims.Create(ctx, pvc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if volume != "" {
			// As the binder leaves a claim it has bound.
			out.Annotations = map[string]string{"pv.kubernetes.io/bind-completed": "yes"}
			if out, err = claims.Update(ctx, out, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			out.Status.Phase = v1.ClaimBound
			if _, err := claims.UpdateStatus(ctx, out, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := c.cs.CoreV1().PersistentVolumes().Create(ctx, &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "wl-pinned"}, Spec: v1.PersistentVolumeSpec{
		Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
		StorageClassName:       class,
		ClaimRef:               &v1.ObjectReference{Namespace: "default", Name: "bound"},
		PersistentVolumeSource: v1.PersistentVolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/tmp/workloads-pinned"}},
		NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{
			Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn, Values: []string{"wl-b"}}}}}}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim("bound", "wl-pinned")
	claim("fresh", "")
	withClaim := func(name string) podOpt {
		return func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}}
		}
	}
	c.create(t, newPod("pinned", withClaim("bound")), newPod("provisioned", withClaim("fresh")))
	eventually(t, "the pod of the pinned volume on its node", func() bool { return c.get(t, "pinned").Spec.NodeName == "wl-b" })
	eventually(t, "selected-node on the claim to provision", func() bool {
		pvc, err := claims.Get(ctx, "fresh", metav1.GetOptions{})
		return err == nil && pvc.Annotations["volume.kubernetes.io/selected-node"] != ""
	})
	// No binder runs here: the pod waits for its claim to be bound (PreBind).
	if n := c.get(t, "provisioned").Spec.NodeName; n != "" {
		t.Fatalf("pod bound to %s before its claim was", n)
	}
}
