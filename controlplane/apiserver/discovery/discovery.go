// Package discovery serves the API server's discovery documents: /api,
// /api/v1, /apis, /apis/{group}, /apis/{group}/{version} and /version, in
// both the legacy form (APIVersions, APIGroupList, APIResourceList) and the
// aggregated form (apidiscovery.k8s.io/v2 and v2beta1 APIGroupDiscoveryList)
// that kubectl 1.27 and newer ask for first.
//
// The documents are computed once from the catalog when the handler is
// built; the package holds no state and serves no resources.
package discovery

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"runtime"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiversion "k8s.io/apimachinery/pkg/version"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/internal/version"
)

// Aggregated discovery media types, as client-go sends them in Accept and
// expects back in Content-Type.
const (
	Group             = "apidiscovery.k8s.io"
	AggregatedKind    = "APIGroupDiscoveryList"
	ContentTypeV2     = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
	ContentTypeV2Beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
)

type handler struct {
	coreVersions []string          // /api legacy
	groupList    []byte            // /apis legacy
	groups       map[string][]byte // /apis/{group}
	resourceList map[string][]byte // /api/v1, /apis/{g}/{v} keyed by "g/v" ("/v1" for core)
	aggCore      map[string][]byte // aggregated /api by version ("v2", "v2beta1")
	aggGroups    map[string][]byte // aggregated /apis by version
	versionInfo  []byte
}

// Handler serves discovery for resources grouped into groups (the core
// group "" first, as catalog.Groups returns them). Paths it does not know
// get 404 NotFound as a Status.
func Handler(resources []catalog.Resource, groups []schema.GroupVersion) http.Handler {
	h := &handler{
		groups:       map[string][]byte{},
		resourceList: map[string][]byte{},
		aggCore:      map[string][]byte{},
		aggGroups:    map[string][]byte{},
	}

	// Versions per group, in the order given.
	var groupOrder []string
	versions := map[string][]string{}
	for _, gv := range groups {
		if _, seen := versions[gv.Group]; !seen {
			groupOrder = append(groupOrder, gv.Group)
		}
		versions[gv.Group] = append(versions[gv.Group], gv.Version)
	}

	h.coreVersions = versions[""]

	list := &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}}
	for _, g := range groupOrder {
		if g == "" {
			continue
		}
		grp := apiGroup(g, versions[g])
		list.Groups = append(list.Groups, grp)
		grp.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
		h.groups[g] = mustJSON(&grp)
	}
	if list.Groups == nil {
		list.Groups = []metav1.APIGroup{}
	}
	h.groupList = mustJSON(list)

	for _, gv := range groups {
		h.resourceList[gv.Group+"/"+gv.Version] = mustJSON(ResourceList(resources, gv))
	}

	core, rest := Aggregated(resources, groups)
	for v, doc := range map[string]*apidiscoveryv2.APIGroupDiscoveryList{"v2": core, "v2beta1": core} {
		h.aggCore[v] = mustJSON(withVersion(doc, v))
	}
	for v, doc := range map[string]*apidiscoveryv2.APIGroupDiscoveryList{"v2": rest, "v2beta1": rest} {
		h.aggGroups[v] = mustJSON(withVersion(doc, v))
	}
	h.versionInfo = mustJSON(VersionInfo())
	return h
}

// VersionInfo is what /version answers.
func VersionInfo() *apiversion.Info {
	return &apiversion.Info{
		Major:        version.KubeMajor,
		Minor:        version.KubeMinor,
		GitVersion:   version.KubeGitVersion,
		GitCommit:    version.Commit(),
		GitTreeState: "clean",
		BuildDate:    "1970-01-01T00:00:00Z",
		GoVersion:    runtime.Version(),
		Compiler:     runtime.Compiler,
		Platform:     runtime.GOOS + "/" + runtime.GOARCH,
	}
}

func apiGroup(name string, versions []string) metav1.APIGroup {
	g := metav1.APIGroup{Name: name}
	for _, v := range versions {
		g.Versions = append(g.Versions, metav1.GroupVersionForDiscovery{GroupVersion: name + "/" + v, Version: v})
	}
	if len(g.Versions) > 0 {
		g.PreferredVersion = g.Versions[0]
	}
	return g
}

// StorageVersionHash is the opaque hash kube-apiserver publishes for a
// resource's storage version (the first 8 bytes of the SHA-256 of
// "group/version/kind", base64). Clients only compare it for equality.
func StorageVersionHash(gvk schema.GroupVersionKind) string {
	sum := sha256.Sum256([]byte(gvk.Group + "/" + gvk.Version + "/" + gvk.Kind))
	return base64.StdEncoding.EncodeToString(sum[:8])
}

// ResourceList is the legacy APIResourceList of one group version:
// resources and, as "parent/sub" entries, their subresources.
func ResourceList(resources []catalog.Resource, gv schema.GroupVersion) *metav1.APIResourceList {
	out := &metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: gv.String(),
		APIResources: []metav1.APIResource{},
	}
	for i := range resources {
		r := &resources[i]
		if r.GroupVersion() != gv {
			continue
		}
		out.APIResources = append(out.APIResources, metav1.APIResource{
			Name:               r.Resource,
			SingularName:       r.Singular,
			Namespaced:         r.Namespaced,
			Kind:               r.Kind,
			Verbs:              metav1.Verbs(r.Verbs),
			ShortNames:         r.ShortNames,
			Categories:         r.Categories,
			StorageVersionHash: StorageVersionHash(r.GroupVersionKind()),
		})
		for _, s := range r.Subs {
			kind := s.Kind
			if kind == "" {
				kind = r.Kind
			}
			out.APIResources = append(out.APIResources, metav1.APIResource{
				Name:       r.Resource + "/" + s.Name,
				Namespaced: r.Namespaced,
				Group:      s.Group,
				Version:    s.Version,
				Kind:       kind,
				Verbs:      metav1.Verbs(s.Verbs),
			})
		}
	}
	return out
}

// Aggregated returns the aggregated discovery documents of /api (the core
// group) and /apis (every other group), in apidiscovery.k8s.io/v2.
func Aggregated(resources []catalog.Resource, groups []schema.GroupVersion) (core, rest *apidiscoveryv2.APIGroupDiscoveryList) {
	core = &apidiscoveryv2.APIGroupDiscoveryList{Items: []apidiscoveryv2.APIGroupDiscovery{}}
	rest = &apidiscoveryv2.APIGroupDiscoveryList{Items: []apidiscoveryv2.APIGroupDiscovery{}}
	index := map[string]int{}
	for _, gv := range groups {
		target := rest
		if gv.Group == "" {
			target = core
		}
		i, ok := index[gv.Group]
		if !ok {
			target.Items = append(target.Items, apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: gv.Group}})
			i = len(target.Items) - 1
			index[gv.Group] = i
		}
		vd := apidiscoveryv2.APIVersionDiscovery{Version: gv.Version, Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}
		for j := range resources {
			r := &resources[j]
			if r.GroupVersion() != gv {
				continue
			}
			scope := apidiscoveryv2.ScopeCluster
			if r.Namespaced {
				scope = apidiscoveryv2.ScopeNamespace
			}
			rd := apidiscoveryv2.APIResourceDiscovery{
				Resource:         r.Resource,
				ResponseKind:     &metav1.GroupVersionKind{Group: gv.Group, Version: gv.Version, Kind: r.Kind},
				Scope:            scope,
				SingularResource: r.Singular,
				Verbs:            r.Verbs,
				ShortNames:       r.ShortNames,
				Categories:       r.Categories,
			}
			for _, s := range r.Subs {
				rk := &metav1.GroupVersionKind{Group: gv.Group, Version: gv.Version, Kind: r.Kind}
				if s.Kind != "" {
					rk.Kind = s.Kind
				}
				if s.Group != "" || s.Version != "" {
					rk.Group, rk.Version = s.Group, s.Version
				}
				rd.Subresources = append(rd.Subresources, apidiscoveryv2.APISubresourceDiscovery{
					Subresource: s.Name, ResponseKind: rk, Verbs: s.Verbs,
				})
			}
			vd.Resources = append(vd.Resources, rd)
		}
		target.Items[i].Versions = append(target.Items[i].Versions, vd)
	}
	return core, rest
}

// withVersion stamps the list with apidiscovery.k8s.io/<v>: v2 and v2beta1
// have the same JSON shape.
func withVersion(l *apidiscoveryv2.APIGroupDiscoveryList, v string) *apidiscoveryv2.APIGroupDiscoveryList {
	c := *l
	c.TypeMeta = metav1.TypeMeta{APIVersion: Group + "/" + v, Kind: AggregatedKind}
	c.Items = make([]apidiscoveryv2.APIGroupDiscovery, len(l.Items))
	for i, it := range l.Items {
		it.TypeMeta = metav1.TypeMeta{APIVersion: Group + "/" + v, Kind: "APIGroupDiscovery"}
		c.Items[i] = it
	}
	return &c
}

// NegotiateAggregated returns the aggregated discovery version ("v2" or
// "v2beta1") the Accept header asks for first, or "" when it asks for none
// (then the legacy document is served, never 406).
func NegotiateAggregated(accept string) string {
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil || (mt != "application/json" && mt != "*/*" && mt != "application/*") {
			continue
		}
		if params["g"] != Group || params["as"] != AggregatedKind {
			continue
		}
		if v := params["v"]; v == "v2" || v == "v2beta1" {
			return v
		}
	}
	return ""
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", fmt.Sprintf("%s is not supported on discovery paths", r.Method))
		return
	}
	path := strings.TrimSuffix(r.URL.Path, "/")
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	switch {
	case path == "/version":
		writeJSON(w, "application/json", h.versionInfo)
		return
	case path == "/api":
		if v := NegotiateAggregated(r.Header.Get("Accept")); v != "" {
			writeJSON(w, aggContentType(v), h.aggCore[v])
			return
		}
		writeJSON(w, "application/json", mustJSON(&metav1.APIVersions{
			TypeMeta: metav1.TypeMeta{Kind: "APIVersions"},
			Versions: h.coreVersions,
			ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{
				{ClientCIDR: "0.0.0.0/0", ServerAddress: r.Host},
			},
		}))
		return
	case path == "/apis":
		if v := NegotiateAggregated(r.Header.Get("Accept")); v != "" {
			writeJSON(w, aggContentType(v), h.aggGroups[v])
			return
		}
		writeJSON(w, "application/json", h.groupList)
		return
	case len(parts) == 2 && parts[0] == "api":
		if doc, ok := h.resourceList["/"+parts[1]]; ok {
			writeJSON(w, "application/json", doc)
			return
		}
	case len(parts) == 2 && parts[0] == "apis":
		if doc, ok := h.groups[parts[1]]; ok {
			writeJSON(w, "application/json", doc)
			return
		}
	case len(parts) == 3 && parts[0] == "apis":
		if doc, ok := h.resourceList[parts[1]+"/"+parts[2]]; ok {
			writeJSON(w, "application/json", doc)
			return
		}
	}
	writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("the server could not find the requested resource (%s)", r.URL.Path))
}

func aggContentType(v string) string {
	if v == "v2beta1" {
		return ContentTypeV2Beta
	}
	return ContentTypeV2
}

func writeJSON(w http.ResponseWriter, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-cache, private")
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	st := &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  msg,
		Reason:   reason,
		Code:     int32(code),
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(mustJSON(st))
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("discovery: encode %T: %v", v, err))
	}
	return b
}
