package apiserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// get sends a GET with headers and returns the response (body read).
func rawGet(t *testing.T, rc *rest.Config, path string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, rc.Host+path, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// rawPost sends a POST of a JSON body with headers and returns the response
// (body read).
func rawPost(t *testing.T, rc *rest.Config, path, body string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, rc.Host+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// isTooLargeRV is k8s.io/apiserver's storage.IsTooLargeResourceVersion, as
// client-go's reflector tests it.
func isTooLargeRV(err error) bool {
	return apierrors.IsTimeout(err) && apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}

// TestProtocolDetailsClientsDependOn covers the answers kubectl, helm and
// client-go key off, each as kube-apiserver 1.37 gives it.
func TestProtocolDetailsClientsDependOn(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()

	t.Run("unserved paths get a path-style 404", func(t *testing.T) {
		for _, p := range []string{
			"/apis/widgets.example.com/v1/widgets",
			"/apis/widgets.example.com/v1/namespaces/default/widgets/w",
			"/api/v1/namespaces/default/widgets/w",
			"/api/v1/namespaces/default/nodes",            // cluster-scoped under a namespace
			"/api/v1/namespaces/default/pods/p/nosuchsub", // unknown subresource
			"/apis/apps/v9/deployments",
		} {
			resp, b := rawGet(t, srv.Config, p, nil)
			var st metav1.Status
			_ = json.Unmarshal(b, &st)
			if resp.StatusCode != 404 || st.Reason != metav1.StatusReasonNotFound || st.Message != "the server could not find the requested resource" ||
				(st.Details != nil && (st.Details.Name != "" || st.Details.Kind != "")) {
				t.Errorf("%s: %d %s", p, resp.StatusCode, b)
			}
		}
	})

	t.Run("discovery answers with a trailing slash", func(t *testing.T) {
		for p, kind := range map[string]string{"/api/": "APIVersions", "/apis/": "APIGroupList", "/api/v1/": "APIResourceList", "/apis/apps/v1/": "APIResourceList", "/apis/apps/": "APIGroup"} {
			resp, b := rawGet(t, srv.Config, p, nil)
			var tm metav1.TypeMeta
			_ = json.Unmarshal(b, &tm)
			if resp.StatusCode != 200 || tm.Kind != kind {
				t.Errorf("%s: %d %.200s, want a %s", p, resp.StatusCode, b, kind)
			}
		}
	})

	t.Run("a resourceVersion newer than the store is a 504 after a short wait", func(t *testing.T) {
		cm, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "rv"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rv, _ := strconv.ParseInt(cm.ResourceVersion, 10, 64)
		future := strconv.FormatInt(rv+100000, 10)
		for _, p := range []string{
			"/api/v1/namespaces/default/configmaps?resourceVersion=" + future,
			"/api/v1/namespaces/default/configmaps?resourceVersionMatch=Exact&resourceVersion=" + future,
			"/api/v1/namespaces/default/configmaps/rv?resourceVersion=" + future,
		} {
			resp, b := rawGet(t, srv.Config, p, nil)
			var st metav1.Status
			_ = json.Unmarshal(b, &st)
			err := &apierrors.StatusError{ErrStatus: st}
			if resp.StatusCode != 504 || !isTooLargeRV(err) || !strings.HasPrefix(st.Message, "Timeout: Too large resource version: "+future) ||
				resp.Header.Get("Retry-After") != "1" {
				t.Errorf("%s: %d Retry-After %q %s", p, resp.StatusCode, resp.Header.Get("Retry-After"), b)
			}
		}
		// The current one is fine.
		if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "rv", metav1.GetOptions{ResourceVersion: cm.ResourceVersion}); err != nil {
			t.Errorf("get at the current resourceVersion: %v", err)
		}
	})

	t.Run("a Table the server cannot produce is a 406", func(t *testing.T) {
		resp, b := rawGet(t, srv.Config, "/api/v1/namespaces/default/configmaps", map[string]string{"Accept": "application/json;as=Table;v=v2;g=meta.k8s.io"})
		var st metav1.Status
		_ = json.Unmarshal(b, &st)
		if resp.StatusCode != 406 || st.Reason != metav1.StatusReasonNotAcceptable {
			t.Errorf("unserved Table version: %d %s", resp.StatusCode, b)
		}
		// With a fallback the client gets the object; v1 and v1beta1 Tables are served.
		for accept, kind := range map[string]string{
			"application/json;as=Table;v=v2;g=meta.k8s.io,application/json": "ConfigMapList",
			"application/json;as=Table;v=v1;g=meta.k8s.io":                  "Table",
			"application/json;as=Table;v=v1beta1;g=meta.k8s.io":             "Table",
		} {
			resp, b := rawGet(t, srv.Config, "/api/v1/namespaces/default/configmaps", map[string]string{"Accept": accept})
			var tm metav1.TypeMeta
			_ = json.Unmarshal(b, &tm)
			if resp.StatusCode != 200 || tm.Kind != kind {
				t.Errorf("Accept %s: %d %.200s", accept, resp.StatusCode, b)
			}
		}
	})

	t.Run("a Table of a resource without table conversion is a 406", func(t *testing.T) {
		// The access reviews have no table conversion upstream: a Table-only
		// Accept is refused; with a fallback the review itself comes back.
		sar := `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","spec":{"nonResourceAttributes":{"path":"/","verb":"get"}}}`
		for accept, want := range map[string]int{
			"application/json;as=Table;v=v1;g=meta.k8s.io":                  406,
			"application/json;as=Table;v=v1;g=meta.k8s.io,application/json": 201,
		} {
			resp, b := rawPost(t, srv.Config, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", sar, map[string]string{"Accept": accept})
			var tm metav1.TypeMeta
			_ = json.Unmarshal(b, &tm)
			if resp.StatusCode != want || (want == 201 && tm.Kind != "SelfSubjectAccessReview") || (want == 406 && tm.Kind != "Status") {
				t.Errorf("Accept %s: %d %.300s, want %d", accept, resp.StatusCode, b, want)
			}
		}
	})

	t.Run("componentstatuses, virtual but with table conversion, is a Table", func(t *testing.T) {
		resp, b := rawGet(t, srv.Config, "/api/v1/componentstatuses", map[string]string{"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
		var tbl metav1.Table
		_ = json.Unmarshal(b, &tbl)
		var cols []string
		for _, c := range tbl.ColumnDefinitions {
			cols = append(cols, c.Name)
		}
		if resp.StatusCode != 200 || tbl.Kind != "Table" || strings.Join(cols, " ") != "Name Status Message Error" {
			t.Errorf("componentstatuses Table: %d %v %.300s", resp.StatusCode, cols, b)
		}
	})

	t.Run("streaming list: initial events, then the end bookmark, then changes", func(t *testing.T) {
		ns := "watchlist"
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var last string
		for i := 0; i < 3; i++ {
			cm, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", i)}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			last = cm.ResourceVersion
		}
		hc, _ := rest.HTTPClientFor(srv.Config)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(wctx, http.MethodGet, srv.Config.Host+"/api/v1/namespaces/"+ns+
			"/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("watch-list: %d %s", resp.StatusCode, b)
		}
		sc := bufio.NewScanner(resp.Body)
		next := func() (string, metav1.ObjectMeta) {
			for sc.Scan() {
				var ev struct {
					Type   string
					Object struct{ Metadata metav1.ObjectMeta }
				}
				if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
					t.Fatalf("frame %s: %v", sc.Bytes(), err)
				}
				if ev.Type == "BOOKMARK" && ev.Object.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "" {
					continue // a periodic bookmark
				}
				return ev.Type, ev.Object.Metadata
			}
			t.Fatalf("stream ended: %v", sc.Err())
			return "", metav1.ObjectMeta{}
		}
		for i := 0; i < 3; i++ {
			if typ, m := next(); typ != "ADDED" || m.Name != fmt.Sprintf("c%d", i) {
				t.Fatalf("initial event %d: %s %s", i, typ, m.Name)
			}
		}
		typ, m := next()
		bm, _ := strconv.ParseInt(m.ResourceVersion, 10, 64)
		lastRV, _ := strconv.ParseInt(last, 10, 64)
		if typ != "BOOKMARK" || m.Annotations[metav1.InitialEventsAnnotationKey] != "true" || bm < lastRV {
			t.Fatalf("after the initial events: %s %+v (want the end bookmark at >= %d)", typ, m, lastRV)
		}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "later"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if typ, m := next(); typ != "ADDED" || m.Name != "later" {
			t.Fatalf("change after the list: %s %s", typ, m.Name)
		}
	})

	t.Run("client-go informers sync by streaming list, without a LIST", func(t *testing.T) {
		before := requests(t, srv, "list", "secrets")
		f := informers.NewSharedInformerFactory(cs, 0)
		inf := f.Core().V1().Secrets().Informer()
		if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s1"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		defer close(stop)
		f.Start(stop)
		if !cache.WaitForCacheSync(stop, inf.HasSynced) {
			t.Fatal("informer did not sync")
		}
		if _, ok, _ := inf.GetStore().GetByKey("default/s1"); !ok {
			t.Fatal("informer lacks default/s1")
		}
		if after := requests(t, srv, "list", "secrets"); after != before {
			t.Errorf("the informer fell back to LIST (%v -> %v list requests)", before, after)
		}
	})
}

// requests sums apiserver_request_total for verb and resource.
func requests(t *testing.T, srv *apiservertest.Server, verb, resource string) float64 {
	t.Helper()
	mfs, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "apiserver_request_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["verb"] == verb && l["resource"] == resource {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
