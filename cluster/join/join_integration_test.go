package join_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"

	"github.com/waggle-io/waggle/cluster/join"
	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
	"github.com/waggle-io/waggle/controlplane/controllers"
	"github.com/waggle-io/waggle/internal/leaderelect"
	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet"
)

type env struct {
	srv   *apiservertest.Server
	admin kubernetes.Interface
	ca    []byte
}

// start runs a real API server with bootstrap token authentication and a
// controller-manager running the token and CSR controllers, as `waggle up`.
func start(t *testing.T) *env {
	t.Helper()
	return startWith(t, nil)
}

// startWith is start with the controller-manager's config changed by mod.
func startWith(t *testing.T, mod func(*controllers.Config)) *env {
	t.Helper()
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) { c.EnableBootstrapTokenAuth, c.AnonymousAuth = true, true }})
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cm := controllers.DefaultConfig()
	cm.Kubeconfig = filepath.Join(srv.DataDir, "controller-manager.kubeconfig")
	cm.SecureServing.SecurePort = 0
	cm.Controllers = []string{"*", controllers.BootstrapSignerName, controllers.TokenCleanerName}
	cm.ClusterSigningCertFile = filepath.Join(srv.DataDir, "pki", "ca.crt")
	cm.ClusterSigningKeyFile = filepath.Join(srv.DataDir, "pki", "ca.key")
	cm.LeaderElection = leaderelect.Config{Enabled: true, LeaseName: "kube-controller-manager", LeaseNamespace: "kube-system",
		Identity: "cm-0", LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: time.Second}
	if mod != nil {
		mod(&cm)
	}
	go func() { done <- controllers.Run(ctx, cm) }()
	t.Cleanup(func() { cancel(); <-done })
	return &env{srv: srv, admin: cs, ca: srv.Bundle().CAPEM()}
}

// nodeToken creates a node join token and returns it with the CA's pin.
func (e *env) nodeToken(t *testing.T) (string, string) {
	t.Helper()
	tok, err := join.CreateToken(context.Background(), e.admin, join.TokenOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hash, err := join.CACertHash(e.ca)
	if err != nil {
		t.Fatal(err)
	}
	return tok, hash
}

func whoami(t *testing.T, rc *rest.Config) (*authenticationv1.UserInfo, error) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return &r.Status.UserInfo, nil
}

func tokenConfig(e *env, tok string) *rest.Config {
	rc := rest.AnonymousClientConfig(e.srv.Config)
	rc.BearerToken = tok
	return rc
}

// A token from CreateToken authenticates as system:bootstrap:<id> in
// system:bootstrappers and its extra group; a wrong secret, an unknown id
// and a token not meant for authentication are 401s, never anonymous.
func TestBootstrapTokenAuthenticates(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	tok, err := join.CreateToken(ctx, e.admin, join.TokenOptions{TTL: time.Hour, Description: "test"})
	if err != nil {
		t.Fatal(err)
	}
	id := strings.SplitN(tok, ".", 2)[0]
	var u *authenticationv1.UserInfo
	testutil.Eventually(t, 30*time.Second, func() error {
		u, err = whoami(t, tokenConfig(e, tok))
		return err
	})
	if u.Username != "system:bootstrap:"+id {
		t.Errorf("user = %q, want system:bootstrap:%s", u.Username, id)
	}
	for _, g := range []string{"system:bootstrappers", join.NodeGroup, "system:authenticated"} {
		if !contains(u.Groups, g) {
			t.Errorf("groups %v lack %s", u.Groups, g)
		}
	}
	// Not for authentication: usage-bootstrap-authentication unset.
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-abcdef", Namespace: "kube-system"},
		Type: bootstrapapi.SecretTypeBootstrapToken,
		Data: map[string][]byte{"token-id": []byte("abcdef"), "token-secret": []byte("0123456789abcdef"), "usage-bootstrap-signing": []byte("true")}}
	if _, err := e.admin.CoreV1().Secrets("kube-system").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{id + ".0000000000000000", "zzzzzz.0123456789abcdef", "abcdef.0123456789abcdef"} {
		_, err := whoami(t, tokenConfig(e, bad))
		if !apierrors.IsUnauthorized(err) {
			t.Errorf("token %s: err = %v, want 401", bad, err)
		}
	}
	toks, err := join.ListTokens(ctx, e.admin)
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) != 2 {
		t.Errorf("ListTokens = %+v, want 2", toks)
	}
	if err := join.DeleteToken(ctx, e.admin, tok); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if _, err := whoami(t, tokenConfig(e, tok)); !apierrors.IsUnauthorized(err) {
			return fmt.Errorf("deleted token: err = %v, want 401", err)
		}
		return nil
	})
}

// An expired token is refused and the tokencleaner deletes its Secret.
func TestExpiredTokenIsRefusedAndCleanedUp(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	tok, err := join.CreateToken(ctx, e.admin, join.TokenOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	id := strings.SplitN(tok, ".", 2)[0]
	testutil.Eventually(t, 45*time.Second, func() error {
		_, err := e.admin.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-"+id, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("expired token's Secret still there (err %v)", err)
		}
		return nil
	})
	if _, err := whoami(t, tokenConfig(e, tok)); !apierrors.IsUnauthorized(err) {
		t.Errorf("expired token: err = %v, want 401", err)
	}
}

// The whole join: discovery validates cluster-info's JWS signature and the
// CA pin (a wrong pin is refused), the kubelet's TLS bootstrap gets a
// certificate for system:node:<name> approved and signed by the
// controller-manager, while a kubelet serving CSR is signed only once an
// administrator approves it, as upstream.
func TestNodeJoinsWithToken(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	tok, hash := e.nodeToken(t)
	server := e.srv.Config.Host
	if _, err := join.Discover(ctx, server, tok, []string{"sha256:" + strings.Repeat("0", 64)}, false, 20*time.Second); err == nil {
		t.Fatal("discovery with a wrong CA pin succeeded")
	}
	if _, err := join.Discover(ctx, server, tok, nil, false, time.Second); err == nil {
		t.Fatal("discovery without a pin succeeded")
	}
	d, err := join.Discover(ctx, server, tok, []string{hash}, false, 45*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(d.CAPEM) != string(e.ca) {
		t.Fatal("discovered CA differs from the cluster's")
	}

	// A serving CSR from the bootstrapper, before the client one: it must
	// stay unapproved after the client CSR was approved and signed.
	servingName := createServingCSR(t, tokenConfig(e, tok), "n1")

	dir := t.TempDir()
	boot := filepath.Join(dir, "bootstrap.kubeconfig")
	if err := join.WriteKubeconfig(boot, server, d.CAPEM, tok); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubelet.kubeconfig")
	bctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := kubelet.TLSBootstrap(bctx, kubelet.Config{NodeName: "n1", Kubeconfig: kc, BootstrapKubeconfig: boot, CertDir: filepath.Join(dir, "pki")}); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	u, err := whoami(t, rc)
	if err != nil {
		t.Fatal(err)
	}
	if u.Username != "system:node:n1" || !contains(u.Groups, "system:nodes") {
		t.Errorf("bootstrapped identity = %s %v, want system:node:n1 in system:nodes", u.Username, u.Groups)
	}
	csr, err := e.admin.CertificatesV1().CertificateSigningRequests().Get(ctx, servingName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(csr.Status.Conditions) != 0 || len(csr.Status.Certificate) != 0 {
		t.Fatalf("serving CSR was acted on without an administrator: %+v", csr.Status)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "approved by the test"})
	if _, err := e.admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, servingName, csr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		c, err := e.admin.CertificatesV1().CertificateSigningRequests().Get(ctx, servingName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(c.Status.Certificate) == 0 {
			return errors.New("approved serving CSR not signed yet")
		}
		certs, err := cert.ParseCertsPEM(c.Status.Certificate)
		if err != nil {
			return err
		}
		if certs[0].CheckSignatureFrom(parseCA(t, e.ca)) != nil {
			return errors.New("serving certificate not signed by the cluster CA")
		}
		return nil
	})
}

func createServingCSR(t *testing.T, rc *rest.Config, node string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}, DNSNames: []string{node}}, key)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := cs.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "serving-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeletServingSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return csr.Name
}

func parseCA(t *testing.T, p []byte) *x509.Certificate {
	t.Helper()
	c, err := cert.ParseCertsPEM(p)
	if err != nil {
		t.Fatal(err)
	}
	return c[0]
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestJoinedNodeRunsItsProxyAsKubeProxy: a machine joined with
// join.Bootstrap and the kubelet's TLS bootstrap keeps what it needs to
// run again without the token; its proxy runs as system:kube-proxy with
// the certificate the server issued to the token, and may do what the
// proxy and the cluster DNS server do (read Services, EndpointSlices, Pods,
// Namespaces, NetworkPolicies), while the node's own identity stays where
// the Node authorizer keeps it (no listing every pod, as upstream). Only a
// node join token may get the proxy's certificate.
func TestJoinedNodeRunsItsProxyAsKubeProxy(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	tok, hash := e.nodeToken(t)
	dir := t.TempDir()
	if join.NodeFiles(dir).Joined() {
		t.Fatal("an empty data dir reads as joined")
	}
	n, err := join.Bootstrap(ctx, dir, e.srv.Config.Host, tok, []string{hash}, false)
	if err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := kubelet.TLSBootstrap(bctx, kubelet.Config{NodeName: "j1", Kubeconfig: n.Kubeconfig, BootstrapKubeconfig: n.BootstrapKubeconfig, CertDir: n.CertDir}); err != nil {
		t.Fatal(err)
	}
	if !join.NodeFiles(dir).Joined() {
		t.Fatal("after the TLS bootstrap the data dir does not read as joined")
	}
	// The token is gone: the node runs on its own certificates.
	if err := join.DeleteToken(ctx, e.admin, tok); err != nil {
		t.Fatal(err)
	}
	client := func(kubeconfig string) (kubernetes.Interface, *rest.Config) {
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		return cs, rc
	}
	proxy, prc := client(n.ProxyKubeconfig)
	if u, err := whoami(t, prc); err != nil || u.Username != "system:kube-proxy" {
		t.Fatalf("the proxy's identity: %+v, %v", u, err)
	}
	for what, list := range map[string]func() error{
		"services": func() error { _, err := proxy.CoreV1().Services("").List(ctx, metav1.ListOptions{}); return err },
		"endpointslices": func() error {
			_, err := proxy.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
			return err
		},
		"pods":       func() error { _, err := proxy.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err },
		"namespaces": func() error { _, err := proxy.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); return err },
		"networkpolicies": func() error {
			_, err := proxy.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
			return err
		},
	} {
		if err := list(); err != nil {
			t.Errorf("the joined node's proxy lists %s: %v", what, err)
		}
	}
	node, nrc := client(n.Kubeconfig)
	if u, err := whoami(t, nrc); err != nil || u.Username != "system:node:j1" {
		t.Fatalf("the node's identity: %+v, %v", u, err)
	}
	if _, err := node.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node listed every pod: %v", err)
	}
	// A server join token may not get it (node join tokens only).
	stok, err := join.CreateToken(ctx, e.admin, join.TokenOptions{TTL: time.Hour, Groups: []string{bootstrap.BootstrapServerGroup}})
	if err != nil {
		t.Fatal(err)
	}
	d := &join.Discovered{Server: e.srv.Config.Host, CAPEM: e.ca}
	if _, err := d.Fetch(ctx, stok, bootstrap.NodeProxyCredentialsURL); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("a server token got the proxy's certificate: %v", err)
	}
}
