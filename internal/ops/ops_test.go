package ops

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestReadyzFailsWhileACheckFails(t *testing.T) {
	h := NewHealth()
	var notReady = errors.New("informers not synced")
	h.AddReadiness(Check{Name: "informers", Func: func(context.Context) error { return notReady }})
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()

	for path, want := range map[string]int{"/healthz": 200, "/livez": 200, "/readyz": 500, "/metrics": 200} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: got %d, want %d", path, resp.StatusCode, want)
		}
	}
	notReady = nil
	resp, err := http.Get(srv.URL + "/readyz?verbose")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "[+]informers ok") {
		t.Fatalf("after recovery: %d %q", resp.StatusCode, body)
	}
}

func TestNewLoggerRejectsUnknownLevel(t *testing.T) {
	if _, err := NewLogger("x", "loud"); err == nil {
		t.Fatal("want an error for level 'loud'")
	}
}
