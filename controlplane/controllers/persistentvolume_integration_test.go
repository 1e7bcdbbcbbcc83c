package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/controllers/localpath"
	"github.com/waggle-io/waggle/controlplane/controllers/persistentvolume"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestPersistentVolumeBinder: the binder (upstream's, as the
// controller-manager's identity) binds a claim to the smallest volume that
// fits, releases a Retain volume when its claim goes, and holds a
// WaitForFirstConsumer claim until the scheduler names a node, then hands
// it to the class's provisioner.
func TestPersistentVolumeBinder(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pvs, claims := cs.CoreV1().PersistentVolumes(), cs.CoreV1().PersistentVolumeClaims("default")
	pv := func(name, size string) {
		if _, err := pvs.Create(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain, StorageClassName: "manual",
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/workloads-" + name}},
		}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(name, size, class string) {
		if _, err := claims.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pvPhase := func(name string, want corev1.PersistentVolumePhase) {
		t.Helper()
		eventually(t, 45*time.Second, func() error {
			v, err := pvs.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if v.Status.Phase != want {
				return fmt.Errorf("pv %s is %s, want %s", name, v.Status.Phase, want)
			}
			return nil
		})
	}
	event := func(name, reason string) {
		t.Helper()
		eventually(t, 45*time.Second, func() error {
			evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			if err != nil {
				return err
			}
			var seen []string
			for _, e := range evs.Items {
				if e.Reason == reason {
					return nil
				}
				seen = append(seen, e.Reason)
			}
			return fmt.Errorf("no %s event for %s (seen %s)", reason, name, strings.Join(seen, ","))
		})
	}

	pv("pv-small", "1Gi")
	pv("pv-big", "5Gi")
	pv("pv-huge", "50Gi")
	claim("data", "2Gi", "manual")
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "late"},
		Provisioner: "example.com/external", VolumeBindingMode: &wffc}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim("late", "1Gi", "late")

	cfg := DefaultConfig()
	cfg.RestConfig = srv.UserConfig(t, "system:kube-controller-manager")
	cfg.SecureServing.SecurePort = 0
	cfg.Controllers = []string{persistentvolume.Name}
	cfg.LeaderElection = defaultLease("cm-pv")
	cfg.Log = testLogger(t, "cm-pv")
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(mctx, cfg) }()
	t.Cleanup(func() { cancel(); <-done })

	// The smallest volume that fits.
	eventually(t, 45*time.Second, func() error {
		c, err := claims.Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c.Status.Phase != corev1.ClaimBound || c.Spec.VolumeName != "pv-big" {
			return fmt.Errorf("claim %s bound to %q", c.Status.Phase, c.Spec.VolumeName)
		}
		return nil
	})
	pvPhase("pv-big", corev1.VolumeBound)
	if v, err := pvs.Get(ctx, "pv-big", metav1.GetOptions{}); err != nil || v.Spec.ClaimRef == nil || v.Spec.ClaimRef.Name != "data" {
		t.Fatalf("pv-big claimRef: %+v (%v)", v.Spec.ClaimRef, err)
	}

	// WaitForFirstConsumer: pending until a node is selected, then
	// handed to the provisioner.
	event("late", "WaitForFirstConsumer")
	c, err := claims.Get(ctx, "late", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Phase != corev1.ClaimPending || c.Annotations["volume.kubernetes.io/storage-provisioner"] != "" {
		t.Fatalf("a WaitForFirstConsumer claim before scheduling: %s %v", c.Status.Phase, c.Annotations)
	}
	c.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "node-a"}
	if _, err := claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 45*time.Second, func() error {
		c, err := claims.Get(ctx, "late", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p := c.Annotations["volume.kubernetes.io/storage-provisioner"]; p != "example.com/external" {
			return fmt.Errorf("claim not handed to the provisioner: %v", c.Annotations)
		}
		return nil
	})
	event("late", "ExternalProvisioning")

	// The claim goes: a Retain volume is Released and kept.
	if err := claims.Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pvPhase("pv-big", corev1.VolumeReleased)
	pvPhase("pv-small", corev1.VolumeAvailable)
}

// TestLocalPathProvisioner: with the binder and the built-in provisioner
// running, the default local-path StorageClass appears; a claim of it
// waits for its first consumer, and once a node is selected gets a
// hostPath volume under the provisioner's directory pinned to that node,
// bound to it; deleting the claim deletes the volume (reclaim Delete).
// A ReadWriteMany claim is refused with a ProvisioningFailed Event.
func TestLocalPathProvisioner(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wl-node-a",
		Labels: map[string]string{"kubernetes.io/hostname": "wl-host-a"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.RestConfig = srv.UserConfig(t, "system:kube-controller-manager")
	cfg.SecureServing.SecurePort = 0
	cfg.Controllers = []string{persistentvolume.Name, localpath.Name}
	cfg.LocalPathDir = "/tmp/workloads-storage"
	cfg.LeaderElection = defaultLease("cm-localpath")
	cfg.Log = testLogger(t, "cm-localpath")
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(mctx, cfg) }()
	t.Cleanup(func() { cancel(); <-done })

	eventually(t, 45*time.Second, func() error {
		sc, err := cs.StorageV1().StorageClasses().Get(ctx, localpath.ClassName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if sc.Provisioner != localpath.Provisioner || sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer ||
			sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
			return fmt.Errorf("class %+v", sc)
		}
		return nil
	})
	claims := cs.CoreV1().PersistentVolumeClaims("default")
	class := localpath.ClassName
	mk := func(name string, mode corev1.PersistentVolumeAccessMode) {
		if _, err := claims.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{mode}, StorageClassName: &class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	selectNode := func(name string) {
		t.Helper()
		c, err := claims.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "wl-node-a"}
		if _, err := claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("data", corev1.ReadWriteOnce)
	mk("shared", corev1.ReadWriteMany)
	eventually(t, 45*time.Second, func() error {
		evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=data,reason=WaitForFirstConsumer"})
		if err != nil || len(evs.Items) == 0 {
			return fmt.Errorf("no WaitForFirstConsumer event yet (%v)", err)
		}
		return nil
	})
	selectNode("data")
	selectNode("shared")
	var pvName string
	eventually(t, 45*time.Second, func() error {
		c, err := claims.Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("claim is %s", c.Status.Phase)
		}
		pvName = c.Spec.VolumeName
		return nil
	})
	c, _ := claims.Get(ctx, "data", metav1.GetOptions{})
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := localpath.Path(cfg.LocalPathDir, c); pv.Spec.HostPath == nil || pv.Spec.HostPath.Path != want || pvName != "pvc-"+string(c.UID) {
		t.Fatalf("volume %s source %+v, want hostPath %s", pvName, pv.Spec.PersistentVolumeSource, want)
	}
	if na := pv.Spec.NodeAffinity; na == nil || na.Required == nil || na.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != "wl-host-a" {
		t.Fatalf("volume node affinity %+v, want kubernetes.io/hostname wl-host-a", pv.Spec.NodeAffinity)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.Annotations["pv.kubernetes.io/provisioned-by"] != localpath.Provisioner {
		t.Fatalf("volume %+v", pv)
	}
	eventually(t, 45*time.Second, func() error {
		evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=shared,reason=ProvisioningFailed"})
		if err != nil || len(evs.Items) == 0 {
			return fmt.Errorf("no ProvisioningFailed event for a ReadWriteMany claim (%v)", err)
		}
		if !strings.Contains(evs.Items[0].Message, "ReadWriteMany is not supported") {
			return fmt.Errorf("message %q", evs.Items[0].Message)
		}
		return nil
	})

	if err := claims.Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 45*time.Second, func() error {
		_, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("volume %s still there (%v)", pvName, err)
		}
		return nil
	})
}
