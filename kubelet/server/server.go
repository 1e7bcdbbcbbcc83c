// Package server is the kubelet API on port 10250: HTTPS with client
// certificate authentication, serving /healthz, /pods, container logs
// (/containerLogs: CRI-format log files read with follow, previous,
// tailLines, limitBytes, timestamps, sinceSeconds and sinceTime), exec
// and attach (/exec, /attach and /run, in SPDY v1–v4 and WebSocket v4/v5 channel protocols, so
// kubectl 1.27–1.33 work through the apiserver's proxy), /stats/summary,
// /metrics, /metrics/resource (metrics-server's source) and /metrics/cadvisor.
//
// Every request, /healthz included, is authenticated and authorized as
// upstream's kubelet does (Auth): a client certificate of the client CA or a
// bearer token (TokenReview), then a SubjectAccessReview on the node's
// subresource (nodes/proxy, nodes/stats, nodes/metrics, nodes/log,
// nodes/pods, nodes/healthz...). An unauthenticated /healthz is served on the
// kubelet's plain-HTTP health address (127.0.0.1:10248), not here.
//
// It is not the kubelet's pod logic: it reads what a Provider gives it.
package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/waggle-io/waggle/kubelet/containerlog"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// ErrNotFound is returned by a Provider for unknown pods or containers.
var ErrNotFound = errors.New("not found")

// Provider is what the server needs from the kubelet.
type Provider interface {
	// Container finds a pod's container: the current one, or the previous
	// (exited) attempt when previous is set.
	Container(ns, pod, container string, previous bool) (runtime.Container, types.UID, error)
	// Pods lists the pods the kubelet runs.
	Pods() []*v1.Pod
	// Summary returns the node's and pods' resource usage.
	Summary(ctx context.Context) (*statsapi.Summary, error)
	// PortForwardDial connects to a TCP port of the pod as a process in it
	// would (the pod's 127.0.0.1), and returns the pod's UID.
	PortForwardDial(ctx context.Context, ns, pod string, port int32) (net.Conn, error)
	// PodUID returns the UID of a pod the kubelet runs.
	PodUID(ns, pod string) (types.UID, error)
	// Runtime runs execs.
	Runtime() runtime.Runtime
	// Metrics serves /metrics.
	Metrics() http.Handler
	// Healthy answers /healthz.
	Healthy(ctx context.Context) error
}

// Config of the server.
type Config struct {
	// Address:Port to listen on; Port 0 picks a free port.
	Address string
	Port    int
	// TLS serves HTTPS with this certificate.
	Cert tls.Certificate
	// ClientCAs verify client certificates during the handshake (nil: no
	// certificate is asked for).
	ClientCAs *x509.CertPool
	// Auth authenticates and authorizes every request; nil answers 401 to
	// every request.
	Auth *Auth
	Log  *slog.Logger
}

// Server is a running kubelet API.
type Server struct {
	cfg  Config
	p    Provider
	ln   net.Listener
	srv  *http.Server
	port int
}

// Start listens and serves in the background.
func Start(cfg Config, p Provider) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Address, strconv.Itoa(cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("kubelet API listener: %w", err)
	}
	s := &Server{cfg: cfg, p: p, ln: ln, port: ln.Addr().(*net.TCPAddr).Port}
	tlsCfg := &tls.Config{
		Certificates: []tls.Certificate{cfg.Cert},
		// The authenticator verifies the chain against the current client
		// CA (which may be reloaded); the handshake only asks for it.
		ClientAuth: tls.RequestClientCert,
		ClientCAs:  cfg.ClientCAs,
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"}, // SPDY and WebSocket upgrades need HTTP/1.1
	}
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 30 * time.Second, ErrorLog: nil}
	go func() {
		if err := s.srv.Serve(tls.NewListener(ln, tlsCfg)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Log.Error("kubelet API server", "err", err)
		}
	}()
	return s, nil
}

// Port is the bound port.
func (s *Server) Port() int { return s.port }

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return s.srv.Close()
	}
	return nil
}

// Handler is the server's router behind authentication and authorization
// (exported for in-process tests).
func (s *Server) Handler() http.Handler {
	if s.cfg.Log == nil {
		s.cfg.Log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.p.Healthy(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "ok")
	})
	mux.HandleFunc("GET /pods", s.pods)
	mux.HandleFunc("GET /containerLogs/{ns}/{pod}/{container}", s.logs)
	mux.HandleFunc("/exec/{ns}/{pod}/{container}", s.exec)
	mux.HandleFunc("/exec/{ns}/{pod}/{uid}/{container}", s.exec)
	mux.HandleFunc("POST /run/{ns}/{pod}/{container}", s.run)
	mux.HandleFunc("/attach/{ns}/{pod}/{container}", s.attach)
	mux.HandleFunc("/attach/{ns}/{pod}/{uid}/{container}", s.attach)
	mux.HandleFunc("/portForward/{ns}/{pod}", s.portForward)
	mux.HandleFunc("GET /stats/summary", s.summary)
	mux.HandleFunc("GET /stats/summary/", s.summary)
	mux.Handle("GET /metrics", s.p.Metrics())
	mux.Handle("GET /metrics/resource", summaryMetrics(s.p, false))
	mux.Handle("GET /metrics/cadvisor", summaryMetrics(s.p, true))
	return s.filter(mux)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func httpError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	if errors.Is(err, ErrNotFound) || errors.Is(err, runtime.ErrNotFound) {
		code = http.StatusNotFound
	}
	var bad badRequest
	if errors.As(err, &bad) {
		code = http.StatusBadRequest
	}
	http.Error(w, err.Error(), code)
}

type badRequest struct{ msg string }

func (b badRequest) Error() string { return b.msg }

func (s *Server) pods(w http.ResponseWriter, r *http.Request) {
	list := v1.PodList{}
	list.Kind, list.APIVersion = "PodList", "v1"
	for _, p := range s.p.Pods() {
		list.Items = append(list.Items, *p)
	}
	writeJSON(w, &list)
}

func (s *Server) summary(w http.ResponseWriter, r *http.Request) {
	sum, err := s.p.Summary(r.Context())
	if err != nil {
		httpError(w, err)
		return
	}
	writeJSON(w, sum)
}

// LogOptions are the query parameters of /containerLogs, checked as
// upstream's ValidatePodLogOptions does.
type LogOptions struct {
	Follow, Previous, Timestamps bool
	// TailLines < 0 means all.
	TailLines  int64
	LimitBytes int64
	// SinceSeconds (0: unset) or SinceTime (zero: unset), not both.
	SinceSeconds int64
	SinceTime    time.Time
}

// ParseLogOptions validates the query of a logs request.
func ParseLogOptions(q map[string][]string) (LogOptions, error) {
	o := LogOptions{TailLines: -1}
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	for name, dst := range map[string]*bool{"follow": &o.Follow, "previous": &o.Previous, "timestamps": &o.Timestamps} {
		v, err := parseBool(get(name))
		if err != nil {
			return o, badRequest{name + ": " + err.Error()}
		}
		*dst = v
	}
	for _, n := range []struct {
		name string
		dst  *int64
		min  int64
	}{{"tailLines", &o.TailLines, 0}, {"limitBytes", &o.LimitBytes, 1}, {"sinceSeconds", &o.SinceSeconds, 1}} {
		v := get(n.name)
		if v == "" {
			continue
		}
		i, err := strconv.ParseInt(v, 10, 64)
		if err != nil || i < n.min {
			return o, badRequest{fmt.Sprintf("%s %q: want an integer of at least %d", n.name, v, n.min)}
		}
		*n.dst = i
	}
	if v := get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return o, badRequest{fmt.Sprintf("sinceTime %q: want an RFC 3339 time", v)}
		}
		o.SinceTime = t
	}
	if o.SinceSeconds > 0 && !o.SinceTime.IsZero() {
		return o, badRequest{"at most one of sinceTime or sinceSeconds may be specified"}
	}
	return o, nil
}

// read is what to read of the log at now, as upstream's kubelet converts
// PodLogOptions (a previous container's log is not followed).
func (o LogOptions) read(now time.Time) containerlog.Options {
	r := containerlog.Options{Follow: o.Follow && !o.Previous, TailLines: o.TailLines, LimitBytes: o.LimitBytes, Timestamps: o.Timestamps}
	if o.SinceSeconds > 0 {
		r.Since = now.Add(-time.Duration(o.SinceSeconds) * time.Second)
	}
	if o.SinceTime.After(r.Since) {
		r.Since = o.SinceTime
	}
	return r
}

func parseBool(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	return strconv.ParseBool(s)
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	opts, err := ParseLogOptions(r.URL.Query())
	if err != nil {
		httpError(w, err)
		return
	}
	ns, pod, name := r.PathValue("ns"), r.PathValue("pod"), r.PathValue("container")
	c, _, err := s.p.Container(ns, pod, name, opts.Previous)
	if err != nil {
		httpError(w, err)
		return
	}
	if _, err := os.Stat(c.LogPath); err != nil && !os.IsNotExist(err) {
		httpError(w, fmt.Errorf("open log: %w", err))
		return
	}
	running := func() bool {
		cur, _, err := s.p.Container(ns, pod, name, false)
		return err == nil && cur.ID == c.ID && cur.State == runtime.StateRunning
	}
	read := opts.read(time.Now())
	if wsstream.IsWebSocketRequest(r) {
		// Logs over WebSocket, as upstream serves them to clients that ask
		// (binary.k8s.io or base64.binary.k8s.io frames of the stream).
		pr, pw := io.Pipe()
		go func() {
			pw.CloseWithError(containerlog.Read(r.Context(), c.LogPath, read, pw, pw, running))
		}()
		if err := wsstream.NewReader(pr, true, wsstream.NewDefaultReaderProtocols()).Copy(w, r); err != nil && s.cfg.Log != nil {
			s.cfg.Log.Debug("log over WebSocket", "pod", ns+"/"+pod, "err", err)
		}
		pr.Close()
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Transfer-Encoding", "chunked")
	// Both streams into the one response, as upstream's kubelet writes them.
	if err := containerlog.Read(r.Context(), c.LogPath, read, w, w, running); err != nil {
		s.cfg.Log.Debug("read log", "pod", ns+"/"+pod, "container", name, "err", err)
	}
}

func (s *Server) run(w http.ResponseWriter, r *http.Request) {
	cmd := strings.Fields(r.URL.Query().Get("cmd"))
	if len(cmd) == 0 {
		httpError(w, badRequest{"cmd is required"})
		return
	}
	c, _, err := s.p.Container(r.PathValue("ns"), r.PathValue("pod"), r.PathValue("container"), false)
	if err != nil {
		httpError(w, err)
		return
	}
	var out strings.Builder
	code, err := s.p.Runtime().Exec(r.Context(), c.ID, cmd, runtime.ExecOptions{Stdout: &out, Stderr: &out})
	if err != nil {
		httpError(w, err)
		return
	}
	if code != 0 {
		w.WriteHeader(http.StatusInternalServerError)
	}
	io.WriteString(w, out.String())
}
