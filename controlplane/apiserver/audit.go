package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"gopkg.in/natefinch/lumberjack.v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/apiserver/pkg/audit"
	"k8s.io/apiserver/pkg/audit/policy"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	auditlog "k8s.io/apiserver/plugin/pkg/audit/log"
	clientscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
)

// AuditConfig is kube-apiserver's audit log configuration.
type AuditConfig struct {
	// PolicyFile is --audit-policy-file (audit.k8s.io/v1 Policy); without
	// it nothing is audited.
	PolicyFile string
	// LogPath is --audit-log-path ("-" is standard output); without it
	// nothing is audited.
	LogPath string
	// MaxAge (days), MaxBackup (files) and MaxSize (megabytes) rotate the
	// log as --audit-log-maxage/-maxbackup/-maxsize do; all zero: one file,
	// appended to, never rotated.
	MaxAge, MaxBackup, MaxSize int
}

// auditor evaluates the policy per request and writes the events.
type auditor struct {
	eval    audit.PolicyRuleEvaluator
	backend audit.Backend
	closer  io.Closer
}

// newAuditor loads the policy with k8s.io/apiserver's reader (its
// validation and errors) and opens the log backend, which writes
// audit.k8s.io/v1 events as JSON lines.
func newAuditor(c AuditConfig) (*auditor, error) {
	if c.PolicyFile == "" || c.LogPath == "" {
		if c.PolicyFile != "" || c.LogPath != "" {
			return nil, errors.New("audit: --audit-policy-file and --audit-log-path go together")
		}
		return nil, nil
	}
	p, err := policy.LoadPolicyFromFile(c.PolicyFile)
	if err != nil {
		return nil, fmt.Errorf("audit: --audit-policy-file: %w", err)
	}
	a := &auditor{eval: policy.NewPolicyRuleEvaluator(p)}
	var out io.Writer
	switch {
	case c.LogPath == "-":
		out = os.Stdout
	case c.MaxAge > 0 || c.MaxBackup > 0 || c.MaxSize > 0:
		if err := os.MkdirAll(filepath.Dir(c.LogPath), 0o700); err != nil {
			return nil, fmt.Errorf("audit: --audit-log-path: %w", err)
		}
		lj := &lumberjack.Logger{Filename: c.LogPath, MaxAge: c.MaxAge, MaxBackups: c.MaxBackup, MaxSize: c.MaxSize}
		out, a.closer = lj, lj
	default:
		if err := os.MkdirAll(filepath.Dir(c.LogPath), 0o700); err != nil {
			return nil, fmt.Errorf("audit: --audit-log-path: %w", err)
		}
		f, err := os.OpenFile(c.LogPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("audit: --audit-log-path: %w", err)
		}
		out, a.closer = f, f
	}
	a.backend = auditlog.NewBackend(out, auditlog.FormatJson, auditv1.SchemeGroupVersion)
	return a, nil
}

func (a *auditor) Close() error {
	if a == nil || a.closer == nil {
		return nil
	}
	return a.closer.Close()
}

// auditBodyLimit bounds what a RequestResponse event keeps of a response.
const auditBodyLimit = 4 << 20

// serve runs h under audit, as kube-apiserver's WithAudit filter: the
// policy picks the level and omitted stages from the request's
// authorization attributes; the event is written at RequestReceived, then
// at ResponseComplete (or Panic, before the panic goes on). Metadata
// events carry no object; Request adds the request body, RequestResponse
// the response body too (JSON bodies; watches and upgraded connections
// never carry a response body).
func (a *auditor) serve(w http.ResponseWriter, r *http.Request, attrs authz.Attributes, h http.HandlerFunc) {
	rec := toAuthorizerAttributes(attrs)
	ctx, rac, ok := a.begin(w, r, rec)
	if !ok {
		h(w, r)
		return
	}
	ac := audit.AuditContextFrom(ctx)
	if !rac.Level.Less(auditinternal.LevelRequest) && r.Body != nil && (r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch) {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if j := auditJSON(body, r.Header.Get("Content-Type")); err == nil && j != nil {
			audit.LogRequestPatch(ctx, j)
		}
	}
	ac.ProcessEventStage(ctx, auditinternal.StageRequestReceived)
	q := r.URL.Query()
	streaming := q.Get("watch") == "true" || q.Get("watch") == "1" || q.Get("follow") == "true" || r.Header.Get("Upgrade") != ""
	aw := &auditWriter{ResponseWriter: w, keepAll: rac.Level == auditinternal.LevelRequestResponse && !streaming}
	if streaming {
		// Long-running requests (watches, follows, upgrades) also get a
		// ResponseStarted event once their headers go out, as upstream.
		aw.started = func(code int) {
			ac.SetEventResponseStatus(&metav1.Status{Code: int32(code)})
			ac.ProcessEventStage(ctx, auditinternal.StageResponseStarted)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			ac.SetEventResponseStatus(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError,
				Reason: metav1.StatusReasonInternalError, Message: fmt.Sprintf("APIServer panic'd: %v", p)})
			ac.ProcessEventStage(ctx, auditinternal.StagePanic)
			panic(p)
		}
		code := aw.code
		if code == 0 {
			code = http.StatusOK
		}
		var st *metav1.Status
		if code >= 300 {
			var s metav1.Status
			if j := auditJSON(aw.buf.Bytes(), aw.Header().Get("Content-Type")); j != nil && json.Unmarshal(j, &s) == nil && s.Kind == "Status" {
				st = &s
			}
		}
		if st == nil {
			st = &metav1.Status{Code: int32(code)}
		}
		st.Code = int32(code)
		var obj *runtime.Unknown
		if aw.keepAll && !aw.over && aw.buf.Len() > 0 {
			if j := auditJSON(aw.buf.Bytes(), aw.Header().Get("Content-Type")); j != nil {
				obj = &runtime.Unknown{Raw: j, ContentType: runtime.ContentTypeJSON}
			}
		}
		ac.LogResponseObject(st, obj)
		ac.ProcessEventStage(ctx, auditinternal.StageResponseComplete)
	}()
	h(aw, r.WithContext(ctx))
}

// begin starts the audit of a request as WithAudit does: the policy's
// level and stages for rec, an audit ID (the client's, else a new one)
// echoed in the response header, and the request's metadata. ok is false
// when the request is not audited (level None, or the context would not
// initialise).
func (a *auditor) begin(w http.ResponseWriter, r *http.Request, rec authorizer.AttributesRecord) (ctx context.Context, rac audit.RequestAuditConfig, ok bool) {
	rac = a.eval.EvaluatePolicyRule(rec)
	if rac.Level == auditinternal.LevelNone {
		return nil, rac, false
	}
	received := time.Now()
	ctx = audit.WithAuditContext(r.Context())
	id := types.UID(r.Header.Get(auditinternal.HeaderAuditID))
	if id == "" {
		id = types.UID(uuid.NewString())
	}
	audit.WithAuditID(ctx, id)
	if err := audit.AuditContextFrom(ctx).Init(rac, a.backend); err != nil {
		return nil, rac, false
	}
	w.Header().Set(auditinternal.HeaderAuditID, string(id))
	audit.LogRequestMetadata(ctx, r, received, rec)
	return ctx, rac, true
}

// failedAuthn runs h (which writes the 401) under audit as upstream's
// WithFailedAuthenticationAudit: the policy is evaluated with no user, and
// one event at stage ResponseStarted records the code and which credentials
// were tried ("Authentication failed, attempted: bearer, x509").
func (a *auditor) failedAuthn(w http.ResponseWriter, r *http.Request, h http.HandlerFunc) {
	rec := toAuthorizerAttributes(authz.AttributesFrom(r, nil))
	ctx, _, ok := a.begin(w, r, rec)
	if !ok {
		h(w, r)
		return
	}
	ac := audit.AuditContextFrom(ctx)
	aw := &auditWriter{ResponseWriter: w}
	h(aw, r.WithContext(ctx))
	code := aw.code
	if code == 0 {
		code = http.StatusOK
	}
	ac.SetEventResponseStatus(&metav1.Status{Code: int32(code), Message: failedAuthnMethods(r)})
	ac.ProcessEventStage(ctx, auditinternal.StageResponseStarted)
}

// failedAuthnMethods is upstream's getAuthMethods message.
func failedAuthnMethods(r *http.Request) string {
	var m []string
	if _, _, ok := r.BasicAuth(); ok {
		m = append(m, "basic")
	}
	if parts := strings.Split(strings.TrimSpace(r.Header.Get("Authorization")), " "); len(parts) > 1 && strings.ToLower(parts[0]) == "bearer" {
		m = append(m, "bearer")
	}
	if strings.TrimSpace(r.URL.Query().Get("access_token")) != "" {
		m = append(m, "access_token")
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		m = append(m, "x509")
	}
	if len(m) > 0 {
		return "Authentication failed, attempted: " + strings.Join(m, ", ")
	}
	return "Authentication failed, no credentials provided"
}

// auditAnnotate adds an annotation to the request's audit event, if any.
func auditAnnotate(ctx context.Context, key, value string) {
	audit.AddAuditAnnotation(ctx, key, value)
}

func toAuthorizerAttributes(a authz.Attributes) authorizer.AttributesRecord {
	rec := authorizer.AttributesRecord{
		Verb: a.Verb, Namespace: a.Namespace, APIGroup: a.APIGroup, APIVersion: a.APIVersion,
		Resource: a.Resource, Subresource: a.Subresource, Name: a.Name, ResourceRequest: a.ResourceRequest, Path: a.Path,
	}
	if a.User != nil {
		rec.User = &user.DefaultInfo{Name: a.User.Name, UID: a.User.UID, Groups: a.User.Groups}
	}
	return rec
}

// auditWriter records the status code and, when asked (or for an error's
// Status), the body, passing everything through.
type auditWriter struct {
	http.ResponseWriter
	code    int
	started func(code int) // called once, when the status code is known
	keepAll bool
	keep    bool
	over    bool
	buf     bytes.Buffer
}

func (w *auditWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
		w.keep = w.keepAll || code >= 300
		if w.started != nil {
			w.started(code)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *auditWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.keep && !w.over {
		if w.buf.Len()+len(b) > auditBodyLimit {
			w.over = true
			w.buf.Reset()
		} else {
			w.buf.Write(b)
		}
	}
	return w.ResponseWriter.Write(b)
}

// auditJSON is a body as the audit event's JSON: JSON as it is, protobuf
// (client-go's default for built-in kinds) decoded and re-encoded; nil for
// anything else (YAML apply patches, tables, streams).
func auditJSON(body []byte, contentType string) []byte {
	if len(body) == 0 {
		return nil
	}
	if strings.Contains(contentType, "protobuf") {
		obj, gvk, err := clientscheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		if err != nil {
			return nil
		}
		obj.GetObjectKind().SetGroupVersionKind(*gvk)
		j, err := json.Marshal(obj)
		if err != nil {
			return nil
		}
		return j
	}
	if json.Valid(body) {
		return bytes.Clone(body)
	}
	return nil
}

func (w *auditWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *auditWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.code == 0 {
		w.code = http.StatusSwitchingProtocols
		if w.started != nil {
			w.started(w.code)
		}
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *auditWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
