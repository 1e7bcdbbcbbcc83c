package storage

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/internal/testutil"
)

// withTLS fills cfg's certificates for an embedded etcd under dir, as the
// API server does (pki.EnsureEtcd under dir/pki).
func withTLS(t testing.TB, dir string, cfg Config) Config {
	t.Helper()
	p, err := pki.EnsureEtcd(filepath.Join(dir, "pki"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = dir
	cfg.CAFile, cfg.CertFile, cfg.KeyFile = p.CAFile, p.ClientCertFile, p.ClientKeyFile
	cfg.EmbeddedCertFile, cfg.EmbeddedKeyFile = p.ServerCertFile, p.ServerKeyFile
	return cfg
}

// embeddedTLS is an EmbeddedConfig with certificates under dir.
func embeddedTLS(t testing.TB, dir string) (EmbeddedConfig, *pki.EtcdPKI) {
	t.Helper()
	p, err := pki.EnsureEtcd(filepath.Join(dir, "pki"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return EmbeddedConfig{DataDir: dir, UnsafeNoFsync: true, CertFile: p.ServerCertFile, KeyFile: p.ServerKeyFile, TrustedCAFile: p.CAFile}, p
}

// TestEmbeddedEtcdRefusesUnauthenticatedClients: the embedded etcd answers
// only clients with a certificate of its own CA. Plain HTTP, TLS without a
// certificate, and a certificate of another CA (the cluster CA that signs
// kubelets' and users' certificates) read nothing and write nothing.
func TestEmbeddedEtcdRefusesUnauthenticatedClients(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	s, err := Open(context.Background(), withTLS(t, dir, Config{UnsafeNoFsync: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if _, err := s.Create(ctx, "/registry/secrets/default/s", []byte(`{"data":{"k":"c2VjcmV0"}}`)); err != nil {
		t.Fatal(err)
	}
	url := s.Endpoints()[0]
	if !strings.HasPrefix(url, "https://127.0.0.1:") {
		t.Fatalf("embedded etcd at %s, want https on loopback", url)
	}
	host := strings.TrimPrefix(url, "https://")
	other, err := pki.Ensure(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	oc, ok, err := other.IssueClient(pki.EtcdClientUser, nil)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tls.X509KeyPair(oc, ok)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ClientTLS(filepath.Join(dir, "pki", pki.EtcdCACertFile), "", "")
	if err != nil {
		t.Fatal(err)
	}
	withForeign := ca.Clone()
	withForeign.Certificates = []tls.Certificate{foreign}

	// Raw HTTP(S) to the gRPC gateway, as curl would.
	for name, c := range map[string]*http.Client{
		"plain http":           {Timeout: 10 * time.Second},
		"https, no cert":       {Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: ca}},
		"https, other CA cert": {Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: withForeign}},
	} {
		u := "https://" + host
		if name == "plain http" {
			u = "http://" + host
		}
		for _, path := range []string{"/v3/kv/range", "/v3/kv/put"} {
			body := `{"key":"L3JlZ2lzdHJ5L3NlY3JldHMvZGVmYXVsdC9z"}` // /registry/secrets/default/s
			if path == "/v3/kv/put" {
				body = `{"key":"L3JlZ2lzdHJ5L3NlY3JldHMvZGVmYXVsdC9z","value":"b3duZWQ="}`
			}
			resp, err := c.Post(u+path, "application/json", strings.NewReader(body))
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 || strings.Contains(string(b), "c2VjcmV0") {
					t.Errorf("%s POST %s = %d %s: etcd answered without a client certificate of its CA", name, path, resp.StatusCode, b)
				}
			}
		}
	}
	// The etcd client, with the same wrong credentials.
	for name, tc := range map[string]*tls.Config{"no cert": ca, "other CA cert": withForeign} {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, TLS: tc, DialTimeout: 5 * time.Second})
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, gerr := c.Get(cctx, "/registry/secrets/default/s")
		_, perr := c.Put(cctx, "/registry/secrets/default/s", "owned")
		cancel()
		c.Close()
		if gerr == nil || perr == nil {
			t.Errorf("etcd client with %s: get %v, put %v; want both refused", name, gerr, perr)
		}
	}
	// Nothing changed.
	kv, _, err := s.Get(ctx, "/registry/secrets/default/s")
	if err != nil || kv == nil || string(kv.Value) != `{"data":{"k":"c2VjcmV0"}}` {
		t.Fatalf("after the refused writes: %v %+v", err, kv)
	}
}

func TestEmbeddedEtcdNeedsCertificates(t *testing.T) {
	if _, err := StartEmbedded(context.Background(), EmbeddedConfig{DataDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("StartEmbedded without certificates: %v", err)
	}
	if _, err := Open(context.Background(), Config{DataDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("Open of the embedded etcd without certificates: %v", err)
	}
	if _, err := ClientTLS("", "cert.pem", ""); err == nil || !strings.Contains(err.Error(), "go together") {
		t.Fatalf("ClientTLS with a certificate and no key: %v", err)
	}
	if _, err := ClientTLS("/nonexistent/ca.crt", "", ""); err == nil || !strings.Contains(err.Error(), "--etcd-cafile") {
		t.Fatalf("ClientTLS with a missing CA: %v", err)
	}
}
