package storage

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// EmbeddedConfig configures the embedded etcd.
type EmbeddedConfig struct {
	// DataDir is the parent directory; etcd keeps its data in DataDir/etcd.
	DataDir string
	// ClientAddr is the client listen address, on loopback only
	// ("127.0.0.1:0", the default, picks a free port).
	ClientAddr    string
	UnsafeNoFsync bool
	Log           *slog.Logger
	// CertFile and KeyFile are etcd's serving certificate (its client and
	// peer listeners); TrustedCAFile the CA whose client certificates it
	// accepts. All three are required: the embedded etcd serves clients only
	// over TLS with client-certificate authentication, so no local process
	// without a certificate of that CA can read or write it.
	CertFile, KeyFile, TrustedCAFile string
	// ClientTLS is the etcd client TLS (a client certificate of the etcd
	// CA) a joining Member uses to add and promote itself.
	ClientTLS *tls.Config
	// Member, when set, makes this etcd a member of a cluster of several
	// (an HA control plane) instead of a single member on loopback.
	Member *MemberConfig
}

// MemberConfig is one member of a multi-member embedded etcd cluster, as
// k3s's servers run one each: the member serves its peers on
// https://Host:PeerPort and clients (the local API server on loopback,
// joining servers on Host) on https://Host:ClientPort, all with
// certificates of the cluster's etcd CA (peer TLS with client-certificate
// authentication both ways).
type MemberConfig struct {
	// Name is the member's name (the server's name; unique in the
	// cluster).
	Name string
	// Host is the address peers and clients reach this member at; the
	// serving certificate must name it.
	Host string
	// PeerPort and ClientPort default to etcd's 2380 and 2379.
	PeerPort, ClientPort int
	// Join, when set, adds this member to the existing cluster its
	// endpoints belong to (as a learner first, promoted to a voting member
	// once it caught up, as etcd recommends), unless its data dir already
	// holds a member (a restart). Nil starts a new cluster of one
	// (--cluster-init).
	Join *JoinConfig
}

// PeerURL is the member's advertised peer URL.
func (m *MemberConfig) PeerURL() string {
	return "https://" + net.JoinHostPort(m.Host, strconv.Itoa(m.peerPort()))
}

// ClientURL is the member's advertised client URL.
func (m *MemberConfig) ClientURL() string {
	return "https://" + net.JoinHostPort(m.Host, strconv.Itoa(m.clientPort()))
}

func (m *MemberConfig) peerPort() int {
	if m.PeerPort == 0 {
		return 2380
	}
	return m.PeerPort
}

func (m *MemberConfig) clientPort() int {
	if m.ClientPort == 0 {
		return 2379
	}
	return m.ClientPort
}

// Embedded is a single-member etcd running inside this process.
type Embedded struct {
	// ClientURL is where clients reach it (https://127.0.0.1:port).
	ClientURL string
	// LocalURL is the unix socket (unix:///path) that this process's own
	// client uses: plain gRPC served by grpc-go's server, without TLS. The
	// socket is in a directory of mode 0700 (the data dir, or a private
	// temporary dir when that path is too long for a socket) and is itself
	// 0600, so only this user (and root, who can read the data dir anyway)
	// can connect; every TCP listener keeps TLS with client certificates.
	LocalURL string
	// sockDir is a private temporary dir holding the socket, removed on
	// Close ("" when the socket is in the data dir).
	sockDir string
	etcd    *embed.Etcd
	// closing silences etcd's log while it shuts down: its listeners
	// report their own closing ("http: Server closed") as errors.
	closing *atomic.Bool
	once    sync.Once
}

// StartEmbedded starts a single-member etcd with data under
// cfg.DataDir/etcd, listening on 127.0.0.1 only, and waits until it serves.
func StartEmbedded(ctx context.Context, cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.CertFile == "" || cfg.KeyFile == "" || cfg.TrustedCAFile == "" {
		return nil, errors.New("embedded etcd: a serving certificate, key and client CA are required (it serves clients only over TLS with client certificates)")
	}
	dir := filepath.Join(cfg.DataDir, "etcd")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd data dir: %w", err)
	}
	addr := cfg.ClientAddr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ec := embed.NewConfig()
	ec.Name = "waggle"
	ec.Dir = dir
	ec.Logger = "zap"
	ec.LogLevel = "warn"
	ec.LogOutputs = []string{"stderr"}
	closing := new(atomic.Bool)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdLogger(cfg.Log, "etcd", zapcore.WarnLevel).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return silenced{Core: c, off: closing}
	})))
	cu := url.URL{Scheme: "https", Host: addr}
	// The in-process client's socket. A unix listener is served by etcd's
	// cmux straight to grpc-go's server, where the TLS listener goes
	// through net/http's HTTP/2 server and TLS: about 0.2 ms less CPU per
	// write (see controlplane/apiserver/README.md).
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd data dir: %w", err)
	}
	sock, sockDir, err := localSocketPath(dir)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			removeSockDir(sockDir)
		}
	}()
	lu := url.URL{Scheme: "unix", Path: sock}
	pu := url.URL{Scheme: "https", Host: "127.0.0.1:0"}
	// Clients and the (idle, single-member) peer listener both need a
	// certificate of TrustedCAFile.
	tlsInfo := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.TrustedCAFile, ClientCertAuth: true}
	ec.ClientTLSInfo = tlsInfo
	ec.PeerTLSInfo = tlsInfo
	ec.ListenClientUrls = []url.URL{lu, cu}
	ec.AdvertiseClientUrls = []url.URL{cu}
	ec.ListenPeerUrls = []url.URL{pu}
	// The advertised peer URL is only the member's recorded name in a
	// single-member cluster (nothing dials it); it stays what earlier data
	// dirs recorded.
	adv := url.URL{Scheme: "http", Host: "127.0.0.1:2380"}
	ec.AdvertisePeerUrls = []url.URL{adv}
	ec.InitialCluster = ec.Name + "=" + adv.String()
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	// Keep five minutes of history, as kube-apiserver's compactor does.
	ec.AutoCompactionMode = embed.CompactorModePeriodic
	ec.AutoCompactionRetention = "5m"
	ec.QuotaBackendBytes = 8 << 30
	ec.MaxRequestBytes = 2 << 20
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var promoteDone chan error
	if m := cfg.Member; m != nil {
		if m.Name == "" || net.ParseIP(m.Host) == nil {
			return nil, fmt.Errorf("embedded etcd member: name %q and host IP %q are required", m.Name, m.Host)
		}
		ec.Name = m.Name
		pu := url.URL{Scheme: "https", Host: net.JoinHostPort(m.Host, strconv.Itoa(m.peerPort()))}
		ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
		mc := url.URL{Scheme: "https", Host: net.JoinHostPort(m.Host, strconv.Itoa(m.clientPort()))}
		// The local API server's socket, loopback (for local tools), and
		// Host for the other servers.
		ec.ListenClientUrls = []url.URL{lu, cu, mc}
		ec.AdvertiseClientUrls = []url.URL{mc}
		ec.InitialCluster = ec.Name + "=" + pu.String()
		// Raft timing as etcd's defaults (100 ms heartbeat, 1 s election):
		// a killed leader is replaced within about a second.
		_, statErr := os.Stat(filepath.Join(dir, "member", "wal"))
		hasData := statErr == nil
		if m.Join != nil && !hasData {
			if cfg.ClientTLS == nil {
				return nil, errors.New("embedded etcd member: joining needs the etcd client TLS (an etcd client certificate)")
			}
			j := *m.Join
			j.TLS = cfg.ClientTLS
			initial, err := addLearner(ctx, &j, m.Name, pu.String(), time.Minute)
			if err != nil {
				return nil, err
			}
			ec.InitialCluster = initial
			ec.ClusterState = embed.ClusterStateFlagExisting
			promoteDone = make(chan error, 1)
			m.Join = &j
		}
		adv = pu
	}
	if err := upgradeFrom35(dir, ec.Name, adv.String(), log); err != nil {
		return nil, err
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", dir, err)
	}
	// Owner only, beside the 0700 directory.
	if err := os.Chmod(sock, 0o600); err != nil {
		e.Close()
		return nil, fmt.Errorf("embedded etcd socket: %w", err)
	}
	if promoteDone != nil {
		// A learner serves no client requests: promote it (through the
		// other members) before anyone uses it.
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		go func() { defer cancel(); promoteDone <- promote(pctx, cfg.Member.Join, cfg.Member.Name, 10*time.Second) }()
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: not ready after 60s", dir)
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
	if promoteDone != nil {
		if err := <-promoteDone; err != nil {
			e.Close()
			return nil, err
		}
		log.Info("joined the etcd cluster: learner promoted to voting member", "member", cfg.Member.Name)
	}
	// The loopback TLS listener (e.Clients follows a map's order).
	u := ""
	for _, l := range e.Clients {
		a, ok := l.Addr().(*net.TCPAddr)
		if ok && a.IP.IsLoopback() && (cfg.Member == nil || a.String() != net.JoinHostPort(cfg.Member.Host, strconv.Itoa(cfg.Member.clientPort()))) {
			u = "https://" + a.String()
			break
		}
	}
	if u == "" {
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: no loopback client listener", dir)
	}
	if cfg.Log != nil {
		cfg.Log.Info("embedded etcd serving", "url", u, "local", lu.String(), "dir", dir)
	}
	started = true
	return &Embedded{ClientURL: u, LocalURL: lu.String(), sockDir: sockDir, etcd: e, closing: closing}, nil
}

// maxSocketPath is the longest unix socket path that every platform's
// sockaddr_un holds (104 bytes on the BSDs, 108 on Linux, with the NUL).
const maxSocketPath = 103

// localSocketPath is where the in-process client's socket goes: in the
// etcd data dir (0700) when the path fits in a socket address, else in a
// fresh private temporary dir (0700, returned to remove on Close).
func localSocketPath(dir string) (sock, tmp string, err error) {
	abs, err := filepath.Abs(filepath.Join(dir, "grpc.sock"))
	if err != nil {
		return "", "", err
	}
	if len(abs) <= maxSocketPath {
		return abs, "", nil
	}
	tmp, err = os.MkdirTemp("", "waggle-etcd-")
	if err != nil {
		return "", "", fmt.Errorf("embedded etcd socket dir: %w", err)
	}
	return filepath.Join(tmp, "grpc.sock"), tmp, nil
}

func removeSockDir(dir string) {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// Close stops the embedded etcd and waits for it; later calls do nothing.
func (e *Embedded) Close() {
	e.once.Do(func() {
		e.closing.Store(true)
		e.etcd.Close()
		removeSockDir(e.sockDir)
	})
}
