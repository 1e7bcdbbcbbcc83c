// Package apilb is the node agents' client-side load balancer over the API
// servers of an HA control plane, as k3s's agent has one: a client starts
// with the one server its kubeconfig names, learns every server from the
// default/kubernetes Endpoints (which the lease reconciler keeps to the live
// API servers), probes each server's /readyz, and dials a ready one — the one
// it used last while it stays ready — so losing a server needs no kubeconfig
// change and no restart: the broken connections are redialled, to another
// server.
//
// k3s runs a TCP proxy on loopback because its kubelet is a separate
// binary it does not own; Waggle's kubelet, proxy and DNS server are its own
// client-go programs, so the balancer is the client's dialer instead (no
// extra hop, no extra port, nothing to clean up). TLS is verified for the
// name "kubernetes", which every server's certificate carries, instead of
// the dialled IP.
//
// It is not a general load balancer: it spreads nothing, it fails over.
package apilb

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ServerName is the name every API server's certificate carries.
const ServerName = "kubernetes"

// Intervals of the endpoint refresh and the readiness probes.
var (
	RefreshInterval = 10 * time.Second
	ProbeInterval   = 2 * time.Second
)

// Balancer picks the API server each new connection goes to.
type Balancer struct {
	log  *slog.Logger
	seed string

	mu      sync.Mutex
	servers []string        // host:port, the seed first
	ready   map[string]bool // last probe
	current string
	// refreshErr is the last refresh error logged.
	refreshErr string
}

// Wrap returns a copy of rc whose connections go through a Balancer seeded
// with rc.Host, and runs the balancer's refresh and probes until ctx ends.
// A config with its own *http.Transport (the kubelet's rotating client
// certificate transport) keeps it: a copy of it dials through the balancer
// with the transport's own dialer, so closing that dialer's connections
// still closes them all. A config that already sets a dialer, another kind
// of transport, or a non-https host is returned unchanged.
func Wrap(ctx context.Context, rc *rest.Config, log *slog.Logger) *rest.Config {
	u, err := url.Parse(rc.Host)
	if err != nil || u.Scheme != "https" || rc.Dial != nil {
		return rc
	}
	var own *http.Transport
	if rc.Transport != nil {
		t, ok := rc.Transport.(*http.Transport)
		if !ok || t.DialContext == nil {
			return rc
		}
		own = t
	}
	seed := u.Host
	if u.Port() == "" {
		seed = net.JoinHostPort(u.Hostname(), "443")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Balancer{log: log, seed: seed, servers: []string{seed}, ready: map[string]bool{seed: true}, current: seed}
	out := rest.CopyConfig(rc)
	if own != nil {
		t := own.Clone()
		if t.TLSClientConfig == nil {
			t.TLSClientConfig = &tls.Config{}
		}
		if t.TLSClientConfig.ServerName == "" {
			t.TLSClientConfig.ServerName = ServerName
		}
		dial := own.DialContext
		t.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) { return b.dial(ctx, network, dial) }
		out.Transport = t
		go b.run(ctx, out)
		return out
	}
	if out.TLSClientConfig.ServerName == "" {
		out.TLSClientConfig.ServerName = ServerName
	}
	out.Dial = b.DialContext
	go b.run(ctx, out)
	return out
}

// Servers returns the known servers and the current one.
func (b *Balancer) Servers() (all []string, current string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.servers), b.current
}

// DialContext dials the current server if it is ready, else the first ready
// one, else each in turn; the address client-go asks for is ignored.
func (b *Balancer) DialContext(ctx context.Context, network, _ string) (net.Conn, error) {
	d := net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}
	return b.dial(ctx, network, d.DialContext)
}

// dial is DialContext with the given dialer (which gets 3 s a server).
func (b *Balancer) dial(ctx context.Context, network string, dialer func(ctx context.Context, network, addr string) (net.Conn, error)) (net.Conn, error) {
	b.mu.Lock()
	order := []string{b.current}
	for _, s := range b.servers {
		if s != b.current && b.ready[s] {
			order = append(order, s)
		}
	}
	if !b.ready[b.current] && len(order) > 1 {
		order = append(order[1:], order[0])
	}
	for _, s := range b.servers {
		if !slices.Contains(order, s) {
			order = append(order, s)
		}
	}
	b.mu.Unlock()
	var lastErr error
	for _, s := range order {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		c, err := dialer(dctx, network, s)
		cancel()
		if err == nil {
			b.mu.Lock()
			if b.current != s {
				b.log.Info("API server failover", "from", b.current, "to", s)
				b.current = s
			}
			b.mu.Unlock()
			return c, nil
		}
		lastErr = err
		b.mu.Lock()
		b.ready[s] = false
		b.mu.Unlock()
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func (b *Balancer) run(ctx context.Context, rc *rest.Config) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.log.Warn("API server balancer: no client", "err", err)
		return
	}
	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // readiness only: no credential is sent
	}}
	refresh := time.NewTicker(RefreshInterval)
	defer refresh.Stop()
	probeT := time.NewTicker(ProbeInterval)
	defer probeT.Stop()
	b.refresh(ctx, cs)
	for {
		select {
		case <-ctx.Done():
			return
		case <-refresh.C:
			b.refresh(ctx, cs)
		case <-probeT.C:
			b.probe(ctx, probe)
		}
	}
}

// refresh learns the servers from the kubernetes Endpoints (the seed stays,
// as the way back in when every learned server is gone).
func (b *Balancer) refresh(ctx context.Context, cs kubernetes.Interface) {
	ep, err := kubernetesEndpoints(ctx, cs)
	if err != nil {
		// Said once per distinct error: a client that cannot read the
		// endpoints never fails over.
		b.mu.Lock()
		if msg := err.Error(); msg != b.refreshErr {
			b.refreshErr = msg
			b.log.Warn("API server balancer: cannot read the kubernetes endpoints; no failover until it can", "err", err)
		}
		b.mu.Unlock()
		return
	}
	b.mu.Lock()
	b.refreshErr = ""
	b.mu.Unlock()
	servers := []string{b.seed}
	for _, ss := range ep.Subsets {
		for _, p := range ss.Ports {
			for _, a := range ss.Addresses {
				hp := net.JoinHostPort(a.IP, strconv.Itoa(int(p.Port)))
				if !slices.Contains(servers, hp) {
					servers = append(servers, hp)
				}
			}
		}
	}
	b.mu.Lock()
	if !slices.Equal(servers, b.servers) {
		b.log.Info("API servers", "servers", servers)
	}
	b.servers = servers
	b.mu.Unlock()
}

// kubernetesEndpoints reads default/kubernetes with a GET, or with a LIST
// narrowed to that name where the client may only list endpoints, as
// kube-proxy's role (system:node-proxier: list and watch) allows.
func kubernetesEndpoints(ctx context.Context, cs kubernetes.Interface) (*corev1.Endpoints, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ep, err := cs.CoreV1().Endpoints(metav1.NamespaceDefault).Get(cctx, "kubernetes", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		return ep, err
	}
	l, lerr := cs.CoreV1().Endpoints(metav1.NamespaceDefault).List(cctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", "kubernetes").String()})
	if lerr != nil {
		return nil, fmt.Errorf("%w; list: %w", err, lerr)
	}
	for i := range l.Items {
		if l.Items[i].Name == "kubernetes" {
			return &l.Items[i], nil
		}
	}
	return nil, apierrors.NewNotFound(corev1.Resource("endpoints"), "kubernetes")
}

func (b *Balancer) probe(ctx context.Context, c *http.Client) {
	all, _ := b.Servers()
	res := map[string]bool{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, s := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+s+"/readyz", nil)
			resp, err := c.Do(req)
			ok := err == nil && resp.StatusCode == http.StatusOK
			if resp != nil {
				resp.Body.Close()
			}
			mu.Lock()
			res[s] = ok
			mu.Unlock()
		}()
	}
	wg.Wait()
	b.mu.Lock()
	b.ready = res
	b.mu.Unlock()
}
