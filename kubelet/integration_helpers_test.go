package kubelet_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/namespaces"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/waggle-io/waggle/kubelet"
	"github.com/waggle-io/waggle/kubelet/internal/ktest"
)

type certKeyPEM struct{ cert, key []byte }

func pemCert(c tls.Certificate) certKeyPEM {
	var out certKeyPEM
	for _, der := range c.Certificate {
		out.cert = append(out.cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		panic(err)
	}
	out.key = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})
	return out
}

func urlQuery(s string) string { return url.QueryEscape(s) }

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

func newLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

var tlsConfigNoCert = tls.Config{InsecureSkipVerify: true}

func mustAddr(t interface{ Fatalf(string, ...any) }, s string) netip.Addr {
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("address %q: %v", s, err)
	}
	return a
}

// KubeletConfig is kubelet.Config, for option funcs.
type KubeletConfig = kubelet.Config

func namespacesCtx(n *node) context.Context {
	return namespaces.WithNamespace(context.Background(), n.cfg.ContainerdNamespace)
}

func intOrStr(i int) intstr.IntOrString { return intstr.FromInt(i) }

func cgroupMounts() []string {
	b, _ := os.ReadFile("/proc/self/mounts")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && (f[2] == "cgroup" || f[2] == "cgroup2") {
			out = append(out, f[1])
		}
	}
	return out
}

// removeTree removes an empty cgroup tree, children first.
func removeTree(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() {
			removeTree(filepath.Join(dir, e.Name()))
		}
	}
	os.Remove(dir)
}

func TestMain(m *testing.M) {
	ktest.RunLoggerIfAsked()
	code := m.Run()
	if cniDir != "" {
		os.RemoveAll(cniDir)
	}
	if loggerPath != "" {
		os.RemoveAll(filepath.Dir(loggerPath))
	}
	os.Exit(code)
}
