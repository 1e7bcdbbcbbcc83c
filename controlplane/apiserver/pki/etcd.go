package pki

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// The embedded etcd's PKI, in kubeadm's layout under the PKI directory: its
// own CA (etcd trusts no certificate of the cluster CA, so a kubelet's or a
// user's certificate cannot open etcd), etcd's serving certificate, and the
// API server's client certificate.
const (
	EtcdCACertFile     = "etcd/ca.crt"
	EtcdCAKeyFile      = "etcd/ca.key"
	EtcdServerCertFile = "etcd/server.crt"
	EtcdServerKeyFile  = "etcd/server.key"
	EtcdClientCertFile = "apiserver-etcd-client.crt"
	EtcdClientKeyFile  = "apiserver-etcd-client.key"
	// EtcdClientUser is the API server's identity towards etcd.
	EtcdClientUser = "kube-apiserver-etcd-client"
)

// EtcdPKI is the embedded etcd's CA and the paths of its files.
type EtcdPKI struct {
	// CA issues the etcd certificates (peer certificates too: a member
	// joining a cluster gets one from the same CA).
	CA *Bundle
	// Absolute paths of the files EnsureEtcd keeps.
	CAFile, ServerCertFile, ServerKeyFile, ClientCertFile, ClientKeyFile string
}

// EnsureEtcd loads or creates, under dir (the PKI directory), the etcd CA,
// etcd's serving certificate (server and client auth, for localhost,
// 127.0.0.1, ::1 and hosts) and the API server's etcd client certificate
// (kube-apiserver-etcd-client). A leaf that is missing, not signed by the
// CA, expiring within 30 days or (serving) missing a host is reissued.
func EnsureEtcd(dir string, hosts []string) (*EtcdPKI, error) {
	p := &EtcdPKI{
		CAFile:         filepath.Join(dir, EtcdCACertFile),
		ServerCertFile: filepath.Join(dir, EtcdServerCertFile),
		ServerKeyFile:  filepath.Join(dir, EtcdServerKeyFile),
		ClientCertFile: filepath.Join(dir, EtcdClientCertFile),
		ClientKeyFile:  filepath.Join(dir, EtcdClientKeyFile),
	}
	ca, err := ensureCA(p.CAFile, filepath.Join(dir, EtcdCAKeyFile), "etcd-ca")
	if err != nil {
		return nil, err
	}
	p.CA = ca
	serverHosts := []string{"localhost", "127.0.0.1", "::1"}
	for _, h := range hosts {
		if h != "" && !slices.Contains(serverHosts, h) {
			serverHosts = append(serverHosts, h)
		}
	}
	covers := func(c *x509.Certificate) bool { return coversHosts(c, serverHosts) }
	if _, _, err := ca.ensureLeaf(p.ServerCertFile, p.ServerKeyFile, covers, func() ([]byte, []byte, error) {
		return ca.IssueEtcdMember("etcd-server", serverHosts)
	}); err != nil {
		return nil, err
	}
	if _, _, err := ca.ensureLeaf(p.ClientCertFile, p.ClientKeyFile, nil, func() ([]byte, []byte, error) {
		return ca.IssueClient(EtcdClientUser, nil)
	}); err != nil {
		return nil, err
	}
	return p, nil
}

// IssueEtcdMember issues a certificate an etcd member serves clients (or
// peers) with: server and client auth, for hosts.
func (b *Bundle) IssueEtcdMember(commonName string, hosts []string) (certPEM, keyPEM []byte, err error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return b.issue(tmpl)
}

// ensureLeaf keeps certPath/keyPath when they hold a pair signed by b's CA,
// valid for more than 30 days and passing want (nil: any); otherwise it
// writes what issue returns (key first). It returns the pair in use.
func (b *Bundle) ensureLeaf(certPath, keyPath string, want func(*x509.Certificate) bool, issue func() ([]byte, []byte, error)) (certPEM, keyPEM []byte, err error) {
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	if cerr == nil && kerr == nil {
		if pair, err := tls.X509KeyPair(certPEM, keyPEM); err == nil {
			leaf, _ := x509.ParseCertificate(pair.Certificate[0])
			if leaf != nil && leaf.CheckSignatureFrom(b.caCert) == nil && time.Until(leaf.NotAfter) > 30*24*time.Hour &&
				(want == nil || want(leaf)) {
				return certPEM, keyPEM, nil
			}
		}
	}
	if certPEM, keyPEM, err = issue(); err != nil {
		return nil, nil, err
	}
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}
