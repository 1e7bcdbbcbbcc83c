package apiserver_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

// TestCertificatesFieldSelectors: the certificates.k8s.io kinds serve
// upstream's field selectors (CSR and ClusterTrustBundle spec.signerName;
// PodCertificateRequest spec.signerName, spec.podName, spec.nodeName), and
// an unknown field is still a 400.
func TestCertificatesFieldSelectors(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ctx := context.Background()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "x"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	req := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	for name, signer := range map[string]string{"a": "example.com/one", "b": "example.com/two"} {
		if _, err := cs.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: certificatesv1.CertificateSigningRequestSpec{Request: req, SignerName: signer, Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=example.com/two"})
	if err != nil || len(l.Items) != 1 || l.Items[0].Name != "b" {
		t.Fatalf("CSRs with spec.signerName=example.com/two: %v %v", err, l)
	}
	c, err := cert.NewSelfSignedCACert(cert.Config{CommonName: "ca"}, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	for _, b := range []certificatesv1.ClusterTrustBundle{
		{ObjectMeta: metav1.ObjectMeta{Name: "example.com:one:x"}, Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: "example.com/one", TrustBundle: ca}},
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: certificatesv1.ClusterTrustBundleSpec{TrustBundle: ca}},
	} {
		if _, err := cs.CertificatesV1().ClusterTrustBundles().Create(ctx, &b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := cs.CertificatesV1().ClusterTrustBundles().List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=example.com/one"})
	if err != nil || len(cl.Items) != 1 || cl.Items[0].Name != "example.com:one:x" {
		t.Fatalf("ClusterTrustBundles with spec.signerName=example.com/one: %v %v", err, cl)
	}
	if _, err := cs.CertificatesV1().PodCertificateRequests("default").List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=example.com/one,spec.nodeName=n,spec.podName=p"}); err != nil {
		t.Fatalf("PodCertificateRequests by signer, node and pod: %v", err)
	}
	if _, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{FieldSelector: "spec.usages=x"}); !apierrors.IsBadRequest(err) {
		t.Errorf("unknown field selector: %v, want 400", err)
	}
}
