package apiserver_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/apiclient"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/scale"
)

// A scale client configured for protobuf (the controller-manager's HPA scale
// client, as kube-controller-manager's) asks a custom resource's /scale for
// protobuf first, gets the Scale (in JSON: custom resources' requests drop
// protobuf from Accept) and updates it (client-go's scale client sends its
// update as JSON whatever the config).
func TestCustomResourceScaleServesAProtobufClient(t *testing.T) {
	rc, _, stop := apiservertest.StartTestServer(t)
	defer stop()
	ctx := context.Background()
	ac, dc := crdClients(t, rc)
	crd, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, widgetCRD("example.waggle.io"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, ac, crd.Name)
	gvr := schema.GroupVersionResource{Group: "example.waggle.io", Version: "v1", Resource: "widgets"}
	if _, err := dc.Resource(gvr).Namespace("default").Create(ctx, widget("w", map[string]any{"replicas": int64(1)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	pc := rest.CopyConfig(rc)
	apiclient.SetContentType(pc, apiclient.Protobuf)
	var mu sync.Mutex
	var accepts []string
	pc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/scale") {
				mu.Lock()
				accepts = append(accepts, r.Header.Get("Accept"))
				mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	})
	disc := discovery.NewDiscoveryClientForConfigOrDie(rc)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	scales, err := scale.NewForConfig(pc, mapper, dynamic.LegacyAPIPathResolverFunc, scale.NewDiscoveryScaleKindResolver(disc))
	if err != nil {
		t.Fatal(err)
	}
	gr := gvr.GroupResource()
	sc, err := scales.Scales("default").Get(ctx, gr, "w", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sc.Spec.Replicas != 1 {
		t.Fatalf("scale spec.replicas %d, want 1", sc.Spec.Replicas)
	}
	mu.Lock()
	if len(accepts) != 1 || !strings.HasPrefix(accepts[0], apiclient.Protobuf+",") {
		t.Errorf("the scale get sent Accept %q, want protobuf first", accepts)
	}
	mu.Unlock()
	sc.Spec.Replicas = 3
	if _, err := scales.Scales("default").Update(ctx, gr, sc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := dc.Resource(gvr).Namespace("default").Get(ctx, "w", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, _, _ := unstructured.NestedInt64(w.Object, "spec", "replicas"); n != 3 {
		t.Errorf("spec.replicas %d after the protobuf scale update, want 3", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
