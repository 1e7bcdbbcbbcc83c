package discovery

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/internal/version"
)

// legacyOnly strips the aggregated profiles from Accept, as an old client
// would send, so the same client-go code exercises the legacy documents.
func legacyOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Accept", "application/json, */*")
		h.ServeHTTP(w, r)
	})
}

func newClient(t *testing.T, h http.Handler) *discovery.DiscoveryClient {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	dc, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return dc
}

func TestClientGoDiscoversEveryCatalogResource(t *testing.T) {
	h := Handler(catalog.All(), catalog.Groups())
	for _, mode := range []struct {
		name string
		h    http.Handler
	}{{"aggregated", h}, {"legacy", legacyOnly(h)}} {
		t.Run(mode.name, func(t *testing.T) {
			dc := newClient(t, mode.h)
			groups, lists, err := dc.ServerGroupsAndResources()
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, g := range groups {
				names = append(names, g.Name)
			}
			// kube-apiserver's order of its default-enabled groups.
			want := []string{"", "apiregistration.k8s.io", "apps", "events.k8s.io", "authentication.k8s.io", "authorization.k8s.io", "autoscaling", "batch",
				"certificates.k8s.io", "networking.k8s.io", "policy", "rbac.authorization.k8s.io", "storage.k8s.io", "admissionregistration.k8s.io", "apiextensions.k8s.io", "scheduling.k8s.io",
				"coordination.k8s.io", "node.k8s.io", "discovery.k8s.io", "resource.k8s.io", "flowcontrol.apiserver.k8s.io", "storagemigration.k8s.io"}
			if !slices.Equal(names, want) {
				t.Errorf("groups = %q, want %q", names, want)
			}
			byName := map[string]metav1.APIResource{}
			for _, l := range lists {
				for _, r := range l.APIResources {
					byName[l.GroupVersion+" "+r.Name] = r
				}
			}
			for _, r := range catalog.All() {
				key := r.GroupVersion().String() + " " + r.Resource
				got, ok := byName[key]
				if !ok {
					t.Errorf("%s not discovered", key)
					continue
				}
				if got.Kind != r.Kind || got.Namespaced != r.Namespaced || got.SingularName != r.Singular ||
					!slices.Equal(got.Verbs, r.Verbs) || !slices.Equal(got.ShortNames, r.ShortNames) || !slices.Equal(got.Categories, r.Categories) {
					t.Errorf("%s = %+v, catalog %+v", key, got, r)
				}
				for _, s := range r.Subs {
					if _, ok := byName[key+"/"+s.Name]; !ok {
						t.Errorf("%s/%s not discovered", key, s.Name)
					}
				}
			}
			scale := byName["apps/v1 deployments/scale"]
			if scale.Group != "autoscaling" || scale.Version != "v1" || scale.Kind != "Scale" || !slices.Contains(scale.Verbs, "update") {
				t.Errorf("deployments/scale = %+v, want autoscaling/v1 Scale", scale)
			}
			if mode.name == "legacy" && byName["v1 pods"].StorageVersionHash == "" {
				t.Error("legacy pods have no storageVersionHash")
			}
		})
	}
}

func TestRESTMapperResolvesShortNamesAndKinds(t *testing.T) {
	dc := newClient(t, Handler(catalog.All(), catalog.Groups()))
	gr, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewShortcutExpander(restmapper.NewDiscoveryRESTMapper(gr), dc, nil)
	cases := []struct {
		input string
		want  schema.GroupVersionResource
	}{
		{"po", schema.GroupVersionResource{Version: "v1", Resource: "pods"}},
		{"deploy", schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}},
		{"svc", schema.GroupVersionResource{Version: "v1", Resource: "services"}},
		{"endpointslices", schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}},
		{"lease", schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}},
	}
	for _, tc := range cases {
		got, err := mapper.ResourceFor(schema.GroupVersionResource{Resource: tc.input})
		if err != nil {
			t.Errorf("%s: %v", tc.input, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s -> %v, want %v", tc.input, got, tc.want)
		}
	}
	m, err := mapper.RESTMapping(schema.GroupKind{Group: "apps", Kind: "DaemonSet"}, "v1")
	if err != nil || m.Resource.Resource != "daemonsets" || m.Scope.Name() != "namespace" {
		t.Errorf("DaemonSet mapping = %+v, %v", m, err)
	}
}

func get(t *testing.T, h http.Handler, path, accept string) (*http.Response, []byte) {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	body, _ := io.ReadAll(w.Result().Body)
	return w.Result(), body
}

func TestContentNegotiation(t *testing.T) {
	h := Handler(catalog.All(), catalog.Groups())
	cases := []struct {
		name, path, accept string
		wantType, wantKind string
		wantAPIVersion     string
	}{
		{"kubectl 1.28+ asks v2 first", "/apis", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
			ContentTypeV2, "APIGroupDiscoveryList", "apidiscovery.k8s.io/v2"},
		{"kubectl 1.27 asks v2beta1", "/api", "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
			ContentTypeV2Beta, "APIGroupDiscoveryList", "apidiscovery.k8s.io/v2beta1"},
		{"protobuf aggregated skipped for json", "/apis", "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
			ContentTypeV2, "APIGroupDiscoveryList", "apidiscovery.k8s.io/v2"},
		{"unknown aggregated version falls back", "/apis", "application/json;g=apidiscovery.k8s.io;v=v9;as=APIGroupDiscoveryList",
			"application/json", "APIGroupList", "v1"},
		{"plain json", "/api", "application/json", "application/json", "APIVersions", ""},
		{"no accept", "/apis", "", "application/json", "APIGroupList", "v1"},
		{"protobuf only still gets json, not 406", "/apis/apps/v1", "application/vnd.kubernetes.protobuf", "application/json", "APIResourceList", "v1"},
		{"group", "/apis/apps", "", "application/json", "APIGroup", "v1"},
		{"trailing slash", "/api/v1/", "", "application/json", "APIResourceList", "v1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, h, tc.path, tc.accept)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != tc.wantType {
				t.Errorf("Content-Type = %q, want %q", ct, tc.wantType)
			}
			var tm metav1.TypeMeta
			json.Unmarshal(body, &tm)
			if tm.Kind != tc.wantKind || tm.APIVersion != tc.wantAPIVersion {
				t.Errorf("type = %+v, want %s %s", tm, tc.wantAPIVersion, tc.wantKind)
			}
		})
	}
}

func TestUnknownPathsAreNotFoundStatus(t *testing.T) {
	h := Handler(catalog.All(), catalog.Groups())
	for _, p := range []string{"/api/v2", "/apis/nope", "/apis/apps/v2", "/apis/apps/v1/extra", "/x"} {
		resp, body := get(t, h, p, "")
		var st metav1.Status
		if err := json.Unmarshal(body, &st); err != nil || resp.StatusCode != 404 || st.Reason != metav1.StatusReasonNotFound || st.Kind != "Status" {
			t.Errorf("%s: %d %s", p, resp.StatusCode, body)
		}
	}
	r := httptest.NewRequest("POST", "/api", strings.NewReader("{}"))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /api: %d", w.Code)
	}
}

func TestVersionReportsKubeGitVersion(t *testing.T) {
	dc := newClient(t, Handler(catalog.All(), catalog.Groups()))
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != version.KubeGitVersion || v.Major != version.KubeMajor || v.Minor != version.KubeMinor {
		t.Errorf("version = %+v", v)
	}
}

func TestStorageVersionHashIsStableAndDistinct(t *testing.T) {
	pod := StorageVersionHash(schema.GroupVersionKind{Version: "v1", Kind: "Pod"})
	if pod != StorageVersionHash(schema.GroupVersionKind{Version: "v1", Kind: "Pod"}) {
		t.Error("hash not stable")
	}
	if pod == StorageVersionHash(schema.GroupVersionKind{Version: "v1", Kind: "Service"}) {
		t.Error("hash not distinct")
	}
	if len(pod) != 12 {
		t.Errorf("hash %q: want 12 base64 characters", pod)
	}
}

func FuzzNegotiateAggregated(f *testing.F) {
	f.Add(ContentTypeV2 + "," + ContentTypeV2Beta)
	f.Add("application/json;g=")
	f.Add(";;;,,,")
	f.Fuzz(func(t *testing.T, accept string) {
		if v := NegotiateAggregated(accept); v != "" && v != "v2" && v != "v2beta1" {
			t.Fatalf("negotiated %q", v)
		}
	})
}
