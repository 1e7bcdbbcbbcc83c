package kubelet

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	kubeletcertificate "k8s.io/kubernetes/pkg/kubelet/certificate"
	"k8s.io/kubernetes/pkg/kubelet/certificate/bootstrap"
)

// tlsBootstrap is the kubelet's TLS bootstrap, upstream's own
// (k8s.io/kubernetes/pkg/kubelet/certificate/bootstrap, as kubelet
// --bootstrap-kubeconfig): while cfg.Kubeconfig holds no valid client
// certificate, it generates a key under the certificate dir, creates a
// CertificateSigningRequest for system:node:<name> in system:nodes (signer
// kubernetes.io/kube-apiserver-client-kubelet) with the bootstrap
// kubeconfig's credentials (a bootstrap token), waits for the
// controller-manager to approve and sign it, and writes cfg.Kubeconfig
// pointing at the issued certificate (<cert-dir>/kubelet-client-current.pem).
// A kubelet restarted with a still valid certificate skips all of it.
//
// The certificate is then rotated by rotatingClientConfig (on by default
// with a bootstrap kubeconfig, --rotate-certificates); a node whose
// certificate expired anyway bootstraps again if its bootstrap token is
// still valid.
func tlsBootstrap(ctx context.Context, cfg *Config) error {
	if cfg.Kubeconfig == "" {
		return fmt.Errorf("%w: --bootstrap-kubeconfig needs --kubeconfig (where the kubeconfig with the issued certificate is written)", ErrInvalidConfig)
	}
	name, certDir, err := clientCertDir(cfg)
	if err != nil {
		return err
	}
	if cfg.Log != nil {
		cfg.Log.Info("TLS bootstrap: ensuring a client certificate", "node", name, "kubeconfig", cfg.Kubeconfig, "certDir", certDir)
	}
	if err := bootstrap.LoadClientCert(ctx, cfg.Kubeconfig, cfg.BootstrapKubeconfig, certDir, types.NodeName(name)); err != nil {
		return fmt.Errorf("TLS bootstrap of node %s (CSR via %s): %w", name, cfg.BootstrapKubeconfig, err)
	}
	return nil
}

// clientCertDir returns the node's name and its client certificate dir
// (--cert-dir, default <root-dir>/pki), created if missing.
func clientCertDir(cfg *Config) (string, string, error) {
	name := cfg.NodeName
	if name == "" {
		name, _ = os.Hostname()
	}
	certDir := cfg.CertDir
	if certDir == "" {
		root := cfg.RootDir
		if root == "" {
			root = filepath.Join("/var/lib/waggle/kubelet", name)
		}
		certDir = filepath.Join(root, "pki")
	}
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return "", "", fmt.Errorf("kubelet certificate dir: %w", err)
	}
	return name, certDir, nil
}

// rotatingClientConfig is kubelet --rotate-certificates, wired as upstream's
// kubelet wires it (buildKubeletClientConfig): a client certificate
// manager (k8s.io/kubernetes/pkg/kubelet/certificate's
// NewKubeletClientCertificateManager over client-go's util/certificate)
// starts from the certificate cfg.Kubeconfig names (or the cert dir's
// kubelet-client-current.pem) and, at a random 70–90 % of its lifetime,
// creates a new CSR for system:node:<name> (signer
// kubernetes.io/kube-apiserver-client-kubelet) with the current
// certificate, which the controller-manager's csrapproving controller
// approves (selfnodeclient) and csrsigning signs; the new pair is written
// to <cert-dir>/kubelet-client-<timestamp>.pem and kubelet-client-current.pem
// points at it, so cfg.Kubeconfig (which names that file after a TLS
// bootstrap) stays valid across restarts. The returned config's transport
// (UpdateTransport) presents the manager's current certificate and closes
// every open connection when it changes, so the kubelet's watches and
// requests carry on with the new certificate without a restart. As
// upstream, the process exits when the certificate has expired (or is gone)
// for five minutes while the API server answers, so a supervisor or the
// bootstrap credentials can start it afresh.
//
// Left out: upstream's certificate_manager_client_ttl_seconds gauge and
// closing the connections after a failed node status update.
func rotatingClientConfig(ctx context.Context, cfg *Config) (*rest.Config, error) {
	name, certDir, err := clientCertDir(cfg)
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	if cfg.Log != nil {
		logger = logr.FromSlogHandler(cfg.Log.Handler())
	}
	certConfig, clientConfig, err := bootstrap.LoadClientConfig(logger, cfg.Kubeconfig, cfg.BootstrapKubeconfig, certDir)
	if err != nil {
		return nil, fmt.Errorf("client certificate rotation: %w", err)
	}
	newClientset := func(current *tls.Certificate) (kubernetes.Interface, error) {
		// With a valid certificate the node renews as itself; without one
		// it asks with the bootstrap credentials, as upstream.
		c := certConfig
		if current != nil {
			c = clientConfig
		}
		return kubernetes.NewForConfig(c)
	}
	m, err := kubeletcertificate.NewKubeletClientCertificateManager(certDir, types.NodeName(name),
		clientConfig.CertData, clientConfig.KeyData, clientConfig.CertFile, clientConfig.KeyFile, newClientset)
	if err != nil {
		return nil, fmt.Errorf("client certificate rotation: %w", err)
	}
	// The rotating transport presents the manager's certificate instead of
	// the kubeconfig's files.
	transportConfig := rest.AnonymousClientConfig(clientConfig)
	if _, err := kubeletcertificate.UpdateTransport(logger, ctx.Done(), transportConfig, m, 5*time.Minute); err != nil {
		return nil, fmt.Errorf("client certificate rotation: %w", err)
	}
	m.Start()
	go func() { <-ctx.Done(); m.Stop() }()
	if cfg.Log != nil {
		cfg.Log.Info("client certificate rotation on", "node", name, "certDir", certDir)
	}
	return transportConfig, nil
}

// TLSBootstrap runs the TLS bootstrap of cfg (cfg.BootstrapKubeconfig must
// be set) and returns once cfg.Kubeconfig holds a valid client certificate;
// Run does it first.
func TLSBootstrap(ctx context.Context, cfg Config) error { return tlsBootstrap(ctx, &cfg) }
