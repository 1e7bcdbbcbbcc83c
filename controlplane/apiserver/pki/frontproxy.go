package pki

import (
	"crypto/x509"
	"path/filepath"
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
	ca, err := ensureCA(filepath.Join(dir, FrontProxyCACertFile), filepath.Join(dir, FrontProxyCAKeyFile), "front-proxy-ca")
	if err != nil {
		return nil, err
	}
	named := func(c *x509.Certificate) bool { return c.Subject.CommonName == FrontProxyClientName }
	certPEM, keyPEM, err := ca.ensureLeaf(filepath.Join(dir, FrontProxyClientCertFile), filepath.Join(dir, FrontProxyClientKeyFile), named,
		func() ([]byte, []byte, error) { return ca.IssueClient(FrontProxyClientName, nil) })
	if err != nil {
		return nil, err
	}
	return &FrontProxy{CA: ca, ClientCert: certPEM, ClientKey: keyPEM}, nil
}
