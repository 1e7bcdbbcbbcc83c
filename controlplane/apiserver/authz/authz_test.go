package authz

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
)

func TestAttributesFromParsesKubernetesPaths(t *testing.T) {
	cases := []struct {
		method, url string
		want        Attributes
	}{
		{"GET", "/api/v1/namespaces/default/pods",
			Attributes{Verb: "list", APIVersion: "v1", Resource: "pods", Namespace: "default", ResourceRequest: true}},
		{"GET", "/api/v1/namespaces/default/pods/web-1",
			Attributes{Verb: "get", APIVersion: "v1", Resource: "pods", Namespace: "default", Name: "web-1", ResourceRequest: true}},
		{"GET", "/api/v1/namespaces/default/pods?watch=true&resourceVersion=10",
			Attributes{Verb: "watch", APIVersion: "v1", Resource: "pods", Namespace: "default", ResourceRequest: true}},
		{"GET", "/api/v1/namespaces/default/pods?watch=1&fieldSelector=metadata.name%3Dweb-1",
			Attributes{Verb: "watch", APIVersion: "v1", Resource: "pods", Namespace: "default", Name: "web-1", ResourceRequest: true}},
		{"GET", "/api/v1/watch/namespaces/default/pods",
			Attributes{Verb: "watch", APIVersion: "v1", Resource: "pods", Namespace: "default", ResourceRequest: true}},
		{"GET", "/api/v1/pods",
			Attributes{Verb: "list", APIVersion: "v1", Resource: "pods", ResourceRequest: true}},
		{"GET", "/api/v1/pods?watch=false",
			Attributes{Verb: "list", APIVersion: "v1", Resource: "pods", ResourceRequest: true}},
		{"PUT", "/api/v1/namespaces/default/pods/web-1/status",
			Attributes{Verb: "update", APIVersion: "v1", Resource: "pods", Subresource: "status", Namespace: "default", Name: "web-1", ResourceRequest: true}},
		{"POST", "/api/v1/namespaces/default/pods/web-1/binding",
			Attributes{Verb: "create", APIVersion: "v1", Resource: "pods", Subresource: "binding", Namespace: "default", Name: "web-1", ResourceRequest: true}},
		{"GET", "/api/v1/namespaces/default/pods/web-1/proxy/metrics/x",
			Attributes{Verb: "get", APIVersion: "v1", Resource: "pods", Subresource: "proxy", Namespace: "default", Name: "web-1", ResourceRequest: true}},
		{"POST", "/api/v1/namespaces/kube-system/configmaps",
			Attributes{Verb: "create", APIVersion: "v1", Resource: "configmaps", Namespace: "kube-system", ResourceRequest: true}},
		{"PATCH", "/apis/apps/v1/namespaces/default/deployments/web/scale",
			Attributes{Verb: "patch", APIGroup: "apps", APIVersion: "v1", Resource: "deployments", Subresource: "scale", Namespace: "default", Name: "web", ResourceRequest: true}},
		{"DELETE", "/apis/apps/v1/namespaces/default/replicasets/web-abc",
			Attributes{Verb: "delete", APIGroup: "apps", APIVersion: "v1", Resource: "replicasets", Namespace: "default", Name: "web-abc", ResourceRequest: true}},
		{"DELETE", "/apis/apps/v1/namespaces/default/replicasets?labelSelector=a%3Db",
			Attributes{Verb: "deletecollection", APIGroup: "apps", APIVersion: "v1", Resource: "replicasets", Namespace: "default", ResourceRequest: true}},
		{"GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
			Attributes{Verb: "get", APIGroup: "coordination.k8s.io", APIVersion: "v1", Resource: "leases", Namespace: "kube-node-lease", Name: "n1", ResourceRequest: true}},
		{"GET", "/apis/discovery.k8s.io/v1/endpointslices",
			Attributes{Verb: "list", APIGroup: "discovery.k8s.io", APIVersion: "v1", Resource: "endpointslices", ResourceRequest: true}},
		{"GET", "/api/v1/nodes/node-1",
			Attributes{Verb: "get", APIVersion: "v1", Resource: "nodes", Name: "node-1", ResourceRequest: true}},
		{"PATCH", "/api/v1/nodes/node-1/status",
			Attributes{Verb: "patch", APIVersion: "v1", Resource: "nodes", Subresource: "status", Name: "node-1", ResourceRequest: true}},
		{"GET", "/api/v1/namespaces",
			Attributes{Verb: "list", APIVersion: "v1", Resource: "namespaces", ResourceRequest: true}},
		{"GET", "/api/v1/namespaces/kube-system",
			Attributes{Verb: "get", APIVersion: "v1", Resource: "namespaces", Namespace: "kube-system", Name: "kube-system", ResourceRequest: true}},
		{"DELETE", "/api/v1/namespaces/team-a",
			Attributes{Verb: "delete", APIVersion: "v1", Resource: "namespaces", Namespace: "team-a", Name: "team-a", ResourceRequest: true}},
		{"PUT", "/api/v1/namespaces/team-a/finalize",
			Attributes{Verb: "update", APIVersion: "v1", Resource: "namespaces", Subresource: "finalize", Namespace: "team-a", Name: "team-a", ResourceRequest: true}},
		{"HEAD", "/api/v1/namespaces/default/secrets/s",
			Attributes{Verb: "get", APIVersion: "v1", Resource: "secrets", Namespace: "default", Name: "s", ResourceRequest: true}},
		// Non-resource requests.
		{"GET", "/api", Attributes{Verb: "get"}},
		{"GET", "/api/v1", Attributes{Verb: "get"}},
		{"GET", "/apis", Attributes{Verb: "get"}},
		{"GET", "/apis/apps", Attributes{Verb: "get"}},
		{"GET", "/apis/apps/v1", Attributes{Verb: "get"}},
		{"GET", "/healthz", Attributes{Verb: "get"}},
		{"GET", "/openapi/v3/apis/apps/v1", Attributes{Verb: "get"}},
		{"POST", "/version", Attributes{Verb: "post"}},
		{"GET", "/", Attributes{Verb: "get"}},
	}
	alice := &authn.User{Name: "alice"}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.url, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.url, nil)
			got := AttributesFrom(r, alice)
			tc.want.User = alice
			tc.want.Path = r.URL.Path
			got.FieldSelector = "" // checked below
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func FuzzAttributesFrom(f *testing.F) {
	for _, s := range []string{"/api/v1/namespaces/a/pods/b/status", "/apis/x", "/api", "//api//v1/", "/apis/a/b/watch/namespaces", "/api/v1/watch", "/api/v1//x"} {
		f.Add("GET", s)
	}
	f.Fuzz(func(t *testing.T, method, path string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Method = method
		r.URL.Path = path
		a := AttributesFrom(r, nil)
		if a.ResourceRequest && a.Resource == "" && a.Verb != "" && path != "" {
			// A resource request must name a resource.
			t.Fatalf("resource request without resource: %+v", a)
		}
	})
}

func TestUnion(t *testing.T) {
	broken := Func(func(context.Context, Attributes) (bool, string, error) { return false, "", errors.New("down") })
	deny := Func(func(context.Context, Attributes) (bool, string, error) { return false, "no rule", nil })
	cases := []struct {
		name      string
		chain     []Authorizer
		allowed   bool
		wantErr   bool
		inReasons string
	}{
		{"empty chain denies", nil, false, false, ""},
		{"always allow", []Authorizer{AlwaysAllow{}}, true, false, ""},
		{"deny then allow allows", []Authorizer{deny, AlwaysAllow{}}, true, false, ""},
		{"broken then allow allows", []Authorizer{broken, AlwaysAllow{}}, true, false, ""},
		{"all deny joins reasons", []Authorizer{deny, AlwaysDeny{}}, false, false, "no rule; all requests are denied"},
		{"broken and deny reports error", []Authorizer{broken, deny}, false, true, "no rule"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok, reason, err := Union(tc.chain...).Authorize(context.Background(), Attributes{Verb: "get"})
			if ok != tc.allowed || (err != nil) != tc.wantErr || !strings.Contains(reason, tc.inReasons) {
				t.Errorf("ok=%v reason=%q err=%v", ok, reason, err)
			}
		})
	}
}

func TestAttributesStringNamesWhatWasDenied(t *testing.T) {
	a := Attributes{User: &authn.User{Name: "bob"}, Verb: "delete", Resource: "pods", Subresource: "status", Namespace: "ns1", ResourceRequest: true}
	if got, want := a.String(), `user "bob" cannot delete resource "pods/status" in API group "" in the namespace "ns1"`; got != want {
		t.Errorf("got %q want %q", got, want)
	}
	n := Attributes{Verb: "get", Path: "/metrics"}
	if got, want := n.String(), `user "<anonymous>" cannot get path "/metrics"`; got != want {
		t.Errorf("got %q want %q", got, want)
	}
}
