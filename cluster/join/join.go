// Package join is how a machine joins a Waggle cluster with a bootstrap
// token, as kubeadm's token discovery and TLS bootstrap do it: `waggle token
// create` makes a Bootstrap Token Secret (kube-system/bootstrap-token-<id>,
// type bootstrap.kubernetes.io/token, with an expiry) and prints the token
// and the cluster CA's public-key pin; a joining machine fetches the
// kube-public/cluster-info ConfigMap without trusting the server yet, checks
// that its JWS signature (the bootstrapsigner controller's) was made with
// the same token, so the server knows the token, checks the CA against the
// pin, and fetches cluster-info again over TLS verified with that CA
// (kubeadm's own code: k8s.io/kubernetes/cmd/kubeadm/app/discovery/token).
// The kubelet then requests its own certificate with the token (package
// kubelet, TLS bootstrap).
//
// It is not a certificate authority and holds no cluster state.
package join

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	bootstrapsecretutil "k8s.io/cluster-bootstrap/util/secrets"
	kubeadmapi "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm"
	"k8s.io/kubernetes/cmd/kubeadm/app/discovery/token"
	"k8s.io/kubernetes/cmd/kubeadm/app/util/pubkeypin"

	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
)

// NodeGroup is the extra group of node join tokens; the default policy lets
// it create CSRs that are approved automatically (see package
// authz/rbac/bootstrap, BootstrapNodeGroup).
const NodeGroup = "system:bootstrappers:waggle:default-node-token"

// DefaultTTL is a token's default lifetime (kubeadm's).
const DefaultTTL = 24 * time.Hour

// TokenOptions describe a new token.
type TokenOptions struct {
	// Token is <id>.<secret>; empty generates one.
	Token string
	// TTL is the lifetime (0: never expires).
	TTL time.Duration
	// Groups are extra groups (default NodeGroup); each must start with
	// system:bootstrappers:.
	Groups      []string
	Description string
}

// CreateToken creates a bootstrap token Secret usable for authentication
// and for signing cluster-info, and returns the token.
func CreateToken(ctx context.Context, cs kubernetes.Interface, o TokenOptions) (string, error) {
	tok := o.Token
	if tok == "" {
		var err error
		if tok, err = bootstraputil.GenerateBootstrapToken(); err != nil {
			return "", err
		}
	}
	if !bootstraputil.IsValidBootstrapToken(tok) {
		return "", fmt.Errorf("token %q is not of the form [a-z0-9]{6}.[a-z0-9]{16}", tok)
	}
	groups := o.Groups
	if len(groups) == 0 {
		groups = []string{NodeGroup}
	}
	for _, g := range groups {
		if err := bootstraputil.ValidateBootstrapGroupName(g); err != nil {
			return "", err
		}
	}
	if o.TTL < 0 {
		return "", fmt.Errorf("--ttl %v is negative", o.TTL)
	}
	id, secret, _ := strings.Cut(tok, ".")
	data := map[string][]byte{
		bootstrapapi.BootstrapTokenIDKey:               []byte(id),
		bootstrapapi.BootstrapTokenSecretKey:           []byte(secret),
		bootstrapapi.BootstrapTokenUsageAuthentication: []byte("true"),
		bootstrapapi.BootstrapTokenUsageSigningKey:     []byte("true"),
		bootstrapapi.BootstrapTokenExtraGroupsKey:      []byte(strings.Join(groups, ",")),
	}
	if o.Description != "" {
		data[bootstrapapi.BootstrapTokenDescriptionKey] = []byte(o.Description)
	}
	if o.TTL > 0 {
		data[bootstrapapi.BootstrapTokenExpirationKey] = []byte(time.Now().Add(o.TTL).UTC().Format(time.RFC3339))
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: bootstraputil.BootstrapTokenSecretName(id), Namespace: metav1.NamespaceSystem},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		Data:       data,
	}
	if _, err := cs.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create bootstrap token %s: %w", id, err)
	}
	return tok, nil
}

// Token is one bootstrap token as `waggle token list` shows it.
type Token struct {
	ID, Description string
	Expires         time.Time // zero: never
	Groups          []string
	Usages          []string
}

// ListTokens lists the bootstrap tokens of the cluster (not their secrets).
func ListTokens(ctx context.Context, cs kubernetes.Interface) ([]Token, error) {
	list, err := cs.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{FieldSelector: "type=" + string(bootstrapapi.SecretTypeBootstrapToken)})
	if err != nil {
		return nil, fmt.Errorf("list bootstrap tokens: %w", err)
	}
	var out []Token
	for i := range list.Items {
		s := &list.Items[i]
		if s.Type != bootstrapapi.SecretTypeBootstrapToken {
			continue
		}
		t := Token{ID: bootstrapsecretutil.GetData(s, bootstrapapi.BootstrapTokenIDKey), Description: bootstrapsecretutil.GetData(s, bootstrapapi.BootstrapTokenDescriptionKey)}
		if e := bootstrapsecretutil.GetData(s, bootstrapapi.BootstrapTokenExpirationKey); e != "" {
			t.Expires, _ = time.Parse(time.RFC3339, e)
		}
		t.Groups, _ = bootstrapsecretutil.GetGroups(s)
		for k, v := range s.Data {
			if u, ok := strings.CutPrefix(k, bootstrapapi.BootstrapTokenUsagePrefix); ok && string(v) == "true" {
				t.Usages = append(t.Usages, u)
			}
		}
		slices.Sort(t.Usages)
		out = append(out, t)
	}
	return out, nil
}

// DeleteToken deletes the token with id (or a whole <id>.<secret>); a
// missing token is not an error.
func DeleteToken(ctx context.Context, cs kubernetes.Interface, idOrToken string) error {
	id, _, _ := strings.Cut(idOrToken, ".")
	if !bootstraputil.IsValidBootstrapTokenID(id) {
		return fmt.Errorf("%q is not a bootstrap token id ([a-z0-9]{6})", id)
	}
	err := cs.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, bootstraputil.BootstrapTokenSecretName(id), metav1.DeleteOptions{})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("delete bootstrap token %s: %w", id, err)
	}
	return nil
}

// CACertHash returns kubeadm's public-key pin of the first certificate of
// caPEM: sha256:<hex of the SHA-256 of its SubjectPublicKeyInfo>.
func CACertHash(caPEM []byte) (string, error) {
	b, _ := pem.Decode(caPEM)
	if b == nil {
		return "", errors.New("no PEM certificate")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return "", err
	}
	return pubkeypin.Hash(c), nil
}

// Discovered is what discovery learned: a kubeconfig cluster entry that
// trusts the cluster CA.
type Discovered struct {
	Server string
	CAPEM  []byte
}

// Discover runs kubeadm's token discovery against server (https://host:port)
// and returns the CA it validated. caHashes pin the CA (sha256:...); an
// empty list is refused unless unsafeSkipCAVerification.
func Discover(ctx context.Context, server, tok string, caHashes []string, unsafeSkipCAVerification bool, timeout time.Duration) (*Discovered, error) {
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("--server %q: want https://<host>:<port>", server)
	}
	if !bootstraputil.IsValidBootstrapToken(tok) {
		return nil, fmt.Errorf("--token: not a bootstrap token (<6 chars>.<16 chars>, from `waggle token create`)")
	}
	if len(caHashes) == 0 && !unsafeSkipCAVerification {
		return nil, errors.New("give --discovery-token-ca-cert-hash sha256:<hash> (printed by `waggle token create`) to pin the cluster CA, or --discovery-token-unsafe-skip-ca-verification")
	}
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	cfg, err := token.RetrieveValidatedConfigInfo(nil, &kubeadmapi.Discovery{BootstrapToken: &kubeadmapi.BootstrapTokenDiscovery{
		Token: tok, APIServerEndpoint: u.Host, CACertHashes: caHashes, UnsafeSkipCAVerification: unsafeSkipCAVerification,
	}}, timeout)
	if err != nil {
		return nil, fmt.Errorf("discovery through %s: %w", server, err)
	}
	for _, c := range cfg.Clusters {
		if len(c.CertificateAuthorityData) == 0 {
			return nil, errors.New("cluster-info holds no CA")
		}
		// Keep talking to the server the user named (cluster-info's URL is
		// the first server's, which may be gone).
		return &Discovered{Server: server, CAPEM: c.CertificateAuthorityData}, nil
	}
	return nil, errors.New("cluster-info holds no cluster")
}

// WriteKubeconfig writes a kubeconfig for server, trusting caPEM, with a
// bearer token (a bootstrap kubeconfig) — or, with tok empty, none.
func WriteKubeconfig(path, server string, caPEM []byte, tok string) error {
	return writeKubeconfig(path, server, caPEM, "bootstrap", &clientcmdapi.AuthInfo{Token: tok})
}

// writeKubeconfig writes a kubeconfig for server, trusting caPEM, whose
// one user (and context) is name with the credentials auth.
func writeKubeconfig(path, server string, caPEM []byte, name string, auth *clientcmdapi.AuthInfo) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["waggle"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	kc.AuthInfos[name] = auth
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: "waggle", AuthInfo: name}
	kc.CurrentContext = name
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*kc, path)
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// Node is what a machine that joined as a node keeps in its data dir.
type Node struct {
	// CAFile is the cluster CA discovery validated (the kubelet API's
	// client CA too: the API server's kubelet client is signed by it).
	CAFile string
	// BootstrapKubeconfig holds the bootstrap token; the kubelet uses it
	// only when its own certificate is missing or expired.
	BootstrapKubeconfig string
	// Kubeconfig names the node's own client certificate
	// (system:node:<name>), which the kubelet rotates in CertDir.
	Kubeconfig string
	CertDir    string
	// ProxyKubeconfig holds the proxy's client certificate
	// (system:kube-proxy), which the server issued to the join token.
	ProxyKubeconfig string
}

// NodeFiles returns where a node keeps its join files under dataDir.
func NodeFiles(dataDir string) Node {
	return Node{
		CAFile:              filepath.Join(dataDir, "pki", "ca.crt"),
		BootstrapKubeconfig: filepath.Join(dataDir, "bootstrap.kubeconfig"),
		Kubeconfig:          filepath.Join(dataDir, "kubelet.kubeconfig"),
		CertDir:             filepath.Join(dataDir, "pki"),
		ProxyKubeconfig:     filepath.Join(dataDir, "proxy.kubeconfig"),
	}
}

// Joined tells whether dataDir holds a node that joined already: its
// kubeconfigs and CA are there, so it needs no token to run again.
func (n Node) Joined() bool {
	for _, f := range []string{n.CAFile, n.Kubeconfig, n.ProxyKubeconfig} {
		if _, err := os.Stat(f); err != nil {
			return false
		}
	}
	return true
}

// Bootstrap is a node's first join: discovery through server with the
// token (the CA pinned by caHashes), then the CA, a bootstrap kubeconfig
// and the proxy's kubeconfig (a system:kube-proxy certificate the server
// issues to node join tokens) written under dataDir. The kubelet's TLS
// bootstrap, which needs them, comes after.
func Bootstrap(ctx context.Context, dataDir, server, tok string, caHashes []string, unsafeSkipCAVerification bool) (Node, error) {
	n := NodeFiles(dataDir)
	d, err := Discover(ctx, server, tok, caHashes, unsafeSkipCAVerification, 0)
	if err != nil {
		return n, err
	}
	body, err := d.Fetch(ctx, tok, bootstrap.NodeProxyCredentialsURL)
	if err != nil {
		return n, fmt.Errorf("the proxy's certificate: %w", err)
	}
	var creds struct{ CertPEM, KeyPEM []byte } // apiserver.NodeProxyCredentials
	if err := json.Unmarshal(body, &creds); err != nil || len(creds.CertPEM) == 0 || len(creds.KeyPEM) == 0 {
		return n, fmt.Errorf("the proxy's certificate from %s: not a certificate and key (%v)", d.Server, err)
	}
	if err := os.MkdirAll(filepath.Dir(n.CAFile), 0o700); err != nil {
		return n, err
	}
	if err := os.WriteFile(n.CAFile, d.CAPEM, 0o644); err != nil {
		return n, err
	}
	proxy := &clientcmdapi.AuthInfo{ClientCertificateData: creds.CertPEM, ClientKeyData: creds.KeyPEM}
	if err := writeKubeconfig(n.ProxyKubeconfig, d.Server, d.CAPEM, "proxy", proxy); err != nil {
		return n, err
	}
	// (clientcmd writes kubeconfigs 0600: the token and key stay private.)
	return n, WriteKubeconfig(n.BootstrapKubeconfig, d.Server, d.CAPEM, tok)
}

// Fetch GETs path (one of a server's join endpoints) from the server
// discovery validated, authenticated by the bootstrap token.
func (d *Discovered) Fetch(ctx context.Context, tok, path string) ([]byte, error) {
	rc := &rest.Config{Host: d.Server, BearerToken: tok, TLSClientConfig: rest.TLSClientConfig{CAData: d.CAPEM}, Timeout: 30 * time.Second}
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(d.Server, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s from %s: %w", path, d.Server, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s from %s: %s: %s", path, d.Server, resp.Status, strings.TrimSpace(string(b)))
	}
	return b, nil
}
