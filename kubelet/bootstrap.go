package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
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
// Left out for now: rotating the client certificate before it expires
// (upstream's certificate manager); a node whose certificate expired
// bootstraps again if its bootstrap token is still valid.
func tlsBootstrap(ctx context.Context, cfg *Config) error {
	if cfg.Kubeconfig == "" {
		return fmt.Errorf("%w: --bootstrap-kubeconfig needs --kubeconfig (where the kubeconfig with the issued certificate is written)", ErrInvalidConfig)
	}
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
		return fmt.Errorf("kubelet certificate dir: %w", err)
	}
	if cfg.Log != nil {
		cfg.Log.Info("TLS bootstrap: ensuring a client certificate", "node", name, "kubeconfig", cfg.Kubeconfig, "certDir", certDir)
	}
	if err := bootstrap.LoadClientCert(ctx, cfg.Kubeconfig, cfg.BootstrapKubeconfig, certDir, types.NodeName(name)); err != nil {
		return fmt.Errorf("TLS bootstrap of node %s (CSR via %s): %w", name, cfg.BootstrapKubeconfig, err)
	}
	return nil
}

// TLSBootstrap runs the TLS bootstrap of cfg (cfg.BootstrapKubeconfig must
// be set) and returns once cfg.Kubeconfig holds a valid client certificate;
// Run does it first.
func TLSBootstrap(ctx context.Context, cfg Config) error { return tlsBootstrap(ctx, &cfg) }
