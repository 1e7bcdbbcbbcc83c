package join_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/cert"

	"github.com/waggle-io/waggle/cluster/join"
	"github.com/waggle-io/waggle/controlplane/controllers"
	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet"
)

// TestKubeletRotatesItsClientCertificate: a kubelet (hollow runtime, the
// real node agent otherwise) that TLS-bootstraps with --rotate-certificates
// against a controller-manager signing 150 s certificates renews its client
// certificate before it expires: a second CSR, requested by the node
// itself, is auto-approved (selfnodeclient) and signed, the cert dir's
// kubelet-client-current.pem becomes the new certificate, and the kubelet
// keeps renewing its Lease after the first certificate expired, which only
// a client presenting the new certificate can do.
//
// 150 s is the shortest lifetime that does not rotate at once: the signer
// backdates NotBefore by 5 minutes, and client-go's manager rotates at
// 70–90 % of NotAfter−NotBefore, so 15–105 s after issuance here.
func TestKubeletRotatesItsClientCertificate(t *testing.T) {
	e := startWith(t, func(cm *controllers.Config) { cm.ClusterSigningDuration = 150 * time.Second })
	ctx := context.Background()
	tok, err := join.CreateToken(ctx, e.admin, join.TokenOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error { _, err := whoami(t, tokenConfig(e, tok)); return err })
	w, err := e.admin.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	const node = "sp-rotate"
	dir := t.TempDir()
	boot := filepath.Join(dir, "bootstrap.kubeconfig")
	if err := join.WriteKubeconfig(boot, e.srv.Config.Host, e.ca, tok); err != nil {
		t.Fatal(err)
	}
	certDir := filepath.Join(dir, "pki")
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- kubelet.Run(kctx, kubelet.Config{NodeName: node, Kubeconfig: filepath.Join(dir, "kubelet.kubeconfig"),
			BootstrapKubeconfig: boot, CertDir: certDir, RotateCertificates: true,
			Runtime: kubelet.RuntimeHollow, PodCIDR: "10.78.0.0/24", RootDir: filepath.Join(dir, "root"),
			Address: "127.0.0.1", Port: 0, NodeIP: "127.0.0.1",
			NodeStatusUpdateFrequency: 2 * time.Second, LeaseDuration: 4 * time.Second})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kubelet.Run = %v", err)
		}
	})

	// The CSR watch: the bootstrap CSR, then the node's own renewal, each
	// approved and signed.
	type issuedCSR struct {
		requester string
		cert      *x509.Certificate
	}
	var issued []issuedCSR
	seen := map[string]bool{}
	deadline := time.After(150 * time.Second)
	for len(issued) < 2 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("CSR watch closed")
			}
			csr, isCSR := ev.Object.(*certificatesv1.CertificateSigningRequest)
			if !isCSR || ev.Type == watch.Deleted || seen[csr.Name] || csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName || len(csr.Status.Certificate) == 0 {
				continue
			}
			approved := false
			for _, c := range csr.Status.Conditions {
				approved = approved || (c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue && c.Reason == "AutoApproved")
			}
			certs, err := cert.ParseCertsPEM(csr.Status.Certificate)
			if err != nil {
				t.Fatalf("CSR %s certificate: %v", csr.Name, err)
			}
			if !approved || certs[0].Subject.CommonName != "system:node:"+node {
				t.Fatalf("CSR %s signed without auto-approval or for %q: %+v", csr.Name, certs[0].Subject.CommonName, csr.Status.Conditions)
			}
			seen[csr.Name] = true
			issued = append(issued, issuedCSR{csr.Spec.Username, certs[0]})
			t.Logf("CSR %s by %s: serial %s, valid until %s", csr.Name, csr.Spec.Username, certs[0].SerialNumber, certs[0].NotAfter.Format(time.TimeOnly))
		case <-deadline:
			t.Fatalf("%d client CSRs issued within 150s, want 2 (bootstrap, rotation)", len(issued))
		}
	}
	if !strings.HasPrefix(issued[0].requester, "system:bootstrap:") {
		t.Errorf("first CSR requested by %s, want the bootstrap token", issued[0].requester)
	}
	if issued[1].requester != "system:node:"+node {
		t.Errorf("renewal requested by %s, want the node itself", issued[1].requester)
	}
	first, second := issued[0].cert, issued[1].cert

	// The cert dir's current pair is the renewed certificate.
	testutil.Eventually(t, 30*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(certDir, "kubelet-client-current.pem"))
		if err != nil {
			return err
		}
		certs, err := cert.ParseCertsPEM(b)
		if err != nil {
			return err
		}
		if certs[0].SerialNumber.Cmp(first.SerialNumber) == 0 {
			return errors.New("kubelet-client-current.pem still holds the bootstrap certificate")
		}
		return nil
	})

	// Lease renewals (every second) go on after the first certificate
	// expired: the kubelet's connections switched to a renewed one.
	testutil.Eventually(t, 150*time.Second, func() error {
		l, err := e.admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(first.NotAfter.Add(2*time.Second)) {
			return fmt.Errorf("lease renewed at %v; first certificate valid until %s", l.Spec.RenewTime, first.NotAfter)
		}
		return nil
	})
	n, err := e.admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			t.Errorf("node Ready = %s (%s)", c.Status, c.Message)
		}
	}
	_ = second
}
