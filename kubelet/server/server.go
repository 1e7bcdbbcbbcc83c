// Package server is the kubelet API on port 10250: HTTPS with client
// certificate authentication, serving /healthz, /pods, container logs
// (/containerLogs, with follow, previous, tailLines and limitBytes), exec
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

// LogOptions are the query parameters of /containerLogs.
type LogOptions struct {
	Follow, Previous bool
	// TailLines < 0 means all.
	TailLines  int64
	LimitBytes int64
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
	var err error
	if o.Follow, err = parseBool(get("follow")); err != nil {
		return o, badRequest{"follow: " + err.Error()}
	}
	if o.Previous, err = parseBool(get("previous")); err != nil {
		return o, badRequest{"previous: " + err.Error()}
	}
	if v := get("tailLines"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return o, badRequest{fmt.Sprintf("tailLines %q: want a non-negative integer", v)}
		}
		o.TailLines = n
	}
	if v := get("limitBytes"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return o, badRequest{fmt.Sprintf("limitBytes %q: want a positive integer", v)}
		}
		o.LimitBytes = n
	}
	return o, nil
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
	f, err := os.Open(c.LogPath)
	if err != nil {
		if os.IsNotExist(err) {
			// Started, nothing logged yet.
			f = nil
		} else {
			httpError(w, fmt.Errorf("open log: %w", err))
			return
		}
	}
	var out io.Writer = w
	if opts.LimitBytes > 0 {
		out = &limitedWriter{w: w, n: opts.LimitBytes}
	}
	if f != nil {
		defer f.Close()
		if opts.TailLines >= 0 {
			if err := seekTail(f, opts.TailLines); err != nil {
				httpError(w, err)
				return
			}
		}
	}
	running := func() bool {
		cur, _, err := s.p.Container(ns, pod, name, false)
		return err == nil && cur.ID == c.ID && cur.State == runtime.StateRunning
	}
	if wsstream.IsWebSocketRequest(r) {
		// Logs over WebSocket, as upstream serves them to clients that ask
		// (binary.k8s.io or base64.binary.k8s.io frames of the stream).
		pr, pw := io.Pipe()
		go func() {
			var lw io.Writer = pw
			if opts.LimitBytes > 0 {
				lw = &limitedWriter{w: pw, n: opts.LimitBytes}
			}
			FollowLog(r.Context(), lw, f, c.LogPath, opts.Follow && !opts.Previous, running)
			pw.Close()
		}()
		if err := wsstream.NewReader(pr, true, wsstream.NewDefaultReaderProtocols()).Copy(w, r); err != nil && s.cfg.Log != nil {
			s.cfg.Log.Debug("log over WebSocket", "pod", ns+"/"+pod, "err", err)
		}
		pr.Close()
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Transfer-Encoding", "chunked")
	FollowLog(r.Context(), out, f, c.LogPath, opts.Follow && !opts.Previous, running)
}

type limitedWriter struct {
	w io.Writer
	n int64
}

var errLimit = errors.New("limit reached")

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errLimit
	}
	q := p
	if int64(len(q)) > l.n {
		q = q[:l.n]
	}
	n, err := l.w.Write(q)
	l.n -= int64(n)
	if err == nil && len(q) < len(p) {
		err = errLimit
	}
	return n, err
}

// seekTail positions f at the start of its last n lines.
func seekTail(f *os.File, n int64) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if n == 0 {
		_, err := f.Seek(size, io.SeekStart)
		return err
	}
	const chunk = 8192
	var lines int64
	pos := size
	buf := make([]byte, chunk)
	// A trailing newline ends the last line; it does not start another.
	first := true
	for pos > 0 {
		start := max(pos-chunk, 0)
		b := buf[:pos-start]
		if _, err := f.ReadAt(b, start); err != nil && err != io.EOF {
			return err
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] != '\n' {
				first = false
				continue
			}
			if first && start+int64(i) == size-1 {
				first = false
				continue
			}
			lines++
			if lines == n {
				_, err := f.Seek(start+int64(i)+1, io.SeekStart)
				return err
			}
		}
		pos = start
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}

// FollowLog copies f to w; with follow it keeps copying what is appended
// while running() holds and the client stays, flushing as it goes.
func FollowLog(ctx context.Context, w io.Writer, f *os.File, path string, follow bool, running func() bool) {
	flush := func() {
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		} else if lw, ok := w.(*limitedWriter); ok {
			if fl, ok := lw.w.(http.Flusher); ok {
				fl.Flush()
			}
		}
	}
	copyAll := func() error {
		if f == nil {
			return nil
		}
		_, err := io.Copy(w, f)
		return err
	}
	if err := copyAll(); err != nil {
		return
	}
	flush()
	if !follow {
		return
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if f == nil {
			if nf, err := os.Open(path); err == nil {
				f = nf
				defer nf.Close()
			}
		}
		alive := running()
		if err := copyAll(); err != nil {
			return
		}
		flush()
		if !alive {
			return
		}
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
