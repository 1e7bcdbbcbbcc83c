package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/waggle-io/waggle/kubelet/containerlog"
	"github.com/waggle-io/waggle/kubelet/runtime"
	"github.com/waggle-io/waggle/kubelet/runtime/runtimetest"
)

func TestParseLogOptions(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  LogOptions
		bad   bool
	}{
		{"", LogOptions{TailLines: -1}, false},
		{"follow=true&previous=1&tailLines=10&limitBytes=5", LogOptions{Follow: true, Previous: true, TailLines: 10, LimitBytes: 5}, false},
		{"tailLines=0", LogOptions{TailLines: 0}, false},
		{"tailLines=-1", LogOptions{}, true},
		{"tailLines=x", LogOptions{}, true},
		{"limitBytes=0", LogOptions{}, true},
		{"follow=maybe", LogOptions{}, true},
		{"timestamps=true&sinceSeconds=5", LogOptions{TailLines: -1, Timestamps: true, SinceSeconds: 5}, false},
		{"sinceTime=2024-05-06T07:08:09Z", LogOptions{TailLines: -1, SinceTime: time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)}, false},
		{"sinceSeconds=0", LogOptions{}, true},
		{"sinceTime=yesterday", LogOptions{}, true},
		{"sinceSeconds=5&sinceTime=2024-05-06T07:08:09Z", LogOptions{}, true},
		{"timestamps=maybe", LogOptions{}, true},
	} {
		t.Run(tc.query, func(t *testing.T) {
			q, _ := url.ParseQuery(tc.query)
			got, err := ParseLogOptions(q)
			if tc.bad {
				var br badRequest
				if !errors.As(err, &br) {
					t.Fatalf("err = %v, want a bad request", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzParseLogOptions(f *testing.F) {
	for _, s := range []string{"", "tailLines=3", "follow=true&previous=false", "limitBytes=-1", "tailLines=99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := url.ParseQuery(s)
		if err != nil {
			return
		}
		o, err := ParseLogOptions(q)
		if err == nil && (o.TailLines < -1 || o.LimitBytes < 0 || o.SinceSeconds < 0 || (o.SinceSeconds > 0 && !o.SinceTime.IsZero())) {
			t.Fatalf("accepted invalid options %+v from %q", o, s)
		}
	})
}

// fakeProvider serves one pod with a current and a previous container.
type fakeProvider struct {
	rt  *runtimetest.Fake
	cur runtime.Container
	old runtime.Container
	// runtimeCalls counts Runtime(): every exec and run goes through it.
	runtimeCalls int
}

func (p *fakeProvider) Container(ns, pod, c string, previous bool) (runtime.Container, types.UID, error) {
	if ns != "default" || pod != "web" || c != "echo" {
		return runtime.Container{}, "", ErrNotFound
	}
	if previous {
		return p.old, "uid", nil
	}
	return p.cur, "uid", nil
}
func (p *fakeProvider) Pods() []*v1.Pod                          { return []*v1.Pod{{}} }
func (p *fakeProvider) PodUID(string, string) (types.UID, error) { return "", ErrNotFound }
func (p *fakeProvider) PortForwardDial(context.Context, string, string, int32) (net.Conn, error) {
	return nil, ErrNotFound
}
func (p *fakeProvider) Summary(context.Context) (*statsapi.Summary, error) {
	return &statsapi.Summary{Node: statsapi.NodeStats{NodeName: "n1"}}, nil
}
func (p *fakeProvider) Runtime() runtime.Runtime { p.runtimeCalls++; return p.rt }
func (p *fakeProvider) Metrics() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "m 1\n") })
}
func (p *fakeProvider) Healthy(context.Context) error { return nil }

// testAuth authenticates "Bearer <user>" as <user> and allows what allow
// says for (user, subresource); "Bearer broken" makes the authorizer fail.
func testAuth(allow map[string][]string) *Auth {
	return &Auth{
		NodeName: "n1",
		Authenticator: authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
			name, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok {
				return nil, false, nil
			}
			return &authenticator.Response{User: &user.DefaultInfo{Name: name}}, true, nil
		}),
		Authorizer: authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
			if a.GetUser().GetName() == "broken" {
				return authorizer.DecisionNoOpinion, "", errors.New("webhook down")
			}
			if a.GetResource() != "nodes" || a.GetName() != "n1" || !a.IsResourceRequest() {
				return authorizer.DecisionNoOpinion, "", nil
			}
			if slices.Contains(allow[a.GetUser().GetName()], a.GetSubresource()) {
				return authorizer.DecisionAllow, "", nil
			}
			return authorizer.DecisionNoOpinion, "", nil
		}),
	}
}

func TestHandlerAuthAndLogs(t *testing.T) {
	dir := t.TempDir()
	cur, old := filepath.Join(dir, "1.log"), filepath.Join(dir, "0.log")
	// Records at now-3600.5 s, -3599.5 s, -3598.5 s: half a second from
	// where sinceSeconds cuts.
	now := time.Now()
	start := now.Add(-time.Hour - 500*time.Millisecond)
	writeCRILog(t, cur, start, "one", "two", "three")
	writeCRILog(t, old, now.Add(-2*time.Hour), "previous run")
	stamp := start.Add(2 * time.Second).Format(containerlog.TimeFormatOut)
	p := &fakeProvider{rt: runtimetest.NewFake(),
		cur: runtime.Container{ID: "c1", State: runtime.StateExited, LogPath: cur},
		old: runtime.Container{ID: "c0", State: runtime.StateExited, LogPath: old}}
	s := &Server{p: p, cfg: Config{Auth: testAuth(map[string][]string{
		"admin":   {"proxy"},
		"metrics": {"metrics", "stats"},
		"health":  {"healthz"},
	})}}
	h := s.Handler()
	do := func(method, path, user string) (int, string) {
		r := httptest.NewRequest(method, path, nil)
		if user != "" {
			r.Header.Set("Authorization", "Bearer "+user)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	for _, tc := range []struct {
		method, path, user string
		code               int
		body               string
	}{
		{"GET", "/healthz", "", 401, "Unauthorized"},
		{"GET", "/pods", "", 401, "Unauthorized"},
		{"GET", "/healthz", "health", 200, "ok"},
		{"GET", "/healthz", "admin", 200, "ok"}, // nodes/proxy covers healthz
		{"GET", "/pods", "admin", 200, "PodList"},
		{"GET", "/pods", "metrics", 403, "Forbidden (user=metrics, verb=get, resource=nodes, subresource(s)=[pods proxy])"},
		{"GET", "/containerLogs/default/web/echo", "", 401, ""},
		{"GET", "/containerLogs/default/web/echo", "metrics", 403, "subresource(s)=[proxy]"},
		{"GET", "/containerLogs/default/web/echo", "admin", 200, "one\ntwo\nthree\n"},
		{"GET", "/containerLogs/default/web/echo?tailLines=1", "admin", 200, "three\n"},
		{"GET", "/containerLogs/default/web/echo?limitBytes=4", "admin", 200, "one\n"},
		{"GET", "/containerLogs/default/web/echo?previous=true", "admin", 200, "previous run\n"},
		{"GET", "/containerLogs/default/web/echo?tailLines=1&timestamps=true", "admin", 200, stamp + " three\n"},
		{"GET", "/containerLogs/default/web/echo?sinceSeconds=3599", "admin", 200, "three\n"},
		{"GET", "/containerLogs/default/web/echo?sinceSeconds=86400", "admin", 200, "one\ntwo\nthree\n"},
		{"GET", "/containerLogs/default/web/echo?sinceTime=" + start.Add(time.Second).UTC().Format(time.RFC3339Nano), "admin", 200, "two\nthree\n"},
		{"GET", "/containerLogs/default/web/echo?sinceSeconds=1&sinceTime=" + now.UTC().Format(time.RFC3339), "admin", 400, ""},
		{"GET", "/containerLogs/default/web/other", "admin", 404, ""},
		{"GET", "/containerLogs/default/web/echo?tailLines=no", "admin", 400, ""},
		{"GET", "/stats/summary", "metrics", 200, `"nodeName":"n1"`},
		{"GET", "/stats/summary", "health", 403, "subresource(s)=[stats]"},
		{"GET", "/metrics", "metrics", 200, "m 1"},
		{"POST", "/run/default/web/echo?cmd=id", "metrics", 403, "Forbidden (user=metrics, verb=create, resource=nodes, subresource(s)=[proxy])"},
		{"GET", "/pods", "broken", 500, "Authorization error (user=broken, verb=get, resource=nodes, subresource=pods)"},
	} {
		code, body := do(tc.method, tc.path, tc.user)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s %s (as %q) = %d %q, want %d containing %q", tc.method, tc.path, tc.user, code, body, tc.code, tc.body)
		}
	}
	if n := p.runtimeCalls; n != 0 {
		t.Errorf("a refused /run reached the runtime: %d execs", n)
	}
}

func TestNoAuthRefusesEverything(t *testing.T) {
	s := &Server{p: &fakeProvider{rt: runtimetest.NewFake()}}
	r := httptest.NewRequest("GET", "/healthz", nil)
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("GET /healthz without Auth = %d, want 401", w.Code)
	}
}

func TestRequestAttributes(t *testing.T) {
	u := &user.DefaultInfo{Name: "u"}
	for _, tc := range []struct {
		method, path string
		verb         string
		subs         []string
	}{
		{"GET", "/pods", "get", []string{"pods", "proxy"}},
		{"GET", "/runningpods/", "get", []string{"pods", "proxy"}},
		{"GET", "/healthz", "get", []string{"healthz", "proxy"}},
		{"GET", "/healthz/ping", "get", []string{"healthz", "proxy"}},
		{"GET", "/configz", "get", []string{"configz", "proxy"}},
		{"GET", "/stats/summary", "get", []string{"stats"}},
		{"GET", "/stats", "get", []string{"stats"}},
		{"GET", "/metrics", "get", []string{"metrics"}},
		{"GET", "/metrics/cadvisor", "get", []string{"metrics"}},
		{"GET", "/logs/syslog", "get", []string{"log"}},
		{"POST", "/checkpoint/ns/p/c", "create", []string{"checkpoint"}},
		{"GET", "/containerLogs/ns/p/c", "get", []string{"proxy"}},
		{"POST", "/exec/ns/p/c", "create", []string{"proxy"}},
		{"POST", "/run/ns/p/c", "create", []string{"proxy"}},
		{"GET", "/portForward/ns/p", "get", []string{"proxy"}},
		{"GET", "/podsx", "get", []string{"proxy"}},
		{"GET", "/spec/", "get", []string{"proxy"}},
		{"DELETE", "/x", "delete", []string{"proxy"}},
		{"PUT", "/x", "update", []string{"proxy"}},
		{"PATCH", "/x", "patch", []string{"proxy"}},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		attrs := RequestAttributes("n1", u, r)
		var subs []string
		for _, a := range attrs {
			subs = append(subs, a.GetSubresource())
			if a.GetVerb() != tc.verb || a.GetResource() != "nodes" || a.GetName() != "n1" || a.GetAPIVersion() != "v1" ||
				a.GetAPIGroup() != "" || a.GetNamespace() != "" || !a.IsResourceRequest() || a.GetPath() != tc.path {
				t.Errorf("%s %s: attributes %+v", tc.method, tc.path, a)
			}
		}
		if !slices.Equal(subs, tc.subs) {
			t.Errorf("%s %s: subresources %v, want %v", tc.method, tc.path, subs, tc.subs)
		}
	}
}

// TestLogsOverWebSocket: a WebSocket request for a log gets the log in
// binary.k8s.io frames, as upstream serves newer clients.
func TestLogsOverWebSocket(t *testing.T) {
	dir := t.TempDir()
	cur := filepath.Join(dir, "1.log")
	writeCRILog(t, cur, time.Now(), "one", "two")
	p := &fakeProvider{rt: runtimetest.NewFake(), cur: runtime.Container{ID: "c1", State: runtime.StateExited, LogPath: cur}}
	s := &Server{p: p, cfg: Config{Auth: testAuth(map[string][]string{"admin": {"proxy"}})}}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	cfg, err := websocket.NewConfig("ws"+strings.TrimPrefix(srv.URL, "http")+"/containerLogs/default/web/echo", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Protocol = []string{"binary.k8s.io"}
	cfg.Header = http.Header{"Authorization": {"Bearer admin"}}
	ws, err := websocket.DialConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	var got []byte
	for {
		var frame []byte
		if err := websocket.Message.Receive(ws, &frame); err != nil {
			break
		}
		got = append(got, frame...)
	}
	if string(got) != "one\ntwo\n" {
		t.Errorf("log over WebSocket = %q", got)
	}
}

// writeCRILog writes lines as stdout records a second apart from start.
func writeCRILog(t *testing.T, path string, start time.Time, lines ...string) {
	t.Helper()
	var b []byte
	for i, l := range lines {
		b = containerlog.Record{Time: start.Add(time.Duration(i) * time.Second), Stream: containerlog.Stdout, Content: []byte(l)}.Append(b)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
