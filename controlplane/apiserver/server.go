// Package apiserver is Waggle's Kubernetes-compatible API server: HTTPS on
// 6443, requests flowing authn ▶ authz ▶ admission ▶ registry (defaulting,
// validation, strategies) ▶ storage (etcd through package storage, reads
// and watches through its watch cache), speaking the wire protocol kubectl
// and client-go expect (discovery, CRUD, patch, watch, subresources, tables,
// Status errors).
//
// The served resources are package catalog's built-in list plus the custom
// resources of CustomResourceDefinitions (package extensions/crd), added
// and removed at run time.
// Bodies may be JSON, YAML or protobuf; responses, watch streams included,
// are protobuf for clients that prefer it (client-go) and JSON otherwise.
// README.md in this folder describes the data flow.
package apiserver

import (
	"context"
	"errors"
	"fmt"
	"k8s.io/kubernetes/pkg/capabilities"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/controlplane/apiserver/serviceaccount"
	metricsapi "github.com/waggle-io/waggle/controlplane/metrics"
	"github.com/waggle-io/waggle/controlplane/storage"
	"github.com/waggle-io/waggle/internal/ops"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Config is `waggle apiserver`'s configuration.
type Config struct {
	// DataDir holds the PKI, the kubeconfigs and the embedded etcd.
	DataDir string
	// EtcdServers are external etcd client URLs; empty starts an embedded
	// etcd under DataDir on 127.0.0.1.
	EtcdServers []string
	// EtcdCAFile, EtcdCertFile and EtcdKeyFile are --etcd-cafile,
	// --etcd-certfile and --etcd-keyfile: the external etcd's CA and this
	// server's client certificate. The embedded etcd ignores them: its own
	// CA and certificates live under DataDir/pki/etcd (pki.EnsureEtcd).
	EtcdCAFile, EtcdCertFile, EtcdKeyFile string
	// EtcdMember makes the embedded etcd one member of a cluster of
	// several (an HA control plane: `waggle up --cluster-init` starts it,
	// `waggle up --server ... --token ...` joins it); nil runs a single
	// member on loopback.
	EtcdMember *storage.MemberConfig
	// EncryptionProviderConfig is --encryption-provider-config: upstream's
	// EncryptionConfiguration file (aescbc, aesgcm, secretbox, identity)
	// choosing how each resource is encrypted in etcd; empty stores values
	// as they are.
	EncryptionProviderConfig string
	// StorageMediaType is --storage-media-type, as kube-apiserver's: how
	// built-in objects are written to etcd, "application/vnd.kubernetes.protobuf"
	// (the default) or "application/json", what builds before protobuf
	// storage read (for a rolling upgrade of several API servers sharing
	// one etcd). Both are always read; custom resources are always JSON.
	StorageMediaType string
	// Audit is --audit-policy-file, --audit-log-path and the log's rotation
	// (--audit-log-maxage, -maxbackup, -maxsize).
	Audit AuditConfig
	// PodSecurityConfigFile is the PodSecurity admission plugin's
	// PodSecurityConfiguration (pod-security.admission.config.k8s.io/v1):
	// the defaults for namespaces without labels and the exemptions; empty
	// is upstream's default (privileged at latest).
	PodSecurityConfigFile string
	// BindAddress and SecurePort are where HTTPS is served (port 0 picks a
	// free port; Addr reports it, and it is written to DataDir/apiserver.addr).
	BindAddress string
	SecurePort  int
	// AdvertiseAddress is the address other components reach the server at
	// (default: 127.0.0.1); it goes into the kubeconfigs and the serving
	// certificate.
	AdvertiseAddress string
	// ServiceClusterIPRange and ServiceNodePortRange are the allocators'
	// ranges (defaults 10.96.0.0/12 and 30000-32767).
	ServiceClusterIPRange string
	ServiceNodePortRange  string
	// NodeName is the node whose kubelet.kubeconfig the server writes
	// (default: the hostname, as the kubelet's default node name).
	NodeName string
	// AnonymousAuth is --anonymous-auth: requests without credentials run
	// as system:anonymous (group system:unauthenticated) and are authorized
	// like any other (by default RBAC grants them only /healthz, /livez,
	// /readyz, /version); off, they get 401. The commands default it on, as
	// kube-apiserver.
	AnonymousAuth bool
	// AuthorizationModes is --authorization-mode, in order (default
	// Node,RBAC; AlwaysAllow only when asked for).
	AuthorizationModes []string
	// TokenAuthFile is kube-apiserver's static token CSV (optional).
	TokenAuthFile string
	// EnableBootstrapTokenAuth is --enable-bootstrap-token-auth: bearer
	// tokens <id>.<secret> authenticate against the bootstrap token Secrets
	// of kube-system (as system:bootstrap:<id>, group system:bootstrappers);
	// nodes join with them. The commands default it on (kubeadm and k3s
	// turn it on; kube-apiserver's own default is off).
	EnableBootstrapTokenAuth bool
	// ServiceAccountIssuers are --service-account-issuer (the first signs;
	// default https://kubernetes.default.svc.cluster.local).
	ServiceAccountIssuers []string
	// APIAudiences are --api-audiences (default: the first issuer).
	APIAudiences []string
	// ServiceAccountSigningKeyFile signs service-account tokens; empty: a
	// key pair generated under DataDir/pki (sa.key, sa.pub).
	ServiceAccountSigningKeyFile string
	// ServiceAccountKeyFiles verify service-account tokens (several for a
	// rotation; default: the generated sa.pub).
	ServiceAccountKeyFiles []string
	// ServiceAccountMaxTokenExpiration caps a TokenRequest's lifetime
	// (0: no cap).
	ServiceAccountMaxTokenExpiration time.Duration
	// ServiceAccountExtendTokenExpiration lets the projected tokens pods
	// get (3607 s, API audiences) last a year, flagged stale after the
	// hour; the commands default it on, as kube-apiserver.
	ServiceAccountExtendTokenExpiration bool
	// DenyPrivileged is --allow-privileged=false: pods asking for
	// securityContext.privileged (or host namespaces' privileged use) are
	// refused at validation. Privileged pods are allowed by default, as
	// kubeadm's and k3s's clusters (and the conformance suite) expect;
	// PodSecurity admission is where namespaces are restricted. Upstream's
	// switch is process-wide: the first server of a process decides.
	DenyPrivileged bool
	// DisableAdmissionPlugins is --disable-admission-plugins: plugins by
	// name (ServiceAccount, DefaultTolerationSeconds; NamespaceLifecycle and
	// NodeRestriction cannot be turned off here).
	DisableAdmissionPlugins []string
	// EventTTL is --event-ttl: how long an Event (core/v1 and
	// events.k8s.io/v1, one store) lives after its last write; etcd then
	// deletes it (a lease) and watchers see DELETED, as kube-apiserver's.
	// Whole seconds, rounded up; a shared lease may keep an Event up to
	// 5 % (at most storage.DefaultLeaseReuse, 60 s) longer. Zero: Events
	// never expire (what upstream does with 0); the commands default it to
	// 1h, as kube-apiserver.
	EventTTL time.Duration
	// LeaseReuse is --lease-reuse-duration-seconds: the longest window an
	// etcd lease of keys written with a TTL (Events) is shared for
	// (storage.Config.LeaseReuse; the window is also at most 5 % of the
	// TTL). Zero: storage.DefaultLeaseReuse (60 s, kube-apiserver's
	// default); otherwise at least a second.
	LeaseReuse time.Duration
	// TLSCertFile, TLSPrivateKeyFile and ClientCAFile replace the generated
	// PKI when given.
	TLSCertFile, TLSPrivateKeyFile, ClientCAFile string
	LogLevel                                     string

	// In-process options (tests, `waggle up`).

	// Listener, if set, is served instead of listening on BindAddress.
	Listener net.Listener
	// Log overrides the logger made from LogLevel.
	Log *slog.Logger
	// Authorizer, when set, replaces the chain AuthorizationModes builds.
	Authorizer authz.Authorizer
	// EtcdUnsafeNoFsync turns off fsync in the embedded etcd (tests only).
	EtcdUnsafeNoFsync bool
	// RepairInterval is the period of the allocators' repair loop
	// (default 3 minutes).
	RepairInterval time.Duration
	// BookmarkInterval is how often watchers asking for bookmarks get one
	// (default 5 s).
	BookmarkInterval time.Duration
	// ShutdownTimeout bounds the graceful shutdown (default 10 s).
	ShutdownTimeout time.Duration
	// EtcdTimeout bounds each etcd call (default storage.DefaultTimeout).
	EtcdTimeout time.Duration
	// ComponentProbes are the health URLs componentstatuses reports, by
	// component name (default DefaultComponentProbes; etcd-0 is always the
	// server's own store).
	ComponentProbes map[string]string
	// MetricsAPI is --metrics-api: "native" serves metrics.k8s.io/v1beta1
	// (NodeMetrics, PodMetrics) from the kubelets' /metrics/resource
	// (package controlplane/metrics); "off" or "" serves nothing there, for
	// when an aggregated metrics server answers the group. The commands
	// default it to native.
	MetricsAPI string
	// MetricsResolution is how often kubelets are scraped (default 15 s).
	MetricsResolution time.Duration
}

// ValidateEventTTL refuses an --event-ttl etcd cannot keep: leases count
// whole seconds, and kube-apiserver truncates, so that anything under a
// second would silently never expire there.
func ValidateEventTTL(ttl time.Duration) error {
	if ttl < 0 || (ttl > 0 && ttl < time.Second) {
		return fmt.Errorf("apiserver: --event-ttl %v: 0 (Events never expire) or at least 1s", ttl)
	}
	return nil
}

// ValidateLeaseReuse refuses a --lease-reuse-duration-seconds under a
// second, as kube-apiserver refuses anything but a positive number of
// seconds.
func ValidateLeaseReuse(d time.Duration) error {
	if d < time.Second {
		return fmt.Errorf("apiserver: --lease-reuse-duration-seconds %v: must be at least 1 (second)", d.Seconds())
	}
	return nil
}

// LeaseReuseSeconds is the LeaseReuse of the flag's whole seconds, refused
// under 1 (and beyond what a time.Duration holds).
func LeaseReuseSeconds(s int64) (time.Duration, error) {
	if s > int64(math.MaxInt64/time.Second) {
		return 0, fmt.Errorf("apiserver: --lease-reuse-duration-seconds %d: too large", s)
	}
	d := time.Duration(s) * time.Second
	return d, ValidateLeaseReuse(d)
}

func (c *Config) setDefaults() {
	if c.BindAddress == "" {
		c.BindAddress = "0.0.0.0"
	}
	if c.ServiceClusterIPRange == "" {
		c.ServiceClusterIPRange = "10.96.0.0/12"
	}
	if c.ServiceNodePortRange == "" {
		c.ServiceNodePortRange = "30000-32767"
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.RepairInterval == 0 {
		c.RepairInterval = 3 * time.Minute
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
}

// Kubeconfig is one kubeconfig written at start: file name (under
// DataDir) → identity.
type Kubeconfig struct {
	File, CommonName string
	Orgs             []string
}

// Kubeconfigs returns the kubeconfigs written at start, each component with
// its own identity (the RBAC each needs is in the default policy): admin
// (system:masters), the scheduler, the controller-manager, the proxy, and
// the kubelet of the node nodeName (system:node:<nodeName> in
// system:nodes, which the Node authorizer limits to that node).
func Kubeconfigs(nodeName string) []Kubeconfig {
	return []Kubeconfig{
		{"admin.kubeconfig", "admin", []string{"system:masters"}},
		{"scheduler.kubeconfig", "system:kube-scheduler", nil},
		{"controller-manager.kubeconfig", "system:kube-controller-manager", nil},
		{"kubelet.kubeconfig", "system:node:" + nodeName, []string{"system:nodes"}},
		{"proxy.kubeconfig", "system:kube-proxy", nil},
	}
}

// Server is a running API server.
type Server struct {
	cfg    Config
	log    *slog.Logger
	store  *storage.Store
	health *ops.Health
	bundle *pki.Bundle
	authn  authn.Authenticator
	// loopback authenticates the server's own clients (admission informers).
	loopback *authn.Loopback
	// dynAdmission is admission webhooks and policies (admission_dynamic.go).
	dynAdmission *dynamicAdmission
	// limitRangesLive is LimitRanger's live lookups (limitranger.go).
	limitRangesLive liveLimitRanges
	// agg is the aggregation layer (APIService objects, aggregator.go).
	agg *aggregator
	// auditor writes the audit log (nil: no audit); podSecurity is the
	// PodSecurity admission plugin.
	auditor         *auditor
	podSecurity     *podSecurity
	webhookServices *endpointServiceResolver
	// tokenAuthn is the bearer-token part of authn (what TokenReview asks).
	tokenAuthn authn.Authenticator
	tokens     *serviceaccount.Tokens
	authz      authz.Authorizer
	// authorization holds the RBAC and Node authorizers' state (nil with
	// an injected Authorizer).
	authorization *authorization
	bgCtx         context.Context
	admission     []Admitter
	validating    []Admitter // built-in validating plugins, after validation
	quota         Admitter   // ResourceQuota, the last validating plugin
	catalog       *catalog.Catalog
	// metricsStore answers metrics.k8s.io with MetricsAPI native.
	metricsStore *metricsapi.Store
	registries   map[string]*registry // built-in stored resources by plural name (a shared store's owner wins)
	// byGVR holds every served resource by "group/version/resource"; it
	// is replaced, never modified, so readers need no lock (custom
	// resources come and go at run time: setRegistry, dropRegistry).
	byGVR     atomic.Pointer[map[string]*registry]
	regMu     sync.Mutex
	crds      *crdController
	virtual   map[string]VirtualCreate
	discovery http.Handler
	ipAlloc   *allocator   // the primary family's
	ipAllocs  []*allocator // one per served family, primary first
	portAlloc *allocator
	metrics   *metrics
	ln        net.Listener
	url       string

	kubelet kubeletTransport

	// watchStop ends every watch at shutdown.
	watchStop chan struct{}
	bg        sync.WaitGroup
	bgCancel  context.CancelFunc
}

// Run serves until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, cfg Config) error {
	s, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

// New prepares a server: PKI, storage, watch caches, allocators, the
// initial namespaces and the kubeconfigs. Serve then serves it; Close
// releases it if Serve is never called.
func New(ctx context.Context, cfg Config) (*Server, error) {
	cfg.setDefaults()
	if cfg.DataDir == "" {
		return nil, errors.New("apiserver: --data-dir is required")
	}
	if err := ValidateEventTTL(cfg.EventTTL); err != nil {
		return nil, err
	}
	if cfg.LeaseReuse != 0 {
		if err := ValidateLeaseReuse(cfg.LeaseReuse); err != nil {
			return nil, err
		}
	}
	switch cfg.StorageMediaType {
	case "", protobufType, "application/json":
	default:
		return nil, fmt.Errorf("apiserver: --storage-media-type %q: application/vnd.kubernetes.protobuf or application/json", cfg.StorageMediaType)
	}
	// Upstream's pod validation reads --allow-privileged from this
	// process-wide setting, which is false until someone sets it.
	capabilities.Setup(!cfg.DenyPrivileged, 0)
	log := cfg.Log
	if log == nil {
		l, err := ops.NewLogger("apiserver", cfg.LogLevel)
		if err != nil {
			return nil, err
		}
		log = l
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("apiserver: data dir: %w", err)
	}
	s := &Server{cfg: cfg, log: log, health: ops.NewHealth(), catalog: catalog.Builtin(), registries: map[string]*registry{}, virtual: map[string]VirtualCreate{}, watchStop: make(chan struct{})}
	s.byGVR.Store(&map[string]*registry{})
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()

	// Listener first: the serving certificate and kubeconfigs need the port.
	s.ln = cfg.Listener
	if s.ln == nil {
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.BindAddress, strconv.Itoa(cfg.SecurePort)))
		if err != nil {
			return nil, fmt.Errorf("apiserver: listen on %s:%d: %w", cfg.BindAddress, cfg.SecurePort, err)
		}
		s.ln = ln
	}
	port := s.ln.Addr().(*net.TCPAddr).Port
	adv := cfg.AdvertiseAddress
	if adv == "" {
		adv = "127.0.0.1"
	}
	s.url = "https://" + net.JoinHostPort(adv, strconv.Itoa(port))

	ipAllocs, err := newIPAllocators(cfg.ServiceClusterIPRange, nil, log)
	if err != nil {
		return nil, err
	}
	ipAlloc := ipAllocs[0]
	portAlloc, err := newPortAllocator(cfg.ServiceNodePortRange, nil, log)
	if err != nil {
		return nil, err
	}
	hosts := []string{adv}
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	hosts = append(hosts, ipAlloc.value(1)) // the kubernetes Service's ClusterIP
	if cfg.TLSCertFile != "" || cfg.TLSPrivateKeyFile != "" {
		if cfg.TLSCertFile == "" || cfg.TLSPrivateKeyFile == "" {
			return nil, errors.New("apiserver: --tls-cert-file and --tls-private-key-file go together")
		}
		s.bundle, err = pki.Load(cfg.TLSCertFile, cfg.TLSPrivateKeyFile, cfg.ClientCAFile)
	} else {
		s.bundle, err = pki.Ensure(filepath.Join(cfg.DataDir, "pki"), hosts)
	}
	if err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	s.loopback = authn.NewLoopback()
	auths := []authn.Authenticator{s.loopback}
	if pool := s.bundle.CAPool(); pool != nil {
		auths = append(auths, authn.NewX509(pool))
	}
	var tokenAuths []authn.Authenticator
	if cfg.TokenAuthFile != "" {
		ta, err := authn.NewTokenFile(cfg.TokenAuthFile)
		if err != nil {
			return nil, fmt.Errorf("apiserver: %w", err)
		}
		tokenAuths = append(tokenAuths, ta)
	}
	if cfg.EnableBootstrapTokenAuth {
		tokenAuths = append(tokenAuths, authn.NewBootstrapTokens(kubeSystemSecrets{s}))
	}

	scfg := storage.Config{
		Servers: cfg.EtcdServers, DataDir: cfg.DataDir, UnsafeNoFsync: cfg.EtcdUnsafeNoFsync, Timeout: cfg.EtcdTimeout,
		CAFile: cfg.EtcdCAFile, CertFile: cfg.EtcdCertFile, KeyFile: cfg.EtcdKeyFile,
		Log: log.With("subsystem", "storage"), Registerer: s.health.Registry, LeaseReuse: cfg.LeaseReuse,
	}
	if len(cfg.EtcdServers) == 0 {
		var etcdHosts []string
		if cfg.EtcdMember != nil {
			etcdHosts = append(etcdHosts, cfg.EtcdMember.Host)
			scfg.Member = cfg.EtcdMember
		}
		ep, err := pki.EnsureEtcd(filepath.Join(cfg.DataDir, "pki"), etcdHosts)
		if err != nil {
			return nil, fmt.Errorf("apiserver: embedded etcd PKI: %w", err)
		}
		scfg.CAFile, scfg.CertFile, scfg.KeyFile = ep.CAFile, ep.ClientCertFile, ep.ClientKeyFile
		scfg.EmbeddedCertFile, scfg.EmbeddedKeyFile = ep.ServerCertFile, ep.ServerKeyFile
	}
	if s.auditor, err = newAuditor(cfg.Audit); err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	if s.podSecurity, err = s.newPodSecurity(cfg.PodSecurityConfigFile); err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	if cfg.EncryptionProviderConfig != "" {
		if scfg.Transformer, err = s.loadEncryption(ctx, cfg.EncryptionProviderConfig); err != nil {
			return nil, fmt.Errorf("apiserver: %w", err)
		}
	}
	s.store, err = storage.Open(ctx, scfg)
	if err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	for _, a := range ipAllocs {
		a.store = s.store
	}
	portAlloc.store = s.store
	s.ipAlloc, s.ipAllocs, s.portAlloc = ipAlloc, ipAllocs, portAlloc
	s.metrics = newMetrics(s.health.Registry, s)

	bgCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.bgCancel = cancel
	s.bgCtx = bgCtx
	if err := s.setupMetricsAPI(); err != nil {
		return nil, err
	}
	for _, r := range s.catalog.All() {
		reg, err := s.newRegistry(r)
		if err != nil {
			return nil, err
		}
		s.setRegistry(reg)
		if reg.cache == nil {
			continue
		}
		if _, taken := s.registries[r.Resource]; !taken && r.StoredAs == nil {
			s.registries[r.Resource] = reg
		}
		s.bg.Add(1)
		go func() { defer s.bg.Done(); reg.cache.Run(bgCtx) }()
	}
	sa, err := s.setupServiceAccounts()
	if err != nil {
		return nil, err
	}
	tokenAuths = append(tokenAuths, sa)
	s.tokenAuthn = authn.Union(tokenAuths...)
	s.authn = authn.Union(append(auths, tokenAuths...)...)
	// In kube-apiserver's order: mutating plugins here, the validating ones
	// after defaulting and validation.
	s.admission = []Admitter{namespaceLifecycle{s}}
	for _, p := range []Admitter{limitRanger{s: s}, serviceAccountAdmission{s}, priorityAdmission{s}, defaultTolerationSeconds{seconds: 300}, defaultStorageClass{s}, runtimeClassAdmission{s: s}} {
		if !slices.Contains(cfg.DisableAdmissionPlugins, p.Name()) {
			s.admission = append(s.admission, p)
		}
	}
	// PodCertificateRequestSigning is part of upstream's status strategy,
	// not a plugin one may disable.
	s.validating = []Admitter{limitRanger{s: s, validate: true}, podCertificateSigning{s}}
	if !slices.Contains(cfg.DisableAdmissionPlugins, "RuntimeClass") {
		s.validating = append(s.validating, runtimeClassAdmission{s: s, validate: true})
	}
	if c := newCSRAdmission(s, cfg.DisableAdmissionPlugins); c != nil {
		s.validating = append(s.validating, c)
	}
	if err := s.setupDynamicAdmission(); err != nil {
		return nil, err
	}
	if err := s.setupAggregator(); err != nil {
		return nil, err
	}
	s.quota = newQuotaAdmission(s, bgCtx.Done())
	if err := s.setupAuthorization(ctx); err != nil {
		return nil, err
	}
	if err := s.installReviews(); err != nil {
		return nil, err
	}

	s.crds = newCRDController(s)
	if err := s.bootstrap(ctx); err != nil {
		return nil, err
	}
	if err := s.registerLocalAPIServices(ctx); err != nil {
		return nil, err
	}
	if err := s.publishExtensionAuthentication(ctx); err != nil {
		return nil, err
	}
	if err := s.reconcilePolicy(ctx); err != nil {
		return nil, err
	}
	if err := s.waitAuthorizationReady(ctx); err != nil {
		return nil, err
	}
	s.bg.Add(1)
	go func() { defer s.bg.Done(); s.repairLoop(bgCtx) }()
	s.bg.Add(1)
	go func() { defer s.bg.Done(); s.crds.run(bgCtx) }()
	s.bg.Add(1)
	go func() { defer s.bg.Done(); s.endpointReconcileLoop(bgCtx) }()
	if s.metricsStore != nil {
		s.bg.Add(1)
		go func() { defer s.bg.Done(); s.metricsStore.Run(bgCtx) }()
	}
	if len(cfg.EtcdServers) > 0 {
		// The embedded etcd compacts itself; an external one is compacted
		// by the API servers, as kube-apiserver does.
		s.bg.Add(1)
		go func() { defer s.bg.Done(); s.compactLoop(bgCtx, 5*time.Minute) }()
	}

	nodeName := cfg.NodeName
	if nodeName == "" {
		nodeName, _ = os.Hostname()
	}
	for _, k := range Kubeconfigs(nodeName) {
		if !s.bundle.HasCAKey() {
			break
		}
		if err := s.bundle.WriteKubeconfig(filepath.Join(cfg.DataDir, k.File), s.url, k.CommonName, k.Orgs); err != nil {
			return nil, fmt.Errorf("apiserver: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(cfg.DataDir, "apiserver.addr"), []byte(s.ln.Addr().String()+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	s.health.AddReadiness(ops.Check{Name: "etcd", Func: func(ctx context.Context) error {
		_, err := s.store.Revision(ctx)
		return err
	}})
	s.health.AddReadiness(ops.Check{Name: "admission", Func: func(context.Context) error {
		if d := s.dynAdmission; d.active() && !d.synced() {
			return errors.New("admission webhook and policy informers not synced")
		}
		if d := s.dynAdmission; d.active() && s.agg != nil && !s.agg.synced() {
			return errors.New("APIService informer not synced")
		}
		return nil
	}})
	s.health.AddReadiness(ops.Check{Name: "crd-informer-synced", Func: func(context.Context) error {
		if !s.crds.synced.Load() {
			return errors.New("CustomResourceDefinitions not yet served")
		}
		return nil
	}})
	s.health.AddReadiness(ops.Check{Name: "authorization", Func: func(context.Context) error { return s.authorizationReady() }})
	s.health.AddReadiness(ops.Check{Name: "watch-cache", Func: func(ctx context.Context) error {
		for name, r := range s.allRegistries() {
			if r.cache == nil {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			_, _, err := r.cache.List(cctx, 0, storage.Predicate{KeyPrefix: "\x00"})
			cancel()
			if errors.Is(r.cache.ListErr(), storage.ErrTransform) {
				// A value the encryption config cannot decrypt fails that
				// resource's reads (500, as upstream), not the server.
				continue
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	}})
	ok = true
	return s, nil
}

func (s *Server) repairLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.RepairInterval)
	defer t.Stop()
	for {
		if err := s.repairAllocations(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("allocation repair failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// compactLoop compacts etcd every interval to the revision seen one
// interval earlier, so history covers at least one interval for watches to
// resume in.
func (s *Server) compactLoop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if last > 0 {
			if err := s.store.Compact(ctx, last); err != nil && !errors.Is(err, storage.ErrCompacted) {
				s.log.Warn("etcd compaction failed", "rev", last, "err", err)
			}
		}
		rev, err := s.store.Revision(ctx)
		if err == nil {
			last = rev
		}
	}
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// URL is the server's https URL as written into the kubeconfigs.
func (s *Server) URL() string { return s.url }

// Bundle is the server's PKI.
func (s *Server) Bundle() *pki.Bundle { return s.bundle }

// Store is the server's storage (for tests: compaction).
func (s *Server) Store() *storage.Store { return s.store }

// Registry is the server's Prometheus registry.
func (s *Server) Registry() *prometheus.Registry { return s.health.Registry }

// Serve serves HTTPS until ctx ends, then shuts down gracefully: new
// connections are refused, watches end cleanly, in-flight requests finish
// (bounded by ShutdownTimeout), then storage closes.
func (s *Server) Serve(ctx context.Context) error {
	defer s.Close()
	tlsCfg, err := s.bundle.ServerTLSConfig()
	if err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	tlsCfg.NextProtos = []string{"h2", "http/1.1"}
	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: 30 * time.Second,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(s.ln, "", "") }()
	if s.dynAdmission != nil {
		s.dynAdmission.start()
	}
	if s.agg != nil {
		s.agg.start()
	}
	s.log.Info("serving", "addr", s.ln.Addr().String(), "url", s.url)
	select {
	case err := <-errc:
		return fmt.Errorf("apiserver: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("shutting down")
	// Leave the kubernetes endpoints first, as kube-apiserver does, so
	// clients and the kubernetes Service stop choosing this server.
	lctx, lcancel := context.WithTimeout(context.Background(), 3*time.Second)
	if err := s.reconcileEndpoints(lctx, true); err != nil {
		s.log.Warn("could not remove this server from the kubernetes endpoints", "err", err)
	}
	lcancel()
	close(s.watchStop)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		srv.Close()
		return fmt.Errorf("apiserver: shutdown: %w", err)
	}
	return nil
}

// Close stops background work and storage. Serve calls it.
func (s *Server) Close() {
	defer s.auditor.Close()
	if s.dynAdmission != nil {
		s.dynAdmission.close()
	}
	if s.agg != nil {
		s.agg.close()
	}
	if s.bgCancel != nil {
		s.bgCancel()
		s.bg.Wait()
		s.bgCancel = nil
	}
	if s.store != nil {
		s.store.Close()
		s.store = nil
	}
	if s.ln != nil && s.cfg.Listener == nil {
		s.ln.Close()
	}
}

// Handler is the whole HTTP surface: open health endpoints, then
// authentication and authorization in front of discovery, OpenAPI,
// /metrics and the resources.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(legacyProxyPaths, s.recoverer, s.instrument, limitBody)
	health := s.health.Handler()
	disc := s.dynamicDiscovery()
	for _, p := range []string{"/healthz", "/livez", "/readyz"} {
		r.Handle(p, health)
	}
	r.Get("/version", disc.ServeHTTP)
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate, s.serveAggregated)
		r.Handle("/metrics", health)
		r.Get(ControlPlaneBootstrapPath, s.serveControlPlaneBootstrap)
		r.Get(NodeProxyCredentialsPath, s.serveNodeProxyCredentials)
		r.Delete(EtcdMembersPath+"/{name}", s.removeEtcdMember)
		r.Get(serviceaccount.OpenIDConfigPath, s.serveOIDC(false))
		r.Get(serviceaccount.JWKSPath, s.serveOIDC(true))
		for _, p := range []string{"/api", "/api/", "/api/v1", "/apis", "/apis/", "/apis/{group}", "/apis/{group}/", "/apis/{group}/{version}"} {
			r.Get(p, disc.ServeHTTP)
		}
		s.discovery = disc
		s.mountOpenAPI(r)
		r.Handle("/api/v1/*", s.resourceHandler())
		r.Handle("/apis/{group}/{version}/*", s.resourceHandler())
	})
	r.NotFound(func(w http.ResponseWriter, req *http.Request) {
		writeStatus(w, errPathNotFound(), notFoundGR, "")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		writeStatus(w, apierrors.NewMethodNotSupported(notFoundGR, req.Method), notFoundGR, "")
	})
	return r
}
