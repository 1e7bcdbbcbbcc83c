package kubelet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"k8s.io/kubernetes/pkg/probe"
	grpcprobe "k8s.io/kubernetes/pkg/probe/grpc"
	probehttp "k8s.io/kubernetes/pkg/probe/http"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

type probeKind int

const (
	liveness probeKind = iota
	readiness
	startup
)

func (p probeKind) String() string { return [...]string{"liveness", "readiness", "startup"}[p] }

// title is the kind as upstream's Unhealthy events name it ("Readiness").
func (p probeKind) title() string { return [...]string{"Liveness", "Readiness", "Startup"}[p] }

type probeKey struct {
	containerID string
	kind        probeKind
}

// probeManager runs the probes of running containers, one goroutine per
// container and probe, with Kubernetes' thresholds and periods.
type probeManager struct {
	k       *Kubelet
	mu      sync.Mutex
	workers map[probeKey]*probeWorker
	// results: true = success. Readiness starts false, liveness true,
	// startup false (when a startup probe exists).
	results map[probeKey]bool
	hasKind map[probeKey]bool
	byPod   map[types.UID]map[string]bool // pod -> container IDs
}

type probeWorker struct {
	stop chan struct{}
}

func newProbeManager(k *Kubelet) *probeManager {
	return &probeManager{k: k, workers: map[probeKey]*probeWorker{}, results: map[probeKey]bool{},
		hasKind: map[probeKey]bool{}, byPod: map[types.UID]map[string]bool{}}
}

// ensure starts the probe workers of a running container once.
func (m *probeManager) ensure(pod *v1.Pod, c *v1.Container, rc runtime.Container) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byPod[pod.UID] == nil {
		m.byPod[pod.UID] = map[string]bool{}
	}
	if m.byPod[pod.UID][rc.ID] {
		return
	}
	m.byPod[pod.UID][rc.ID] = true
	for kind, p := range map[probeKind]*v1.Probe{liveness: c.LivenessProbe, readiness: c.ReadinessProbe, startup: c.StartupProbe} {
		if p == nil {
			continue
		}
		key := probeKey{rc.ID, kind}
		m.hasKind[key] = true
		m.results[key] = kind == liveness
		w := &probeWorker{stop: make(chan struct{})}
		m.workers[key] = w
		go m.run(pod.DeepCopy(), c.DeepCopy(), rc, kind, p.DeepCopy(), w)
	}
}

func (m *probeManager) result(id string, kind probeKind) (val, has bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := probeKey{id, kind}
	return m.results[key], m.hasKind[key]
}

// started reports whether the container passed its startup probe (or has
// none).
func (m *probeManager) started(id string) bool {
	v, has := m.result(id, startup)
	return !has || v
}

// ready reports whether the container passes its readiness probe (or has
// none) and has started.
func (m *probeManager) ready(id string) bool {
	if !m.started(id) {
		return false
	}
	v, has := m.result(id, readiness)
	return !has || v
}

// mustRestart says why a container must be restarted ("" if not).
func (m *probeManager) mustRestart(id string) string {
	if v, has := m.result(id, liveness); has && !v {
		return "liveness probe failed"
	}
	m.mu.Lock()
	failed := m.results[probeKey{id, -1}]
	m.mu.Unlock()
	if failed {
		return "startup probe failed"
	}
	return ""
}

func (m *probeManager) stopContainer(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, w := range m.workers {
		if key.containerID == id {
			close(w.stop)
			delete(m.workers, key)
		}
	}
}

func (m *probeManager) stopPod(uid types.UID) {
	m.mu.Lock()
	ids := m.byPod[uid]
	delete(m.byPod, uid)
	m.mu.Unlock()
	for id := range ids {
		m.stopContainer(id)
		m.mu.Lock()
		for _, kind := range []probeKind{liveness, readiness, startup, -1} {
			delete(m.results, probeKey{id, kind})
			delete(m.hasKind, probeKey{id, kind})
		}
		m.mu.Unlock()
	}
}

func (m *probeManager) stopAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, w := range m.workers {
		close(w.stop)
		delete(m.workers, key)
	}
}

func defaulted(p *v1.Probe) (period, timeout time.Duration, success, failure int32) {
	period, timeout = 10*time.Second, time.Second
	success, failure = 1, 3
	if p.PeriodSeconds > 0 {
		period = time.Duration(p.PeriodSeconds) * time.Second
	}
	if p.TimeoutSeconds > 0 {
		timeout = time.Duration(p.TimeoutSeconds) * time.Second
	}
	if p.SuccessThreshold > 0 {
		success = p.SuccessThreshold
	}
	if p.FailureThreshold > 0 {
		failure = p.FailureThreshold
	}
	return
}

func (m *probeManager) run(pod *v1.Pod, c *v1.Container, rc runtime.Container, kind probeKind, p *v1.Probe, w *probeWorker) {
	period, timeout, successT, failureT := defaulted(p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-w.stop; cancel() }()
	// Initial delay counts from the container's start.
	delay := time.Until(rc.StartedAt.Add(time.Duration(p.InitialDelaySeconds) * time.Second))
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
	}
	var okRun, failRun int32
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		// Liveness and readiness wait for the startup probe.
		if kind == startup || m.started(rc.ID) {
			pctx, pcancel := context.WithTimeout(ctx, timeout)
			err := m.k.probe(pctx, pod, c, rc, p)
			pcancel()
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				okRun++
				failRun = 0
			} else {
				failRun++
				okRun = 0
				m.k.containerEvent(pod, c.Name, v1.EventTypeWarning, EventUnhealthy, "%s probe failed: %v", kind.title(), err)
			}
			m.mu.Lock()
			key := probeKey{rc.ID, kind}
			before := m.results[key]
			switch {
			case err == nil && okRun >= successT:
				m.results[key] = true
			case err != nil && failRun >= failureT:
				m.results[key] = false
				if kind == startup {
					m.results[probeKey{rc.ID, -1}] = true
				}
			}
			after := m.results[key]
			m.mu.Unlock()
			if before != after || (err != nil && failRun == failureT && kind != readiness) {
				m.k.log.Info("probe result changed", "pod", pod.Name, "container", c.Name, "probe", kind.String(), "success", after, "err", err)
				m.k.pokePod(pod.UID)
			}
			if kind == startup && after {
				return // a startup probe stops once it succeeds
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (k *Kubelet) pokePod(uid types.UID) {
	k.mu.Lock()
	w := k.workers[uid]
	k.mu.Unlock()
	if w != nil {
		w.poke()
	}
}

// resolvePort resolves a named or numbered port of a container.
func resolvePort(p intstr.IntOrString, c *v1.Container) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("port %q is not a named port of container %s", p.StrVal, c.Name)
}

func (k *Kubelet) podHost(pod *v1.Pod) string {
	if pod.Spec.HostNetwork {
		return "127.0.0.1"
	}
	k.mu.Lock()
	w := k.workers[pod.UID]
	k.mu.Unlock()
	if w != nil {
		if ips := w.ips.Load(); ips != nil && len(*ips) > 0 {
			return (*ips)[0]
		}
	}
	if sb, err := k.loadSandbox(pod.UID); err == nil && len(sb.IPs) > 0 {
		return sb.IPs[0]
	}
	return pod.Status.PodIP
}

// Prober runs one probe of a container once; nil is success.
type Prober interface {
	Probe(ctx context.Context, pod *v1.Pod, c *v1.Container, rc runtime.Container, p *v1.Probe) error
}

// actionProber runs the probe's action (exec, HTTP GET, TCP, gRPC) against
// the container.
type actionProber struct{ k *Kubelet }

func (a actionProber) Probe(ctx context.Context, pod *v1.Pod, c *v1.Container, rc runtime.Container, p *v1.Probe) error {
	if p.GRPC != nil {
		return a.k.grpcProbe(ctx, pod, p.GRPC)
	}
	return a.k.runAction(ctx, pod, c, rc, "probe", p.Exec, p.HTTPGet, p.TCPSocket)
}

// grpcProbe calls the gRPC health service (grpc.health.v1.Health/Check) of
// the pod through upstream's prober: anything but SERVING is a failure.
func (k *Kubelet) grpcProbe(ctx context.Context, pod *v1.Pod, g *v1.GRPCAction) error {
	timeout := time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	service := ""
	if g.Service != nil {
		service = *g.Service
	}
	opts := grpcprobe.ProbeOptions{UseTLS: g.Mode != nil && *g.Mode == v1.GRPCProbeModeTLS}
	res, out, err := grpcprobe.New().Probe(k.podHost(pod), service, int(g.Port), timeout, opts)
	if err != nil {
		return fmt.Errorf("grpc probe of port %d: %w", g.Port, err)
	}
	if res != probe.Success {
		return fmt.Errorf("grpc probe of port %d: %s", g.Port, out)
	}
	return nil
}

// hollowProber is the hollow node's: its containers run nothing that could
// answer, so every probe passes (as on kubemark's hollow nodes).
type hollowProber struct{}

func (hollowProber) Probe(context.Context, *v1.Pod, *v1.Container, runtime.Container, *v1.Probe) error {
	return nil
}

// probe runs one probe once; nil is success.
func (k *Kubelet) probe(ctx context.Context, pod *v1.Pod, c *v1.Container, rc runtime.Container, p *v1.Probe) error {
	return k.prober.Probe(ctx, pod, c, rc, p)
}

// runHandler runs a lifecycle hook.
func (k *Kubelet) runHandler(ctx context.Context, pod *v1.Pod, rc runtime.Container, c *v1.Container, h *v1.LifecycleHandler) error {
	if h.Sleep != nil {
		select {
		case <-time.After(time.Duration(h.Sleep.Seconds) * time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return k.runAction(ctx, pod, c, rc, "lifecycle", h.Exec, h.HTTPGet, h.TCPSocket)
}

var errNoAction = errors.New("probe or hook has no action")

// purpose names the caller in the User-Agent (kube-probe, kube-lifecycle).
func (k *Kubelet) runAction(ctx context.Context, pod *v1.Pod, c *v1.Container, rc runtime.Container, purpose string, ex *v1.ExecAction, hg *v1.HTTPGetAction, tcp *v1.TCPSocketAction) error {
	switch {
	case ex != nil:
		var out bytes.Buffer
		code, err := k.rt.Exec(ctx, rc.ID, ex.Command, runtime.ExecOptions{Stdout: &limitWriter{w: &out, n: 10 << 10}, Stderr: &limitWriter{w: &out, n: 10 << 10}})
		if err != nil {
			return fmt.Errorf("exec %v: %w", ex.Command, err)
		}
		if code != 0 {
			return fmt.Errorf("exec %v: exit code %d: %s", ex.Command, code, out.String())
		}
		return nil
	case hg != nil:
		// Upstream's request: the path may carry a query, Host and other
		// headers as given.
		req, err := probehttp.NewRequestForHTTPGetAction(hg, c, k.podHost(pod), purpose)
		if err != nil {
			return err
		}
		req = req.WithContext(ctx)
		u := req.URL
		resp, err := probeClient.Do(req)
		if err != nil {
			return fmt.Errorf("GET %s: %w", u.String(), err)
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("GET %s: HTTP %d", u.String(), resp.StatusCode)
		}
		return nil
	case tcp != nil:
		port, err := resolvePort(tcp.Port, c)
		if err != nil {
			return err
		}
		host := tcp.Host
		if host == "" {
			host = k.podHost(pod)
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("tcp %s:%d: %w", host, port, err)
		}
		conn.Close()
		return nil
	}
	return errNoAction
}

var probeClient = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: insecureTLS()},
	// Kubernetes' probes follow redirects to the same host only; none here.
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

type limitWriter struct {
	w interface{ Write([]byte) (int, error) }
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return len(p), nil
	}
	q := p
	if len(q) > l.n {
		q = q[:l.n]
	}
	l.n -= len(q)
	l.w.Write(q)
	return len(p), nil
}
