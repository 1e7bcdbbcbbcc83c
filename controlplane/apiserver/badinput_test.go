package apiserver_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

type rawClient struct {
	t    *testing.T
	c    *http.Client
	host string
}

func newRaw(t *testing.T, rc *rest.Config) *rawClient {
	c, err := rest.HTTPClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	return &rawClient{t: t, c: c, host: rc.Host}
}

// do sends a request and returns the code and the decoded Status (if the
// body is one).
func (r *rawClient) do(method, path, contentType string, body io.Reader, length int64) (int, *metav1.Status, []byte) {
	r.t.Helper()
	req, err := http.NewRequest(method, r.host+path, body)
	if err != nil {
		r.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.ContentLength = length
	resp, err := r.c.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st metav1.Status
	if json.Unmarshal(b, &st) == nil && st.Kind == "Status" {
		return resp.StatusCode, &st, b
	}
	return resp.StatusCode, nil, b
}

func cmJSON(name string, dataSize int) string {
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q},"data":{"k":%q}}`, name, strings.Repeat("x", dataSize))
}

func TestBadInputIsRefusedWithStatusAndNothingStored(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	raw := newRaw(t, srv.Config)
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed", Finalizers: []string{"test/hold"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Namespaces().Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := "/api/v1/namespaces/default/configmaps"
	pods := "/api/v1/namespaces/default/pods"
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	laughs := "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
	for i, prev := 'b', 'a'; i <= 'j'; i, prev = i+1, i {
		laughs += fmt.Sprintf("%c: &%c [*%c,*%c,*%c,*%c,*%c,*%c,*%c,*%c,*%c]\n", i, i, prev, prev, prev, prev, prev, prev, prev, prev, prev)
	}
	laughs = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: laughs}\n" + laughs

	cases := []struct {
		name        string
		method      string
		path        string
		contentType string
		body        string
		chunked     bool
		wantCode    int
		wantReason  metav1.StatusReason
		wantField   string // a field path the Status details must name
		stored      string // the object that must not exist afterwards (path)
	}{
		{name: "body over 3 MiB with length", method: "POST", path: cms, contentType: "application/json", body: cmJSON("big1", 3<<20+10),
			wantCode: 413, wantReason: metav1.StatusReasonRequestEntityTooLarge, stored: cms + "/big1"},
		{name: "body over 3 MiB chunked", method: "POST", path: cms, contentType: "application/json", body: cmJSON("big2", 3<<20+10), chunked: true,
			wantCode: 413, wantReason: metav1.StatusReasonRequestEntityTooLarge, stored: cms + "/big2"},
		{name: "object over 1.5 MiB", method: "POST", path: cms, contentType: "application/json", body: cmJSON("big3", 1600<<10),
			wantCode: 413, wantReason: metav1.StatusReasonRequestEntityTooLarge, stored: cms + "/big3"},
		{name: "malformed JSON", method: "POST", path: cms, contentType: "application/json", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"m1"`,
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, stored: cms + "/m1"},
		{name: "malformed YAML", method: "POST", path: cms, contentType: "application/yaml", body: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: m2\n data: [",
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, stored: cms + "/m2"},
		{name: "deeply nested JSON", method: "POST", path: cms, contentType: "application/json", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"m3"},"x":` + deep + `}`,
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, stored: cms + "/m3"},
		{name: "deeply nested YAML", method: "POST", path: cms, contentType: "application/yaml", body: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: m11}\nx: " + strings.Repeat("[", 200000) + strings.Repeat("]", 200000),
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, stored: cms + "/m11"},
		{name: "deeply nested patch", method: "PATCH", path: cms + "/m12", contentType: "application/merge-patch+json", body: deep,
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest},
		{name: "billion laughs YAML", method: "POST", path: cms, contentType: "application/yaml", body: laughs,
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, stored: cms + "/laughs"},
		{name: "wrong kind for the URL", method: "POST", path: cms, contentType: "application/json", body: `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"m4"}}`,
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, stored: cms + "/m4"},
		{name: "unknown field under Strict", method: "POST", path: cms + "?fieldValidation=Strict", contentType: "application/json", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"m5"},"bogus":1}`,
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, stored: cms + "/m5"},
		{name: "invalid name", method: "POST", path: cms, contentType: "application/json", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Not_Valid"}}`,
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantField: "metadata.name", stored: cms + "/Not_Valid"},
		{name: "invalid label", method: "POST", path: cms, contentType: "application/json", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"m6","labels":{"a b":"c"}}}`,
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantField: "metadata.labels", stored: cms + "/m6"},
		{name: "invalid service port", method: "POST", path: "/api/v1/namespaces/default/services", contentType: "application/json",
			body:     `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1"},"spec":{"ports":[{"port":70000}]}}`,
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantField: "spec.ports[0].port", stored: "/api/v1/namespaces/default/services/s1"},
		{name: "pod without containers", method: "POST", path: pods, contentType: "application/json", body: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p1"},"spec":{"containers":[]}}`,
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantField: "spec.containers", stored: pods + "/p1"},
		{name: "deployment selector not matching template", method: "POST", path: "/apis/apps/v1/namespaces/default/deployments", contentType: "application/json",
			body:     `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d1"},"spec":{"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"c"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}}`,
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantField: "spec.template.metadata.labels", stored: "/apis/apps/v1/namespaces/default/deployments/d1"},
		{name: "create in a missing namespace", method: "POST", path: "/api/v1/namespaces/nope/configmaps", contentType: "application/json", body: cmJSON("m7", 1),
			wantCode: 404, wantReason: metav1.StatusReasonNotFound, stored: "/api/v1/namespaces/nope/configmaps/m7"},
		{name: "create in a terminating namespace", method: "POST", path: "/api/v1/namespaces/doomed/configmaps", contentType: "application/json", body: cmJSON("m8", 1),
			wantCode: 403, wantReason: metav1.StatusReasonForbidden, stored: "/api/v1/namespaces/doomed/configmaps/m8"},
		{name: "unsupported dryRun", method: "POST", path: cms + "?dryRun=Some", contentType: "application/json", body: cmJSON("m9", 1),
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, stored: cms + "/m9"},
		{name: "dryRun=All stores nothing", method: "POST", path: cms + "?dryRun=All", contentType: "application/json", body: cmJSON("m10", 1),
			wantCode: 201, stored: cms + "/m10"},
		{name: "bad label selector", method: "GET", path: cms + "?labelSelector=a%20in%20(", wantCode: 400, wantReason: metav1.StatusReasonBadRequest},
		{name: "unsupported field selector", method: "GET", path: pods + "?fieldSelector=spec.bogus%3Dx", wantCode: 400, wantReason: metav1.StatusReasonBadRequest},
		{name: "sendInitialEvents without resourceVersionMatch", method: "GET", path: pods + "?watch=1&sendInitialEvents=true",
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantField: "resourceVersionMatch"},
		{name: "sendInitialEvents on a list", method: "GET", path: pods + "?sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0",
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantField: "sendInitialEvents"},
		{name: "resourceVersionMatch without resourceVersion", method: "GET", path: pods + "?resourceVersionMatch=NotOlderThan",
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantField: "resourceVersionMatch"},
		{name: "unknown resourceVersionMatch", method: "GET", path: pods + "?resourceVersionMatch=Newest&resourceVersion=1",
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantField: "resourceVersionMatch"},
		{name: "create body in an unknown format", method: "POST", path: cms, contentType: "text/plain", body: cmJSON("m11", 1),
			wantCode: 415, wantReason: metav1.StatusReasonUnsupportedMediaType, stored: cms + "/m11"},
		{name: "update body in an unknown format", method: "PUT", path: cms + "/m12", contentType: "application/xml", body: cmJSON("m12", 1),
			wantCode: 415, wantReason: metav1.StatusReasonUnsupportedMediaType, stored: cms + "/m12"},
		{name: "bad continue token", method: "GET", path: pods + "?limit=1&continue=garbage", wantCode: 400, wantReason: metav1.StatusReasonBadRequest},
		{name: "unknown resource", method: "GET", path: "/api/v1/namespaces/default/widgets", wantCode: 404, wantReason: metav1.StatusReasonNotFound},
		{name: "unknown path", method: "GET", path: "/nowhere", wantCode: 404, wantReason: metav1.StatusReasonNotFound},
		{name: "deleting kube-system", method: "DELETE", path: "/api/v1/namespaces/kube-system", wantCode: 403, wantReason: metav1.StatusReasonForbidden},
		{name: "unsupported patch type", method: "PATCH", path: cms + "/x", contentType: "text/plain", body: "x", wantCode: 415, wantReason: metav1.StatusReasonUnsupportedMediaType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw.t = t
			var body io.Reader
			length := int64(len(tc.body))
			if tc.body != "" {
				body = strings.NewReader(tc.body)
				if tc.chunked {
					body = io.MultiReader(strings.NewReader(tc.body)) // unknown length
					length = -1
				}
			} else {
				length = 0
			}
			code, st, b := raw.do(tc.method, tc.path, tc.contentType, body, length)
			if code != tc.wantCode {
				t.Fatalf("code = %d, want %d; body: %.300s", code, tc.wantCode, b)
			}
			if tc.wantReason != "" {
				if st == nil || st.Reason != tc.wantReason || st.Code != int32(tc.wantCode) {
					t.Fatalf("Status = %+v, want reason %s; body %.300s", st, tc.wantReason, b)
				}
			}
			if tc.wantField != "" {
				found := false
				for _, c := range st.Details.Causes {
					if strings.HasPrefix(c.Field, tc.wantField) {
						found = true
					}
				}
				if !found {
					t.Fatalf("no cause names %s: %+v", tc.wantField, st.Details)
				}
			}
			if tc.stored != "" {
				if code, _, b := raw.do("GET", tc.stored, "", nil, 0); code != 404 {
					t.Fatalf("%s was stored (GET: %d %.200s)", tc.stored, code, b)
				}
			}
		})
	}
}

func TestAnonymousRequestsGet401ButHealthStaysOpen(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, tc := range []struct {
		path string
		want int
	}{{"/api/v1/pods", 401}, {"/api", 401}, {"/metrics", 401}, {"/healthz", 200}, {"/readyz", 200}, {"/livez", 200}, {"/version", 200}} {
		resp, err := anon.Get(srv.Config.Host + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d (%s)", tc.path, resp.StatusCode, tc.want, bytes.TrimSpace(b))
		}
	}
}
