package apiserver

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
)

// TestAuditPanicStage: a handler that panics leaves a Panic event (500)
// after RequestReceived, and the panic goes on to the recoverer.
func TestAuditPanicStage(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"), 0o600)
	logPath := filepath.Join(dir, "audit.log")
	a, err := newAuditor(AuditConfig{PolicyFile: pol, LogPath: logPath})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	r := httptest.NewRequest("GET", "/api/v1/namespaces/default/pods/p", nil)
	attrs := authz.Attributes{User: &authn.User{Name: "u"}, Verb: "get", APIVersion: "v1", Resource: "pods", Namespace: "default", Name: "p", ResourceRequest: true}
	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(p.(string), "boom") {
				t.Errorf("recovered %v, want the handler's panic", p)
			}
		}()
		a.serve(httptest.NewRecorder(), r, attrs, func(http.ResponseWriter, *http.Request) { panic("boom") })
	}()
	b, _ := os.ReadFile(logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d events, want RequestReceived and Panic:\n%s", len(lines), b)
	}
	var first, last auditv1.Event
	json.Unmarshal([]byte(lines[0]), &first)
	json.Unmarshal([]byte(lines[1]), &last)
	if first.Stage != auditv1.StageRequestReceived || last.Stage != auditv1.StagePanic || last.ResponseStatus == nil ||
		last.ResponseStatus.Code != 500 || !strings.Contains(last.ResponseStatus.Message, "APIServer panic'd: boom") || first.AuditID != last.AuditID {
		t.Fatalf("events:\n%s", b)
	}
}
