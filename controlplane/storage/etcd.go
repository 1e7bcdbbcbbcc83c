package storage

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apiserver/pkg/storage/value"
)

// DefaultTimeout bounds every storage call that has no tighter deadline.
const DefaultTimeout = 10 * time.Second

// Config selects and tunes the etcd behind a Store.
type Config struct {
	// Servers are external etcd client URLs. Empty means: start an embedded
	// etcd with its data under DataDir, listening on 127.0.0.1 only.
	Servers []string
	// DataDir holds the embedded etcd's data (DataDir/etcd).
	DataDir string
	// Timeout bounds each call (DefaultTimeout when zero).
	Timeout time.Duration
	// UnsafeNoFsync turns off fsync in the embedded etcd (tests only: a
	// crash loses writes).
	UnsafeNoFsync bool
	// CAFile, CertFile and KeyFile authenticate the client to etcd and
	// verify etcd's certificate, as kube-apiserver's --etcd-cafile,
	// --etcd-certfile and --etcd-keyfile (all empty: plain HTTP, only for an
	// external etcd that asks for no certificate).
	CAFile, CertFile, KeyFile string
	// EmbeddedCertFile and EmbeddedKeyFile serve the embedded etcd, which
	// accepts client certificates of CAFile only; required when Servers is
	// empty, with CAFile/CertFile/KeyFile.
	EmbeddedCertFile, EmbeddedKeyFile string
	// Member makes the embedded etcd a member of a multi-member cluster
	// (nil: a single member on loopback).
	Member *MemberConfig
	// Transformer returns the transformer of the values under a key
	// (encryption at rest, k8s.io/apiserver's value transformers, the key as
	// authenticated data as upstream); nil, or a nil result, stores values
	// as they are.
	Transformer func(key string) value.Transformer
	// LeaseReuse is the longest a lease of keys written with a TTL is
	// shared by later writes (kube-apiserver's
	// --lease-reuse-duration-seconds; DefaultLeaseReuse when zero).
	LeaseReuse time.Duration
	// Log receives storage logs; Registerer the etcd latency metrics (both
	// optional).
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Store is the one long-lived etcd client of the API server, with the
// Kubernetes-style operations on top. It is safe for concurrent use.
type Store struct {
	kc        *kubernetes.Client
	transform func(key string) value.Transformer
	timeout   time.Duration
	embedded  *Embedded
	log       *slog.Logger
	latency   *prometheus.HistogramVec
	// leases grants the leases of writes with a TTL (lease.go).
	leases *leaseManager
	// lastProgress is when a progress notification was last asked for
	// (unix nanoseconds).
	lastProgress atomic.Int64
}

// Open connects to the configured etcd, starting the embedded one first when
// no servers are given.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	s := &Store{timeout: timeout, log: log, transform: cfg.Transformer}
	endpoints := cfg.Servers
	tlsCfg, err := ClientTLS(cfg.CAFile, cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	if len(endpoints) == 0 {
		if cfg.DataDir == "" {
			return nil, errors.New("storage: either etcd servers or a data dir for the embedded etcd is needed")
		}
		if cfg.CertFile == "" || cfg.KeyFile == "" || cfg.CAFile == "" {
			return nil, errors.New("storage: the embedded etcd needs a client certificate, key and CA (it serves only over TLS with client certificates)")
		}
		e, err := StartEmbedded(ctx, EmbeddedConfig{DataDir: cfg.DataDir, UnsafeNoFsync: cfg.UnsafeNoFsync, Log: log,
			CertFile: cfg.EmbeddedCertFile, KeyFile: cfg.EmbeddedKeyFile, TrustedCAFile: cfg.CAFile,
			Member: cfg.Member, ClientTLS: tlsCfg})
		if err != nil {
			return nil, err
		}
		s.embedded = e
		// This process's own socket: no TLS (the socket is owner-only).
		endpoints, tlsCfg = []string{e.LocalURL}, nil
	}
	kc, err := kubernetes.New(clientv3.Config{
		Endpoints:          endpoints,
		TLS:                tlsCfg,
		DialTimeout:        timeout,
		MaxCallSendMsgSize: 8 << 20,
		MaxCallRecvMsgSize: 0, // unlimited: LIST of many objects
		Logger:             etcdLogger(log, "etcd-client", zapcore.ErrorLevel),
	})
	if err != nil {
		s.closeEmbedded()
		return nil, fmt.Errorf("etcd client for %v: %w", endpoints, err)
	}
	s.kc = kc
	s.leases = newLeaseManager(kc.Client.Lease, cfg.LeaseReuse)
	// Prove the connection now rather than on the first request.
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := kc.Get(cctx, "/registry/health", kubernetes.GetOptions{}); err != nil {
		kc.Close()
		s.closeEmbedded()
		return nil, fmt.Errorf("etcd at %v: %w", endpoints, mapErr(err))
	}
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "etcd_request_duration_seconds",
		Help:    "Latency of the API server's etcd requests by operation and resource.",
		Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
	}, []string{"operation", "type"})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.latency); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				s.latency = are.ExistingCollector.(*prometheus.HistogramVec)
			} else {
				return nil, fmt.Errorf("register etcd metrics: %w", err)
			}
		}
	}
	log.Info("storage ready", "endpoints", endpoints, "embedded", s.embedded != nil)
	return s, nil
}

// ClientTLS is the etcd client's TLS configuration from
// --etcd-cafile/--etcd-certfile/--etcd-keyfile; nil when all are empty.
// A certificate needs its key; a CA alone verifies etcd without presenting
// a certificate.
func ClientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("storage: --etcd-certfile and --etcd-keyfile go together")
	}
	info := transport.TLSInfo{CertFile: certFile, KeyFile: keyFile, TrustedCAFile: caFile}
	c, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("storage: etcd client TLS (--etcd-cafile %q, --etcd-certfile %q, --etcd-keyfile %q): %w", caFile, certFile, keyFile, err)
	}
	return c, nil
}

func (s *Store) closeEmbedded() {
	if s.embedded != nil {
		s.embedded.Close()
	}
}

// Close closes the client and stops the embedded etcd, if any.
func (s *Store) Close() error {
	err := s.kc.Close()
	s.closeEmbedded()
	return err
}

// Client exposes the raw etcd client (for compaction and tests).
func (s *Store) Client() *clientv3.Client { return s.kc.Client }

// Endpoints are the etcd client URLs in use.
func (s *Store) Endpoints() []string { return s.kc.Endpoints() }

// resourceOf names the resource of a key for metrics: /registry/pods/ns/n → pods.
func resourceOf(key string) string {
	const p = "/registry/"
	if len(key) <= len(p) || key[:len(p)] != p {
		return "other"
	}
	rest := key[len(p):]
	for i := 0; i < len(rest); i++ {
		if rest[i] == '/' {
			return rest[:i]
		}
	}
	return rest
}

func (s *Store) call(ctx context.Context, op, key string) (context.Context, func()) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	return ctx, func() {
		cancel()
		s.latency.WithLabelValues(op, resourceOf(key)).Observe(time.Since(start).Seconds())
	}
}

func toKV(kv *mvccpb.KeyValue) *KV {
	if kv == nil {
		return nil
	}
	return &KV{Key: string(kv.Key), Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision}
}

// mapErr turns etcd errors into the package's sentinels.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, rpctypes.ErrCompacted), errors.Is(err, rpctypes.ErrGRPCCompacted):
		return fmt.Errorf("%w: %v", ErrCompacted, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge), errors.Is(err, rpctypes.ErrGRPCRequestTooLarge):
		return fmt.Errorf("%w: %v", ErrTooLarge, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		case codes.ResourceExhausted:
			return fmt.Errorf("%w: %v", ErrTooLarge, err)
		case codes.OutOfRange:
			if st.Message() == rpctypes.ErrGRPCCompacted.Error() || st.Message() == "etcdserver: mvcc: required revision has been compacted" {
				return fmt.Errorf("%w: %v", ErrCompacted, err)
			}
		}
	}
	return err
}

// Get returns the key's current value (ErrNotFound if absent) and the store's
// revision.
func (s *Store) Get(ctx context.Context, key string) (*KV, int64, error) {
	ctx, done := s.call(ctx, "get", key)
	defer done()
	resp, err := s.kc.Get(ctx, key, kubernetes.GetOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("get %s: %w", key, mapErr(err))
	}
	if resp.KV == nil {
		return nil, resp.Revision, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	kv := toKV(resp.KV)
	if err := s.fromStorage(ctx, kv); err != nil {
		return nil, resp.Revision, err
	}
	return kv, resp.Revision, nil
}

// ErrTransform marks a stored value that cannot be decrypted (a key no
// longer in the encryption configuration, or tampered data).
var ErrTransform = errors.New("unable to transform a stored value")

// fromStorage decrypts kv's value in place, recording whether it was
// written with a key that is no longer the first (Stale).
func (s *Store) fromStorage(ctx context.Context, kv *KV) error {
	if kv == nil || s.transform == nil || len(kv.Value) == 0 {
		return nil
	}
	t := s.transform(kv.Key)
	if t == nil {
		return nil
	}
	out, stale, err := t.TransformFromStorage(ctx, kv.Value, value.DefaultContext(kv.Key))
	if err != nil {
		return fmt.Errorf("%w %s: %v", ErrTransform, kv.Key, err)
	}
	kv.Value, kv.Stale = out, stale
	return nil
}

// toStorage encrypts a value about to be written under key.
func (s *Store) toStorage(ctx context.Context, key string, data []byte) ([]byte, error) {
	if s.transform == nil {
		return data, nil
	}
	t := s.transform(key)
	if t == nil {
		return data, nil
	}
	out, err := t.TransformToStorage(ctx, data, value.DefaultContext(key))
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrTransform, key, err)
	}
	return out, nil
}

// ListOptions page and pin a List.
type ListOptions struct {
	// Revision reads at that revision (0: latest).
	Revision int64
	// Limit bounds the number of pairs (0: all).
	Limit int64
	// After starts the listing right after this key (exclusive).
	After string
}

// ListResult is one page of a List.
type ListResult struct {
	KVs []*KV
	// Revision the page was read at; pass it back to read the next page at
	// the same point in time.
	Revision int64
	// More is true when pairs remain after the last one returned.
	More bool
	// Count is the number of pairs from the page's start to the prefix's
	// end (the returned ones included), as etcd counts them.
	Count int64
}

// List returns the pairs under prefix in key order.
func (s *Store) List(ctx context.Context, prefix string, opts ListOptions) (ListResult, error) {
	ctx, done := s.call(ctx, "list", prefix)
	defer done()
	ko := kubernetes.ListOptions{Revision: opts.Revision, Limit: opts.Limit}
	if opts.After != "" {
		ko.Continue = opts.After + "\x00"
	}
	resp, err := s.kc.List(ctx, prefix, ko)
	if err != nil {
		if errors.Is(mapErr(err), ErrCompacted) {
			return ListResult{}, fmt.Errorf("list %s: %w", prefix, &CompactedError{Requested: opts.Revision})
		}
		return ListResult{}, fmt.Errorf("list %s: %w", prefix, mapErr(err))
	}
	out := ListResult{Revision: resp.Revision, KVs: make([]*KV, len(resp.Kvs))}
	if opts.Revision > 0 {
		// etcd's header carries its current revision; a page read at a
		// fixed revision is of that revision (every page of one
		// continued LIST answers the first page's resourceVersion).
		out.Revision = opts.Revision
	}
	for i, kv := range resp.Kvs {
		out.KVs[i] = toKV(kv)
		if err := s.fromStorage(ctx, out.KVs[i]); err != nil {
			return ListResult{}, fmt.Errorf("list %s: %w", prefix, err)
		}
	}
	out.More = resp.Count > int64(len(resp.Kvs))
	out.Count = resp.Count
	return out, nil
}

// Count returns the number of keys under prefix.
func (s *Store) Count(ctx context.Context, prefix string) (int64, error) {
	ctx, done := s.call(ctx, "count", prefix)
	defer done()
	n, err := s.kc.Count(ctx, prefix, kubernetes.CountOptions{})
	if err != nil {
		return 0, fmt.Errorf("count %s: %w", prefix, mapErr(err))
	}
	return n, nil
}

// PutOption modifies one write (Create, OptimisticPut).
type PutOption func(*putOptions)

type putOptions struct {
	ttl time.Duration
}

// WithTTL makes etcd delete the key ttl after the write (in whole seconds,
// rounded up; a shared lease may keep it up to 5 % or the lease reuse
// window longer, as kube-apiserver's): watchers see a deletion. Each write
// sets the key's lifetime anew, and a write without WithTTL keeps it for
// good. Zero or less is no TTL.
func WithTTL(ttl time.Duration) PutOption {
	return func(o *putOptions) { o.ttl = ttl }
}

// put is the transaction of Create (expected 0) and OptimisticPut, with the
// lease of a TTL attached.
func (s *Store) put(ctx context.Context, key string, value []byte, expected int64, getOnFailure bool, opts []PutOption) (*kubernetes.PutResponse, error) {
	var o putOptions
	for _, opt := range opts {
		opt(&o)
	}
	po := kubernetes.PutOptions{GetOnFailure: getOnFailure}
	if o.ttl <= 0 {
		resp, err := s.kc.OptimisticPut(ctx, key, value, expected, po)
		return &resp, err
	}
	for attempt := 0; ; attempt++ {
		id, err := s.leases.get(ctx, ttlSeconds(o.ttl))
		if err != nil {
			return nil, fmt.Errorf("lease: %w", err)
		}
		po.LeaseID = id
		resp, err := s.kc.OptimisticPut(ctx, key, value, expected, po)
		if attempt == 0 && (errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)) {
			// The shared lease went (revoked by hand, or its expiry
			// came earlier than this side counted): a fresh one.
			s.leases.forget(id)
			continue
		}
		return &resp, err
	}
}

// Create writes key only if it does not exist (ErrExists otherwise) and
// returns the new revision.
func (s *Store) Create(ctx context.Context, key string, value []byte, opts ...PutOption) (int64, error) {
	ctx, done := s.call(ctx, "create", key)
	defer done()
	value, err := s.toStorage(ctx, key, value)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", key, err)
	}
	resp, err := s.put(ctx, key, value, 0, false, opts)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", key, mapErr(err))
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("create %s: %w", key, ErrExists)
	}
	return resp.Revision, nil
}

// OptimisticPut replaces key only if its modification revision is still
// expected. A key that vanished meanwhile gives ErrNotFound, one modified
// since gives ErrConflict (with the current pair).
func (s *Store) OptimisticPut(ctx context.Context, key string, value []byte, expected int64, opts ...PutOption) (int64, *KV, error) {
	ctx, done := s.call(ctx, "update", key)
	defer done()
	value, err := s.toStorage(ctx, key, value)
	if err != nil {
		return 0, nil, fmt.Errorf("update %s: %w", key, err)
	}
	resp, err := s.put(ctx, key, value, expected, true, opts)
	if err != nil {
		return 0, nil, fmt.Errorf("update %s: %w", key, mapErr(err))
	}
	if !resp.Succeeded {
		if resp.KV == nil {
			return 0, nil, fmt.Errorf("update %s: %w", key, ErrNotFound)
		}
		cur := toKV(resp.KV)
		if err := s.fromStorage(ctx, cur); err != nil {
			return 0, nil, fmt.Errorf("update %s: %w", key, err)
		}
		return 0, cur, fmt.Errorf("update %s: %w", key, ErrConflict)
	}
	return resp.Revision, nil, nil
}

// OptimisticDelete deletes key only if its modification revision is still
// expected (ErrConflict with the current pair otherwise; ErrNotFound if gone).
func (s *Store) OptimisticDelete(ctx context.Context, key string, expected int64) (int64, *KV, error) {
	ctx, done := s.call(ctx, "delete", key)
	defer done()
	resp, err := s.kc.OptimisticDelete(ctx, key, expected, kubernetes.DeleteOptions{GetOnFailure: true})
	if err != nil {
		return 0, nil, fmt.Errorf("delete %s: %w", key, mapErr(err))
	}
	if !resp.Succeeded {
		if resp.KV == nil {
			return 0, nil, fmt.Errorf("delete %s: %w", key, ErrNotFound)
		}
		cur := toKV(resp.KV)
		if err := s.fromStorage(ctx, cur); err != nil {
			return 0, nil, fmt.Errorf("delete %s: %w", key, err)
		}
		return 0, cur, fmt.Errorf("delete %s: %w", key, ErrConflict)
	}
	prev := toKV(resp.KV)
	if err := s.fromStorage(ctx, prev); err != nil {
		// The key is gone; only its last value is unreadable.
		s.log.Warn("deleted a value that cannot be decrypted", "key", key, "err", err)
		prev.Value = nil
	}
	return resp.Revision, prev, nil
}

// Compact discards history before rev.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	ctx, done := s.call(ctx, "compact", "/registry/")
	defer done()
	if _, err := s.kc.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact to %d: %w", rev, mapErr(err))
	}
	return nil
}

// Revision returns the store's current revision.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	_, rev, err := s.Get(ctx, "/registry/health")
	if err != nil && !errors.Is(err, ErrNotFound) {
		return 0, err
	}
	return rev, nil
}

// RawEvent is one change under a watched prefix.
type RawEvent struct {
	// Delete is true for deletions (KV holds the key; PrevKV the last value).
	Delete bool
	KV     *KV
	PrevKV *KV
}

// RequestProgress asks etcd to send a progress notification (the current
// revision) on the watch stream Store.Watch uses.
func (s *Store) RequestProgress(ctx context.Context) error {
	s.lastProgress.Store(time.Now().UnixNano())
	return s.kc.RequestProgress(clientv3.WithRequireLeader(ctx))
}

// RequestProgressEvery is RequestProgress for periodic callers (the watch
// caches' bookmark tickers), skipped when anyone asked less than every
// ago. Every watch of the store shares one etcd watch stream, and etcd
// answers a progress request with a single notification that the client
// hands to every watch on the stream: one watch cache per resource asking
// on its own tick made N caches broadcast N notifications each per
// interval, N² wake-ups (72 kinds: over a thousand a second, about 3 % of
// the process's CPU in the write-path benchmark).
func (s *Store) RequestProgressEvery(ctx context.Context, every time.Duration) error {
	now := time.Now().UnixNano()
	last := s.lastProgress.Load()
	if now-last < int64(every) || !s.lastProgress.CompareAndSwap(last, now) {
		return nil
	}
	return s.kc.RequestProgress(clientv3.WithRequireLeader(ctx))
}

// WatchBatch is one etcd watch response: its events and the revision the
// store had reached (for progress when there are no events).
type WatchBatch struct {
	Events   []RawEvent
	Revision int64
}

// Watch streams changes under prefix starting at revision from (inclusive).
// The returned channel closes when ctx ends or the watch fails; err then
// reports why (ErrCompacted as *CompactedError when from is too old).
func (s *Store) Watch(ctx context.Context, prefix string, from int64) (<-chan WatchBatch, func() error) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wc := s.kc.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV(), clientv3.WithProgressNotify())
	out := make(chan WatchBatch, 64)
	var werr error
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		defer close(out)
		defer cancel()
		for resp := range wc {
			if resp.CompactRevision != 0 {
				werr = &CompactedError{Requested: from, Compacted: resp.CompactRevision}
				return
			}
			if err := resp.Err(); err != nil {
				werr = fmt.Errorf("watch %s: %w", prefix, mapErr(err))
				return
			}
			b := WatchBatch{Revision: resp.Header.Revision, Events: make([]RawEvent, 0, len(resp.Events))}
			for _, ev := range resp.Events {
				re := RawEvent{Delete: ev.Type == clientv3.EventTypeDelete, KV: toKV(ev.Kv), PrevKV: toKV(ev.PrevKv)}
				if re.Delete {
					re.KV.Value = nil
				}
				for _, kv := range []*KV{re.KV, re.PrevKV} {
					if err := s.fromStorage(ctx, kv); err != nil {
						werr = fmt.Errorf("watch %s: %w", prefix, err)
						return
					}
				}
				b.Events = append(b.Events, re)
			}
			select {
			case out <- b:
			case <-ctx.Done():
				return
			}
		}
		if werr == nil && ctx.Err() == nil {
			werr = fmt.Errorf("watch %s: %w", prefix, ErrUnavailable)
		}
	}()
	return out, func() error { <-finished; return werr }
}
