package apiserver_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodCertificateProjectionValidation: a pod's podCertificate projected
// source is checked as kube-apiserver checks it (upstream's messages, which
// the conformance specs match), while projected volumes that upstream
// defaults before validating (a downwardAPI fieldRef without apiVersion,
// a token without expirationSeconds) are still accepted.
func TestPodCertificateProjectionValidation(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	i32 := func(v int32) *int32 { return &v }
	podWith := func(name string, srcs ...corev1.VolumeProjection) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "c", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/v"}}}},
				Volumes:    []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: srcs}}}},
			},
		}
	}
	cert := func(max *int32) corev1.VolumeProjection {
		return corev1.VolumeProjection{PodCertificate: &corev1.PodCertificateProjection{
			SignerName: "example.com/signer", KeyType: "ECDSAP256", CredentialBundlePath: "bundle.pem", MaxExpirationSeconds: max,
		}}
	}
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		field  string
		detail string
	}{
		{name: "max-too-long", pod: podWith("max-too-long", cert(i32(91*24*3600+1))),
			field: "spec.volumes[0].projected.sources[0].podCertificate.maxExpirationSeconds", detail: "if provided, maxExpirationSeconds must be <= 7862400"},
		{name: "max-too-short", pod: podWith("max-too-short", cert(i32(3599))),
			field: "spec.volumes[0].projected.sources[0].podCertificate.maxExpirationSeconds", detail: "if provided, maxExpirationSeconds must be >= 3600"},
		{name: "bad-key-type", pod: podWith("bad-key-type", corev1.VolumeProjection{PodCertificate: &corev1.PodCertificateProjection{
			SignerName: "example.com/signer", KeyType: "DSA", CredentialBundlePath: "b"}}),
			field: "spec.volumes[0].projected.sources[0].podCertificate.keyType"},
		{name: "one-hour", pod: podWith("one-hour", cert(i32(3600)))},
		{name: "ninety-one-days", pod: podWith("ninety-one-days", cert(i32(91*24*3600)))},
		{name: "default-expiration", pod: podWith("default-expiration", cert(nil))},
		{name: "upstream-defaults-first", pod: podWith("upstream-defaults-first",
			corev1.VolumeProjection{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "ns", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
			corev1.VolumeProjection{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cs.CoreV1().Pods("default").Create(ctx, tc.pod, metav1.CreateOptions{})
			if tc.field == "" {
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				return
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create: got %v, want 422 Invalid", err)
			}
			var fields []string
			for _, c := range err.(apierrors.APIStatus).Status().Details.Causes {
				fields = append(fields, c.Field)
			}
			if !strings.Contains(strings.Join(fields, " "), tc.field) || !strings.Contains(err.Error(), tc.detail) {
				t.Fatalf("create: got %v (fields %v), want field %s and %q", err, fields, tc.field, tc.detail)
			}
			if _, err := cs.CoreV1().Pods("default").Get(ctx, tc.pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("refused pod was stored: %v", err)
			}
		})
	}
}
