package apiserver

import (
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var notFoundGR = schema.GroupResource{}

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newMetrics(reg *prometheus.Registry, s *Server) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiserver_request_total",
			Help: "API requests by verb, resource and HTTP code.",
		}, []string{"verb", "resource", "subresource", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "apiserver_request_duration_seconds",
			Help:    "API request latency by verb and resource (watches: until the first byte).",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"verb", "resource", "subresource"}),
	}
	reg.MustRegister(m.requests, m.latency)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "apiserver_registered_watchers",
		Help: "Open watches served from the watch cache (to clients; the authorizers' own are not counted).",
	}, func() float64 {
		n := 0
		for _, r := range s.allRegistries() {
			if r.cache != nil {
				n += r.cache.Watchers()
			}
		}
		if s.authorization != nil {
			n -= int(s.authorization.following.Load())
		}
		if s.crds != nil {
			n -= int(s.crds.following.Load())
		}
		return float64(n)
	}))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "apiserver_watch_cache_slow_watchers_closed_total",
		Help: "Watchers closed because they fell behind (they resume from their last revision).",
	}, func() float64 {
		var n int64
		for _, r := range s.allRegistries() {
			if r.cache != nil {
				n += r.cache.SlowClosed()
			}
		}
		return float64(n)
	}))
	return m
}

// statusRecorder remembers the response code and whether the first byte
// went out.
type statusRecorder struct {
	http.ResponseWriter
	code    int
	started time.Time
	first   time.Duration
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
		w.first = time.Since(w.started)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusRecorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// instrument records request metrics and logs errors.
func (s *Server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, started: time.Now()}
		next.ServeHTTP(rec, r)
		a := authz.AttributesFrom(r, nil)
		verb, res := a.Verb, a.Resource
		if !a.ResourceRequest {
			verb, res = r.Method, "nonresource"
		}
		code := rec.code
		if code == 0 {
			code = http.StatusOK
		}
		d := time.Since(rec.started)
		if verb == "watch" {
			d = rec.first
		}
		s.metrics.requests.WithLabelValues(verb, res, a.Subresource, strconv.Itoa(code)).Inc()
		s.metrics.latency.WithLabelValues(verb, res, a.Subresource).Observe(d.Seconds())
		if code >= 500 {
			s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "code", code)
		} else {
			s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "code", code, "took", d)
		}
	})
}

// recoverer turns a panic into a 500 Status instead of a dropped connection.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic serving request", "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				writeStatus(w, apierrors.NewInternalError(fmt.Errorf("internal error")), notFoundGR, "")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// limitBody answers 413 for bodies over MaxBodyBytes before anything reads
// them, and caps bodies of unknown length at the same size.
func limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > MaxBodyBytes {
			writeStatus(w, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("limit is %d", MaxBodyBytes)), notFoundGR, "")
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		}
		next.ServeHTTP(w, r)
	})
}

// authenticate runs authentication (401 for anonymous or bad credentials)
// and authorization (403) before the protected routes.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, ok, err := s.authn.Authenticate(r)
		// A credential nobody recognizes is a 401, never anonymous (as
		// upstream, where the token authenticators reject it).
		if err == nil && !ok && s.cfg.AnonymousAuth && r.Header.Get("Authorization") == "" {
			u, ok = &authn.User{Name: authn.UserAnonymous, Groups: []string{authn.GroupUnauthenticated}}, true
		}
		if err != nil || !ok {
			msg := "Unauthorized"
			if err != nil {
				s.log.Debug("authentication failed", "err", err)
			}
			if s.auditor != nil {
				s.auditor.failedAuthn(w, r, func(w http.ResponseWriter, _ *http.Request) {
					writeStatus(w, apierrors.NewUnauthorized(msg), notFoundGR, "")
				})
				return
			}
			writeStatus(w, apierrors.NewUnauthorized(msg), notFoundGR, "")
			return
		}
		if u, err = s.impersonate(r.Context(), r, u); err != nil {
			writeStatus(w, err, notFoundGR, "")
			return
		}
		a := authz.AttributesFrom(r, u)
		if s.auditor != nil {
			s.auditor.serve(w, r, a, func(w http.ResponseWriter, r *http.Request) { s.authorized(w, r, a, u, next) })
			return
		}
		s.authorized(w, r, a, u, next)
	})
}

// authorized runs authorization (403) before next.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request, a authz.Attributes, u *authn.User, next http.Handler) {
	{
		allowed, reason, err := s.authz.Authorize(r.Context(), a)
		if err != nil || !allowed {
			if reason == "" && err != nil {
				reason = err.Error()
			}
			gr := schema.GroupResource{Group: a.APIGroup, Resource: a.Resource}
			// Worded as kube-apiserver's, which clients and tests match.
			msg := fmt.Sprintf("User %q cannot %s", u.Name, a.Verb)
			if a.ResourceRequest {
				res := a.Resource
				if a.Subresource != "" {
					res += "/" + a.Subresource
				}
				msg += fmt.Sprintf(" resource %q in API group %q", res, a.APIGroup)
				if a.Namespace != "" {
					msg += fmt.Sprintf(" in the namespace %q", a.Namespace)
				} else {
					msg += " at the cluster scope"
				}
			} else {
				msg += fmt.Sprintf(" path %q", a.Path)
			}
			if reason != "" {
				msg += ": " + reason
			}
			writeStatus(w, apierrors.NewForbidden(gr, a.Name, errors.New(msg)), gr, a.Name)
			return
		}
		next.ServeHTTP(w, r.WithContext(authn.WithUser(r.Context(), u)))
	}
}

// legacyProxyPaths serves the proxy paths older guides document
// (/api/v1/proxy/nodes/<node>/..., /api/v1/proxy/namespaces/<ns>/services/
// <svc>/... and .../pods/<pod>/...) as aliases of the current proxy
// subresources: the path is rewritten before authorization and routing, so
// both forms are authorized and answered alike.
func legacyProxyPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, ok := currentProxyPath(r.URL.Path); ok {
			r2 := r.Clone(r.Context())
			r2.URL.Path, r2.URL.RawPath = p, ""
			r2.RequestURI = r2.URL.RequestURI()
			r = r2
		}
		next.ServeHTTP(w, r)
	})
}

// currentProxyPath maps a legacy /api/v1/proxy/... path to the proxy
// subresource it stands for.
func currentProxyPath(path string) (string, bool) {
	const prefix = "/api/v1/proxy/"
	if !strings.HasPrefix(path, prefix) {
		return "", false
	}
	parts := strings.SplitN(path[len(prefix):], "/", 5)
	rest := func(i int) string {
		if len(parts) > i {
			return "/" + parts[i]
		}
		return ""
	}
	switch {
	case len(parts) >= 2 && parts[0] == "nodes" && parts[1] != "":
		return "/api/v1/nodes/" + parts[1] + "/proxy" + restJoin(parts[2:]), true
	case len(parts) >= 4 && parts[0] == "namespaces" && (parts[2] == "services" || parts[2] == "pods") && parts[1] != "" && parts[3] != "":
		return "/api/v1/namespaces/" + parts[1] + "/" + parts[2] + "/" + parts[3] + "/proxy" + rest(4), true
	}
	return "", false
}

func restJoin(parts []string) string {
	if len(parts) == 0 {
		return ""
	}
	return "/" + strings.Join(parts, "/")
}
