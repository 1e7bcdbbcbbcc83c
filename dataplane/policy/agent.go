package policy

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// AgentConfig configures the node agent's NetworkPolicy enforcement.
type AgentConfig struct {
	// NodeName: only this node's pods are enforced.
	NodeName string
	// Datapath programs the compiled policy.
	Datapath Datapath
	// Links finds the pods' host-side veths and this node's addresses, and
	// tells when they change (nil: none are found).
	Links  LinkSource
	Client kubernetes.Interface
	Log    *slog.Logger
	// Registerer receives the metrics (nil: none).
	Registerer prometheus.Registerer
}

// LinkSource maps pod addresses to host-side veth ifindexes.
type LinkSource interface {
	// Veths returns every pod address with the ifindex of its host veth.
	Veths() (map[netip.Addr]uint32, error)
	// HostIPs returns this node's own addresses.
	HostIPs() ([]netip.Addr, error)
	// Watch calls changed whenever links or addresses may have changed,
	// until ctx ends.
	Watch(ctx context.Context, changed func()) error
}

// Agent runs the compiler on informers and programs the datapath.
type Agent struct {
	cfg     AgentConfig
	log     *slog.Logger
	mu      sync.Mutex
	c       *Compiler
	veths   map[netip.Addr]uint32
	pods    map[string]*v1.Pod // local pods, to re-set when their veth appears
	trigger chan struct{}
	synced  bool
	syncs   uint64
	m       *agentMetrics
	// OnSync, if set, is called after every sync with its count (tests).
	OnSync func(n uint64, ch Changes, err error)
}

type agentMetrics struct {
	duration  prometheus.Histogram
	errors    prometheus.Counter
	endpoints prometheus.Gauge
	policies  prometheus.Gauge
	idents    prometheus.Gauge
}

// NewAgent returns an agent; Run starts it.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	a := &Agent{cfg: cfg, log: cfg.Log, c: NewCompiler(cfg.NodeName), veths: map[netip.Addr]uint32{},
		pods: map[string]*v1.Pod{}, trigger: make(chan struct{}, 1)}
	a.m = &agentMetrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "waggle_policy_sync_duration_seconds",
			Help: "Time to compile and program NetworkPolicy changes.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}),
		errors:    prometheus.NewCounter(prometheus.CounterOpts{Name: "waggle_policy_sync_errors_total", Help: "NetworkPolicy syncs that failed."}),
		endpoints: prometheus.NewGauge(prometheus.GaugeOpts{Name: "waggle_policy_endpoints", Help: "Local pods with compiled policy."}),
		policies:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "waggle_policy_policies", Help: "NetworkPolicies known."}),
		idents:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "waggle_policy_identities", Help: "Label-set identities allocated."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{a.m.duration, a.m.errors, a.m.endpoints, a.m.policies, a.m.idents, newVerdictCollector(a)} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("register policy metrics: %w", err)
			}
		}
	}
	return a, nil
}

func (a *Agent) kick() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// Run watches NetworkPolicies, Pods and Namespaces and enforces them until
// ctx ends. Nothing is programmed before the informers synced.
func (a *Agent) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactory(a.cfg.Client, 0)
	pols := f.Networking().V1().NetworkPolicies().Informer()
	pods := f.Core().V1().Pods().Informer()
	nss := f.Core().V1().Namespaces().Informer()
	handle := func(add func(obj any), del func(obj any)) cache.ResourceEventHandler {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { a.mu.Lock(); add(obj); a.mu.Unlock(); a.kick() },
			UpdateFunc: func(_, obj any) { a.mu.Lock(); add(obj); a.mu.Unlock(); a.kick() },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				a.mu.Lock()
				del(obj)
				a.mu.Unlock()
				a.kick()
			},
		}
	}
	if _, err := pols.AddEventHandler(handle(func(o any) {
		np := o.(*networkingv1.NetworkPolicy)
		if err := a.c.SetPolicy(np); err != nil {
			a.log.Warn("networkpolicy not enforced", "policy", np.Namespace+"/"+np.Name, "err", err)
		}
	}, func(o any) {
		if np, ok := o.(*networkingv1.NetworkPolicy); ok {
			a.c.DeletePolicy(np.Namespace, np.Name)
		}
	})); err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(handle(func(o any) { a.setPod(o.(*v1.Pod)) }, func(o any) {
		if p, ok := o.(*v1.Pod); ok {
			delete(a.pods, p.Namespace+"/"+p.Name)
			a.c.DeletePod(p.Namespace, p.Name)
		}
	})); err != nil {
		return err
	}
	if _, err := nss.AddEventHandler(handle(func(o any) { a.c.SetNamespace(o.(*v1.Namespace)) }, func(o any) {
		if n, ok := o.(*v1.Namespace); ok {
			a.c.DeleteNamespace(n.Name)
		}
	})); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if a.cfg.Links != nil {
		go func() {
			if err := a.cfg.Links.Watch(ctx, a.linksChanged); err != nil && ctx.Err() == nil {
				a.log.Warn("watching links for pod veths", "err", err)
			}
		}()
		a.linksChanged()
	}
	if !cache.WaitForCacheSync(ctx.Done(), pols.HasSynced, pods.HasSynced, nss.HasSynced) {
		return ctx.Err()
	}
	a.log.Info("networkpolicy informers synced; enforcing", "node", a.cfg.NodeName)
	a.mu.Lock()
	a.synced = true
	a.mu.Unlock()
	a.kick()
	backoff := time.Duration(0)
	for {
		var retry <-chan time.Time
		if backoff > 0 {
			retry = time.After(backoff)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-a.trigger:
		case <-retry:
		}
		if err := a.sync(); err != nil {
			backoff = min(max(2*backoff, 100*time.Millisecond), 10*time.Second)
			a.log.Warn("networkpolicy sync failed; retrying", "err", err, "in", backoff)
			continue
		}
		backoff = 0
	}
}

func (a *Agent) setPod(p *v1.Pod) {
	key := p.Namespace + "/" + p.Name
	var ifindex uint32
	if p.Spec.NodeName == a.cfg.NodeName && !p.Spec.HostNetwork {
		a.pods[key] = p
		for _, ip := range podIPs(p) {
			if idx, ok := a.veths[ip]; ok {
				ifindex = idx
				break
			}
		}
	} else {
		delete(a.pods, key)
	}
	a.c.SetPod(p, ifindex)
}

// linksChanged re-reads the veths and host addresses and re-sets the local
// pods whose veth changed.
func (a *Agent) linksChanged() {
	veths, err := a.cfg.Links.Veths()
	if err != nil {
		a.log.Warn("listing pod veths", "err", err)
		return
	}
	hostIPs, err := a.cfg.Links.HostIPs()
	if err != nil {
		a.log.Warn("listing node addresses", "err", err)
	}
	a.mu.Lock()
	a.veths = veths
	a.c.SetHostIPs(hostIPs)
	for _, p := range a.pods {
		a.setPod(p)
	}
	a.mu.Unlock()
	a.kick()
}

func (a *Agent) sync() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.synced {
		return nil
	}
	start := time.Now()
	ch := a.c.Compile()
	for _, w := range ch.Warnings {
		a.log.Warn(w)
	}
	err := Program(a.cfg.Datapath, a.c, ch)
	if a.syncs == 0 && err == nil {
		err = a.removeStale()
	}
	a.syncs++
	a.m.duration.Observe(time.Since(start).Seconds())
	a.m.endpoints.Set(float64(len(a.c.endpoints)))
	a.m.policies.Set(float64(len(a.c.policies)))
	a.m.idents.Set(float64(len(a.c.byID)))
	if err != nil {
		a.m.errors.Inc()
		// Recompile everything next time: the datapath diff repairs it.
		for k := range a.c.endpoints {
			a.c.dirty[k] = true
		}
		a.c.ipsDirty, a.c.cidrsDirty = true, true
	}
	if a.OnSync != nil {
		a.OnSync(a.syncs, ch, err)
	}
	return err
}

// removeStale drops the datapath state of endpoints no pod has any more
// (pods deleted while no agent ran).
func (a *Agent) removeStale() error {
	lister, ok := a.cfg.Datapath.(interface{ Endpoints() []uint32 })
	if !ok {
		return nil
	}
	live := map[uint32]bool{}
	for _, e := range a.c.endpoints {
		live[e.Ifindex] = true
	}
	for _, ep := range lister.Endpoints() {
		if !live[ep] {
			if err := a.cfg.Datapath.RemoveEndpoint(ep); err != nil {
				return err
			}
		}
	}
	return nil
}

// Compiler returns the agent's compiler; callers must not use it while
// Run runs (tests read it from OnSync).
func (a *Agent) Compiler() *Compiler { return a.c }
