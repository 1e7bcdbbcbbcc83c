package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func parseLeaf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(certPEM)
	if blk == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestEnsureCreatesCAAndServingCertWithDefaultSANsAndPrivateKeys(t *testing.T) {
	dir := t.TempDir()
	b, err := Ensure(dir, []string{"node-1.example", "10.0.0.7"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{CAKeyFile, ServerKeyFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %v, want 0600", f, st.Mode().Perm())
		}
	}
	leaf := parseLeaf(t, b.ServingCertPEM())
	for _, h := range append([]string{"node-1.example", "10.0.0.7"}, DefaultHosts...) {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("serving certificate does not cover %s: %v", h, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: b.CAPool()}); err != nil {
		t.Errorf("serving certificate does not chain to the CA: %v", err)
	}
}

func TestEnsureReloadsTheSameCAOnSecondStart(t *testing.T) {
	dir := t.TempDir()
	b1, err := Ensure(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := Ensure(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(b1.CAPEM()) != string(b2.CAPEM()) {
		t.Error("second start created a new CA")
	}
	if string(b1.ServingCertPEM()) != string(b2.ServingCertPEM()) {
		t.Error("second start with the same hosts reissued the serving certificate")
	}
	// A new host reissues the serving cert from the same CA.
	b3, err := Ensure(dir, []string{"new.example"})
	if err != nil {
		t.Fatal(err)
	}
	if string(b1.CAPEM()) != string(b3.CAPEM()) {
		t.Error("adding a host created a new CA")
	}
	if err := parseLeaf(t, b3.ServingCertPEM()).VerifyHostname("new.example"); err != nil {
		t.Errorf("new host not in reissued certificate: %v", err)
	}
}

func TestEnsureRejectsCorruptFiles(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(dir string)
	}{
		{"garbage CA certificate", func(dir string) { os.WriteFile(filepath.Join(dir, CACertFile), []byte("nope"), 0o644) }},
		{"missing CA key", func(dir string) { os.Remove(filepath.Join(dir, CAKeyFile)) }},
		{"CA key of another CA", func(dir string) {
			other := t.TempDir()
			if _, err := Ensure(other, nil); err != nil {
				t.Fatal(err)
			}
			k, _ := os.ReadFile(filepath.Join(other, CAKeyFile))
			os.WriteFile(filepath.Join(dir, CAKeyFile), k, 0o600)
		}},
		{"garbage serving certificate", func(dir string) { os.WriteFile(filepath.Join(dir, ServerCertFile), []byte("nope"), 0o644) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := Ensure(dir, nil); err != nil {
				t.Fatal(err)
			}
			tc.corrupt(dir)
			if _, err := Ensure(dir, nil); err == nil {
				t.Fatal("Ensure accepted corrupt files")
			}
		})
	}
}

func TestIssuedClientCertCarriesNameAndGroupsAndChains(t *testing.T) {
	b, err := Ensure(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := b.IssueClient("alice", []string{"dev", "ops"})
	if err != nil {
		t.Fatal(err)
	}
	c := parseLeaf(t, certPEM)
	if c.Subject.CommonName != "alice" || !slices.Equal(c.Subject.Organization, []string{"dev", "ops"}) {
		t.Errorf("subject = %v", c.Subject)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: b.CAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client cert does not verify for client auth: %v", err)
	}
	if _, _, err := b.IssueClient("", nil); err == nil {
		t.Error("IssueClient accepted an empty common name")
	}
}

func TestIssueServingCoversHosts(t *testing.T) {
	b, err := Ensure(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := b.IssueServing([]string{"node-a", "192.168.1.5"})
	if err != nil {
		t.Fatal(err)
	}
	c := parseLeaf(t, certPEM)
	for _, h := range []string{"node-a", "192.168.1.5"} {
		if err := c.VerifyHostname(h); err != nil {
			t.Error(err)
		}
	}
	if _, _, err := b.IssueServing(nil); err == nil {
		t.Error("IssueServing accepted no hosts")
	}
}

func TestLoadedBundleRefusesToIssue(t *testing.T) {
	dir := t.TempDir()
	if _, err := Ensure(dir, nil); err != nil {
		t.Fatal(err)
	}
	b, err := Load(filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile), filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.IssueClient("x", nil); !errors.Is(err, ErrNoCAKey) {
		t.Errorf("IssueClient error = %v, want ErrNoCAKey", err)
	}
	if err := b.WriteKubeconfig(filepath.Join(dir, "k"), "https://x", "x", nil); !errors.Is(err, ErrNoCAKey) {
		t.Errorf("WriteKubeconfig error = %v, want ErrNoCAKey", err)
	}
	tokenOnly, err := Load(filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile), "")
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := tokenOnly.ServerTLSConfig(); err != nil || cfg.ClientAuth != tls.NoClientCert || tokenOnly.CAPool() != nil {
		t.Errorf("without a client CA: config %+v, pool %v, err %v; want no client certificates", cfg, tokenOnly.CAPool(), err)
	}
	if _, err := Load(filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile), filepath.Join(dir, "missing")); err == nil {
		t.Error("Load accepted a missing client CA")
	}
	if _, err := Load(filepath.Join(dir, CACertFile), filepath.Join(dir, ServerKeyFile), filepath.Join(dir, CACertFile)); err == nil {
		t.Error("Load accepted a key that does not match the certificate")
	}
}

// TestKubeconfigAuthenticatesOverRealTLS starts a TLS server with the
// bundle's config and connects with the written kubeconfig through
// client-go's loader: the server sees the client certificate's name.
func TestKubeconfigAuthenticatesOverRealTLS(t *testing.T) {
	dir := t.TempDir()
	b, err := Ensure(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := b.ServerTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	if tlsCfg.MinVersion != tls.VersionTLS12 || tlsCfg.ClientAuth != tls.VerifyClientCertIfGiven {
		t.Errorf("tls config = min %x auth %v", tlsCfg.MinVersion, tlsCfg.ClientAuth)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "anonymous", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, r.TLS.VerifiedChains[0][0].Subject.CommonName+" "+r.Proto)
	}))
	srv.TLS = tlsCfg
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	path := filepath.Join(dir, "admin.kubeconfig")
	if err := b.WriteKubeconfig(path, srv.URL, "admin", []string{"system:masters"}); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig mode = %v", st.Mode().Perm())
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	tlsClient, err := restTLS(rc)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tlsClient.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "admin HTTP/2.0" {
		t.Errorf("server saw %q, want admin over HTTP/2", body)
	}
}

func restTLS(rc *rest.Config) (*http.Client, error) { return rest.HTTPClientFor(rc) }
