package storage

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

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
}

// Embedded is a single-member etcd running inside this process.
type Embedded struct {
	// ClientURL is where clients reach it (http://127.0.0.1:port).
	ClientURL string
	etcd      *embed.Etcd
	// closing silences etcd's log while it shuts down: its listeners
	// report their own closing ("http: Server closed") as errors.
	closing *atomic.Bool
}

// StartEmbedded starts a single-member etcd with data under
// cfg.DataDir/etcd, listening on 127.0.0.1 only, and waits until it serves.
func StartEmbedded(ctx context.Context, cfg EmbeddedConfig) (*Embedded, error) {
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
	cu := url.URL{Scheme: "http", Host: addr}
	pu := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	ec.ListenClientUrls = []url.URL{cu}
	ec.AdvertiseClientUrls = []url.URL{cu}
	ec.ListenPeerUrls = []url.URL{pu}
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
	if err := upgradeFrom35(dir, ec.Name, adv.String(), log); err != nil {
		return nil, err
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", dir, err)
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
	u := "http://" + e.Clients[0].Addr().String()
	if cfg.Log != nil {
		cfg.Log.Info("embedded etcd serving", "url", u, "dir", dir)
	}
	return &Embedded{ClientURL: u, etcd: e, closing: closing}, nil
}

// Close stops the embedded etcd and waits for it.
func (e *Embedded) Close() {
	e.closing.Store(true)
	e.etcd.Close()
}
