package kubelet_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/kubernetes/test/utils/hermeticpodcertificatesigner"
	"k8s.io/utils/clock"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet"
)

// TestPodCertificateProjection runs a hollow kubelet under its own identity
// (system:node:<name>: the Node authorizer and NodeRestriction decide its
// PodCertificateRequests) with upstream's hermetic test signer issuing
// requests of one signer: the pod's projected volume gets the key, the chain
// and the bundle of both, the key being the one the leaf certificate
// certifies, with upstream's default lifetime (24 h) and the signer's use of
// the pod's userAnnotations. A pod of a signer nobody serves waits Pending
// with a FailedMount event.
func TestPodCertificateProjection(t *testing.T) {
	testutil.Privileged(t)
	s := apiservertest.Start(t, apiservertest.Options{})
	admin := kubernetes.NewForConfigOrDie(s.Config)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	const signer = "example.com/podcert-test"
	caKeys, caCerts, err := hermeticpodcertificatesigner.GenerateCAHierarchy(1)
	if err != nil {
		t.Fatal(err)
	}
	go hermeticpodcertificatesigner.New(clock.RealClock{}, signer, "cluster.local", caKeys, caCerts, admin).Run(ctx)

	const nodeName = "podcert-node"
	rootDir := t.TempDir()
	done := make(chan error, 1)
	cfg := kubelet.Config{NodeName: nodeName, RestConfig: s.UserConfig(t, "system:node:"+nodeName, "system:nodes"),
		Runtime: kubelet.RuntimeHollow, PodCIDR: "10.79.0.0/24", RootDir: rootDir, NodeIP: "127.0.0.1",
		Address: "127.0.0.1", Port: 0, SyncFrequency: 200 * time.Millisecond}
	kctx, kcancel := context.WithCancel(ctx)
	go func() { done <- kubelet.Run(kctx, cfg) }()
	t.Cleanup(func() { kcancel(); <-done })

	podWith := func(name, signerName string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: v1.PodSpec{
			NodeName:   nodeName,
			Containers: []v1.Container{{Name: "c", Image: "registry.example/app:v1", VolumeMounts: []v1.VolumeMount{{Name: "tls", MountPath: "/tls"}}}},
			Volumes: []v1.Volume{{Name: "tls", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{PodCertificate: &v1.PodCertificateProjection{SignerName: signerName, KeyType: "ECDSAP256",
					CredentialBundlePath: "bundle.pem", KeyPath: "key.pem", CertificateChainPath: "chain.pem",
					UserAnnotations: map[string]string{"spiffe/path-overriding": "/custom-workload"}}},
			}}}}},
		}}
	}
	// The request names the pods' ServiceAccount by UID (no
	// controller-manager makes "default" here).
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := admin.CoreV1().Pods("default").Create(ctx, podWith("issued", signer), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Pods("default").Create(ctx, podWith("unserved", "example.com/nobody"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "pod issued Running", func() (bool, string) {
		p, err := admin.CoreV1().Pods("default").Get(ctx, "issued", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == v1.PodRunning, string(p.Status.Phase)
	})

	dir := filepath.Join(rootDir, "pods", string(pod.UID), "volumes", "tls")
	read := func(f string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	keyPEM, chainPEM, bundle := read("key.pem"), read("chain.pem"), read("bundle.pem")
	if !bytes.Equal(bundle, append(append([]byte{}, keyPEM...), chainPEM...)) {
		t.Errorf("bundle.pem is not key.pem followed by chain.pem")
	}
	key, err := keyutil.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		t.Fatalf("key.pem: %v", err)
	}
	chain, err := cert.ParseCertsPEM(chainPEM)
	if err != nil || len(chain) < 2 {
		t.Fatalf("chain.pem: %d certificates, %v (want leaf and intermediate)", len(chain), err)
	}
	leaf := chain[0]
	if pub, ok := key.(crypto.Signer); !ok || !pub.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(leaf.PublicKey) {
		t.Errorf("the leaf certificate does not certify key.pem's key")
	}
	if err := leaf.CheckSignatureFrom(chain[1]); err != nil {
		t.Errorf("leaf not signed by the next certificate of the chain: %v", err)
	}
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got != 24*time.Hour {
		t.Errorf("leaf lifetime %v, want the default 24h", got)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].Path != "/custom-workload" {
		t.Errorf("leaf URIs %v, want the SPIFFE path from userAnnotations", leaf.URIs)
	}
	if fi, err := os.Stat(filepath.Join(dir, "key.pem")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("key.pem mode %v (%v), want the projected default 0644", fi.Mode().Perm(), err)
	}
	// The request was the node's, for this pod, with proof of possession.
	reqs, err := admin.CertificatesV1().PodCertificateRequests("default").List(ctx, metav1.ListOptions{FieldSelector: "spec.podName=issued"})
	if err != nil || len(reqs.Items) != 1 {
		t.Fatalf("requests of pod issued: %v %v", reqs, err)
	}
	r := reqs.Items[0]
	if string(r.Spec.NodeName) != nodeName || r.Spec.PodUID != pod.UID || r.Spec.ServiceAccountName != "default" || r.Spec.MaxExpirationSeconds == nil || *r.Spec.MaxExpirationSeconds != 86400 {
		t.Errorf("request spec %+v", r.Spec)
	}
	csr, err := x509.ParseCertificateRequest(r.Spec.StubPKCS10Request)
	if err != nil {
		t.Fatalf("proof of possession: %v", err)
	}
	if !csr.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(leaf.PublicKey) {
		t.Errorf("the request's PKCS#10 proof is not for the projected key")
	}

	// Nobody signs for example.com/nobody: the pod waits, as upstream.
	waitFor(t, 45*time.Second, "a FailedMount event for pod unserved", func() (bool, string) {
		evs, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=unserved"})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == "FailedMount" && strings.Contains(e.Message, "not issued yet") {
				return true, ""
			}
		}
		return false, "no event yet"
	})
	if p, err := admin.CoreV1().Pods("default").Get(ctx, "unserved", metav1.GetOptions{}); err != nil || p.Status.Phase != v1.PodPending {
		t.Errorf("pod unserved: %v, want Pending", err)
	}
}
