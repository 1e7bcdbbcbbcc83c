package controllers

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

func TestControllersFlagSelectsAsKubeControllerManager(t *testing.T) {
	tests := []struct {
		name    string
		list    []string
		ctrl    string
		offByDf bool
		want    bool
	}{
		{"star enables all", []string{"*"}, "deployment", false, true},
		{"star minus one", []string{"*", "-deployment"}, "deployment", false, false},
		{"star minus another", []string{"*", "-deployment"}, "replicaset", false, true},
		{"named only", []string{"replicaset"}, "deployment", false, false},
		{"named", []string{"replicaset"}, "replicaset", false, true},
		{"off by default needs naming", []string{"*"}, "x", true, false},
		{"off by default named", []string{"*", "x"}, "x", true, true},
		{"empty list enables nothing", nil, "deployment", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Enabled(tc.list, tc.ctrl, tc.offByDf); got != tc.want {
				t.Fatalf("Enabled(%v, %s) = %v, want %v", tc.list, tc.ctrl, got, tc.want)
			}
		})
	}
}

func TestKnownControllersIncludeTheWorkloadControllers(t *testing.T) {
	known := strings.Join(KnownControllers(), ",")
	for _, n := range []string{"replicaset", "deployment", "daemonset", "endpointslice", "endpointslicemirroring", "garbagecollector",
		"namespace", "nodeipam", "nodelifecycle", "serviceaccount", "job", "cronjob", "ttl-after-finished", "statefulset", "podgc",
		"horizontalpodautoscaling"} {
		if !strings.Contains(known, n) {
			t.Errorf("%s missing from %s", n, known)
		}
	}
}

func TestRunRejectsBadConfigBeforeContactingAnything(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"unknown controller", func(c *Config) { c.Controllers = []string{"*", "-bogus"} }, `unknown controller "bogus"`},
		{"bad bind address", func(c *Config) { c.SecureServing.BindAddress = "localhost:1" }, "--bind-address"},
		{"port out of range", func(c *Config) { c.SecureServing.SecurePort = 70000 }, "--secure-port"},
		{"slice size", func(c *Config) { c.MaxEndpointsPerSlice = 0 }, "--max-endpoints-per-slice"},
		{"node CIDRs without a cluster CIDR", func(c *Config) { c.AllocateNodeCIDRs = true }, "--cluster-cidr"},
		{"bad dual-stack CIDR", func(c *Config) {
			c.AllocateNodeCIDRs, c.ClusterCIDR = true, "10.244.0.0/16,nonsense"
		}, "--cluster-cidr"},
		{"node mask out of range", func(c *Config) {
			c.AllocateNodeCIDRs, c.ClusterCIDR, c.NodeCIDRMaskSize = true, "10.244.0.0/16", 200
		}, "--node-cidr-mask-size"},
		{"no HPA workers", func(c *Config) { c.ConcurrentHPASyncs = 0 }, "--concurrent-horizontal-pod-autoscaler-syncs must be greater than 0"},
		{"no HPA sync period", func(c *Config) { c.HPASyncPeriod = 0 }, "--horizontal-pod-autoscaler-sync-period"},
		{"negative HPA tolerance", func(c *Config) { c.HPATolerance = -0.1 }, "--horizontal-pod-autoscaler-tolerance"},
		{"lease shorter than renew deadline", func(c *Config) { c.LeaderElection.LeaseDuration = time.Second }, "lease duration"},
		{"unknown content type", func(c *Config) { c.KubeAPIContentType = "application/yaml" }, "--kube-api-content-type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Kubeconfig = "/nonexistent/kubeconfig"
			tc.mod(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := Run(ctx, cfg)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestRunReportsAnUnreadableKubeconfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Kubeconfig = "/nonexistent/kubeconfig"
	cfg.SecureServing.SecurePort = 0
	// A valid dual-stack configuration gets past validation.
	cfg.AllocateNodeCIDRs, cfg.ClusterCIDR = true, "10.244.0.0/16,fd00:10:244::/56"
	err := Run(context.Background(), cfg)
	if errors.Is(err, ErrInvalidConfig) || err == nil || !strings.Contains(err.Error(), "/nonexistent/kubeconfig") {
		t.Fatalf("got %v, want an error naming the kubeconfig", err)
	}
}

func TestGCWatchesEveryDeletableResourceButEvents(t *testing.T) {
	got := map[string]bool{}
	for _, r := range gcResources() {
		got[r.GVR.Resource] = true
		if r.Kind == "" {
			t.Fatalf("%v has no kind", r.GVR)
		}
	}
	for _, want := range []string{"pods", "replicasets", "deployments", "daemonsets", "endpointslices", "services", "configmaps"} {
		if !got[want] {
			t.Errorf("%s not watched", want)
		}
	}
	if got["events"] {
		t.Error("events are watched")
	}
}

// The controller-manager's clients speak protobuf by default, as
// kube-controller-manager's (--kube-api-content-type, JSON accepted after
// it), and JSON only when told; whatever the base config says, the dynamic
// client (custom resources, which have no protobuf) speaks JSON and the
// metadata client asks for protobuf PartialObjectMetadata. client-go's
// generated clientset already prefers protobuf when the config names no
// content type, but the clients built from Deps.RestConfig (the HPA's scale
// and metrics clients) do not: they get it from the config.
func TestAPIClientsContentType(t *testing.T) {
	const pb, pbJSON = "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf,application/json"
	for _, tc := range []struct {
		contentType, wantSent, wantAccept string
	}{
		{DefaultConfig().KubeAPIContentType, pb, pbJSON},
		{"", pb, pbJSON},
		{"application/json", "application/json", "application/json, */*"}, // client-go's default Accept
	} {
		type seen struct{ contentType, accept string }
		var mu sync.Mutex
		got := map[string]seen{}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[r.Method+" "+r.URL.Path] = seen{r.Header.Get("Content-Type"), r.Header.Get("Accept")}
			mu.Unlock()
			http.Error(w, "", http.StatusNotFound)
		}))
		cfg := DefaultConfig()
		cfg.RestConfig, cfg.KubeAPIContentType = &rest.Config{Host: srv.URL}, tc.contentType
		rc, err := cfg.restConfig()
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		if rc.ContentType != tc.wantSent || (tc.wantSent == pb && rc.AcceptContentTypes != pbJSON) {
			t.Errorf("--kube-api-content-type %q: the clients' config has ContentType %q, AcceptContentTypes %q", tc.contentType, rc.ContentType, rc.AcceptContentTypes)
		}
		var d Deps
		if err := d.useConfig(rc); err != nil {
			srv.Close()
			t.Fatal(err)
		}
		ctx := context.Background()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}
		d.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		widget := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": map[string]any{"name": "w"}}}
		d.Dynamic.Resource(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}).Namespace("default").Create(ctx, widget, metav1.CreateOptions{})
		d.Metadata.Resource(corev1.SchemeGroupVersion.WithResource("pods")).Namespace("default").Get(ctx, "p", metav1.GetOptions{})
		srv.Close()
		mu.Lock()
		if s := got["POST /api/v1/namespaces/default/pods"]; s.contentType != tc.wantSent || s.accept != tc.wantAccept {
			t.Errorf("--kube-api-content-type %q: a typed create sent Content-Type %q, Accept %q; want %q, %q", tc.contentType, s.contentType, s.accept, tc.wantSent, tc.wantAccept)
		}
		if s := got["POST /apis/example.com/v1/namespaces/default/widgets"]; s.contentType != "application/json" || s.accept != "application/json" {
			t.Errorf("--kube-api-content-type %q: a dynamic create sent Content-Type %q, Accept %q; want JSON", tc.contentType, s.contentType, s.accept)
		}
		if s := got["GET /api/v1/namespaces/default/pods/p"]; !strings.HasPrefix(s.accept, pb+";as=PartialObjectMetadata") {
			t.Errorf("--kube-api-content-type %q: a metadata get sent Accept %q; want protobuf PartialObjectMetadata first", tc.contentType, s.accept)
		}
		mu.Unlock()
	}
}
