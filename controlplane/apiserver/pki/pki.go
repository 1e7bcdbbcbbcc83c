// Package pki holds the API server's certificates: the cluster CA, the
// serving certificate of port 6443, client certificates for the components
// and kubeconfigs that carry them.
//
// On first start Ensure creates an ECDSA P-256 CA and serving certificate
// under the data directory (keys 0600) and later starts load them; Load
// instead takes user-provided files (--tls-cert-file, --tls-private-key-file,
// --client-ca-file), in which case no CA key is known and nothing can be
// issued. It is not a general certificate authority: no revocation, no CSR
// API, no rotation.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// File names under the directory given to Ensure.
const (
	CACertFile     = "ca.crt"
	CAKeyFile      = "ca.key"
	ServerCertFile = "apiserver.crt"
	ServerKeyFile  = "apiserver.key"
)

// Validity of what Ensure and the Issue methods create.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	LeafValidity = 365 * 24 * time.Hour
)

// ErrNoCAKey is returned by the Issue methods when the bundle was loaded from
// user-provided files without the CA's private key.
var ErrNoCAKey = errors.New("no CA private key: certificates can only be issued when the API server generated its own CA (run without --tls-cert-file/--client-ca-file, or issue them with your own CA)")

// DefaultHosts are always in the serving certificate's SANs.
var DefaultHosts = []string{
	"localhost", "127.0.0.1", "::1",
	"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
}

// Bundle is a loaded CA (with or without its key) and serving certificate.
type Bundle struct {
	caCert   *x509.Certificate
	caKey    crypto.Signer // nil when loaded without CA key
	caPEM    []byte
	caPool   *x509.CertPool
	serving  tls.Certificate
	servPEM  []byte
	servHost []string
}

// Ensure loads the CA and serving certificate from dir, creating whichever is
// missing. A serving certificate that lacks one of the requested hosts, or
// expires within 30 days, is reissued from the CA.
func Ensure(dir string, hosts []string) (*Bundle, error) {
	b, err := ensureCA(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile), "waggle-ca")
	if err != nil {
		return nil, err
	}

	want := mergeHosts(hosts)
	certPath, keyPath := filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile)
	if certPEM, err := os.ReadFile(certPath); err == nil {
		keyPEM, err := os.ReadFile(keyPath)
		if err != nil {
			return nil, fmt.Errorf("pki: read serving key: %w", err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("pki: load serving certificate %s: %w", certPath, err)
		}
		leaf, _ := x509.ParseCertificate(pair.Certificate[0])
		if leaf != nil && coversHosts(leaf, want) && time.Until(leaf.NotAfter) > 30*24*time.Hour &&
			leaf.CheckSignatureFrom(b.caCert) == nil {
			pair.Leaf = leaf
			b.serving, b.servPEM, b.servHost = pair, certPEM, want
			return b, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("pki: read serving certificate: %w", err)
	}
	certPEM, keyPEM, err := b.IssueServing(want)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: load issued serving certificate: %w", err)
	}
	pair.Leaf, _ = x509.ParseCertificate(pair.Certificate[0])
	b.serving, b.servPEM, b.servHost = pair, certPEM, want
	return b, nil
}

// LoadCA loads only the CA (certificate and key) from dir, for issuing
// client certificates elsewhere than in the API server (the lab gives each
// node its own). The bundle has no serving certificate.
func LoadCA(dir string) (*Bundle, error) {
	b := &Bundle{}
	if err := b.loadCA(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)); err != nil {
		return nil, err
	}
	if b.caKey == nil {
		return nil, fmt.Errorf("pki: %s: %w", dir, ErrNoCAKey)
	}
	return b, nil
}

// Load builds a bundle from user-provided files: the serving certificate and
// key, and the CA that client certificates must chain to. Without
// clientCAFile no client certificate is requested (CAPool is nil) and only
// bearer tokens can authenticate. Issue methods on the result return
// ErrNoCAKey.
func Load(certFile, keyFile, clientCAFile string) (*Bundle, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("pki: load serving certificate %s / key %s: %w", certFile, keyFile, err)
	}
	pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("pki: parse serving certificate %s: %w", certFile, err)
	}
	servPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("pki: read %s: %w", certFile, err)
	}
	b := &Bundle{serving: pair, servPEM: servPEM, servHost: append(pair.Leaf.DNSNames, ipStrings(pair.Leaf.IPAddresses)...)}
	if clientCAFile == "" {
		// No client certificates: authentication by bearer token only.
		return b, nil
	}
	caPEM, err := os.ReadFile(clientCAFile)
	if err != nil {
		return nil, fmt.Errorf("pki: read client CA %s: %w", clientCAFile, err)
	}
	certs, err := parseCerts(caPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: client CA %s: %w", clientCAFile, err)
	}
	b.caCert, b.caPEM = certs[0], caPEM
	b.caPool = x509.NewCertPool()
	for _, c := range certs {
		b.caPool.AddCert(c)
	}
	return b, nil
}

// ServerTLSConfig is the serving configuration: the serving certificate,
// client certificates verified against the CA when given (not required, so
// that bearer tokens work), TLS 1.2 or newer, h2 and http/1.1.
func (b *Bundle) ServerTLSConfig() (*tls.Config, error) {
	if len(b.serving.Certificate) == 0 {
		return nil, errors.New("pki: bundle has no serving certificate")
	}
	clientAuth := tls.VerifyClientCertIfGiven
	if b.caPool == nil {
		// Never fall back to the system roots for client certificates.
		clientAuth = tls.NoClientCert
	}
	return &tls.Config{
		Certificates: []tls.Certificate{b.serving},
		ClientAuth:   clientAuth,
		ClientCAs:    b.caPool,
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
	}, nil
}

// CAPool holds the CA that signs client certificates (and, for a generated
// bundle, the serving certificate); nil when loaded without a client CA.
func (b *Bundle) CAPool() *x509.CertPool { return b.caPool }

// CAPEM is the CA certificate(s) in PEM, as kubeconfigs embed them.
func (b *Bundle) CAPEM() []byte { return slices.Clone(b.caPEM) }

// ServingCertPEM is the serving certificate in PEM.
func (b *Bundle) ServingCertPEM() []byte { return slices.Clone(b.servPEM) }

// HasCAKey reports whether the bundle can issue certificates.
func (b *Bundle) HasCAKey() bool { return b.caKey != nil }

// IssueClient issues a client certificate: commonName is the user name, orgs
// its groups.
func (b *Bundle) IssueClient(commonName string, orgs []string) (certPEM, keyPEM []byte, err error) {
	if commonName == "" {
		return nil, nil, errors.New("pki: client certificate needs a common name (the user name)")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName, Organization: orgs},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return b.issue(tmpl)
}

// IssueServing issues a serving certificate for hosts (DNS names or IPs), as
// kubelets need for port 10250. The first host is the common name.
func (b *Bundle) IssueServing(hosts []string) (certPEM, keyPEM []byte, err error) {
	if len(hosts) == 0 {
		return nil, nil, errors.New("pki: serving certificate needs at least one host")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
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

// WriteKubeconfig writes, atomically and 0600, a kubeconfig for serverURL
// that authenticates with a fresh client certificate for commonName/orgs and
// trusts the CA.
func (b *Bundle) WriteKubeconfig(path, serverURL, commonName string, orgs []string) error {
	certPEM, keyPEM, err := b.IssueClient(commonName, orgs)
	if err != nil {
		return err
	}
	const name = "waggle"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: serverURL, CertificateAuthorityData: b.CAPEM()}
	cfg.AuthInfos[commonName] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: commonName, Namespace: "default"}
	cfg.CurrentContext = name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("pki: encode kubeconfig: %w", err)
	}
	return writeFileAtomic(path, data, 0o600)
}

func (b *Bundle) issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	if b.caKey == nil {
		return nil, nil, ErrNoCAKey
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-5 * time.Minute)
	tmpl.NotAfter = now.Add(LeafValidity)
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, b.caCert, key.Public(), b.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: sign certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// ensureCA loads the CA at certPath/keyPath, or creates one named
// commonName when there is none (its directory too).
func ensureCA(certPath, keyPath, commonName string) (*Bundle, error) {
	if err := os.MkdirAll(filepath.Dir(certPath), 0o700); err != nil {
		return nil, fmt.Errorf("pki: create %s: %w", filepath.Dir(certPath), err)
	}
	b := &Bundle{}
	switch _, err := os.Stat(certPath); {
	case err == nil:
		if err := b.loadCA(certPath, keyPath); err != nil {
			return nil, err
		}
	case errors.Is(err, os.ErrNotExist):
		if err := b.createNamedCA(certPath, keyPath, commonName); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("pki: stat %s: %w", certPath, err)
	}
	return b, nil
}

func (b *Bundle) createNamedCA(certPath, keyPath, commonName string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return fmt.Errorf("pki: self-sign CA: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("pki: encode CA key: %w", err)
	}
	// Key first: a crash between the two writes leaves no certificate
	// without its key, and the next start recreates both.
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := writeFileAtomic(certPath, caPEM, 0o644); err != nil {
		return err
	}
	cert, _ := x509.ParseCertificate(der)
	b.setCA(cert, key, caPEM)
	return nil
}

func (b *Bundle) loadCA(certPath, keyPath string) error {
	caPEM, err := os.ReadFile(certPath)
	if err != nil {
		return fmt.Errorf("pki: read CA: %w", err)
	}
	certs, err := parseCerts(caPEM)
	if err != nil {
		return fmt.Errorf("pki: CA %s: %w", certPath, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return fmt.Errorf("pki: read CA key (the CA certificate exists, its key must too): %w", err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return fmt.Errorf("pki: CA key %s: %w", keyPath, err)
	}
	if !publicKeysEqual(certs[0].PublicKey, key.Public()) {
		return fmt.Errorf("pki: CA key %s does not match certificate %s", keyPath, certPath)
	}
	b.setCA(certs[0], key, caPEM)
	return nil
}

func (b *Bundle) setCA(cert *x509.Certificate, key crypto.Signer, caPEM []byte) {
	b.caCert, b.caKey, b.caPEM = cert, key, caPEM
	b.caPool = x509.NewCertPool()
	b.caPool.AddCert(cert)
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block found")
	}
	return out, nil
}

func parseKey(data []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(data)
	if blk == nil {
		return nil, errors.New("no PEM block found")
	}
	switch blk.Type {
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(blk.Bytes)
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, err
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("unsupported key type %T", k)
		}
		return s, nil
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(blk.Bytes)
	}
	return nil, fmt.Errorf("unsupported PEM block %q", blk.Type)
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ae, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ae.Equal(b)
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

func mergeHosts(hosts []string) []string {
	out := []string{}
	for _, h := range append(slices.Clone(hosts), DefaultHosts...) {
		if h != "" && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

func coversHosts(c *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
				return false
			}
		} else if !slices.Contains(c.DNSNames, h) {
			return false
		}
	}
	return true
}

func ipStrings(ips []net.IP) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}

// writeFileAtomic writes data to a temporary file beside path, syncs it and
// renames it over path, so readers see the old or the new file, never a
// partial one.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("pki: chmod %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("pki: sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("pki: close %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("pki: rename into %s: %w", path, err)
	}
	return nil
}
