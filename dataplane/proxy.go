package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/waggle-io/waggle/dataplane/l2announce"
	"github.com/waggle-io/waggle/dataplane/policy"
	"github.com/waggle-io/waggle/internal/apilb"
	"github.com/waggle-io/waggle/internal/ops"
)

// Proxy modes.
const (
	ModeAuto     = "auto"
	ModeEBPF     = "ebpf"
	ModeIPTables = "iptables"
	ModeIPVS     = "ipvs"
)

// ModeConfig is what every backend constructor gets.
type ModeConfig struct {
	NodeName string
	// CgroupRoot is the cgroup v2 directory the eBPF programs attach to.
	CgroupRoot string
	// PinDir is where the eBPF backend pins its maps and links.
	PinDir                                             string
	MaxServices, MaxBackends, MaxAffinity, MaxRevSocks int
	// IPVSScheduler is the IPVS scheduler (rr, wrr, lc, ...).
	IPVSScheduler string
	// NodePortDevices are the external devices on which the eBPF backend
	// serves NodePort, ExternalIP and LoadBalancer traffic from outside
	// (empty: only sockets on the node are load-balanced).
	NodePortDevices []string
	// MaglevTableSize is the eBPF north-south Maglev table size (a prime).
	MaglevTableSize int
	// LBAcceleration is --bpf-lb-acceleration: XDP on NodePortDevices
	// (ebpf.NorthSouth.Acceleration).
	LBAcceleration string
	// LBMode is --bpf-lb-mode: snat, dsr or hybrid
	// (ebpf.NorthSouth.LBMode).
	LBMode string
	// DisableTCX is --enable-tcx=false: the north-south tc programs as
	// clsact filters (ebpf.NorthSouth.DisableTCX).
	DisableTCX bool
	// NodePortNetNS is the network namespace of NodePortDevices (empty:
	// the caller's).
	NodePortNetNS string
	Log           *slog.Logger
	Metrics       prometheus.Registerer
}

// Mode is one proxy backend the proxy can run. The backends live in their
// own packages (which import this one), so the caller hands them in; see
// dataplane/modes.
type Mode struct {
	Name string
	// Supported says whether the kernel can run it (nil) or why not.
	Supported func() error
	// New builds the backend.
	New func(ModeConfig) (Backend, error)
	// Cleanup removes whatever this mode may have programmed, even where
	// the mode is not supported; it is idempotent.
	Cleanup func(context.Context, ModeConfig) error
	// LoopbackNodePorts: the mode serves NodePorts on 127.0.0.1 (the socket
	// level eBPF backend does; iptables and IPVS would need route_localnet).
	LoopbackNodePorts bool
	// AutoCandidate: auto may pick this mode (ebpf, then iptables).
	AutoCandidate bool
}

// Config is `waggle proxy`'s configuration.
type Config struct {
	// Kubeconfig is the path of a kubeconfig; empty means in-cluster.
	Kubeconfig string
	// Client, when set, is used instead of Kubeconfig (waggle up, tests).
	Client kubernetes.Interface
	// NodeName is this node's name (--hostname-override).
	NodeName string
	// Mode is auto, ebpf, iptables or ipvs.
	Mode string
	// Modes are the backends available, in auto's order of preference.
	Modes                                              []Mode
	CgroupRoot                                         string
	BPFPinDir                                          string
	MaxServices, MaxBackends, MaxAffinity, MaxRevSocks int
	IPVSScheduler                                      string
	// NodePortDevices: --nodeport-devices (ModeConfig.NodePortDevices).
	NodePortDevices []string
	// MaglevTableSize: --bpf-lb-maglev-table-size.
	MaglevTableSize int
	// LBAcceleration: --bpf-lb-acceleration (ModeConfig.LBAcceleration).
	LBAcceleration string
	// LBMode: --bpf-lb-mode (ModeConfig.LBMode).
	LBMode string
	// DisableTCX: --enable-tcx=false (ModeConfig.DisableTCX).
	DisableTCX bool
	// NoHealthCheckNodePorts: do not serve healthCheckNodePorts (the
	// default serves them, as kube-proxy).
	NoHealthCheckNodePorts bool
	// NoL2Announcements: with NodePortDevices, do not answer ARP for
	// LoadBalancer IPs (l2announce; the default does).
	NoL2Announcements bool
	// NodePortNetNS is the network namespace of NodePortDevices (empty:
	// the proxy's own; tests and benchmarks).
	NodePortNetNS string
	// ClusterCIDRs are the pod networks (masquerade decisions).
	ClusterCIDRs []netip.Prefix
	// HealthBindAddress serves /healthz, /readyz and /metrics ("" or "0"
	// disables).
	HealthBindAddress string
	// Cleanup removes what every mode programmed, then returns.
	Cleanup bool
	// SyncPeriod is the longest time between syncs: the periodic full
	// reconcile that repairs drift (default 30 min in `waggle proxy`).
	SyncPeriod time.Duration
	// MinSyncPeriod is the shortest time between syncs, for backends that
	// rewrite everything per sync (iptables, ipvs). Backends that program
	// changes incrementally (ebpf) sync each change at once and batch only
	// what arrives while a sync runs.
	MinSyncPeriod time.Duration
	// UnhealthyAfter: /healthz fails once syncs have been failing for this
	// long without a success in between (default 1 min).
	UnhealthyAfter time.Duration
	// Log is the logger (default: a text logger at info).
	Log *slog.Logger
	// Health, when set, receives the checks and metrics (default: a new one
	// served on HealthBindAddress).
	Health *ops.Health
	// NetworkPolicy is --network-policy: auto (default; eBPF where the
	// kernel allows, else iptables), ebpf, iptables or off. Enforcement (dataplane/policy) runs
	// beside the proxy with its client; its failure stops the proxy.
	NetworkPolicy string
	// PolicyMonitorAllows also reports allowed flows to `waggle bpf monitor`.
	PolicyMonitorAllows bool
}

// policyPinDir is where NetworkPolicy's maps and links are pinned.
func (c *Config) policyPinDir() string {
	if c.BPFPinDir != "" {
		return policy.DefaultPinDir(c.BPFPinDir)
	}
	return policy.DefaultPinDir(policy.DefaultPinRoot + "/" + c.NodeName)
}

// Sentinel errors of Run.
var (
	// ErrBadConfig: a flag is missing or wrong.
	ErrBadConfig = errors.New("invalid proxy configuration")
)

func (c *Config) validate() error {
	if c.NodeName == "" {
		return fmt.Errorf("%w: --hostname-override (node name) is required", ErrBadConfig)
	}
	if c.SyncPeriod <= 0 {
		return fmt.Errorf("%w: --sync-period must be positive", ErrBadConfig)
	}
	if c.MinSyncPeriod < 0 || c.MinSyncPeriod > c.SyncPeriod {
		return fmt.Errorf("%w: --min-sync-period must be between 0 and --sync-period", ErrBadConfig)
	}
	var cidrs []netip.Prefix
	for _, p := range c.ClusterCIDRs {
		if p.IsValid() { // an unset CIDR is no CIDR
			cidrs = append(cidrs, p.Masked())
		}
	}
	c.ClusterCIDRs = cidrs
	switch c.NetworkPolicy {
	case "", policy.ModeAuto, policy.ModeEBPF, policy.ModeIPTables, policy.ModeOff:
	default:
		return fmt.Errorf("%w: --network-policy=%q: want auto, ebpf, iptables or off", ErrBadConfig, c.NetworkPolicy)
	}
	switch c.Mode {
	case ModeAuto, ModeEBPF, ModeIPTables, ModeIPVS:
	default:
		return fmt.Errorf("%w: --mode=%q: want auto, ebpf, iptables or ipvs", ErrBadConfig, c.Mode)
	}
	return nil
}

func (c *Config) modeConfig(log *slog.Logger, reg prometheus.Registerer) ModeConfig {
	return ModeConfig{
		NodeName: c.NodeName, CgroupRoot: c.CgroupRoot, PinDir: c.BPFPinDir,
		MaxServices: c.MaxServices, MaxBackends: c.MaxBackends, MaxAffinity: c.MaxAffinity, MaxRevSocks: c.MaxRevSocks,
		IPVSScheduler: c.IPVSScheduler, NodePortDevices: c.NodePortDevices, MaglevTableSize: c.MaglevTableSize,
		NodePortNetNS: c.NodePortNetNS, LBAcceleration: c.LBAcceleration, LBMode: c.LBMode, DisableTCX: c.DisableTCX,
		Log: log, Metrics: reg,
	}
}

// SelectMode picks the mode to run: the one asked for, which must be
// supported, or for auto the first supported AutoCandidate. It returns why.
func SelectMode(requested string, modes []Mode) (Mode, string, error) {
	if requested != ModeAuto {
		for _, m := range modes {
			if m.Name != requested {
				continue
			}
			if err := m.Supported(); err != nil {
				return Mode{}, "", fmt.Errorf("--mode=%s cannot run on this machine: %w", requested, err)
			}
			return m, "asked for with --mode", nil
		}
		return Mode{}, "", fmt.Errorf("%w: --mode=%s is not built into this binary", ErrBadConfig, requested)
	}
	var why []string
	for _, m := range modes {
		if !m.AutoCandidate {
			continue
		}
		err := m.Supported()
		if err == nil {
			reason := "auto: " + m.Name + " is supported"
			for _, w := range why {
				reason += "; " + w
			}
			return m, reason, nil
		}
		why = append(why, fmt.Sprintf("%s not supported: %v", m.Name, err))
	}
	return Mode{}, "", fmt.Errorf("auto: no mode can run here: %v", why)
}

// Run runs the proxy until ctx ends (or, with Cleanup, cleans up and
// returns).
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Log
	if log == nil {
		var err error
		if log, err = ops.NewLogger("proxy", "info"); err != nil {
			return err
		}
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	health := cfg.Health
	if health == nil {
		health = ops.NewHealth()
	}
	if cfg.Cleanup {
		var perr error
		if cfg.NodeName != "" {
			perr = policy.Cleanup(cfg.policyPinDir())
		}
		perr = errors.Join(perr, policy.CleanupIPTables(""))
		return errors.Join(perr, cleanupModes(ctx, log, cfg.Modes, cfg.modeConfig(log, nil), ""))
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	mode, why, err := SelectMode(cfg.Mode, cfg.Modes)
	if err != nil {
		return err
	}
	log.Info("proxy mode selected", "mode", mode.Name, "why", why)
	mc := cfg.modeConfig(log, health.Registry)
	// Switching modes: remove what the other modes left behind.
	if err := cleanupModes(ctx, log, cfg.Modes, cfg.modeConfig(log, nil), mode.Name); err != nil {
		log.Warn("removing other modes' state", "err", err)
	}
	backend, err := mode.New(mc)
	if err != nil {
		return fmt.Errorf("start %s backend: %w", mode.Name, err)
	}
	if c, ok := backend.(interface{ Close() error }); ok {
		defer c.Close()
	}

	client := cfg.Client
	if client == nil {
		rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		if err != nil {
			return fmt.Errorf("kubeconfig %q: %w", cfg.Kubeconfig, err)
		}
		rc.UserAgent = "waggle-proxy/" + cfg.NodeName
		// Fail over between the API servers of an HA control plane.
		rc = apilb.Wrap(ctx, rc, log)
		if client, err = kubernetes.NewForConfig(rc); err != nil {
			return fmt.Errorf("API client: %w", err)
		}
	}
	p, err := newProxy(cfg, log, health, backend, mode, client)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	if cfg.NetworkPolicy == "" {
		cfg.NetworkPolicy = policy.ModeAuto
	}
	// A failing enforcement stops the proxy (and with it the informers).
	parent := ctx
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := policy.Run(ctx, policy.RunConfig{Mode: cfg.NetworkPolicy, NodeName: cfg.NodeName, PinDir: cfg.policyPinDir(),
			MonitorAllows: cfg.PolicyMonitorAllows, Client: client, Log: log.With("part", "networkpolicy"), Registerer: health.Registry})
		if err != nil {
			stop(fmt.Errorf("networkpolicy: %w", err))
		}
	}()
	if cfg.Health == nil && cfg.HealthBindAddress != "" && cfg.HealthBindAddress != "0" {
		// Listen now, so that a taken port is an error at start-up.
		ln, err := net.Listen("tcp", cfg.HealthBindAddress)
		if err != nil {
			return fmt.Errorf("--health-bind-address %s: %w", cfg.HealthBindAddress, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ops.ServeListener(ctx, log, ln, health.Handler()); err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		}()
	}
	if len(cfg.NodePortDevices) > 0 && mode.Name == ModeEBPF && !cfg.NoL2Announcements {
		a, err := l2announce.New(l2announce.Config{Client: client, NodeName: cfg.NodeName, Devices: cfg.NodePortDevices,
			NetNS: cfg.NodePortNetNS, Log: log.With("part", "l2-announcement")})
		if err != nil {
			return fmt.Errorf("L2 announcement of LoadBalancer IPs: %w", err)
		}
		p.l2, p.lbIPs = a, map[ServiceRef][]netip.Addr{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.Run(ctx)
		}()
	}
	runErr := p.run(ctx, errc)
	stop(nil)
	wg.Wait()
	if cause := context.Cause(ctx); runErr == nil && parent.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return runErr
}

func cleanupModes(ctx context.Context, log *slog.Logger, modes []Mode, mc ModeConfig, keep string) error {
	var errs []error
	for _, m := range modes {
		if m.Name == keep || m.Cleanup == nil {
			continue
		}
		if err := m.Cleanup(ctx, mc); err != nil {
			errs = append(errs, fmt.Errorf("clean up %s: %w", m.Name, err))
			continue
		}
		log.Info("cleaned up proxy mode", "mode", m.Name)
	}
	return errors.Join(errs...)
}

// proxy is the running `waggle proxy`: informers, the sync runner, metrics.
type proxy struct {
	cfg     Config
	log     *slog.Logger
	health  *ops.Health
	backend Backend
	mode    Mode
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
	nodes   informers.SharedInformerFactory
	// pods: this node's pods (their hostPorts are frontends).
	pods     informers.SharedInformerFactory
	recorder record.EventRecorder
	bcast    record.EventBroadcaster
	runner   *SyncRunner
	m        *metrics
	tracker  *Tracker
	// incr is the backend's incremental interface (nil: whole States only).
	incr IncrementalBackend
	// hc serves healthCheckNodePorts (nil: off).
	hc *serviceHealth
	// l2 announces LoadBalancer IPs (nil: off); lbIPs are each Service's
	// candidates, as last synced.
	l2    *l2announce.Announcer
	lbIPs map[ServiceRef][]netip.Addr

	mu          sync.Mutex
	synced      bool // informers synced
	programmed  time.Time
	pending     []time.Time // endpoint change times not yet programmed
	lastWarning map[string]string
	// needFull: the next sync hands the backend the whole State (first
	// sync, after an error not confined to frontends).
	needFull bool
	// failingSince: when the current run of failed syncs began (zero when
	// the last sync succeeded).
	failingSince time.Time
}

type metrics struct {
	syncDuration  *prometheus.HistogramVec
	syncErrors    prometheus.Counter
	changeLatency prometheus.Histogram
	services      prometheus.Gauge
	frontends     prometheus.Gauge
	endpoints     prometheus.Gauge
	lastSync      prometheus.Gauge
	mode          *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "waggle_proxy_sync_duration_seconds", Help: "Time to compute the desired state and program it, by kind (full, partial).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"kind"}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "waggle_proxy_sync_errors_total", Help: "Syncs whose programming failed."}),
		changeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "waggle_proxy_endpoint_change_to_programmed_seconds",
			Help:    "From an EndpointSlice change (its endpoints.kubernetes.io/last-change-trigger-time, else when the proxy saw it) to the backend having programmed it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		services:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "waggle_proxy_services_programmed", Help: "Services with at least one frontend programmed."}),
		frontends: prometheus.NewGauge(prometheus.GaugeOpts{Name: "waggle_proxy_frontends_programmed", Help: "Frontends (address, port, protocol) programmed."}),
		endpoints: prometheus.NewGauge(prometheus.GaugeOpts{Name: "waggle_proxy_endpoints_programmed", Help: "Endpoints programmed, summed over frontends."}),
		lastSync:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "waggle_proxy_last_sync_timestamp_seconds", Help: "When the last successful sync finished."}),
		mode:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "waggle_proxy_mode", Help: "The running proxy mode (1)."}, []string{"mode"}),
	}
	for _, c := range []prometheus.Collector{m.syncDuration, m.syncErrors, m.changeLatency, m.services, m.frontends, m.endpoints, m.lastSync, m.mode} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register proxy metrics: %w", err)
		}
	}
	return m, nil
}

func newProxy(cfg Config, log *slog.Logger, health *ops.Health, backend Backend, mode Mode, client kubernetes.Interface) (*proxy, error) {
	m, err := newMetrics(health.Registry)
	if err != nil {
		return nil, err
	}
	m.mode.WithLabelValues(mode.Name).Set(1)
	p := &proxy{
		cfg: cfg, log: log, health: health, backend: backend, mode: mode, client: client, m: m,
		factory: informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(slimObject)),
		nodes: informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(stripManagedFields),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
			})),
		pods: informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(stripManagedFields),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
			})),
		lastWarning: map[string]string{},
		tracker:     NewTracker(cfg.NodeName, !mode.LoopbackNodePorts),
		needFull:    true,
	}
	p.incr, _ = backend.(IncrementalBackend)
	p.bcast = record.NewBroadcaster()
	p.recorder = p.bcast.NewRecorder(scheme.Scheme, v1.EventSource{Component: "waggle-proxy", Host: cfg.NodeName})
	minSync := cfg.MinSyncPeriod
	if p.incr != nil {
		minSync = 0 // a sync costs O(change): write each change at once
	}
	p.runner = NewSyncRunner(minSync, cfg.SyncPeriod, p.sync)
	unhealthyAfter := cfg.UnhealthyAfter
	if unhealthyAfter <= 0 {
		unhealthyAfter = time.Minute
	}
	if !cfg.NoHealthCheckNodePorts {
		p.hc = newServiceHealth(cfg.NodeName, func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return !p.programmed.IsZero() && (p.failingSince.IsZero() || time.Since(p.failingSince) <= unhealthyAfter)
		})
	}

	health.AddReadiness(ops.Check{Name: "informers-synced", Func: func(context.Context) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.synced {
			return errors.New("initial lists of Services, EndpointSlices and Nodes not synced yet")
		}
		return nil
	}})
	health.AddReadiness(ops.Check{Name: "programmed", Func: func(context.Context) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.programmed.IsZero() {
			return errors.New("the dataplane has not been programmed yet")
		}
		return nil
	}})
	health.AddLiveness(ops.Check{Name: "sync", Func: func(context.Context) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		// As kube-proxy's healthz: unhealthy when programming is overdue.
		if p.synced && !p.programmed.IsZero() && time.Since(p.programmed) > 2*cfg.SyncPeriod+time.Minute {
			return fmt.Errorf("last successful sync was at %s", p.programmed.Format(time.RFC3339))
		}
		if !p.failingSince.IsZero() && time.Since(p.failingSince) > unhealthyAfter {
			return fmt.Errorf("syncs have been failing since %s", p.failingSince.Format(time.RFC3339))
		}
		return nil
	}})
	return p, nil
}

func (p *proxy) run(ctx context.Context, errc chan error) error {
	p.bcast.StartStructuredLogging(0)
	p.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.client.CoreV1().Events("")})
	defer p.bcast.Shutdown()

	var regs []cache.ResourceEventHandlerRegistration
	reg := func(r cache.ResourceEventHandlerRegistration, err error) error {
		regs = append(regs, r)
		return err
	}
	if err := reg(p.factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.serviceEvent(obj, false) },
		UpdateFunc: func(_, obj any) { p.serviceEvent(obj, false) },
		DeleteFunc: func(obj any) { p.serviceEvent(obj, true) },
	})); err != nil {
		return err
	}
	if err := reg(p.factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.sliceEvent(obj, false) },
		UpdateFunc: func(_, obj any) { p.sliceEvent(obj, false) },
		DeleteFunc: func(obj any) { p.sliceEvent(obj, true) },
	})); err != nil {
		return err
	}
	if err := reg(p.nodes.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.nodeEvent(obj, false) },
		UpdateFunc: func(_, obj any) { p.nodeEvent(obj, false) },
		DeleteFunc: func(obj any) { p.nodeEvent(obj, true) },
	})); err != nil {
		return err
	}
	if err := reg(p.pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.podEvent(obj, false) },
		UpdateFunc: func(_, obj any) { p.podEvent(obj, false) },
		DeleteFunc: func(obj any) { p.podEvent(obj, true) },
	})); err != nil {
		return err
	}
	if p.hc != nil {
		defer p.hc.close()
	}
	p.factory.Start(ctx.Done())
	p.nodes.Start(ctx.Done())
	p.pods.Start(ctx.Done())
	defer p.factory.Shutdown()
	defer p.nodes.Shutdown()
	defer p.pods.Shutdown()

	p.log.Info("waiting for the initial lists of Services, EndpointSlices, Nodes and this node's Pods")
	for typ, ok := range p.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync: %w", typ, ctx.Err())
		}
	}
	for typ, ok := range p.nodes.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync: %w", typ, ctx.Err())
		}
	}
	for typ, ok := range p.pods.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync: %w", typ, ctx.Err())
		}
	}
	// The tracker is fed by the handlers: wait until they have seen the
	// initial lists too, not only the informers' stores.
	hasSynced := make([]cache.InformerSynced, len(regs))
	for i, r := range regs {
		hasSynced[i] = r.HasSynced
	}
	if !cache.WaitForCacheSync(ctx.Done(), hasSynced...) {
		return fmt.Errorf("event handlers did not see the initial lists: %w", ctx.Err())
	}
	p.mu.Lock()
	p.synced = true
	p.mu.Unlock()
	p.log.Info("informers synced; programming the dataplane", "mode", p.mode.Name)
	p.runner.Trigger()
	done := make(chan struct{})
	go func() { p.runner.Loop(ctx); close(done) }()
	select {
	case <-ctx.Done():
		<-done
		return nil
	case err := <-errc:
		<-done
		return err
	}
}

// stripManagedFields drops metadata.managedFields from every object the
// informers cache, as kube-proxy does: the proxy never reads them, and in a
// cluster where several managers apply Services and EndpointSlices they
// can be a large part of each object. (In BenchmarkEndpointChangeToMap,
// whose objects carry one small entry each, the RSS did not change.)
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil && m.GetManagedFields() != nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// slimObject is the Service and EndpointSlice informers' transform:
// stripManagedFields, then internStrings.
func slimObject(obj any) (any, error) {
	obj, err := stripManagedFields(obj)
	internStrings(obj)
	return obj, err
}

// tombstone unwraps an informer's DeletedFinalStateUnknown.
func tombstone(obj any) any {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

func (p *proxy) serviceEvent(obj any, deleted bool) {
	if s, ok := tombstone(obj).(*v1.Service); ok {
		p.tracker.Service(s, deleted)
		p.runner.Trigger()
	}
}

func (p *proxy) sliceEvent(obj any, deleted bool) {
	if es, ok := tombstone(obj).(*discoveryv1.EndpointSlice); ok {
		p.noteEndpointChange(es)
		p.tracker.EndpointSlice(es, deleted)
		p.runner.Trigger()
	}
}

// podEvent feeds this node's pods to the tracker: their hostPorts. Pods
// without hostPorts cost a look at their ports and no sync.
func (p *proxy) podEvent(obj any, deleted bool) {
	pod, ok := tombstone(obj).(*v1.Pod)
	if !ok {
		return
	}
	p.tracker.Pod(pod, deleted)
	if p.tracker.Pending() {
		p.runner.Trigger()
	}
}

func (p *proxy) nodeEvent(obj any, deleted bool) {
	n, ok := tombstone(obj).(*v1.Node)
	if !ok || n.Name != p.cfg.NodeName {
		return
	}
	if deleted {
		n = nil
	}
	p.tracker.Node(n)
	p.runner.Trigger()
}

// noteEndpointChange records when an EndpointSlice change happened, for the
// change-to-programmed latency.
func (p *proxy) noteEndpointChange(es *discoveryv1.EndpointSlice) {
	t := time.Now()
	if s := es.Annotations[v1.EndpointsLastChangeTriggerTime]; s != "" {
		if parsed, err := time.Parse(time.RFC3339Nano, s); err == nil && !parsed.After(t) {
			t = parsed
		}
	}
	p.mu.Lock()
	p.pending = append(p.pending, t)
	p.mu.Unlock()
}

// sync is one run: drain the tracker's dirty Services and program them —
// as a Change for an incremental backend, else (and for full runs) as the
// whole State.
func (p *proxy) sync(ctx context.Context, full bool) error {
	start := time.Now()
	p.mu.Lock()
	pending := p.pending
	p.pending = nil
	whole := full || p.needFull || p.incr == nil
	p.mu.Unlock()

	if !p.tracker.HasNode() {
		p.warnOnce("no-node", "no Node object named like this node yet: NodePorts are served on 127.0.0.1 only (where the mode allows)", "node", p.cfg.NodeName)
	}
	ch := p.tracker.Drain(func(w Warning) {
		p.warn(p.tracker.ServiceObject(w.Service), w.Service.String(), w.Reason, w.Message)
	})
	kind := "partial"
	var err error
	switch {
	case whole:
		if full {
			kind = "full"
			if fr, ok := p.backend.(FullResyncer); ok {
				fr.RequestFullSync()
			}
		}
		err = p.backend.Sync(ctx, p.tracker.State(p.cfg.ClusterCIDRs))
	case !ch.Empty():
		err = p.incr.Apply(ctx, ch)
	}
	p.m.syncDuration.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	if err != nil {
		p.m.syncErrors.Inc()
		fes := FrontendErrors(err)
		var failed []ServiceRef
		for _, fe := range fes {
			reason := "SyncFailed"
			if errors.Is(fe.Err, ErrMapFull) {
				reason = ReasonMapFull
			}
			ref := ServiceRef{fe.Service.Namespace, fe.Service.Name}
			failed = append(failed, ref)
			p.warn(p.tracker.ServiceObject(ref), ref.String(), reason, fmt.Sprintf("%s %s was not programmed by the %s backend: %v", fe.Service, fe.Frontend, p.backend.Name(), fe.Err))
		}
		// Retry exactly the Services that failed; an error not confined
		// to frontends (a failed map write) makes the retry a whole sync.
		p.tracker.Requeue(failed...)
		p.mu.Lock()
		p.needFull = !onlyFrontendErrors(err)
		p.pending = append(pending, p.pending...)
		if p.failingSince.IsZero() {
			p.failingSince = start
		}
		p.mu.Unlock()
		p.log.Error("sync failed; retrying", "mode", p.backend.Name(), "kind", kind, "failedServices", len(failed), "err", err)
		return err
	}
	now := time.Now()
	for _, t := range pending {
		p.m.changeLatency.Observe(now.Sub(t).Seconds())
	}
	nsvc, nfronts, neps := p.tracker.Counts()
	p.m.services.Set(float64(nsvc))
	p.m.frontends.Set(float64(nfronts))
	p.m.endpoints.Set(float64(neps))
	p.m.lastSync.Set(float64(now.Unix()))
	p.mu.Lock()
	first := p.programmed.IsZero()
	p.programmed = now
	p.needFull = false
	p.failingSince = time.Time{}
	p.mu.Unlock()
	if p.hc != nil || p.l2 != nil {
		refs := ch.Services
		if whole {
			refs = p.tracker.ServiceRefs()
		}
		if p.hc != nil {
			p.hc.update(p.tracker, refs)
		}
		if p.l2 != nil {
			p.updateL2(refs)
		}
	}
	lvl := slog.LevelDebug
	if first || full {
		lvl = slog.LevelInfo
	}
	p.log.Log(ctx, lvl, "dataplane programmed", "mode", p.backend.Name(), "kind", kind, "changedServices", len(ch.Services),
		"services", nsvc, "frontends", nfronts, "endpoints", neps, "took", time.Since(start))
	return nil
}

// updateL2 re-reads the LoadBalancer IPs of refs and hands the announcer
// the new candidate set when it changed.
func (p *proxy) updateL2(refs []ServiceRef) {
	changed := false
	for _, r := range refs {
		ips := p.tracker.LoadBalancerIPs(r)
		if !slices.Equal(ips, p.lbIPs[r]) {
			changed = true
			if len(ips) == 0 {
				delete(p.lbIPs, r)
			} else {
				p.lbIPs[r] = ips
			}
		}
	}
	if !changed {
		return
	}
	var all []netip.Addr
	for _, ips := range p.lbIPs {
		all = append(all, ips...)
	}
	p.l2.SetCandidates(all)
}

// onlyFrontendErrors reports whether err consists of FrontendErrors alone
// (through errors.Join), so that retrying those frontends is enough.
func onlyFrontendErrors(err error) bool {
	switch e := err.(type) {
	case nil:
		return true
	case *FrontendError, *RejectedFrontends:
		return true
	case interface{ Unwrap() []error }:
		for _, x := range e.Unwrap() {
			if !onlyFrontendErrors(x) {
				return false
			}
		}
		return true
	}
	return false
}

// warnOnce logs msg the first time key is seen.
func (p *proxy) warnOnce(key, msg string, args ...any) {
	p.mu.Lock()
	_, seen := p.lastWarning[key]
	p.lastWarning[key] = msg
	p.mu.Unlock()
	if !seen {
		p.log.Warn(msg, args...)
	}
}

// warn logs a Service's problem and records an Event on it, once per
// distinct message.
func (p *proxy) warn(svc *v1.Service, name, reason, msg string) {
	if svc == nil { // a Service already gone: nothing to record on
		p.log.Warn("service problem", "service", name, "reason", reason, "msg", msg)
		return
	}
	key := name + "/" + reason
	p.mu.Lock()
	seen := p.lastWarning[key] == msg
	p.lastWarning[key] = msg
	p.mu.Unlock()
	if seen {
		return
	}
	p.log.Warn("service problem", "service", name, "reason", reason, "msg", msg)
	p.recorder.Event(svc, v1.EventTypeWarning, reason, msg)
}
