package apiserver_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/kubernetes"
	kptr "k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: None
    nonResourceURLs: ["/healthz*", "/readyz*", "/livez*", "/version"]
  - level: Metadata
    resources: [{group: "", resources: ["secrets"]}]
    omitStages: ["RequestReceived"]
  - level: RequestResponse
    resources: [{group: "", resources: ["configmaps"]}]
  - level: Request
    verbs: ["create", "update", "patch", "delete"]
  - level: None
`

func readAudit(t *testing.T, path string) []auditv1.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []auditv1.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var ev auditv1.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("audit line is not an audit.k8s.io/v1 Event: %v: %.200s", err, sc.Text())
		}
		if ev.APIVersion != "audit.k8s.io/v1" || ev.Kind != "Event" {
			t.Fatalf("audit line %s/%s", ev.APIVersion, ev.Kind)
		}
		out = append(out, ev)
	}
	return out
}

// TestAuditLog: the policy (k8s.io/apiserver's evaluator) chooses each
// request's level and stages; a Secret at Metadata level leaves no trace of
// its data, a ConfigMap at RequestResponse carries both bodies and both
// stages, a 403 carries its status, and health checks are not logged.
func TestAuditLog(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte(auditPolicy), 0o600)
	logPath := filepath.Join(dir, "audit", "audit.log")
	srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) {
		c.Audit = apiserver.AuditConfig{PolicyFile: pol, LogPath: logPath, MaxSize: 10, MaxBackup: 2, MaxAge: 1}
	}})
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ctx := context.Background()
	const secret = "s3cr3t-do-not-log"
	if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "audited"},
		StringData: map[string]string{"password": secret}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets("default").Get(ctx, "audited", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "logged"},
		Data: map[string]string{"k": "visible-value"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// PodSecurity in audit mode annotates the event, as upstream.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "psa-audit",
		Labels: map[string]string{"pod-security.kubernetes.io/audit": "restricted"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	priv := true
	if _, err := cs.CoreV1().Pods("psa-audit").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "priv"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", SecurityContext: &corev1.SecurityContext{Privileged: &priv}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A watch: ResponseStarted once its headers are out (before Watch returns).
	w, err := cs.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	// A bad token: 401, audited as upstream's failed-authentication event.
	{
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a raw 401 probe
		req, _ := http.NewRequest(http.MethodPost, srv.Config.Host+"/api/v1/namespaces/default/configmaps", strings.NewReader(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"unauth"}}`))
		req.Header.Set("Authorization", "Bearer not-a-token")
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		tr.CloseIdleConnections()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Audit-Id") == "" {
			t.Fatalf("bad token: %d, Audit-Id %q; want 401 with an Audit-Id", resp.StatusCode, resp.Header.Get("Audit-Id"))
		}
		if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "unauth", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the unauthenticated create left a ConfigMap: %v", err)
		}
	}
	eve := kubernetes.NewForConfigOrDie(srv.UserConfig(t, "eve"))
	if _, err := eve.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "denied"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}, metav1.CreateOptions{}); err == nil {
		t.Fatal("eve created a pod")
	}
	// The last request's event is the marker that every earlier one was written.
	var evs []auditv1.Event
	testutil.Eventually(t, 30*time.Second, func() error {
		evs = readAudit(t, logPath)
		for _, e := range evs {
			if e.User.Username == "eve" && e.Stage == auditv1.StageResponseComplete {
				return nil
			}
		}
		return errors.New("no event for eve's pod yet")
	})
	raw, _ := os.ReadFile(logPath)
	if strings.Contains(string(raw), secret) || strings.Contains(string(raw), "czNjcjN0LWRvLW5vdC1sb2c") {
		t.Fatalf("the Secret's data is in the audit log")
	}
	if strings.Contains(string(raw), `"/healthz`) || strings.Contains(string(raw), `"/readyz`) {
		t.Errorf("health checks were audited")
	}
	find := func(verb, resource, name string, stage auditv1.Stage) *auditv1.Event {
		for i := range evs {
			e := &evs[i]
			if e.Verb == verb && e.ObjectRef != nil && e.ObjectRef.Resource == resource && e.Stage == stage && (name == "" || e.ObjectRef.Name == name) {
				return e
			}
		}
		return nil
	}
	sc := find("create", "secrets", "", auditv1.StageResponseComplete)
	if sc == nil || sc.Level != auditv1.LevelMetadata || sc.RequestObject != nil || sc.ResponseObject != nil || sc.ResponseStatus == nil || sc.ResponseStatus.Code != 201 ||
		sc.User.Username != "admin" || sc.ObjectRef.Namespace != "default" || sc.AuditID == "" {
		t.Errorf("secret create event: %+v", sc)
	}
	if find("create", "secrets", "", auditv1.StageRequestReceived) != nil {
		t.Errorf("RequestReceived was logged though the policy omits it")
	}
	if g := find("get", "secrets", "audited", auditv1.StageResponseComplete); g == nil || g.ResponseObject != nil {
		t.Errorf("secret get event: %+v", g)
	}
	cmRecv := find("create", "configmaps", "", auditv1.StageRequestReceived)
	cm := find("create", "configmaps", "", auditv1.StageResponseComplete)
	if cmRecv == nil || cm == nil || cm.Level != auditv1.LevelRequestResponse || cm.RequestObject == nil || cm.ResponseObject == nil ||
		!strings.Contains(string(cm.RequestObject.Raw), "visible-value") || !strings.Contains(string(cm.ResponseObject.Raw), `"resourceVersion"`) ||
		cmRecv.AuditID != cm.AuditID {
		t.Errorf("configmap create events: %+v %+v", cmRecv, cm)
	}
	if ws := find("watch", "configmaps", "", auditv1.StageResponseStarted); ws == nil || ws.ResponseStatus == nil || ws.ResponseStatus.Code != 200 || ws.ResponseObject != nil {
		t.Errorf("watch ResponseStarted event: %+v", ws)
	}
	var unauth *auditv1.Event
	for i := range evs {
		if e := &evs[i]; e.ResponseStatus != nil && e.ResponseStatus.Code == 401 {
			unauth = e
		}
	}
	if unauth == nil || unauth.Stage != auditv1.StageResponseStarted || unauth.Verb != "create" || unauth.User.Username != "" ||
		unauth.ResponseStatus.Message != "Authentication failed, attempted: bearer" || unauth.ObjectRef == nil || unauth.ObjectRef.Resource != "configmaps" {
		t.Errorf("failed-authentication event: %+v", unauth)
	}
	var psa *auditv1.Event
	for i := range evs {
		if e := &evs[i]; e.Verb == "create" && e.ObjectRef != nil && e.ObjectRef.Namespace == "psa-audit" && e.ObjectRef.Resource == "pods" && e.Stage == auditv1.StageResponseComplete {
			psa = e
		}
	}
	if psa == nil || !strings.Contains(psa.Annotations["pod-security.kubernetes.io/audit-violations"], `would violate PodSecurity "restricted:latest": privileged`) {
		t.Errorf("PodSecurity audit annotation: %+v", psa)
	}
	var d *auditv1.Event
	for i := range evs {
		if e := &evs[i]; e.Verb == "create" && e.User.Username == "eve" && e.Stage == auditv1.StageResponseComplete {
			d = e
		}
	}
	if d == nil || d.Level != auditv1.LevelRequest || d.ResponseStatus == nil || d.ResponseStatus.Code != 403 || d.ResponseStatus.Reason != metav1.StatusReasonForbidden ||
		d.RequestObject == nil || !strings.Contains(string(d.RequestObject.Raw), `"denied"`) {
		t.Errorf("denied pod create event: %+v", d)
	}
}

// TestAuditBadPolicy: a policy the library rejects stops the server with
// an error naming the flag; a policy without a log path (or the reverse)
// is refused.
func TestAuditBadPolicy(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: Loud\n"), 0o600)
	for name, c := range map[string]apiserver.AuditConfig{
		"invalid level": {PolicyFile: bad, LogPath: filepath.Join(dir, "a.log")},
		"missing file":  {PolicyFile: filepath.Join(dir, "none.yaml"), LogPath: filepath.Join(dir, "a.log")},
		"no log path":   {PolicyFile: bad},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		srv, err := apiserver.New(ctx, apiserver.Config{DataDir: t.TempDir(), EtcdUnsafeNoFsync: true, Audit: c})
		cancel()
		if err == nil {
			srv.Close()
			t.Errorf("%s: the server started", name)
		} else if !strings.Contains(err.Error(), "audit") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestAuditAnnotationsFromAdmission: a webhook's auditAnnotations reach the
// request's audit event under the webhook's name, as upstream.
func TestAuditAnnotationsFromAdmission(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "audit.log")
	srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) {
		c.Audit = apiserver.AuditConfig{PolicyFile: pol, LogPath: logPath, MaxSize: 10, MaxBackup: 2, MaxAge: 1}
	}})
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ctx := context.Background()
	wh := startWebhook(t, "webhook.default.svc")
	wh.answer(func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{Allowed: true, AuditAnnotations: map[string]string{"checked": "yes"}}
	})
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "audited"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "audited.waggle.test", ClientConfig: wh.clientConfig("/audit"), Rules: configMapRule,
			SideEffects: kptr.To(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	i := 0
	testutil.Eventually(t, 45*time.Second, func() error {
		i++
		name := fmt.Sprintf("audited-%d", i)
		if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm(name, nil), metav1.CreateOptions{}); err != nil {
			return err
		}
		for _, e := range readAudit(t, logPath) {
			if e.ObjectRef != nil && e.ObjectRef.Resource == "configmaps" && e.Verb == "create" && e.Annotations["audited.waggle.test/checked"] == "yes" {
				return nil
			}
		}
		return fmt.Errorf("no audit event of a configmap create (the last %s) with the webhook's annotation", name)
	})
}
