package kubectl

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
)

// TestAuthenticationWithKubectl: the admin client certificate works, a
// static bearer token from --token-auth-file works, and a client with no
// credentials is system:anonymous (403 from RBAC) and a wrong token gets 401
// Unauthorized.
func TestAuthenticationWithKubectl(t *testing.T) {
	requireE2E(t, defaultKubectl)
	dir := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(tokens, []byte("s3cret-token,alice,uid-alice,\"dev,system:masters\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := startServer(dir, "--token-auth-file", tokens)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stop() })
	k := newKC(t, defaultKubectl, s)
	if out := k.run("get", "ns", "default", "-o", "name"); strings.TrimSpace(out) != "namespace/default" {
		t.Errorf("client certificate: %q", out)
	}

	apiURL := strings.TrimSpace(k.run("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"))
	ca := filepath.Join(dir, "pki", "ca.crt")
	// A kubeconfig-less kubectl: --server, --certificate-authority and
	// optionally --token. KUBECONFIG points at an empty file so the admin
	// kubeconfig is not picked up.
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o600)
	bare := func(args ...string) (string, string, error) {
		c := &kc{t: t, bin: defaultKubectl, s: &server{cacheDir: t.TempDir()}}
		full := append([]string{"--server", apiURL, "--certificate-authority", ca}, args...)
		return c.tryWithKubeconfig(empty, full...)
	}
	out, errOut, err := bare("--token", "s3cret-token", "get", "ns", "kube-system", "-o", "name")
	if err != nil || strings.TrimSpace(out) != "namespace/kube-system" {
		t.Errorf("bearer token: %q %q %v", out, errOut, err)
	}
	out, errOut, err = bare("--token", "nope", "get", "ns")
	if err == nil || !strings.Contains(errOut, "You must be logged in to the server (the server has asked for the client to provide credentials)") {
		t.Errorf("wrong token: want 401 Unauthorized, got %q %q %v", out, errOut, err)
	}

	// Anonymous: kubectl would prompt for credentials, so ask over HTTPS
	// trusting only the CA.
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(ca)
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := hc.Get(apiURL + "/api/v1/namespaces")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// With --anonymous-auth (on by default, as kube-apiserver) the request
	// runs as system:anonymous, which RBAC does not let list namespaces.
	var st metav1.Status
	if resp.StatusCode != http.StatusForbidden || json.Unmarshal(body, &st) != nil || st.Reason != metav1.StatusReasonForbidden ||
		!strings.Contains(st.Message, `User "system:anonymous" cannot list resource "namespaces"`) {
		t.Errorf("anonymous: %d %s", resp.StatusCode, body)
	}
}

// TestUserProvidedCertificates: with --tls-cert-file, --tls-private-key-file
// and --client-ca-file the server serves the user's certificate and accepts
// client certificates of the user's CA (here made with package pki in
// another directory); it writes no kubeconfigs, having no CA key.
func TestUserProvidedCertificates(t *testing.T) {
	requireE2E(t, defaultKubectl)
	userPKI := t.TempDir()
	bundle, err := pki.Ensure(userPKI, nil)
	if err != nil {
		t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(userPKI, "user.kubeconfig")
	if err := bundle.WriteKubeconfig(kubeconfig, fmt.Sprintf("https://127.0.0.1:%d", port), "operator", []string{"system:masters"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s, err := startServerOn(dir, port, kubeconfig,
		"--tls-cert-file", filepath.Join(userPKI, pki.ServerCertFile),
		"--tls-private-key-file", filepath.Join(userPKI, pki.ServerKeyFile),
		"--client-ca-file", filepath.Join(userPKI, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stop() })
	k := newKC(t, defaultKubectl, s)
	if out := k.run("get", "ns", "kube-public", "-o", "name"); strings.TrimSpace(out) != "namespace/kube-public" {
		t.Errorf("user certificate: %q", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "admin.kubeconfig")); !os.IsNotExist(err) {
		t.Errorf("admin.kubeconfig written without a CA key (stat: %v)", err)
	}
	// A client certificate of another CA is refused.
	other, err := pki.Ensure(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(t.TempDir(), "foreign.kubeconfig")
	if err := other.WriteKubeconfig(foreign, fmt.Sprintf("https://127.0.0.1:%d", port), "mallory", []string{"system:masters"}); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := k.tryWithKubeconfig(foreign, "get", "ns")
	if err == nil {
		t.Errorf("foreign CA accepted: %q", out)
	} else if !strings.Contains(errOut, "certificate") && !strings.Contains(errOut, "credentials") {
		t.Errorf("foreign CA: unexpected error %q", errOut)
	}
}

// TestServiceAccountTokensWithKubectl: `kubectl create token` issues a
// token whose user `kubectl auth whoami` reports; it is refused (403) until
// a RoleBinding grants it one verb, then allowed exactly that; a token for
// another audience, or shorter than 10 minutes, is refused as upstream.
func TestServiceAccountTokensWithKubectl(t *testing.T) {
	requireE2E(t, defaultKubectl)
	dir := t.TempDir()
	s, err := startServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stop() })
	k := newKC(t, defaultKubectl, s)
	k.run("create", "namespace", "tok")
	k.run("create", "serviceaccount", "bot", "-n", "tok")
	tok := strings.TrimSpace(k.run("create", "token", "bot", "-n", "tok", "--duration", "15m"))
	apiURL := strings.TrimSpace(k.run("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"))
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o600)
	as := func(token string, args ...string) (string, string, error) {
		c := &kc{t: t, bin: defaultKubectl, s: &server{cacheDir: t.TempDir()}}
		return c.tryWithKubeconfig(empty, append([]string{"--server", apiURL, "--certificate-authority", filepath.Join(dir, "pki", "ca.crt"), "--token", token}, args...)...)
	}
	out, errOut, err := as(tok, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username} {.status.userInfo.groups}")
	if err != nil || !strings.HasPrefix(out, "system:serviceaccount:tok:bot ") || !strings.Contains(out, "system:serviceaccounts:tok") {
		t.Fatalf("whoami with the token: %q %q %v", out, errOut, err)
	}
	if _, errOut, err := as(tok, "get", "configmaps", "-n", "tok"); err == nil || !strings.Contains(errOut, `User "system:serviceaccount:tok:bot" cannot list resource "configmaps"`) {
		t.Errorf("without a binding: want 403, got %q %v", errOut, err)
	}
	k.run("create", "role", "cm-reader", "-n", "tok", "--verb=list", "--resource=configmaps")
	k.run("create", "rolebinding", "bot-reads", "-n", "tok", "--role=cm-reader", "--serviceaccount=tok:bot")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, _, err := as(tok, "get", "configmaps", "-n", "tok"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the RoleBinding did not take effect")
		}
		time.Sleep(100 * time.Millisecond) // poll interval (bounded by the deadline)
	}
	if _, errOut, err := as(tok, "get", "secrets", "-n", "tok"); err == nil || !strings.Contains(errOut, "Forbidden") {
		t.Errorf("secrets with a configmaps binding: want 403, got %q %v", errOut, err)
	}
	vault := strings.TrimSpace(k.run("create", "token", "bot", "-n", "tok", "--audience", "vault"))
	if _, errOut, err := as(vault, "get", "configmaps", "-n", "tok"); err == nil || !strings.Contains(errOut, "the server has asked for the client to provide credentials") {
		t.Errorf("a token for audience vault: want 401, got %q %v", errOut, err)
	}
	if errOut := k.fails("", "create", "token", "bot", "-n", "tok", "--duration", "1m"); !strings.Contains(errOut, "may not specify a duration less than 10 minutes") {
		t.Errorf("a 1-minute token: %q", errOut)
	}
}
