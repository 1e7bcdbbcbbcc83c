// Package controllers is the controller-manager: `waggle controller-manager`
// builds one client and one SharedInformerFactory, and, while it holds the
// leader Lease, runs every enabled controller (replicaset,
// replicationcontroller, deployment,
// daemonset, statefulset, endpointslice, endpoints, endpointslicemirroring, job, cronjob, ttl-after-finished, podgc,
// disruption, root-ca-cert-publisher, resourcequota, horizontalpodautoscaling, lb-ipam, persistentvolume-binder,
// csrapproving, csrsigning, csrcleaner,
// bootstrapsigner and tokencleaner (the last two only when named),
// garbagecollector, and the node and namespace controllers), serving /healthz, /readyz and /metrics (work queue
// depth and work duration per controller) over HTTPS with delegated
// authentication and authorization on --bind-address:--secure-port
// (internal/secureserving).
//
// The controllers' logic lives in the sub-packages; this package only wires
// them, as kube-controller-manager does. It is not a library of controllers.
package controllers

import (
	"k8s.io/component-base/metrics/legacyregistry"
	// The work queue metrics provider kube-controller-manager uses: client-go
	// takes the first provider set in a process, and Kubernetes' libraries
	// (apiserver endpoints, upstream controllers) install this one.
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "k8s.io/component-base/metrics/prometheus/workqueue"

	"github.com/go-logr/logr"
	validatingpolicy "k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/controller-manager/pkg/clientbuilder"
	"k8s.io/kubernetes/pkg/controller/endpointslicemirroring"
	sacontroller "k8s.io/kubernetes/pkg/controller/serviceaccount"
	"k8s.io/kubernetes/pkg/controller/validatingadmissionpolicystatus"
	k8ssa "k8s.io/kubernetes/pkg/serviceaccount"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/controllers/clusterdns"
	"github.com/waggle-io/waggle/controlplane/controllers/clusterroleaggregation"
	"github.com/waggle-io/waggle/controlplane/controllers/cronjob"
	"github.com/waggle-io/waggle/controlplane/controllers/daemonset"
	"github.com/waggle-io/waggle/controlplane/controllers/deployment"
	"github.com/waggle-io/waggle/controlplane/controllers/disruption"
	"github.com/waggle-io/waggle/controlplane/controllers/endpointslice"
	"github.com/waggle-io/waggle/controlplane/controllers/garbagecollector"
	"github.com/waggle-io/waggle/controlplane/controllers/job"
	"github.com/waggle-io/waggle/controlplane/controllers/lbipam"
	"github.com/waggle-io/waggle/controlplane/controllers/localpath"
	"github.com/waggle-io/waggle/controlplane/controllers/namespace"
	"github.com/waggle-io/waggle/controlplane/controllers/nodeipam"
	"github.com/waggle-io/waggle/controlplane/controllers/nodelifecycle"
	"github.com/waggle-io/waggle/controlplane/controllers/persistentvolume"
	"github.com/waggle-io/waggle/controlplane/controllers/podgc"
	"github.com/waggle-io/waggle/controlplane/controllers/replicaset"
	"github.com/waggle-io/waggle/controlplane/controllers/resourcequota"
	"github.com/waggle-io/waggle/controlplane/controllers/rootcacertpublisher"
	"github.com/waggle-io/waggle/controlplane/controllers/serviceaccount"
	"github.com/waggle-io/waggle/controlplane/controllers/statefulset"
	"github.com/waggle-io/waggle/controlplane/controllers/ttlafterfinished"
	"github.com/waggle-io/waggle/internal/apiclient"
	"github.com/waggle-io/waggle/internal/leaderelect"
	"github.com/waggle-io/waggle/internal/ops"
	"github.com/waggle-io/waggle/internal/secureserving"
)

// ErrInvalidConfig wraps every configuration error Run reports.
var ErrInvalidConfig = errors.New("invalid controller-manager config")

// DefaultPort is the controller-manager's HTTPS health and metrics port, as
// kube-controller-manager's.
const DefaultPort = 10257

// Config is the controller-manager's configuration; cmd/waggle fills it from
// flags.
type Config struct {
	// Kubeconfig is the path of the kubeconfig to reach the API server; empty
	// means in-cluster configuration. RestConfig, when set (tests, `waggle
	// up`), is used instead.
	Kubeconfig string
	RestConfig *rest.Config
	// KubeAPIContentType is --kube-api-content-type: the media type of the
	// clients' requests, asked for first in responses. Protobuf by
	// default, as kube-controller-manager's, with JSON accepted after it;
	// "application/json" for JSON only (empty: protobuf). It applies to
	// RestConfig too. The dynamic clients (custom resources: the garbage
	// collector, namespace deletion) always speak JSON and the metadata
	// clients protobuf, as client-go sets them whatever the base config
	// (see the README's "Wire format").
	KubeAPIContentType string

	// SecureServing is where /healthz, /livez, /readyz and /metrics are
	// served: HTTPS with delegated authentication and authorization, as
	// kube-controller-manager serves port 10257 (SecurePort 0: off).
	SecureServing secureserving.Options

	// Controllers selects controllers as kube-controller-manager's
	// --controllers does: "*" is every controller, "foo" enables foo,
	// "-foo" disables it.
	Controllers []string

	// UseServiceAccountCredentials runs each controller as its own
	// kube-system ServiceAccount (ControllerServiceAccount), with a bound
	// token from TokenRequest, instead of the controller-manager's identity,
	// as kube-controller-manager's --use-service-account-credentials (which
	// kubeadm turns on): each holds only its system:controller:* role.
	UseServiceAccountCredentials bool

	LeaderElection leaderelect.Config

	// Worker counts per controller.
	ConcurrentReplicaSetSyncs     int
	ConcurrentDeploymentSyncs     int
	ConcurrentDaemonSetSyncs      int
	ConcurrentEndpointSliceSyncs  int
	ConcurrentEndpointSyncs       int
	ConcurrentGCSyncs             int
	ConcurrentNamespaceSyncs      int
	ConcurrentServiceAccountSyncs int
	// ConcurrentServiceAccountTokenSyncs are the token controller's workers.
	ConcurrentServiceAccountTokenSyncs int
	ConcurrentJobSyncs                 int
	ConcurrentRCSyncs                  int
	ConcurrentStatefulSetSyncs         int
	ConcurrentCronJobSyncs             int
	ConcurrentTTLSyncs                 int
	ConcurrentResourceQuotaSyncs       int
	// ConcurrentHPASyncs are the HorizontalPodAutoscaler workers (5).
	ConcurrentHPASyncs int

	// The HorizontalPodAutoscaler controller's tuning, upstream's flags and
	// defaults: every HPA is synced each HPASyncPeriod (15s); a scale-down
	// goes no lower than the highest recommendation of the last
	// HPADownscaleStabilization (5m, an HPA's behavior may override it); a
	// usage ratio within HPATolerance (0.1) of 1 changes nothing; CPU
	// samples of pods started less than HPACPUInitializationPeriod (5m) ago
	// count only once the pod has been ready a whole metrics window; a pod
	// whose readiness last changed within HPAInitialReadinessDelay (30s) of
	// its start is taken as not yet ready.
	HPASyncPeriod              time.Duration
	HPADownscaleStabilization  time.Duration
	HPATolerance               float64
	HPACPUInitializationPeriod time.Duration
	HPAInitialReadinessDelay   time.Duration

	// ResourceQuotaSyncPeriod: every quota's usage is recalculated in full
	// this often (5m), besides on every change.
	ResourceQuotaSyncPeriod time.Duration

	// TerminatedPodGCThreshold: terminated pods kept before the pod GC
	// deletes the oldest (12500; ≤ 0 keeps all). PodGCPeriod and
	// PodGCQuarantine: how often it runs (20s) and how long a node must be
	// gone before its pods are deleted (40s).
	TerminatedPodGCThreshold int
	PodGCPeriod              time.Duration
	PodGCQuarantine          time.Duration

	// JobPodFailureBackoff is the Job controller's delay before replacing
	// the first failed pod (10s, doubling per consecutive failure).
	JobPodFailureBackoff time.Duration

	// MaxEndpointsPerSlice caps the endpoints of one EndpointSlice (100).
	MaxEndpointsPerSlice int

	// Node IPAM and lifecycle (the node controllers).
	AllocateNodeCIDRs      bool
	ClusterCIDR            string
	NodeCIDRMaskSize       int
	NodeCIDRMaskSizeIPv6   int
	NodeMonitorGracePeriod time.Duration
	NodeMonitorPeriod      time.Duration
	NodeStartupGracePeriod time.Duration

	// ClusterDNSIP is the kube-dns Service's ClusterIP (empty: the clusterdns
	// controller does not run); ClusterDNSPort the node servers' port.
	ClusterDNSIP   string
	ClusterDNSPort int32

	// RootCAFile is the CA bundle the root-ca-cert-publisher puts in every
	// namespace's kube-root-ca.crt ConfigMap; empty uses the CA the
	// controller-manager itself trusts the API server with (its kubeconfig's),
	// as kube-controller-manager does.
	RootCAFile string

	// ClusterSigningCertFile and ClusterSigningKeyFile are the CA the
	// csrsigning controller signs approved CSRs with (the cluster CA);
	// ClusterSigningDuration the longest certificate it issues (a CSR's
	// spec.expirationSeconds may ask for less; default one year).
	ClusterSigningCertFile string
	ClusterSigningKeyFile  string
	ClusterSigningDuration time.Duration
	// LoadBalancerIPPools are --loadbalancer-ip-pool: CIDRs or first-last
	// ranges LoadBalancer Services get their addresses from (empty: the
	// lb-ipam controller does not run).
	LoadBalancerIPPools []string
	// LocalPathDir is --local-path-dir: the directory on every node under
	// which the local-path provisioner puts its volumes.
	LocalPathDir string
	// LocalPathHelperImage is --local-path-helper-image: the image of the
	// helper pods that remove deleted local-path volumes' directories on
	// their nodes (localpath.Options.HelperImage; empty: left on the node).
	LocalPathHelperImage string

	// ServiceAccountPrivateKeyFile is --service-account-private-key-file:
	// the key the serviceaccount-token controller signs legacy tokens of
	// kubernetes.io/service-account-token Secrets with (empty: that
	// controller does not run).
	ServiceAccountPrivateKeyFile string

	// ResyncPeriod of the shared informers (0: none).
	ResyncPeriod time.Duration

	LogLevel string
	// Log, when set, is used instead of a logger built from LogLevel.
	Log *slog.Logger
}

// DefaultConfig returns the defaults the flags also use.
func DefaultConfig() Config {
	return Config{
		SecureServing:                      secureserving.Defaults(DefaultPort),
		Controllers:                        []string{"*"},
		KubeAPIContentType:                 apiclient.Protobuf,
		LocalPathDir:                       localpath.DefaultDir,
		ConcurrentReplicaSetSyncs:          5,
		ConcurrentDeploymentSyncs:          5,
		ConcurrentDaemonSetSyncs:           2,
		ConcurrentEndpointSliceSyncs:       5,
		ConcurrentEndpointSyncs:            5,
		ConcurrentGCSyncs:                  20,
		ConcurrentNamespaceSyncs:           10,
		ConcurrentServiceAccountSyncs:      5,
		ConcurrentServiceAccountTokenSyncs: 5,
		ConcurrentJobSyncs:                 5,
		ConcurrentRCSyncs:                  5,
		ConcurrentStatefulSetSyncs:         5,
		ConcurrentCronJobSyncs:             5,
		ConcurrentTTLSyncs:                 5,
		ConcurrentResourceQuotaSyncs:       resourcequota.DefaultWorkers,
		ResourceQuotaSyncPeriod:            resourcequota.DefaultResyncPeriod,
		ConcurrentHPASyncs:                 5,
		HPASyncPeriod:                      15 * time.Second,
		HPADownscaleStabilization:          5 * time.Minute,
		HPATolerance:                       0.1,
		HPACPUInitializationPeriod:         5 * time.Minute,
		HPAInitialReadinessDelay:           30 * time.Second,
		JobPodFailureBackoff:               job.DefaultPodFailureBackoff,
		TerminatedPodGCThreshold:           podgc.DefaultThreshold,
		PodGCPeriod:                        podgc.DefaultPeriod,
		PodGCQuarantine:                    podgc.DefaultQuarantine,
		MaxEndpointsPerSlice:               100,
		ClusterSigningDuration:             365 * 24 * time.Hour,
		NodeCIDRMaskSize:                   24,
		NodeMonitorGracePeriod:             40 * time.Second,
		NodeMonitorPeriod:                  5 * time.Second,
		NodeStartupGracePeriod:             60 * time.Second,
		LogLevel:                           "info",
		LeaderElection: leaderelect.Config{
			Enabled: true, LeaseName: "kube-controller-manager", LeaseNamespace: leaderelect.DefaultLeaseNamespace,
			LeaseDuration: leaderelect.DefaultLeaseDuration, RenewDeadline: leaderelect.DefaultRenewDeadline,
			RetryPeriod: leaderelect.DefaultRetryPeriod,
		},
	}
}

// Deps is what a controller is started with.
type Deps struct {
	// Ctx is the leader's context (upstream's constructors take one).
	Ctx    context.Context
	Client kubernetes.Interface
	// RestConfig is the client configuration Client was built from (for
	// clients of other API groups: scale, metrics).
	RestConfig *rest.Config
	Dynamic    dynamic.Interface
	// Metadata is the metadata-only client (the ResourceQuota controller
	// counts arbitrary resources through it).
	Metadata metadata.Interface
	Factory  informers.SharedInformerFactory
	// InformersStarted is closed once Factory has been started (after every
	// controller was built); informers added later are started by whoever
	// adds them.
	InformersStarted <-chan struct{}
	Log              *slog.Logger
	Config           *Config
	// RootCA is the CA bundle to publish (see Config.RootCAFile).
	RootCA []byte
	// serviceAccounts, under --use-service-account-credentials, gives each
	// controller its own ServiceAccount's clients (forController).
	serviceAccounts clientbuilder.ControllerClientBuilder
}

// starter builds one controller and returns its run function.
type starter struct {
	name string
	// serviceAccount is the kube-system ServiceAccount the controller runs
	// as under --use-service-account-credentials: the one
	// kube-controller-manager uses for the same controller, whose
	// system:controller:<name> ClusterRole upstream's bootstrap policy
	// binds to it. Where one Waggle controller does the work of two
	// upstream ones it runs as the first, and the bootstrap policy
	// (controlplane/apiserver/authz/rbac/bootstrap) binds the second role
	// to it too; Waggle's own controllers have their roles bound there.
	// Empty (serviceaccount-token, which mints the tokens): the
	// controller-manager's own credentials, as upstream's root client.
	serviceAccount string
	// off: disabled unless named explicitly (as kube's "bootstrapsigner").
	off   bool
	build func(d Deps) (run func(ctx context.Context), err error)
}

// KnownControllers lists every controller name, in start order.
func KnownControllers() []string {
	var names []string
	for _, s := range starters() {
		names = append(names, s.name)
	}
	return names
}

// Enabled reports whether name is enabled by the --controllers list.
func Enabled(list []string, name string, offByDefault bool) bool {
	star := false
	for _, c := range list {
		switch {
		case c == name:
			return true
		case c == "-"+name:
			return false
		case c == "*":
			star = true
		}
	}
	return star && !offByDefault
}

func (c *Config) validate() error {
	var errs []error
	known := KnownControllers()
	for _, n := range c.Controllers {
		n = strings.TrimPrefix(n, "-")
		if n != "*" && !slices.Contains(known, n) {
			errs = append(errs, fmt.Errorf("--controllers: unknown controller %q (known: %s)", n, strings.Join(known, ", ")))
		}
	}
	if err := c.SecureServing.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch c.KubeAPIContentType {
	case "", apiclient.Protobuf, apiclient.JSON:
	default:
		errs = append(errs, fmt.Errorf("--kube-api-content-type %q: want %s or %s", c.KubeAPIContentType, apiclient.Protobuf, apiclient.JSON))
	}
	if c.ClusterDNSIP != "" {
		if _, err := netip.ParseAddr(c.ClusterDNSIP); err != nil {
			errs = append(errs, fmt.Errorf("--cluster-dns-ip %q: %w", c.ClusterDNSIP, err))
		}
	}
	if c.MaxEndpointsPerSlice < 1 || c.MaxEndpointsPerSlice > 1000 {
		errs = append(errs, fmt.Errorf("--max-endpoints-per-slice %d must be within 1..1000", c.MaxEndpointsPerSlice))
	}
	if c.AllocateNodeCIDRs {
		// One CIDR, or IPv4,IPv6 for dual-stack; the node IPAM controller
		// checks the masks against them.
		for _, part := range strings.Split(c.ClusterCIDR, ",") {
			if _, err := netip.ParsePrefix(strings.TrimSpace(part)); err != nil {
				errs = append(errs, fmt.Errorf("--allocate-node-cidrs needs --cluster-cidr: %q: %w", c.ClusterCIDR, err))
				break
			}
		}
		if c.NodeCIDRMaskSize < 0 || c.NodeCIDRMaskSize > 128 || c.NodeCIDRMaskSizeIPv6 < 0 || c.NodeCIDRMaskSizeIPv6 > 128 {
			errs = append(errs, fmt.Errorf("--node-cidr-mask-size %d / --node-cidr-mask-size-ipv6 %d out of range", c.NodeCIDRMaskSize, c.NodeCIDRMaskSizeIPv6))
		}
	}
	if _, err := lbipam.ParsePools(c.LoadBalancerIPPools); err != nil {
		errs = append(errs, err)
	}
	if c.NodeMonitorGracePeriod <= 0 || c.NodeMonitorPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--node-monitor-grace-period (%v) and --node-monitor-period (%v) must be positive", c.NodeMonitorGracePeriod, c.NodeMonitorPeriod))
	}
	if c.ConcurrentHPASyncs < 1 {
		errs = append(errs, fmt.Errorf("--concurrent-horizontal-pod-autoscaler-syncs must be greater than 0, but got %d", c.ConcurrentHPASyncs))
	}
	if c.HPASyncPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--horizontal-pod-autoscaler-sync-period %v must be positive", c.HPASyncPeriod))
	}
	if c.HPATolerance < 0 || c.HPADownscaleStabilization < 0 || c.HPACPUInitializationPeriod < 0 || c.HPAInitialReadinessDelay < 0 {
		errs = append(errs, fmt.Errorf("--horizontal-pod-autoscaler-tolerance (%v), -downscale-stabilization (%v), -cpu-initialization-period (%v) and -initial-readiness-delay (%v) must not be negative",
			c.HPATolerance, c.HPADownscaleStabilization, c.HPACPUInitializationPeriod, c.HPAInitialReadinessDelay))
	}
	if err := c.LeaderElection.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// restConfig is the controllers' client configuration: RestConfig, or
// Kubeconfig's (in-cluster without one), speaking KubeAPIContentType.
func (c *Config) restConfig() (*rest.Config, error) {
	rc := c.RestConfig
	if rc == nil {
		var err error
		if c.Kubeconfig == "" {
			rc, err = rest.InClusterConfig()
		} else {
			rc, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		}
		if err != nil {
			return nil, fmt.Errorf("client config (--kubeconfig %q): %w", c.Kubeconfig, err)
		}
	}
	rc = rest.CopyConfig(rc)
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 200, 400
	}
	rc.UserAgent = "waggle-controller-manager"
	contentType := c.KubeAPIContentType
	if contentType == "" {
		contentType = apiclient.Protobuf
	}
	// Protobuf by default, as kube-controller-manager's
	// --kube-api-content-type.
	apiclient.SetContentType(rc, contentType)
	return rc, nil
}

// useConfig gives d the clients of rc: typed (rc's content type), dynamic
// (JSON, whatever rc says: client-go sets it) and metadata-only.
func (d *Deps) useConfig(rc *rest.Config) error {
	var err error
	d.RestConfig = rc
	if d.Client, err = kubernetes.NewForConfig(rc); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if d.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	if d.Metadata, err = metadata.NewForConfig(rc); err != nil {
		return fmt.Errorf("metadata client: %w", err)
	}
	return nil
}

// Run runs the controller-manager until ctx ends (or it loses the lease).
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	log := cfg.Log
	if log == nil {
		l, err := ops.NewLogger("controller-manager", cfg.LogLevel)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		log = l
	}
	rc, err := cfg.restConfig()
	if err != nil {
		return err
	}
	rootCA, err := rootCABundle(cfg.RootCAFile, rc)
	if err != nil {
		return err
	}
	var own Deps
	if err := own.useConfig(rc); err != nil {
		return err
	}
	cs := own.Client

	health := ops.NewHealth()
	// The work queue metrics (workqueue_depth{name=<controller>}, ...) and
	// those of upstream's own controllers are in component-base's registry.
	health.AddGatherer(legacyregistry.DefaultGatherer)
	var leading, synced atomic.Bool
	health.AddReadiness(ops.Check{Name: "informers-synced", Func: func(context.Context) error {
		if leading.Load() && !synced.Load() {
			return errors.New("informer caches not synced yet")
		}
		return nil
	}})
	health.AddLiveness(ops.Check{Name: "ping", Func: func(context.Context) error { return nil }})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	serveErr := make(chan error, 1)
	srv, err := secureserving.New(cfg.SecureServing, "kube-controller-manager", rc, health.Handler(), log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ctx); err != nil {
			serveErr <- err
			cancel()
		}
	}()

	leErr := leaderelect.Run(ctx, log, cs, cfg.LeaderElection, func(ctx context.Context) {
		leading.Store(true)
		defer leading.Store(false)
		d := own
		d.Log, d.Config, d.RootCA = log, &cfg, rootCA
		if cfg.UseServiceAccountCredentials {
			d.serviceAccounts = serviceAccountClients(rc, cs)
		}
		runControllers(ctx, d, &synced)
	})
	cancel()
	wg.Wait()
	select {
	case err := <-serveErr:
		return err
	default:
	}
	return leErr
}

// runControllers builds the factory and every enabled controller, starts
// them, and blocks until ctx ends and they have stopped.
func runControllers(ctx context.Context, d Deps, synced *atomic.Bool) {
	d.Factory = informers.NewSharedInformerFactory(d.Client, d.Config.ResyncPeriod)
	started := make(chan struct{})
	d.InformersStarted = started
	d.Ctx = ctx
	var runs []func(context.Context)
	for _, s := range starters() {
		if !Enabled(d.Config.Controllers, s.name, s.off) {
			d.Log.Info("controller disabled", "controller", s.name)
			continue
		}
		cd, err := d.forController(s.serviceAccount)
		if err != nil {
			d.Log.Error("controller not started", "controller", s.name, "err", err)
			continue
		}
		run, err := s.build(cd)
		if err != nil {
			d.Log.Info("controller not started", "controller", s.name, "reason", err)
			continue
		}
		runs = append(runs, run)
	}
	d.Factory.Start(ctx.Done())
	close(started)
	var wg sync.WaitGroup
	for _, run := range runs {
		wg.Add(1)
		go func() { defer wg.Done(); run(ctx) }()
	}
	go func() {
		for _, ok := range d.Factory.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return
			}
		}
		synced.Store(true)
	}()
	<-ctx.Done()
	wg.Wait()
	d.Factory.Shutdown()
	synced.Store(false)
}

func starters() []starter {
	return slices.Concat(coreStarters(), autoscalingStarters(), certificateStarters())
}

func coreStarters() []starter {
	return []starter{
		{name: replicaset.Name, serviceAccount: "replicaset-controller", build: func(d Deps) (func(context.Context), error) {
			c := replicaset.New(d.Client, d.Factory, d.Log, replicaset.Options{})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentReplicaSetSyncs) }, nil
		}},
		{name: replicaset.RCName, serviceAccount: "replication-controller", build: func(d Deps) (func(context.Context), error) {
			if err := served(d, "v1", "replicationcontrollers"); err != nil {
				return nil, err
			}
			c := replicaset.NewReplicationController(d.Client, d.Factory, d.Log, replicaset.Options{})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentRCSyncs) }, nil
		}},
		{name: deployment.Name, serviceAccount: "deployment-controller", build: func(d Deps) (func(context.Context), error) {
			c := deployment.New(d.Client, d.Factory, d.Log, deployment.Options{})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentDeploymentSyncs) }, nil
		}},
		{name: daemonset.Name, serviceAccount: "daemon-set-controller", build: func(d Deps) (func(context.Context), error) {
			c := daemonset.New(d.Client, d.Factory, d.Log, daemonset.Options{Revisions: served(d, "apps/v1", "controllerrevisions") == nil})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentDaemonSetSyncs) }, nil
		}},
		{name: endpointslice.Name, serviceAccount: "endpointslice-controller", build: func(d Deps) (func(context.Context), error) {
			c := endpointslice.New(d.Client, d.Factory, d.Log, endpointslice.Options{
				MaxEndpointsPerSlice: d.Config.MaxEndpointsPerSlice, EndpointsWorkers: d.Config.ConcurrentEndpointSyncs})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentEndpointSliceSyncs) }, nil
		}},
		{name: "endpointslicemirroring", serviceAccount: "endpointslicemirroring-controller", build: func(d Deps) (func(context.Context), error) {
			// kube-controller-manager's own controller: it mirrors the
			// Endpoints of Services without a selector (custom Endpoints)
			// into EndpointSlices managed by
			// endpointslicemirroring-controller.k8s.io, skipping Endpoints
			// labelled endpointslice.kubernetes.io/skip-mirror (those the
			// endpoints controller writes). Upstream's defaults: 1000
			// addresses per subset, no batching.
			c := endpointslicemirroring.NewController(d.Ctx, d.Factory.Core().V1().Endpoints(),
				d.Factory.Discovery().V1().EndpointSlices(), d.Factory.Core().V1().Services(),
				1000, d.Client, 0)
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentEndpointSliceSyncs) }, nil
		}},
		{name: clusterroleaggregation.Name, serviceAccount: "clusterrole-aggregation-controller", build: func(d Deps) (func(context.Context), error) {
			c := clusterroleaggregation.New(d.Client, d.Factory, d.Log)
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
		{name: rootcacertpublisher.Name, serviceAccount: "root-ca-cert-publisher", build: func(d Deps) (func(context.Context), error) {
			c, err := rootcacertpublisher.New(d.Client, d.Factory, d.Log, d.RootCA)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
		{name: "validatingadmissionpolicy-status-controller", serviceAccount: "validatingadmissionpolicy-status-controller", build: func(d Deps) (func(context.Context), error) {
			// kube-controller-manager's own controller: it type-checks each
			// ValidatingAdmissionPolicy's expressions against the OpenAPI
			// schemas the API server publishes and writes status.typeChecking.
			if err := served(d, "admissionregistration.k8s.io/v1", "validatingadmissionpolicies"); err != nil {
				return nil, err
			}
			disc := memory.NewMemCacheClient(d.Client.Discovery())
			mapper := restmapper.NewDeferredDiscoveryRESTMapper(disc)
			tc := &validatingpolicy.TypeChecker{SchemaResolver: &resolver.ClientDiscoveryResolver{Discovery: d.Client.Discovery()}, RestMapper: mapper}
			c, err := validatingadmissionpolicystatus.NewController(d.Factory.Admissionregistration().V1().ValidatingAdmissionPolicies(),
				d.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies(), tc)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) { c.Run(ctx, 5) }, nil
		}},
		{name: serviceaccount.Name, serviceAccount: "service-account-controller", build: func(d Deps) (func(context.Context), error) {
			c := serviceaccount.New(d.Client, d.Factory, d.Log, serviceaccount.Options{})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentServiceAccountSyncs) }, nil
		}},
		{name: "serviceaccount-token", build: func(d Deps) (func(context.Context), error) {
			if d.Config.ServiceAccountPrivateKeyFile == "" {
				return nil, errors.New("no --service-account-private-key-file")
			}
			key, err := keyutil.PrivateKeyFromFile(d.Config.ServiceAccountPrivateKeyFile)
			if err != nil {
				return nil, fmt.Errorf("--service-account-private-key-file: %w", err)
			}
			gen, err := k8ssa.JWTTokenGenerator(k8ssa.LegacyIssuer, key)
			if err != nil {
				return nil, err
			}
			// Upstream's own token controller: fills token, ca.crt and
			// namespace of kubernetes.io/service-account-token Secrets and
			// deletes those whose ServiceAccount is gone.
			c, err := sacontroller.NewTokensController(logr.FromSlogHandler(d.Log.Handler()), d.Factory.Core().V1().ServiceAccounts(),
				d.Factory.Core().V1().Secrets(), d.Client, sacontroller.TokensControllerOptions{TokenGenerator: gen, RootCA: d.RootCA})
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentServiceAccountTokenSyncs) }, nil
		}},
		{name: namespace.Name, serviceAccount: "namespace-controller", build: func(d Deps) (func(context.Context), error) {
			// Discovery on each namespace deleted, as upstream: a CRD or an
			// aggregated API added since is emptied too.
			c := namespace.New(d.Client, d.Factory, d.Log, namespace.Options{Dynamic: d.Dynamic,
				Discovery: discovery.ToDiscoveryInterfaceWithContext(d.Client.Discovery())})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentNamespaceSyncs) }, nil
		}},
		{name: nodeipam.Name, serviceAccount: "node-controller", build: func(d Deps) (func(context.Context), error) {
			if !d.Config.AllocateNodeCIDRs {
				return nil, errors.New("--allocate-node-cidrs is off")
			}
			c := nodeipam.New(d.Client, d.Factory, d.Log, nodeipam.Options{ClusterCIDR: d.Config.ClusterCIDR,
				NodeCIDRMaskSize: d.Config.NodeCIDRMaskSize, NodeCIDRMaskSizeIPv6: d.Config.NodeCIDRMaskSizeIPv6})
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
		{name: nodelifecycle.Name, serviceAccount: "node-controller", build: func(d Deps) (func(context.Context), error) {
			c := nodelifecycle.New(d.Client, d.Factory, d.Log, nodelifecycle.Options{
				NodeMonitorGracePeriod: d.Config.NodeMonitorGracePeriod, NodeMonitorPeriod: d.Config.NodeMonitorPeriod,
				NodeStartupGracePeriod: d.Config.NodeStartupGracePeriod})
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
		{name: statefulset.Name, serviceAccount: "statefulset-controller", build: func(d Deps) (func(context.Context), error) {
			for _, r := range []struct{ gv, res string }{{"apps/v1", "statefulsets"}, {"apps/v1", "controllerrevisions"}, {"v1", "persistentvolumeclaims"}} {
				if err := served(d, r.gv, r.res); err != nil {
					return nil, err
				}
			}
			c := statefulset.New(d.Client, d.Factory, d.Log)
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentStatefulSetSyncs) }, nil
		}},
		{name: job.Name, serviceAccount: "job-controller", build: func(d Deps) (func(context.Context), error) {
			if err := served(d, "batch/v1", "jobs"); err != nil {
				return nil, err
			}
			c := job.New(d.Client, d.Factory, d.Log, job.Options{PodFailureBackoff: d.Config.JobPodFailureBackoff})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentJobSyncs) }, nil
		}},
		{name: cronjob.Name, serviceAccount: "cronjob-controller", build: func(d Deps) (func(context.Context), error) {
			if err := served(d, "batch/v1", "cronjobs"); err != nil {
				return nil, err
			}
			c := cronjob.New(d.Client, d.Factory, d.Log, cronjob.Options{})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentCronJobSyncs) }, nil
		}},
		{name: ttlafterfinished.Name, serviceAccount: "ttl-after-finished-controller", build: func(d Deps) (func(context.Context), error) {
			if err := served(d, "batch/v1", "jobs"); err != nil {
				return nil, err
			}
			c := ttlafterfinished.New(d.Client, d.Factory, d.Log)
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentTTLSyncs) }, nil
		}},
		{name: clusterdns.Name, serviceAccount: "clusterdns", build: func(d Deps) (func(context.Context), error) {
			if d.Config.ClusterDNSIP == "" {
				return nil, errors.New("--cluster-dns-ip is not set")
			}
			c := clusterdns.New(d.Client, d.Factory, d.Log, clusterdns.Options{ClusterIP: d.Config.ClusterDNSIP, Port: d.Config.ClusterDNSPort})
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
		{name: disruption.Name, serviceAccount: "disruption-controller", build: func(d Deps) (func(context.Context), error) {
			for _, r := range []struct{ gv, res string }{{"policy/v1", "poddisruptionbudgets"}, {"apps/v1", "statefulsets"}, {"v1", "replicationcontrollers"}} {
				if err := served(d, r.gv, r.res); err != nil {
					return nil, err
				}
			}
			c := disruption.New(d.Client, d.Factory, d.Log)
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
		{name: podgc.Name, serviceAccount: "pod-garbage-collector", build: func(d Deps) (func(context.Context), error) {
			c := podgc.New(d.Client, d.Factory, d.Log, podgc.Options{TerminatedPodThreshold: d.Config.TerminatedPodGCThreshold,
				Period: d.Config.PodGCPeriod, Quarantine: d.Config.PodGCQuarantine})
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
		{name: lbipam.Name, serviceAccount: "service-controller", build: func(d Deps) (func(context.Context), error) {
			pools, err := lbipam.ParsePools(d.Config.LoadBalancerIPPools)
			if err != nil {
				return nil, err
			}
			if len(pools) == 0 {
				return nil, errors.New("--loadbalancer-ip-pool is not set")
			}
			c := lbipam.New(d.Client, d.Factory, d.Log, lbipam.Options{Pools: pools})
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
		{name: persistentvolume.Name, serviceAccount: "persistent-volume-binder", build: func(d Deps) (func(context.Context), error) {
			for _, r := range []struct{ gv, res string }{{"v1", "persistentvolumes"}, {"v1", "persistentvolumeclaims"}, {"storage.k8s.io/v1", "storageclasses"}} {
				if err := served(d, r.gv, r.res); err != nil {
					return nil, err
				}
			}
			c, err := persistentvolume.New(d.Ctx, d.Client, d.Factory, d.Log, 0)
			if err != nil {
				return nil, err
			}
			return c.Run, nil
		}},
		{name: localpath.Name, serviceAccount: "persistent-volume-binder", build: func(d Deps) (func(context.Context), error) {
			for _, r := range []struct{ gv, res string }{{"v1", "persistentvolumes"}, {"v1", "persistentvolumeclaims"}, {"storage.k8s.io/v1", "storageclasses"}} {
				if err := served(d, r.gv, r.res); err != nil {
					return nil, err
				}
			}
			c := localpath.New(d.Client, d.Factory, d.Log, localpath.Options{Dir: d.Config.LocalPathDir, HelperImage: d.Config.LocalPathHelperImage})
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
		{name: resourcequota.Name, serviceAccount: "resourcequota-controller", build: func(d Deps) (func(context.Context), error) {
			if err := served(d, "v1", "resourcequotas"); err != nil {
				return nil, err
			}
			c, err := resourcequota.New(d.Ctx, d.Client, d.Metadata, d.Factory, d.Log, resourcequota.Options{
				ResyncPeriod: d.Config.ResourceQuotaSyncPeriod, Ignored: catalog.QuotaIgnored(), InformersStarted: d.InformersStarted})
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentResourceQuotaSyncs) }, nil
		}},
		{name: garbagecollector.Name, serviceAccount: "generic-garbage-collector", build: func(d Deps) (func(context.Context), error) {
			c := garbagecollector.New(d.Client, d.Factory, d.Log, garbagecollector.Options{Dynamic: d.Dynamic, Resources: gcResources()})
			return func(ctx context.Context) { c.Run(ctx, d.Config.ConcurrentGCSyncs) }, nil
		}},
	}
}

// rootCABundle reads --root-ca-file, or else the CA of rc (inline or file).
func rootCABundle(file string, rc *rest.Config) ([]byte, error) {
	if file == "" {
		if len(rc.TLSClientConfig.CAData) > 0 {
			return rc.TLSClientConfig.CAData, nil
		}
		file = rc.TLSClientConfig.CAFile
	}
	if file == "" {
		return nil, nil // the publisher then refuses to start, saying why
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: --root-ca-file: %w", ErrInvalidConfig, err)
	}
	return b, nil
}

// served reports an error when the API server does not serve resource in
// groupVersion: its controller is not started (an informer on it would
// never sync, and would hold the manager's readiness).
func served(d Deps, groupVersion, resource string) error {
	list, err := d.Client.Discovery().ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return fmt.Errorf("discover %s: %w", groupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return nil
		}
	}
	return fmt.Errorf("the API server does not serve %s in %s", resource, groupVersion)
}

// gcResources lists what the garbage collector watches: every served
// resource that can be listed, watched and deleted, except events (as
// Kubernetes ignores them: many, short-lived, never owners).
func gcResources() []garbagecollector.Resource {
	var out []garbagecollector.Resource
	for _, r := range catalog.All() {
		// A second version of a store (autoscaling/v1 HPAs) holds the same
		// objects: the GC watches each store once, as upstream watches
		// preferred versions only.
		if r.Resource == "events" || r.StoredAs != nil || !slices.Contains(r.Verbs, "watch") || !slices.Contains(r.Verbs, "delete") {
			continue
		}
		out = append(out, garbagecollector.Resource{GVR: r.GroupVersionResource, Kind: r.Kind, Namespaced: r.Namespaced})
	}
	return out
}
