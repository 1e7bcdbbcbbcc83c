package apiserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
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

// TestPodCertificateRequestNodeRulesAndSigning: a node creates
// PodCertificateRequests only for its own pods and the signers they mount
// (NodeRestriction), reads them only through a spec.nodeName selector or by
// name when they name it, and never writes their status (Node authorizer);
// a status change by anyone needs "sign" on the signer (422 otherwise), as
// upstream's status strategy.
func TestPodCertificateRequestNodeRulesAndSigning(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	n1 := clientFor(t, s, "system:node:n1", "system:nodes")
	const signer = "example.com/pcr-test"
	nodes := map[string]*corev1.Node{}
	for _, name := range []string{"n1", "n2"} {
		n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodes[name] = n
	}
	sa, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for name, node := range map[string]string{"on-n1": "n1", "on-n2": "n2"} {
		p, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "img"}},
			Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{PodCertificate: &corev1.PodCertificateProjection{SignerName: signer, KeyType: "ED25519", CredentialBundlePath: "b.pem"}}}}}}},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = p
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	proof, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, priv)
	if err != nil {
		t.Fatal(err)
	}
	request := func(pod, node, signerName string) *certificatesv1.PodCertificateRequest {
		p := pods[pod]
		return &certificatesv1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{GenerateName: "req-"}, Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName: signerName, PodName: p.Name, PodUID: p.UID, ServiceAccountName: "default", ServiceAccountUID: sa.UID,
			NodeName: types.NodeName(node), NodeUID: nodes[node].UID, StubPKCS10Request: proof,
		}}
	}
	pcrs := n1.CertificatesV1().PodCertificateRequests("default")
	mine, err := pcrs.Create(ctx, request("on-n1", "n1", signer), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node creating a request for its pod: %v", err)
	}
	if mine.Spec.MaxExpirationSeconds == nil || *mine.Spec.MaxExpirationSeconds != 86400 {
		t.Errorf("maxExpirationSeconds %v, want upstream's default 86400", mine.Spec.MaxExpirationSeconds)
	}
	for what, r := range map[string]*certificatesv1.PodCertificateRequest{
		"another node's pod": request("on-n2", "n2", signer),
		"a pod on another node": func() *certificatesv1.PodCertificateRequest {
			r := request("on-n2", "n2", signer)
			r.Spec.NodeName, r.Spec.NodeUID = "n1", nodes["n1"].UID
			return r
		}(),
		"a signer the pod mounts not": request("on-n1", "n1", "example.com/other"),
	} {
		if _, err := pcrs.Create(ctx, r, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node creating a request for %s: %v, want 403", what, err)
		}
	}
	if _, err := pcrs.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node listing requests without a selector: %v, want 403", err)
	}
	if l, err := pcrs.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"}); err != nil || len(l.Items) != 1 {
		t.Errorf("node listing its requests: %v %v", l, err)
	}
	within(t, "node reading its request by name", 5*time.Second, func() bool {
		_, err := pcrs.Get(ctx, mine.Name, metav1.GetOptions{})
		return err == nil
	})
	theirs, err := admin.CertificatesV1().PodCertificateRequests("default").Create(ctx, request("on-n2", "n2", signer), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pcrs.Get(ctx, theirs.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node reading another node's request: %v, want 403", err)
	}

	denied := mine.DeepCopy()
	denied.Status.Conditions = []metav1.Condition{{Type: certificatesv1.PodCertificateRequestConditionTypeDenied, Status: metav1.ConditionTrue,
		Reason: "Test", Message: "no", LastTransitionTime: metav1.Now()}}
	if _, err := pcrs.UpdateStatus(ctx, denied, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node writing a request's status: %v, want 403", err)
	}
	// eve may write the status subresource but holds no "sign".
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pcr-status"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"podcertificaterequests/status"}, Verbs: []string{"update"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"eve", "signer"} {
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pcr-status-" + user},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "pcr-status"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// signer may sign for every example.com signer.
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pcr-sign"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, ResourceNames: []string{"example.com/*"}, Verbs: []string{"sign"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pcr-sign"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "pcr-sign"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "signer"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eve := clientFor(t, s, "eve").CertificatesV1().PodCertificateRequests("default")
	within(t, "eve's status write reaching the sign check", 5*time.Second, func() bool {
		_, err := eve.UpdateStatus(ctx, denied, metav1.UpdateOptions{})
		return apierrors.IsInvalid(err) && strings.Contains(err.Error(), `is not permitted to "sign" for signer "example.com/pcr-test"`)
	})
	within(t, "signer denying the request", 5*time.Second, func() bool {
		_, err := clientFor(t, s, "signer").CertificatesV1().PodCertificateRequests("default").UpdateStatus(ctx, denied, metav1.UpdateOptions{})
		return err == nil
	})
}
