// Package apiservertest runs a real Waggle API server inside a test: real
// embedded etcd (in a temporary directory), real HTTPS with a generated CA,
// and an admin client certificate. Other components' integration tests use
// it to talk to the server through client-go exactly as in production.
//
// It is not a fake: nothing is mocked, and it is not for production use
// (etcd runs without fsync).
package apiservertest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/controlplane/storage"
	"github.com/waggle-io/waggle/internal/ops"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options tune a test server. The zero value is what StartTestServer uses.
type Options struct {
	// DataDir reuses a directory (to restart a server on the same data);
	// empty makes a fresh temporary one.
	DataDir string
	// Addr is the address to listen on (default 127.0.0.1:0); a restarted
	// server passes the previous one's address so clients keep working.
	Addr string
	// LogLevel of the server's logs on stderr ("error" unless set).
	LogLevel string
	// Configure may change the configuration before the server starts.
	Configure func(*apiserver.Config)
}

// StartTestServer starts an API server for t and returns an admin
// rest.Config for it, its data directory (holding admin.kubeconfig and the
// other components' kubeconfigs) and a stop function (also registered with
// t.Cleanup; calling it twice is fine).
func StartTestServer(t testing.TB) (*rest.Config, string, func()) {
	t.Helper()
	s := Start(t, Options{})
	return s.Config, s.DataDir, s.Stop
}

// Server is a running test server.
type Server struct {
	*apiserver.Server
	Config  *rest.Config
	DataDir string
	done    chan error
	cancel  context.CancelFunc
	stopped bool
}

// Start starts a test server with options.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	dir := o.DataDir
	if dir == "" {
		dir = t.TempDir()
	}
	level := o.LogLevel
	if level == "" {
		level = os.Getenv("WAGGLE_TEST_APISERVER_LOG")
	}
	if level == "" {
		level = "error"
	}
	log, err := ops.NewLogger("apiserver", level)
	if err != nil {
		t.Fatal(err)
	}
	addr := o.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	for i := 0; ; i++ {
		// A port just released may take a moment to be free again.
		if ln, err = net.Listen("tcp", addr); err == nil || i == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("apiservertest: listen: %v", err)
	}
	cfg := apiserver.Config{
		DataDir: dir, Listener: ln, Log: log, EtcdUnsafeNoFsync: true,
		BookmarkInterval: time.Second, ShutdownTimeout: 5 * time.Second,
		// As kube-apiserver's integration test servers: tests create pods
		// without a controller-manager making `default` ServiceAccounts.
		// A test of the plugin clears this in Configure.
		DisableAdmissionPlugins:             []string{"ServiceAccount"},
		ServiceAccountExtendTokenExpiration: true,
	}
	if o.Configure != nil {
		o.Configure(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := apiserver.New(ctx, cfg)
	if err != nil {
		cancel()
		ln.Close()
		t.Fatalf("apiservertest: start: %v", err)
	}
	s := &Server{Server: srv, DataDir: dir, done: make(chan error, 1), cancel: cancel}
	go func() { s.done <- srv.Serve(ctx) }()
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		s.Stop()
		t.Fatalf("apiservertest: admin kubeconfig: %v", err)
	}
	rc.QPS, rc.Burst = -1, 0 // no client-side throttling in tests
	s.Config = rc
	if err := waitReady(rc); err != nil {
		s.Stop()
		t.Fatalf("apiservertest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func waitReady(rc *rest.Config) error {
	c, err := rest.HTTPClientFor(rc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get(rc.Host + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = context.DeadlineExceeded
			}
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop shuts the server down gracefully and waits for it.
func (s *Server) Stop() {
	if s.stopped {
		return
	}
	s.stopped = true
	s.cancel()
	<-s.done
}

// UserConfig returns a rest.Config that authenticates to s as user (a
// client certificate from the server's CA, groups as its organizations):
// what tests of authorization use for identities other than admin.
func (s *Server) UserConfig(t testing.TB, user string, groups ...string) *rest.Config {
	t.Helper()
	certPEM, keyPEM, err := s.Bundle().IssueClient(user, groups)
	if err != nil {
		t.Fatalf("apiservertest: issue a certificate for %s: %v", user, err)
	}
	rc := rest.AnonymousClientConfig(s.Config)
	rc.CertData, rc.KeyData = certPEM, keyPEM
	return rc
}

// Etcd is a standalone etcd for tests of --etcd-servers: an embedded etcd
// outside any API server, serving TLS with client certificates of its own
// CA, as a production etcd would.
type Etcd struct {
	*storage.Embedded
	PKI *pki.EtcdPKI
	dir string
}

// StartEtcd starts an etcd with data and certificates under dir (a fresh
// temporary dir when empty) on addr (127.0.0.1:0 when empty), stopped at
// the end of t.
func StartEtcd(t testing.TB, dir, addr string) *Etcd {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	p, err := pki.EnsureEtcd(filepath.Join(dir, "pki"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := storage.StartEmbedded(context.Background(), storage.EmbeddedConfig{DataDir: dir, ClientAddr: addr, UnsafeNoFsync: true,
		CertFile: p.ServerCertFile, KeyFile: p.ServerKeyFile, TrustedCAFile: p.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return &Etcd{Embedded: e, PKI: p, dir: dir}
}

// Configure points an API server config at e with its client certificate
// (--etcd-servers, --etcd-cafile, --etcd-certfile, --etcd-keyfile).
func (e *Etcd) Configure(c *apiserver.Config) {
	c.EtcdServers = []string{e.ClientURL}
	c.EtcdCAFile, c.EtcdCertFile, c.EtcdKeyFile = e.PKI.CAFile, e.PKI.ClientCertFile, e.PKI.ClientKeyFile
}
