package apiserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestBindingsAndComponentStatuses: the core/v1 bindings resource binds the
// pod it names as pods/binding does; componentstatuses report each
// component's health endpoint and etcd's, read-only.
func TestBindingsAndComponentStatuses(t *testing.T) {
	testutil.Privileged(t)
	healthy := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer healthy.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL + "/healthz"
	dead.Close()
	srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) {
		c.ComponentProbes = map[string]string{"scheduler": healthy.URL + "/healthz", "controller-manager": deadURL}
	}})
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ctx := context.Background()

	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod("bound", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	raw := newRaw(t, srv.Config)
	body := `{"apiVersion":"v1","kind":"Binding","metadata":{"name":"bound"},"target":{"kind":"Node","name":"node-1"}}`
	if code, st, b := raw.do("POST", "/api/v1/namespaces/default/bindings", "application/json", strings.NewReader(body), int64(len(body))); code != 201 {
		t.Fatalf("binding: %d %+v %s", code, st, b)
	}
	p, err := cs.CoreV1().Pods("default").Get(ctx, "bound", metav1.GetOptions{})
	if err != nil || p.Spec.NodeName != "node-1" {
		t.Fatalf("after binding: %v %q", err, p.Spec.NodeName)
	}
	if code, _, _ := raw.do("POST", "/api/v1/namespaces/default/bindings", "application/json", strings.NewReader(body), int64(len(body))); code != 409 {
		t.Errorf("second binding: %d, want 409", code)
	}
	if code, _, _ := raw.do("GET", "/api/v1/namespaces/default/bindings", "", nil, 0); code != 405 {
		t.Errorf("listing bindings: %d, want 405", code)
	}

	l, err := cs.CoreV1().ComponentStatuses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]corev1.ComponentCondition{}
	for _, c := range l.Items {
		got[c.Name] = c.Conditions[0]
	}
	if c := got["scheduler"]; c.Status != corev1.ConditionTrue || c.Message != "ok" {
		t.Errorf("scheduler: %+v", c)
	}
	if c := got["etcd-0"]; c.Status != corev1.ConditionTrue {
		t.Errorf("etcd-0: %+v", c)
	}
	if c := got["controller-manager"]; c.Status != corev1.ConditionFalse || c.Error == "" || len(got) != 3 {
		t.Errorf("controller-manager: %+v (%d components)", c, len(got))
	}
	if c, err := cs.CoreV1().ComponentStatuses().Get(ctx, "scheduler", metav1.GetOptions{}); err != nil || c.Conditions[0].Status != corev1.ConditionTrue {
		t.Errorf("get scheduler: %v %+v", err, c)
	}
	if _, err := cs.CoreV1().ComponentStatuses().Get(ctx, "nope", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("unknown component: %v", err)
	}
	if _, err := cs.CoreV1().ComponentStatuses().Create(ctx, &corev1.ComponentStatus{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); !apierrors.IsMethodNotSupported(err) {
		t.Errorf("create componentstatus: %v", err)
	}
}
