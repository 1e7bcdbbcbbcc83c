package storage

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	// The process's own client is on the owner-only socket
	// (TestEmbeddedEtcdSocketIsOwnerOnly); every TCP listener needs TLS
	// with a client certificate.
	if ep := s.Endpoints()[0]; !strings.HasPrefix(ep, "unix:///") {
		t.Fatalf("the API server's etcd client uses %s, want the local socket", ep)
	}
	url := s.embedded.ClientURL
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

// TestEmbeddedEtcdSocketIsOwnerOnly: the plain-gRPC socket of the
// process's own etcd client is a 0600 socket in a 0700 directory of this
// user, and another local user cannot connect to it (the kernel refuses
// before etcd sees anything), while this user reads through it.
func TestEmbeddedEtcdSocketIsOwnerOnly(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	cfg, _ := embeddedTLS(t, dir)
	e, err := StartEmbedded(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	sock := strings.TrimPrefix(e.LocalURL, "unix://")
	if !strings.HasPrefix(e.LocalURL, "unix:///") || filepath.Dir(sock) != filepath.Join(dir, "etcd") {
		t.Fatalf("local URL %s, want a socket in %s", e.LocalURL, filepath.Join(dir, "etcd"))
	}
	for path, want := range map[string]os.FileMode{sock: os.ModeSocket | 0o600, filepath.Dir(sock): os.ModeDir | 0o700} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
			t.Errorf("%s: mode %v uid %d, want %v owned by %d", path, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, want, os.Getuid())
		}
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.LocalURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "/registry/k", "v"); err != nil {
		t.Fatalf("put through the socket: %v", err)
	}
	// Another user (nobody) dials the socket from a copy of this test
	// binary it can run.
	bin, err := os.MkdirTemp("", "waggle-sockcheck-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(bin)
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(bin, "storage.test")
	if err := os.WriteFile(exe, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^TestHelperDialUnixSocket$")
	cmd.Env = append(os.Environ(), "WAGGLE_DIAL_UNIX="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dial refused:") {
		t.Fatalf("another user dialing the socket: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "permission denied") {
		t.Fatalf("another user's dial failed for another reason than permissions:\n%s", out)
	}
}

// TestHelperDialUnixSocket is TestEmbeddedEtcdSocketIsOwnerOnly's other
// user: it dials WAGGLE_DIAL_UNIX and says how that went.
func TestHelperDialUnixSocket(t *testing.T) {
	sock := os.Getenv("WAGGLE_DIAL_UNIX")
	if sock == "" {
		t.Skip("only run by TestEmbeddedEtcdSocketIsOwnerOnly")
	}
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		fmt.Println("dial refused:", err)
		return
	}
	c.Close()
	t.Fatalf("uid %d connected to %s", os.Getuid(), sock)
}

// A data dir too long for a socket address puts the socket in a private
// temporary dir, removed on Close.
func TestLocalSocketPathFallsBackForLongDirs(t *testing.T) {
	sock, tmp, err := localSocketPath("/x")
	if err != nil || sock != "/x/grpc.sock" || tmp != "" {
		t.Fatalf("short dir: %q %q %v", sock, tmp, err)
	}
	long := "/" + strings.Repeat("d", 120)
	sock, tmp, err = localSocketPath(long)
	if err != nil {
		t.Fatal(err)
	}
	defer removeSockDir(tmp)
	fi, err := os.Stat(tmp)
	if err != nil || fi.Mode() != os.ModeDir|0o700 || filepath.Dir(sock) != tmp || len(sock) > maxSocketPath {
		t.Fatalf("long dir: socket %q in %q (%v, %v)", sock, tmp, fi.Mode(), err)
	}
}
