package apiserver_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDefaultStorageClassAdmission(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	testNamespace(t, cs, "claims")
	claim := func(name string, class *string, annotations map[string]string) *string {
		t.Helper()
		c, err := cs.CoreV1().PersistentVolumeClaims("claims").Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: class,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create claim %s: %v", name, err)
		}
		return c.Spec.StorageClassName
	}
	class := func(name string, isDefault bool) {
		t.Helper()
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: "example.com/" + name}
		if isDefault {
			sc.Annotations = map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}
		}
		if _, err := cs.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	class("slow", false)
	if got := claim("before-default", nil, nil); got != nil {
		t.Fatalf("no default class: claim got class %q", *got)
	}
	// The claim right after its class's creation sees it (consistent read).
	class("fast", true)
	if got := claim("defaulted", nil, nil); got == nil || *got != "fast" {
		t.Fatalf("claim without class = %v, want the default fast", got)
	}
	if got := claim("explicit", ptr("slow"), nil); got == nil || *got != "slow" {
		t.Fatalf("claim asking for slow = %v", got)
	}
	if got := claim("no-class", ptr(""), nil); got == nil || *got != "" {
		t.Fatalf(`claim asking for no class ("") = %v`, got)
	}
	if got := claim("beta", nil, map[string]string{"volume.beta.kubernetes.io/storage-class": "slow"}); got != nil {
		t.Fatalf("claim naming its class by the beta annotation got spec class %q", *got)
	}
	// Two defaults: the newest wins, as upstream.
	class("newer", true)
	if got := claim("two-defaults", nil, nil); got == nil || (*got != "newer" && *got != "fast") {
		t.Fatalf("claim with two default classes = %v", got)
	}
}
