package apiserver_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
)

// TestCSRApprovalSigningAndSubjectRestriction: kube-apiserver's
// CertificateApproval, CertificateSigning and CertificateSubjectRestriction
// plugins. A user who may update certificatesigningrequests/approval and
// /status still needs "approve" (for approval) or "sign" (for the issued
// certificate) on the request's signer, by name or domain wildcard; nobody,
// not even cluster-admin, may ask the kube-apiserver-client signer for
// system:masters. Each refusal is a 403 and leaves the request unchanged.
func TestCSRApprovalSigningAndSubjectRestriction(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	request := func(subject pkix.Name) []byte {
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: subject}, key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}
	csr := func(name, signer string, subject pkix.Name) *certificatesv1.CertificateSigningRequest {
		return &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: certificatesv1.CertificateSigningRequestSpec{Request: request(subject), SignerName: signer,
				Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}}}
	}

	_, err = admin.CertificatesV1().CertificateSigningRequests().Create(ctx, csr("masters", certificatesv1.KubeAPIServerClientSignerName,
		pkix.Name{CommonName: "mallory", Organization: []string{"system:masters"}}), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "system:masters group is not allowed") {
		t.Errorf("kube-apiserver-client CSR for system:masters: %v, want 403", err)
	}
	if _, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, "masters", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused CSR was stored: %v", err)
	}
	// Another group, or system:masters for another signer, is fine.
	for _, c := range []*certificatesv1.CertificateSigningRequest{
		csr("devs", certificatesv1.KubeAPIServerClientSignerName, pkix.Name{CommonName: "dana", Organization: []string{"devs"}}),
		csr("one", "example.com/one", pkix.Name{CommonName: "x", Organization: []string{"system:masters"}}),
		csr("two", "example.com/two", pkix.Name{CommonName: "y"}),
	} {
		if _, err := admin.CertificatesV1().CertificateSigningRequests().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CSR %s: %v", c.Name, err)
		}
	}

	// approver may update approval and status of every CSR, and approve
	// and sign only example.com/one.
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "csr-approver"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests", "certificatesigningrequests/approval", "certificatesigningrequests/status"}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, ResourceNames: []string{"example.com/one"}, Verbs: []string{"approve", "sign"}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "csr-approver"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "csr-approver"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "approver"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	approver := clientFor(t, s, "approver")
	approve := func(name string) error {
		c, err := approver.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", LastUpdateTime: metav1.Now()})
		_, err = approver.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, c, metav1.UpdateOptions{})
		return err
	}
	within(t, "approver approves example.com/one", 5*time.Second, func() bool { return approve("one") == nil })
	for _, name := range []string{"two", "devs"} {
		err := approve(name)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "user not permitted to approve requests with signerName") {
			t.Errorf("approving %s without approve on its signer: %v, want 403", name, err)
		}
		if c, _ := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{}); len(c.Status.Conditions) != 0 {
			t.Errorf("%s was changed by a refused approval: %+v", name, c.Status)
		}
	}

	// Signing: status.certificate needs sign on the signer.
	issued, err := cert.NewSelfSignedCACert(cert.Config{CommonName: "y"}, key)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name string) error {
		c, err := approver.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: issued.Raw})
		_, err = approver.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	}
	admin2 := func(name string) {
		c, _ := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", LastUpdateTime: metav1.Now()})
		if _, err := admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, c, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("cluster-admin approves %s: %v", name, err)
		}
	}
	admin2("two")
	if err := issue("two"); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "user not permitted to sign requests with signerName") {
		t.Errorf("issuing a certificate for example.com/two without sign: %v, want 403", err)
	}
	if c, _ := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, "two", metav1.GetOptions{}); len(c.Status.Certificate) != 0 {
		t.Errorf("two got a certificate from a refused write")
	}
	// The wildcard grant covers the whole domain.
	cr, _ := admin.RbacV1().ClusterRoles().Get(ctx, "csr-approver", metav1.GetOptions{})
	cr.Rules[1].ResourceNames = []string{"example.com/*"}
	if _, err := admin.RbacV1().ClusterRoles().Update(ctx, cr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	within(t, "sign on example.com/* lets approver issue for example.com/two", 5*time.Second, func() bool { return issue("two") == nil })
}
