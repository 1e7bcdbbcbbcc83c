// Package metrics is Waggle's metrics-server: it scrapes every node's
// kubelet /metrics/resource each resolution interval (15 s by default, as
// metrics-server), keeps the last two samples of each node and container,
// and answers the resource metrics API (metrics.k8s.io/v1beta1 NodeMetrics
// and PodMetrics) with CPU as the rate between those two samples and memory
// as the newest working set — what `kubectl top` and the HPA read.
//
// It does not serve HTTP itself: a Source tells it the nodes and pods, and
// the API server (controlplane/apiserver, with --metrics-api=native) serves
// its objects through its own authn, authz and discovery. The same Store can
// sit behind an aggregated APIService instead; see README.md.
//
// It keeps nothing on disk: after a restart the API answers once two
// scrapes of a node have landed.
package metrics

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	kubeletclient "github.com/waggle-io/waggle/kubelet/client"
)

// DefaultResolution is how often kubelets are scraped (metrics-server's
// --metric-resolution default).
const DefaultResolution = 15 * time.Second

// Source lists what the metrics describe.
type Source interface {
	// Nodes lists the nodes matching sel.
	Nodes(ctx context.Context, sel labels.Selector) ([]*corev1.Node, error)
	// Node gets one node (an apierrors NotFound when there is none).
	Node(ctx context.Context, name string) (*corev1.Node, error)
	// Pods lists the pods of namespace ns ("" for all) matching sel.
	Pods(ctx context.Context, ns string, sel labels.Selector) ([]*corev1.Pod, error)
	// Pod gets one pod (an apierrors NotFound when there is none).
	Pod(ctx context.Context, ns, name string) (*corev1.Pod, error)
}

// Config of a Store.
type Config struct {
	Source Source
	// Transport reaches kubelets (the API server's kubelet client cert).
	Transport http.RoundTripper
	// Resolution is the scrape interval (default DefaultResolution).
	Resolution time.Duration
	// Timeout of one node's scrape (default 0.9 × Resolution, at most 10 s).
	Timeout    time.Duration
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// point is one cumulative CPU sample with the memory seen at the same time.
type point struct {
	t      time.Time
	cpu    float64 // core-seconds
	mem    float64 // working set bytes
	start  time.Time
	hasCPU bool
}

// series holds the last two samples of one node or container.
type series struct{ prev, cur point }

func (s *series) add(p point) {
	if !s.cur.t.IsZero() && !p.t.After(s.cur.t) {
		return // a repeated sample: no new information
	}
	if !s.cur.start.Equal(p.start) || p.cpu < s.cur.cpu {
		s.prev = point{} // restarted: the counter began anew
	} else {
		s.prev = s.cur
	}
	s.cur = p
}

// usage is the CPU rate and memory of the newest window, if two samples
// span one.
func (s *series) usage() (cpuNanoCores int64, mem int64, ts time.Time, window time.Duration, ok bool) {
	if s.prev.t.IsZero() || !s.cur.hasCPU || !s.prev.hasCPU {
		return 0, 0, time.Time{}, 0, false
	}
	window = s.cur.t.Sub(s.prev.t)
	if window <= 0 {
		return 0, 0, time.Time{}, 0, false
	}
	rate := (s.cur.cpu - s.prev.cpu) / window.Seconds()
	return int64(rate * 1e9), int64(s.cur.mem), s.cur.t, window, true
}

type nodeData struct {
	node       series
	containers map[containerKey]*series
	scraped    time.Time
}

type containerKey struct{ ns, pod, container string }

// Store scrapes kubelets and answers the metrics API.
type Store struct {
	cfg Config
	hc  *http.Client

	mu    sync.RWMutex
	nodes map[string]*nodeData

	scrapes  *prometheus.CounterVec
	duration prometheus.Histogram
}

// New returns a Store; Run starts its scrapes.
func New(cfg Config) *Store {
	if cfg.Resolution <= 0 {
		cfg.Resolution = DefaultResolution
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = min(cfg.Resolution*9/10, 10*time.Second)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Store{cfg: cfg, hc: &http.Client{Transport: cfg.Transport, Timeout: cfg.Timeout}, nodes: map[string]*nodeData{}}
	s.scrapes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "waggle_metrics_scrapes_total",
		Help: "Kubelet /metrics/resource scrapes by the resource metrics API, by result."}, []string{"result"})
	s.duration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "waggle_metrics_scrape_duration_seconds",
		Help: "Time to scrape one kubelet's /metrics/resource.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.scrapes, s.duration)
	}
	return s
}

// Resolution is the scrape interval.
func (s *Store) Resolution() time.Duration { return s.cfg.Resolution }

// Run scrapes every node each resolution until ctx ends.
func (s *Store) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Resolution)
	defer t.Stop()
	for {
		s.ScrapeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ScrapeOnce scrapes every node once, in parallel.
func (s *Store) ScrapeOnce(ctx context.Context) {
	nodes, err := s.cfg.Source.Nodes(ctx, labels.Everything())
	if err != nil {
		if ctx.Err() == nil {
			s.cfg.Log.Warn("metrics: list nodes", "err", err)
		}
		return
	}
	var wg sync.WaitGroup
	seen := map[string]bool{}
	for _, n := range nodes {
		seen[n.Name] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := s.scrapeNode(ctx, n)
			s.duration.Observe(time.Since(start).Seconds())
			if err != nil {
				s.scrapes.WithLabelValues("error").Inc()
				s.cfg.Log.Debug("metrics: scrape", "node", n.Name, "err", err)
				return
			}
			s.scrapes.WithLabelValues("success").Inc()
		}()
	}
	wg.Wait()
	s.mu.Lock()
	for name := range s.nodes {
		if !seen[name] {
			delete(s.nodes, name)
		}
	}
	s.mu.Unlock()
}

func (s *Store) scrapeNode(ctx context.Context, n *corev1.Node) error {
	u, err := kubeletclient.Endpoint(n)
	if err != nil {
		return err
	}
	u.Path = "/metrics/resource"
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %d %s", u, resp.StatusCode, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("parse %s: %w", u, err)
	}
	return s.record(n.Name, fams, time.Now())
}

// record files one scrape of node's /metrics/resource.
func (s *Store) record(node string, fams map[string]*famT, now time.Time) error {
	var np point
	ctrs := map[containerKey]*point{}
	get := func(k containerKey) *point {
		p := ctrs[k]
		if p == nil {
			p = &point{}
			ctrs[k] = p
		}
		return p
	}
	for _, m := range metricsOf(fams, "node_cpu_usage_seconds_total") {
		np.cpu, np.t, np.hasCPU = m.value, m.t(now), true
	}
	for _, m := range metricsOf(fams, "node_memory_working_set_bytes") {
		np.mem = m.value
	}
	for _, m := range metricsOf(fams, "container_cpu_usage_seconds_total") {
		p := get(containerKey{m.labels["namespace"], m.labels["pod"], m.labels["container"]})
		p.cpu, p.t, p.hasCPU = m.value, m.t(now), true
	}
	for _, m := range metricsOf(fams, "container_memory_working_set_bytes") {
		get(containerKey{m.labels["namespace"], m.labels["pod"], m.labels["container"]}).mem = m.value
	}
	for _, m := range metricsOf(fams, "container_start_time_seconds") {
		sec := m.value
		get(containerKey{m.labels["namespace"], m.labels["pod"], m.labels["container"]}).start = time.Unix(0, int64(sec*1e9))
	}
	if !np.hasCPU {
		return fmt.Errorf("node %s: no node_cpu_usage_seconds_total", node)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.nodes[node]
	if d == nil {
		d = &nodeData{containers: map[containerKey]*series{}}
		s.nodes[node] = d
	}
	d.scraped = now
	d.node.add(np)
	for k, p := range ctrs {
		if !p.hasCPU {
			continue
		}
		sr := d.containers[k]
		if sr == nil {
			sr = &series{}
			d.containers[k] = sr
		}
		sr.add(*p)
	}
	for k := range d.containers {
		if ctrs[k] == nil {
			delete(d.containers, k)
		}
	}
	return nil
}

func cpuQuantity(nanoCores int64) resource.Quantity {
	return *resource.NewScaledQuantity(nanoCores, -9)
}

func memQuantity(b int64) resource.Quantity { return *resource.NewQuantity(b, resource.BinarySI) }

// nodeMetrics is the NodeMetrics of n, if two samples of it are in.
func (s *Store) nodeMetrics(n *corev1.Node) (*metricsv1beta1.NodeMetrics, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d := s.nodes[n.Name]
	if d == nil {
		return nil, false
	}
	cpu, mem, ts, win, ok := d.node.usage()
	if !ok {
		return nil, false
	}
	return &metricsv1beta1.NodeMetrics{
		TypeMeta:   metav1.TypeMeta{Kind: "NodeMetrics", APIVersion: metricsv1beta1.SchemeGroupVersion.String()},
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, CreationTimestamp: metav1.Now()},
		Timestamp:  metav1.NewTime(ts), Window: metav1.Duration{Duration: win},
		Usage: corev1.ResourceList{corev1.ResourceCPU: cpuQuantity(cpu), corev1.ResourceMemory: memQuantity(mem)},
	}, true
}

// podMetrics is the PodMetrics of p, if every running container of it has
// two samples in (as metrics-server, a pod is left out until then).
func (s *Store) podMetrics(p *corev1.Pod) (*metricsv1beta1.PodMetrics, bool) {
	if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning {
		return nil, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	d := s.nodes[p.Spec.NodeName]
	if d == nil {
		return nil, false
	}
	pm := &metricsv1beta1.PodMetrics{
		TypeMeta:   metav1.TypeMeta{Kind: "PodMetrics", APIVersion: metricsv1beta1.SchemeGroupVersion.String()},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, CreationTimestamp: metav1.Now()},
		Containers: []metricsv1beta1.ContainerMetrics{},
	}
	var newest time.Time
	var window time.Duration
	for k, sr := range d.containers {
		if k.ns != p.Namespace || k.pod != p.Name {
			continue
		}
		cpu, mem, ts, win, ok := sr.usage()
		if !ok {
			return nil, false
		}
		if ts.After(newest) {
			newest, window = ts, win
		}
		pm.Containers = append(pm.Containers, metricsv1beta1.ContainerMetrics{Name: k.container,
			Usage: corev1.ResourceList{corev1.ResourceCPU: cpuQuantity(cpu), corev1.ResourceMemory: memQuantity(mem)}})
	}
	if len(pm.Containers) == 0 {
		return nil, false
	}
	sort.Slice(pm.Containers, func(i, j int) bool { return pm.Containers[i].Name < pm.Containers[j].Name })
	pm.Timestamp, pm.Window = metav1.NewTime(newest), metav1.Duration{Duration: window}
	return pm, true
}
