package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Front-proxy files under the directory given to EnsureFrontProxy, as
// kubeadm names them: the requestheader CA extension API servers trust for
// X-Remote-User headers, and the client certificate the API server proxies
// to them with.
const (
	FrontProxyCACertFile     = "front-proxy-ca.crt"
	FrontProxyCAKeyFile      = "front-proxy-ca.key"
	FrontProxyClientCertFile = "front-proxy-client.crt"
	FrontProxyClientKeyFile  = "front-proxy-client.key"
	// FrontProxyClientName is the client certificate's common name, the
	// one requestheader-allowed-names lists.
	FrontProxyClientName = "front-proxy-client"
)

// FrontProxy is the aggregation layer's PKI: a CA of its own (never the
// cluster CA, so a front-proxy certificate is no user credential) and the
// client certificate it signs.
type FrontProxy struct {
	CA                    *Bundle
	ClientCert, ClientKey []byte
}

// EnsureFrontProxy loads the front-proxy CA and client certificate from
// dir, creating whichever is missing; a client certificate expiring within
// 30 days, or not signed by the CA, is reissued.
func EnsureFrontProxy(dir string) (*FrontProxy, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: create %s: %w", dir, err)
	}
	caCertPath, caKeyPath := filepath.Join(dir, FrontProxyCACertFile), filepath.Join(dir, FrontProxyCAKeyFile)
	ca := &Bundle{}
	switch _, err := os.Stat(caCertPath); {
	case err == nil:
		if err := ca.loadCA(caCertPath, caKeyPath); err != nil {
			return nil, err
		}
	case errors.Is(err, os.ErrNotExist):
		if err := ca.createCA(caCertPath, caKeyPath); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("pki: stat %s: %w", caCertPath, err)
	}
	fp := &FrontProxy{CA: ca}
	certPath, keyPath := filepath.Join(dir, FrontProxyClientCertFile), filepath.Join(dir, FrontProxyClientKeyFile)
	if certPEM, err := os.ReadFile(certPath); err == nil {
		if keyPEM, err := os.ReadFile(keyPath); err == nil {
			if pair, err := tls.X509KeyPair(certPEM, keyPEM); err == nil {
				leaf, _ := x509.ParseCertificate(pair.Certificate[0])
				if leaf != nil && leaf.Subject.CommonName == FrontProxyClientName && time.Until(leaf.NotAfter) > 30*24*time.Hour &&
					leaf.CheckSignatureFrom(ca.caCert) == nil {
					fp.ClientCert, fp.ClientKey = certPEM, keyPEM
					return fp, nil
				}
			}
		}
	}
	certPEM, keyPEM, err := ca.IssueClient(FrontProxyClientName, nil)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	fp.ClientCert, fp.ClientKey = certPEM, keyPEM
	return fp, nil
}
