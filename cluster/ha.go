package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/waggle-io/waggle/cluster/join"
	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/storage"
)

// An HA control plane, as k3s builds one: `waggle up --cluster-init` starts
// the first server with an embedded etcd member that listens for peers and
// clients on the advertise address; `waggle up --server https://<any
// server>:6443 --token <t> --discovery-token-ca-cert-hash sha256:<h>` starts
// a further server: it discovers and pins the cluster CA (kubeadm's token
// discovery), fetches the certificates every server shares (the cluster CA,
// the etcd CA, the service-account keys) from apiserver.
// ControlPlaneBootstrapPath with its token, issues its own certificates from
// them, and adds its etcd member to the cluster as a learner through the
// existing members' client URLs, promoted once it caught up. With
// --etcd-servers every server uses that external cluster instead (joining
// servers still fetch the shared certificates). Each server runs its own
// API server on its own member, and a scheduler and controller-manager that
// stand by unless they hold their Lease.

// controlPlaneMember prepares the HA part of cfg before the API server
// starts: the shared certificates of a joining server, and the etcd member
// to run (nil: a single member on loopback, or an external etcd).
func controlPlaneMember(ctx context.Context, cfg *Config, log *slog.Logger) (*storage.MemberConfig, error) {
	ha := cfg.ClusterInit || cfg.Server != ""
	if !ha {
		return nil, nil
	}
	if cfg.ClusterInit && cfg.Server != "" {
		return nil, errors.New("--cluster-init starts a new cluster; --server joins an existing one: give one of them")
	}
	host := cfg.AdvertiseAddress
	if net.ParseIP(host) == nil {
		return nil, fmt.Errorf("an HA server needs --advertise-address: the IP the other servers reach it at (got %q)", host)
	}
	name := cfg.NodeName
	if name == "" {
		name, _ = os.Hostname()
	}
	m := &storage.MemberConfig{Name: name, Host: host, PeerPort: cfg.EtcdPeerPort, ClientPort: cfg.EtcdClientPort}
	if cfg.ClusterInit {
		if len(cfg.EtcdServers) > 0 {
			return nil, nil
		}
		return m, nil
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "etcd", "member", "wal")); err == nil && len(cfg.EtcdServers) == 0 {
		// A restart: the member is in the cluster already and the
		// certificates are here.
		m.Join = &storage.JoinConfig{}
		log.Info("restarting an etcd member of the cluster", "member", name)
		return m, nil
	}
	d, err := join.Discover(ctx, cfg.Server, cfg.Token, cfg.CACertHashes, cfg.UnsafeSkipCAVerification, 2*time.Minute)
	if err != nil {
		return nil, err
	}
	doc, err := fetchControlPlaneBootstrap(ctx, d, cfg.Token)
	if err != nil {
		return nil, err
	}
	pkiDir := filepath.Join(cfg.DataDir, "pki")
	for rel, b := range doc.Files {
		if strings.Contains(rel, "..") || filepath.IsAbs(rel) {
			return nil, fmt.Errorf("control plane bootstrap: bad file name %q", rel)
		}
		p := filepath.Join(pkiDir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, err
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(rel, ".key") {
			mode = 0o600
		}
		if err := os.WriteFile(p, b, mode); err != nil {
			return nil, err
		}
	}
	log.Info("fetched the shared control plane certificates", "server", cfg.Server, "files", len(doc.Files))
	if len(cfg.EtcdServers) > 0 {
		return nil, nil
	}
	var eps []string
	for _, mem := range doc.EtcdMembers {
		if !mem.IsLearner {
			eps = append(eps, mem.ClientURLs...)
		}
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("%s runs no etcd member with a client URL other servers reach: start the first server with --cluster-init", cfg.Server)
	}
	m.Join = &storage.JoinConfig{Endpoints: eps}
	return m, nil
}

func fetchControlPlaneBootstrap(ctx context.Context, d *join.Discovered, token string) (*apiserver.ControlPlaneBootstrap, error) {
	b, err := d.Fetch(ctx, token, apiserver.ControlPlaneBootstrapPath)
	if err != nil {
		return nil, fmt.Errorf("fetch the control plane certificates: %w (a server token from `waggle token create --server` is needed)", err)
	}
	var doc apiserver.ControlPlaneBootstrap
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("control plane bootstrap: %w", err)
	}
	return &doc, nil
}
