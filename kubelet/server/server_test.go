package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

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
		if err == nil && (o.TailLines < -1 || o.LimitBytes < 0) {
			t.Fatalf("accepted invalid options %+v from %q", o, s)
		}
	})
}

func TestSeekTail(t *testing.T) {
	dir := t.TempDir()
	big := strings.Repeat("0123456789abcdef\n", 2000) + "last\n"
	for _, tc := range []struct {
		name, content string
		n             int64
		want          string
	}{
		{"last two", "a\nb\nc\n", 2, "b\nc\n"},
		{"more than present", "a\nb\n", 5, "a\nb\n"},
		{"zero", "a\nb\n", 0, ""},
		{"no trailing newline", "a\nb\nc", 1, "c"},
		{"empty", "", 3, ""},
		{"across chunks", big, 2, "0123456789abcdef\nlast\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			os.WriteFile(p, []byte(tc.content), 0o644)
			f, _ := os.Open(p)
			defer f.Close()
			if err := seekTail(f, tc.n); err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(f)
			if string(got) != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// fakeProvider serves one pod with a current and a previous container.
type fakeProvider struct {
	rt  *runtimetest.Fake
	cur runtime.Container
	old runtime.Container
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
func (p *fakeProvider) Runtime() runtime.Runtime { return p.rt }
func (p *fakeProvider) Metrics() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "m 1\n") })
}
func (p *fakeProvider) Healthy(context.Context) error { return nil }

func TestHandlerAuthAndLogs(t *testing.T) {
	dir := t.TempDir()
	cur, old := filepath.Join(dir, "1.log"), filepath.Join(dir, "0.log")
	os.WriteFile(cur, []byte("one\ntwo\nthree\n"), 0o644)
	os.WriteFile(old, []byte("previous run\n"), 0o644)
	p := &fakeProvider{rt: runtimetest.NewFake(),
		cur: runtime.Container{ID: "c1", State: runtime.StateExited, LogPath: cur},
		old: runtime.Container{ID: "c0", State: runtime.StateExited, LogPath: old}}
	s := &Server{p: p}
	h := s.Handler()
	do := func(path string, authed bool) (int, string) {
		r := httptest.NewRequest("GET", path, nil)
		if authed {
			r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{nil}}}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	for _, tc := range []struct {
		path   string
		authed bool
		code   int
		body   string
	}{
		{"/healthz", false, 200, "ok"},
		{"/pods", false, 401, ""},
		{"/containerLogs/default/web/echo", false, 401, ""},
		{"/containerLogs/default/web/echo", true, 200, "one\ntwo\nthree\n"},
		{"/containerLogs/default/web/echo?tailLines=1", true, 200, "three\n"},
		{"/containerLogs/default/web/echo?limitBytes=4", true, 200, "one\n"},
		{"/containerLogs/default/web/echo?previous=true", true, 200, "previous run\n"},
		{"/containerLogs/default/web/other", true, 404, ""},
		{"/containerLogs/default/web/echo?tailLines=no", true, 400, ""},
		{"/stats/summary", true, 200, `"nodeName":"n1"`},
		{"/metrics", true, 200, "m 1"},
	} {
		code, body := do(tc.path, tc.authed)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("GET %s (auth %v) = %d %q, want %d containing %q", tc.path, tc.authed, code, body, tc.code, tc.body)
		}
	}
}

func TestFollowStopsWhenContainerStops(t *testing.T) {
	f, _ := os.CreateTemp(t.TempDir(), "log")
	f.WriteString("a\n")
	var out bytes.Buffer
	calls := 0
	r, _ := os.Open(f.Name())
	defer r.Close()
	FollowLog(context.Background(), &out, r, f.Name(), true, func() bool {
		calls++
		if calls == 2 {
			f.WriteString("b\n")
		}
		return calls < 3
	})
	if out.String() != "a\nb\n" {
		t.Errorf("followed %q", out.String())
	}
}
