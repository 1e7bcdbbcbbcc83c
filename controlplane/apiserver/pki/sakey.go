package pki

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// File names of the service-account signing key pair under the directory
// given to EnsureServiceAccountKey (kubeadm's names).
const (
	ServiceAccountKeyFile = "sa.key"
	ServiceAccountPubFile = "sa.pub"
)

// EnsureServiceAccountKey returns the paths of the key pair that signs
// service-account tokens in dir (sa.key, 0600, and sa.pub), creating an
// RSA 2048 pair on first use as kubeadm does (RS256 is what every OIDC
// relying party verifies). An existing pair is kept: tokens already issued
// stay valid across restarts. A sa.key without sa.pub gets its sa.pub back.
func EnsureServiceAccountKey(dir string) (keyPath, pubPath string, err error) {
	keyPath, pubPath = filepath.Join(dir, ServiceAccountKeyFile), filepath.Join(dir, ServiceAccountPubFile)
	keyPEM, err := os.ReadFile(keyPath)
	switch {
	case err == nil:
		k, perr := parseKey(keyPEM)
		if perr != nil {
			return "", "", fmt.Errorf("pki: service-account key %s: %w", keyPath, perr)
		}
		if _, serr := os.Stat(pubPath); serr == nil {
			return keyPath, pubPath, nil
		}
		pubDER, merr := x509.MarshalPKIXPublicKey(k.Public())
		if merr != nil {
			return "", "", fmt.Errorf("pki: service-account public key: %w", merr)
		}
		return keyPath, pubPath, writeFileAtomic(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
	case !errors.Is(err, os.ErrNotExist):
		return "", "", fmt.Errorf("pki: read service-account key: %w", err)
	}
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", fmt.Errorf("pki: generate service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("pki: service-account public key: %w", err)
	}
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), 0o600); err != nil {
		return "", "", err
	}
	if err := writeFileAtomic(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return "", "", err
	}
	return keyPath, pubPath, nil
}
