package apiserver

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"

	"github.com/go-chi/chi/v5"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
)

// ControlPlaneBootstrapPath is where a server joining an HA control plane
// (`waggle up --server ... --token ...`) fetches what every server of the
// cluster must share, as k3s's /v1-k3s/server-bootstrap and kubeadm's
// uploaded control-plane certificates: the cluster CA and its key (serving
// certificates, kubeconfigs and CSR signing), the etcd CA and its key (the
// joiner issues its own etcd peer, server and client certificates), and the
// service-account key pair (a token one server issued verifies on every
// other), plus the current etcd members, for the joiner to add itself.
//
// Only a user RBAC allows `get` on this non-resource URL may read it: the
// default policy grants it to system:masters (as every URL) and to bootstrap
// tokens in the group system:bootstrappers:waggle:server-token (`waggle
// token create --server`), never to node join tokens.
const ControlPlaneBootstrapPath = "/waggle/v1/control-plane-bootstrap"

// ControlPlaneBootstrap is the document served there.
type ControlPlaneBootstrap struct {
	// Files maps a path under <data-dir>/pki to its contents.
	Files map[string][]byte `json:"files"`
	// EtcdMembers are the embedded etcd cluster's members (empty with an
	// external etcd).
	EtcdMembers []EtcdMember `json:"etcdMembers,omitempty"`
	// EtcdServers are the external etcd client URLs this server uses
	// (empty with the embedded etcd).
	EtcdServers []string `json:"etcdServers,omitempty"`
}

// EtcdMember is one member of the embedded etcd cluster.
type EtcdMember struct {
	Name       string   `json:"name"`
	ID         uint64   `json:"id"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner,omitempty"`
}

// SharedPKIFiles are the files under <data-dir>/pki every server of one
// cluster holds the same (each server's own serving and client certificates
// are issued from them locally).
var SharedPKIFiles = []string{
	"ca.crt", "ca.key",
	"sa.key", "sa.pub",
	"etcd/ca.crt", "etcd/ca.key",
	"front-proxy-ca.crt", "front-proxy-ca.key",
}

func (s *Server) serveControlPlaneBootstrap(w http.ResponseWriter, r *http.Request) {
	doc := ControlPlaneBootstrap{Files: map[string][]byte{}, EtcdServers: s.cfg.EtcdServers}
	dir := filepath.Join(s.cfg.DataDir, "pki")
	for _, f := range SharedPKIFiles {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			writeStatus(w, apierrors.NewInternalError(err), notFoundGR, "")
			return
		}
		doc.Files[f] = b
	}
	if _, ok := doc.Files["ca.key"]; !ok {
		writeStatus(w, apierrors.NewServiceUnavailable("this server was started with a user-provided CA (no ca.key): servers cannot join through it; give each server the same certificates instead"), notFoundGR, "")
		return
	}
	members, err := s.store.Members(r.Context())
	if err != nil {
		writeStatus(w, apierrors.NewServiceUnavailable("etcd members: "+err.Error()), notFoundGR, "")
		return
	}
	for _, m := range members {
		doc.EtcdMembers = append(doc.EtcdMembers, EtcdMember{Name: m.Name, ID: m.ID, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(doc)
}

// NodeProxyCredentialsPath is where a machine joining as a node (`waggle
// join`, with a node join token) gets its proxy's credentials, as k3s's
// agent gets its kube-proxy client certificate with its token: a fresh key
// pair and a client certificate for system:kube-proxy from the cluster CA.
// The node's proxy and cluster DNS server run under that identity
// (system:node-proxier, waggle:proxy), since the node's own identity is
// kept by the Node authorizer to its own pods. Only a user RBAC allows
// `get` on this URL may read it: system:masters and node join tokens
// (system:bootstrappers:waggle:default-node-token).
const NodeProxyCredentialsPath = bootstrap.NodeProxyCredentialsURL

// NodeProxyCredentials is the document served there.
type NodeProxyCredentials struct {
	CertPEM []byte `json:"certPEM"`
	KeyPEM  []byte `json:"keyPEM"`
}

func (s *Server) serveNodeProxyCredentials(w http.ResponseWriter, r *http.Request) {
	if s.bundle == nil || !s.bundle.HasCAKey() {
		writeStatus(w, apierrors.NewServiceUnavailable("this server was started with a user-provided CA (no CA key): it cannot issue the proxy's certificate of a joining node"), notFoundGR, "")
		return
	}
	cert, key, err := s.bundle.IssueClient(bootstrap.ProxyUser, nil)
	if err != nil {
		writeStatus(w, apierrors.NewInternalError(err), notFoundGR, "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(NodeProxyCredentials{CertPEM: cert, KeyPEM: key})
}

// EtcdMembersPath/<name>: DELETE removes that server's member from the
// embedded etcd cluster (`waggle server remove <name>`); allowed to
// whoever RBAC grants `delete` on the URL (cluster-admin).
const EtcdMembersPath = "/waggle/v1/etcd-members"

func (s *Server) removeEtcdMember(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	if len(s.cfg.EtcdServers) > 0 {
		writeStatus(w, apierrors.NewBadRequest("this server uses an external etcd (--etcd-servers): manage its members with etcdctl"), notFoundGR, "")
		return
	}
	if err := s.store.RemoveMember(r.Context(), name); err != nil {
		writeStatus(w, apierrors.NewInternalError(err), notFoundGR, "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"removed": name})
}
