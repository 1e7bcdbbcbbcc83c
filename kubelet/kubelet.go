package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/kubernetes/pkg/kubelet/clustertrustbundle"
	"k8s.io/kubernetes/pkg/kubelet/podcertificate"
	"k8s.io/kubernetes/pkg/kubelet/token"

	"github.com/waggle-io/waggle/internal/apiclient"
	"github.com/waggle-io/waggle/internal/apilb"
	"github.com/waggle-io/waggle/internal/ops"
	"github.com/waggle-io/waggle/kubelet/internal/eviction"
	"github.com/waggle-io/waggle/kubelet/network"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// Deps are the kubelet's edges; New fills any left nil from the Config.
type Deps struct {
	Client  kubernetes.Interface
	Runtime runtime.Runtime
	Network network.Manager
	// Prober runs probes (nil: from the Config; hollow nodes pass every probe).
	Prober Prober
	// Recorder records Events (nil: one writing to the API server).
	Recorder record.EventRecorder
	Health   *ops.Health
}

// Kubelet is one running node agent.
type Kubelet struct {
	cfg    Config
	log    *slog.Logger
	client kubernetes.Interface
	// claimPaths maps "<pod uid>/<volume>" to the host directory of a
	// PersistentVolumeClaim volume, resolved by setUpVolume.
	claimPaths sync.Map
	rt         runtime.Runtime
	net        network.Manager
	prober     Prober
	recorder   record.EventRecorder
	health     *ops.Health
	// nodeIP is the primary InternalIP; nodeIPs every one (one per family
	// on a dual-stack node, primary first).
	nodeIP  string
	nodeIPs []string
	// hostNetNS is the network namespace hostNetwork pods join (hostNetNS());
	// hostNetNSFile holds it open.
	hostNetNS     string
	hostNetNSFile *os.File
	// tokens caches and renews the pods' projected service-account tokens.
	tokens *token.Manager
	// ctb serves clusterTrustBundle projections (upstream's lazy
	// informer manager: it starts its informer on first use).
	ctbOnce sync.Once
	ctb     clustertrustbundle.Manager
	// podCerts serves podCertificate projections (upstream's
	// IssuingManager, started on first use: podCertificates()).
	podCertsOnce sync.Once
	podCerts     atomic.Pointer[podcertificate.IssuingManager]

	mu       sync.Mutex
	nodeObj  *v1.Node
	workers  map[types.UID]*podWorker
	snapshot map[types.UID][]runtime.Container
	// snapshotAt is when the snapshot's listing began: what a worker
	// started or stopped after it is not in it yet.
	snapshotAt time.Time
	// sourcesReady is set once the API and static sources have listed:
	// only then are unknown containers and sandboxes orphans.
	sourcesReady atomic.Bool
	// imageVolumesSwept: cleanupOrphans has released the image volumes a
	// stopped kubelet left (once per start).
	imageVolumesSwept atomic.Bool
	relistMu          sync.Mutex
	// startSlots caps the container starts in flight (nil: no cap).
	startSlots chan struct{}
	relistKick chan struct{}
	relistDone chan struct{}
	backoff    *flowcontrol.Backoff
	probes     *probeManager
	static     *staticSource
	apiPortV   atomic.Int32
	podLister  func(ns, name string) (*v1.Pod, bool)
	// services lists every Service, for the pods' Service variables.
	services corelisters.ServiceLister

	runtimeErr atomic.Pointer[error]
	metrics    metrics
	// eviction is the eviction manager (node pressure conditions,
	// admission under pressure, evictions); imageGC collects unused images
	// by disk usage. Both are made in Run (startEviction).
	eviction *eviction.Manager
	imageGC  *imageGC
	// startedAt is the node's start time in /stats/summary.
	startedAt time.Time
	// cpu turns cumulative CPU counters into rates for /stats/summary.
	cpu cpuRates
	ctx context.Context
	// layerUsage caches the containers' writable-layer usage for the
	// stats summary (eviction.go).
	layerUsage layerUsageCache
}

type metrics struct {
	podStarts   prometheus.Counter
	syncs       prometheus.Counter
	syncErrors  prometheus.Counter
	running     prometheus.GaugeFunc
	startupSecs prometheus.Histogram
	// evictions and evictionStatsAge are upstream's kubelet_evictions and
	// kubelet_eviction_stats_age_seconds (by eviction_signal).
	evictions        *prometheus.CounterVec
	evictionStatsAge *prometheus.HistogramVec
	// ops are upstream's per-operation histograms (metrics.go).
	ops opMetrics
}

// Run runs a kubelet with cfg until ctx ends. Containers keep running when
// it returns: a restarted kubelet adopts them.
func Run(ctx context.Context, cfg Config) error {
	if cfg.BootstrapKubeconfig != "" {
		if err := tlsBootstrap(ctx, &cfg); err != nil {
			return err
		}
	}
	if cfg.RestConfig == nil && cfg.Kubeconfig != "" {
		var rc *rest.Config
		var err error
		if cfg.RotateCertificates {
			rc, err = rotatingClientConfig(ctx, &cfg)
			if err != nil {
				return err
			}
		} else if rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig); err != nil {
			return fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)
		}
		// Fail over between the API servers of an HA control plane.
		cfg.RestConfig = apilb.Wrap(ctx, rc, cfg.Log)
	}
	k, err := New(cfg, Deps{})
	if err != nil {
		return err
	}
	return k.Run(ctx)
}

// New builds a kubelet from cfg, using d's edges where given.
func New(cfg Config, d Deps) (*Kubelet, error) {
	if cfg.NodeName == "" {
		h, _ := os.Hostname()
		cfg.NodeName = h
	}
	if d.Client != nil && cfg.Kubeconfig == "" && cfg.RestConfig == nil {
		cfg.RestConfig = &rest.Config{}
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	k := &Kubelet{
		cfg: cfg, log: cfg.Log.With("node", cfg.NodeName),
		workers:    map[types.UID]*podWorker{},
		snapshot:   map[types.UID][]runtime.Container{},
		relistKick: make(chan struct{}, 1),
		relistDone: make(chan struct{}),
		backoff:    flowcontrol.NewBackOff(cfg.BackoffBase, cfg.BackoffMax),
		health:     d.Health,
		client:     d.Client,
		rt:         d.Runtime,
		net:        d.Network,
		prober:     d.Prober,
		recorder:   d.Recorder,
		startedAt:  time.Now().Truncate(time.Second),
	}
	if cfg.ParallelStarts > 0 {
		k.startSlots = make(chan struct{}, cfg.ParallelStarts)
	}
	if k.prober == nil {
		if cfg.Runtime == RuntimeHollow {
			k.prober = hollowProber{}
		} else {
			k.prober = actionProber{k}
		}
	}
	k.hostNetNS, k.hostNetNSFile = hostNetNS()
	// Validated by cfg.Validate above.
	ips, _ := ParseNodeIPs(cfg.NodeIP)
	for _, a := range ips {
		k.nodeIPs = append(k.nodeIPs, a.String())
	}
	if len(k.nodeIPs) == 0 {
		k.nodeIPs = []string{DefaultNodeIP()}
	}
	k.nodeIP = k.nodeIPs[0]
	if k.health == nil {
		k.health = ops.NewHealth()
	}
	if k.client == nil {
		rc := cfg.RestConfig
		if rc == nil {
			var err error
			rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)
			}
		}
		rc = rest.CopyConfig(rc)
		if rc.QPS == 0 {
			rc.QPS, rc.Burst = 100, 200
		}
		rc.UserAgent = "waggle-kubelet/" + cfg.NodeName
		apiclient.SetContentType(rc, cfg.KubeAPIContentType)
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("API client: %w", err)
		}
		k.client = cs
	}
	k.tokens = token.NewManager(k.client)
	k.probes = newProbeManager(k)
	k.registerMetrics()
	return k, nil
}

// trustBundles returns the ClusterTrustBundle manager, started on first use
// with the kubelet's context, as upstream's kubelet does
// (NewLazyInformerManager, cache of 2×maxPods entries).
func (k *Kubelet) trustBundles() clustertrustbundle.Manager {
	k.ctbOnce.Do(func() {
		ctx := k.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		k.ctb = clustertrustbundle.NewLazyInformerManager(ctx, k.client, 2*k.cfg.MaxPods)
	})
	return k.ctb
}

func (k *Kubelet) registerMetrics() {
	k.metrics.podStarts = prometheus.NewCounter(prometheus.CounterOpts{Name: "waggle_kubelet_container_starts_total", Help: "Containers started."})
	k.metrics.syncs = prometheus.NewCounter(prometheus.CounterOpts{Name: "waggle_kubelet_pod_syncs_total", Help: "Pod worker syncs."})
	k.metrics.syncErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "waggle_kubelet_pod_sync_errors_total", Help: "Pod worker syncs that failed."})
	k.metrics.running = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "waggle_kubelet_running_pods", Help: "Pods with a worker."}, func() float64 {
		k.mu.Lock()
		defer k.mu.Unlock()
		return float64(len(k.workers))
	})
	k.metrics.startupSecs = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "waggle_kubelet_pod_start_duration_seconds", Help: "From the first sync of a pod to all its containers running.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)})
	k.metrics.evictions = eviction.NewEvictionsCounter()
	k.metrics.evictionStatsAge = eviction.NewStatsAgeHistogram()
	k.metrics.ops = newOpMetrics()
	for _, c := range append([]prometheus.Collector{k.metrics.podStarts, k.metrics.syncs, k.metrics.syncErrors, k.metrics.running, k.metrics.startupSecs,
		k.metrics.evictions, k.metrics.evictionStatsAge}, k.metrics.ops.collectors()...) {
		k.health.Registry.Register(c)
	}
}

// Client returns the kubelet's API client.
func (k *Kubelet) Client() kubernetes.Interface { return k.client }

// Runtime returns the container runtime.
func (k *Kubelet) Runtime() runtime.Runtime { return k.rt }

// NodeName returns the node's name.
func (k *Kubelet) NodeName() string { return k.cfg.NodeName }

// Health returns the kubelet's health and metrics registry.
func (k *Kubelet) Health() *ops.Health { return k.health }

func (k *Kubelet) apiPort() int { return int(k.apiPortV.Load()) }

func (k *Kubelet) node() *v1.Node {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.nodeObj
}

func (k *Kubelet) setNode(n *v1.Node) {
	k.mu.Lock()
	k.nodeObj = n.DeepCopy()
	k.mu.Unlock()
}

func (k *Kubelet) runtimeHealthy() error {
	if p := k.runtimeErr.Load(); p != nil && *p != nil {
		return *p
	}
	if k.net != nil {
		if err := k.net.Ready(); err != nil {
			return fmt.Errorf("network not ready: %w", err)
		}
	}
	return nil
}

// Run runs the kubelet until ctx ends.
func (k *Kubelet) Run(ctx context.Context) error {
	k.ctx = ctx
	if k.hostNetNSFile != nil {
		defer k.hostNetNSFile.Close()
	}
	if err := os.MkdirAll(filepath.Join(k.cfg.RootDir, "pods"), 0o750); err != nil {
		return fmt.Errorf("kubelet root dir: %w", err)
	}
	if k.rt == nil {
		if err := k.buildRuntime(ctx); err != nil {
			return err
		}
		defer k.rt.Close()
	}
	if k.net == nil {
		k.buildNetwork()
	}
	defer k.startEvents(ctx)()
	srv, err := k.startServer(ctx)
	if err != nil {
		return err
	}
	k.health.AddLiveness(ops.Check{Name: "runtime", Func: func(ctx context.Context) error {
		_, _, err := k.rt.Version(ctx)
		return err
	}})
	k.health.AddReadiness(ops.Check{Name: "node-registered", Func: func(context.Context) error {
		if k.node() == nil {
			return errors.New("node not registered yet")
		}
		return nil
	}})
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := ops.Serve(ctx, k.log, k.cfg.HealthAddress, k.health.Handler()); err != nil {
			k.log.Error("health server", "err", err)
		}
	}()

	k.startEviction(ctx, &wg)

	n, err := k.registerNode(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("register node: %w", err)
	}
	k.setNode(n)
	if err := k.ensureCNIConfig(ctx); err != nil {
		return err
	}
	if err := k.updateNodeStatus(ctx); err != nil {
		k.log.Warn("update node status", "err", err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); k.heartbeat(ctx) }()
	k.startRouteController(ctx, &wg)

	// Adopt what the runtime has before any pod worker runs.
	k.relist(ctx)
	wg.Add(1)
	go func() { defer wg.Done(); k.relistLoop(ctx) }()

	factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.cfg.NodeName).String()
		}))
	podInf := factory.Core().V1().Pods()
	inf := podInf.Informer()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { k.podFromAPI(o.(*v1.Pod)) },
		UpdateFunc: func(_, o any) { k.podFromAPI(o.(*v1.Pod)) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if p, ok := o.(*v1.Pod); ok {
				k.podGoneFromAPI(p)
			}
		},
	})
	lister := podInf.Lister()
	k.podLister = func(ns, name string) (*v1.Pod, bool) {
		p, err := lister.Pods(ns).Get(name)
		return p, err == nil
	}
	if err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	// Services of every namespace, for the Service environment variables;
	// as upstream, no container starts before they have been listed once.
	svcFactory := informers.NewSharedInformerFactory(k.client, 0)
	svcInf := svcFactory.Core().V1().Services()
	k.services = svcInf.Lister()
	svcSynced := svcInf.Informer().HasSynced
	svcFactory.Start(ctx.Done())
	defer svcFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), svcSynced) {
		srv.Close()
		return nil
	}
	factory.Start(ctx.Done())
	// The handler's own HasSynced: every listed pod has reached a worker
	// before anything else may be called an orphan.
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced, reg.HasSynced) {
		factory.Shutdown()
		srv.Close()
		return nil // stopped before the pods were listed
	}
	if k.cfg.PodManifestPath != "" {
		if err := os.MkdirAll(k.cfg.PodManifestPath, 0o755); err != nil {
			k.log.Warn("pod manifest dir", "dir", k.cfg.PodManifestPath, "err", err)
		}
		k.static = newStaticSource(k, func() []*v1.Pod {
			var ms []*v1.Pod
			for _, o := range inf.GetStore().List() {
				if p := o.(*v1.Pod); isMirror(p) {
					ms = append(ms, p)
				}
			}
			return ms
		})
		k.static.scan(ctx)
		wg.Add(1)
		go func() { defer wg.Done(); k.static.run(ctx) }()
	}
	k.sourcesReady.Store(true)
	k.kickRelist()
	k.log.Info("kubelet running", "api", fmt.Sprintf("%s:%d", k.cfg.Address, k.apiPort()), "runtime", k.cfg.Runtime)
	<-ctx.Done()
	factory.Shutdown()
	k.stopWorkers()
	srv.Close()
	return nil
}

// stopWorkers stops every pod worker without touching its containers.
func (k *Kubelet) stopWorkers() {
	k.mu.Lock()
	ws := make([]*podWorker, 0, len(k.workers))
	for _, w := range k.workers {
		ws = append(ws, w)
	}
	k.mu.Unlock()
	for _, w := range ws {
		<-w.done
	}
	k.probes.stopAll()
}

func (k *Kubelet) buildRuntime(ctx context.Context) error {
	if k.cfg.Runtime == RuntimeHollow {
		k.rt = runtime.NewHollow()
		return nil
	}
	c, err := runtime.NewContainerd(runtime.ContainerdOptions{
		Address: k.cfg.ContainerdAddress, Namespace: k.cfg.ContainerdNamespace, Logger: k.cfg.ContainerLogger, Log: k.log,
		LocalRegistries: k.cfg.LocalRegistries, Observe: k.metrics.ops.observeRuntime,
	})
	if err != nil {
		return err
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, _, err := c.Version(vctx); err != nil {
		c.Close()
		return fmt.Errorf("containerd at %s does not answer (start it, or let `waggle up` supervise one): %w", k.cfg.ContainerdAddress, err)
	}
	k.rt = c
	if k.cfg.ImageDir != "" {
		if err := importImageDir(ctx, c, k.cfg.ImageDir, k.log); err != nil {
			return err
		}
	}
	return nil
}

func (k *Kubelet) buildNetwork() {
	if k.cfg.Runtime == RuntimeHollow {
		p, _ := netip.ParsePrefix(k.cfg.PodCIDR)
		k.net = network.NewHollow(p)
		return
	}
	k.net = network.NewCNI(network.CNIOptions{
		ConfDir: k.cfg.CNIConfDir, BinDirs: k.cfg.CNIBinDirs, CacheDir: k.cfg.CNICacheDir,
		IPAMDataDir: filepath.Join(k.cfg.RootDir, "ipam"),
		NetNSDir:    k.cfg.NetNSDir, Log: k.log,
	})
}

// ensureCNIConfig configures the network from the node's pod CIDR (for CNI:
// writes the conflist when the config dir has none), waiting for the pod
// CIDR if need be. Managers that take no configuration are left alone.
func (k *Kubelet) ensureCNIConfig(ctx context.Context) error {
	conf, ok := k.net.(network.Configurer)
	if !ok || k.net.Ready() == nil {
		return nil
	}
	configure := func() bool {
		cidr := k.cfg.PodCIDR
		if n := k.node(); n != nil && n.Spec.PodCIDR != "" {
			cidr = n.Spec.PodCIDR
		}
		if cidr == "" {
			return false
		}
		pod, err := netip.ParsePrefix(cidr)
		if err != nil {
			k.log.Error("node pod CIDR", "cidr", cidr, "err", err)
			return false
		}
		pods := []netip.Prefix{pod}
		if n := k.node(); n != nil && n.Spec.PodCIDR == cidr {
			// A dual-stack node: spec.podCIDRs holds the primary and one
			// CIDR of the other family.
			for _, c := range n.Spec.PodCIDRs {
				if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is4() != pod.Addr().Is4() {
					pods = append(pods, p)
					break
				}
			}
		}
		clusters, _ := ParseDualStackPrefixes(k.cfg.ClusterCIDR)
		changed, err := conf.Configure(pods, clusters)
		if err != nil {
			k.log.Error("configure pod network", "err", err)
		} else if changed {
			k.log.Info("configured pod network", "podCIDRs", pods)
		}
		return true
	}
	if configure() {
		return nil
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			if n, err := k.client.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{}); err == nil {
				k.setNode(n)
			}
			if configure() {
				return
			}
		}
	}()
	return nil
}

// sandboxState is what the kubelet keeps per pod on disk.
type sandboxState struct {
	network.Sandbox
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Cgroup    string    `json:"cgroup"`
	StartTime time.Time `json:"startTime"`
	// Torn is set once the network is torn down (terminal pods).
	Torn bool `json:"torn,omitempty"`
}

func (k *Kubelet) podDir(uid types.UID) string {
	return filepath.Join(k.cfg.RootDir, "pods", string(uid))
}

func (k *Kubelet) loadSandbox(uid types.UID) (*sandboxState, error) {
	b, err := os.ReadFile(filepath.Join(k.podDir(uid), "sandbox.json"))
	if err != nil {
		return nil, err
	}
	var s sandboxState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("sandbox state of %s: %w", uid, err)
	}
	return &s, nil
}

func (k *Kubelet) saveSandbox(s *sandboxState) error {
	dir := k.podDir(s.UID)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	b, _ := json.Marshal(s)
	tmp := filepath.Join(dir, ".sandbox.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "sandbox.json"))
}
