package kubelet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// The kubelet's API client speaks protobuf by default, as upstream's
// (--kube-api-content-type application/vnd.kubernetes.protobuf, JSON
// accepted after it), and JSON only when told.
func TestAPIClientContentType(t *testing.T) {
	for _, tc := range []struct {
		contentType, wantSent, wantAccept string
	}{
		{"", "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf,application/json"},
		{ContentTypeJSON, "application/json", "application/json, */*"}, // client-go's default Accept
	} {
		var mu sync.Mutex
		var sent, accept string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			sent, accept = r.Header.Get("Content-Type"), r.Header.Get("Accept")
			mu.Unlock()
			http.Error(w, "", http.StatusNotFound)
		}))
		k, err := New(Config{NodeName: node, RootDir: t.TempDir(), RestConfig: &rest.Config{Host: srv.URL}, KubeAPIContentType: tc.contentType}, Deps{})
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}
		k.client.CoreV1().Pods("default").UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		srv.Close()
		mu.Lock()
		if sent != tc.wantSent || accept != tc.wantAccept {
			t.Errorf("--kube-api-content-type %q: a status write sent Content-Type %q, Accept %q; want %q, %q", tc.contentType, sent, accept, tc.wantSent, tc.wantAccept)
		}
		mu.Unlock()
	}
	if _, err := New(Config{NodeName: node, RestConfig: &rest.Config{}, KubeAPIContentType: "application/yaml"}, Deps{}); err == nil {
		t.Error("--kube-api-content-type application/yaml: no error")
	}
}
