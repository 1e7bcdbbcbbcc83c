// Package ops gives every Waggle daemon the same operational surface: a slog
// logger, and an HTTP server for /healthz, /livez, /readyz and Prometheus
// /metrics. Components register their own metrics on the registry they are
// given; they do not use the global Prometheus registry.
//
// It is not the API server's router: the API server mounts Handler into its
// own HTTPS mux.
package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewLogger returns a text slog logger on stderr at the given level
// ("debug", "info", "warn", "error") tagged with the component's name.
func NewLogger(component, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	h := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})
	return slog.New(h).With("component", component), nil
}

// Check is a named health or readiness check; nil means healthy.
type Check struct {
	Name string
	Func func(context.Context) error
}

// Health holds a daemon's checks and metrics registry.
type Health struct {
	// Registry is the daemon's own Prometheus registry, with the Go and
	// process collectors already registered.
	Registry *prometheus.Registry

	mu     sync.Mutex
	live   []Check
	ready  []Check
	extras []prometheus.Gatherer
}

// AddGatherer serves g's metrics on /metrics beside Registry's: for code
// that registers where Kubernetes' own libraries do (component-base's
// legacyregistry). A family Registry also has (the Go and process
// collectors) is served from Registry only.
func (h *Health) AddGatherer(g prometheus.Gatherer) {
	h.mu.Lock()
	h.extras = append(h.extras, g)
	h.mu.Unlock()
}

// Gather implements prometheus.Gatherer: Registry, then every added
// gatherer's families that Registry does not have.
func (h *Health) Gather() ([]*dto.MetricFamily, error) {
	out, err := h.Registry.Gather()
	if err != nil {
		return out, err
	}
	h.mu.Lock()
	extras := append([]prometheus.Gatherer(nil), h.extras...)
	h.mu.Unlock()
	have := map[string]bool{}
	for _, f := range out {
		have[f.GetName()] = true
	}
	var errs []error
	for _, g := range extras {
		fams, err := g.Gather()
		if err != nil {
			errs = append(errs, err)
		}
		for _, f := range fams {
			if !have[f.GetName()] {
				have[f.GetName()] = true
				out = append(out, f)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, errors.Join(errs...)
}

// NewHealth returns a Health with a fresh registry.
func NewHealth() *Health {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Health{Registry: r}
}

// AddLiveness adds a check to /healthz and /livez.
func (h *Health) AddLiveness(c Check) { h.mu.Lock(); h.live = append(h.live, c); h.mu.Unlock() }

// AddReadiness adds a check to /readyz.
func (h *Health) AddReadiness(c Check) { h.mu.Lock(); h.ready = append(h.ready, c); h.mu.Unlock() }

// Handler serves /healthz, /livez, /readyz and /metrics. A failing check
// answers 500 with one line per check, as Kubernetes' ?verbose output does.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	live := func(w http.ResponseWriter, r *http.Request) { h.serveChecks(w, r, h.snapshot(false)) }
	mux.HandleFunc("/healthz", live)
	mux.HandleFunc("/livez", live)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { h.serveChecks(w, r, h.snapshot(true)) })
	mux.Handle("/metrics", promhttp.HandlerFor(h, promhttp.HandlerOpts{}))
	return mux
}

func (h *Health) snapshot(ready bool) []Check {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ready {
		return append(append([]Check(nil), h.live...), h.ready...)
	}
	return append([]Check(nil), h.live...)
}

func (h *Health) serveChecks(w http.ResponseWriter, r *http.Request, checks []Check) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	failed := false
	var body []byte
	for _, c := range checks {
		if err := c.Func(ctx); err != nil {
			failed = true
			body = fmt.Appendf(body, "[-]%s failed: %v\n", c.Name, err)
		} else {
			body = fmt.Appendf(body, "[+]%s ok\n", c.Name)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if failed {
		w.WriteHeader(http.StatusInternalServerError)
		w.Write(body)
		return
	}
	if r.URL.Query().Has("verbose") {
		w.Write(body)
	}
	w.Write([]byte("ok"))
}

// Serve serves h.Handler() on addr until ctx ends, then shuts down gracefully.
// An empty addr or "0" disables the server.
func Serve(ctx context.Context, log *slog.Logger, addr string, h http.Handler) error {
	if addr == "" || addr == "0" {
		<-ctx.Done()
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("health and metrics listener on %s: %w", addr, err)
	}
	return ServeListener(ctx, log, ln, h)
}

// ServeListener is Serve on an existing listener.
func ServeListener(ctx context.Context, log *slog.Logger, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving health and metrics", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
