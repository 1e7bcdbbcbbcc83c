package apiserver

import (
	"crypto/sha512"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/discovery"
	"github.com/waggle-io/waggle/controlplane/apiserver/extensions/crd"
	"github.com/waggle-io/waggle/controlplane/apiserver/openapi"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// The served resources change at run time (CustomResourceDefinitions add
// and remove custom resources): the registries are looked up in a map that
// is replaced on change, and discovery and OpenAPI are rebuilt from the
// catalog when its generation moves.

func regKey(r *catalog.Resource) string { return r.Group + "/" + r.Version + "/" + r.Resource }

// lookupRegistry finds the registry of "group/version/resource".
func (s *Server) lookupRegistry(key string) *registry { return (*s.byGVR.Load())[key] }

// allRegistries is the current map of registries; do not modify it.
func (s *Server) allRegistries() map[string]*registry { return *s.byGVR.Load() }

// setRegistry serves reg (replacing the registry of the same resource).
func (s *Server) setRegistry(reg *registry) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	old := *s.byGVR.Load()
	next := make(map[string]*registry, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[regKey(reg.res)] = reg
	s.byGVR.Store(&next)
}

// dropRegistry stops serving the resource of key, returning its registry.
func (s *Server) dropRegistry(key string) *registry {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	old := *s.byGVR.Load()
	reg, ok := old[key]
	if !ok {
		return nil
	}
	next := make(map[string]*registry, len(old))
	for k, v := range old {
		if k != key {
			next[k] = v
		}
	}
	s.byGVR.Store(&next)
	return reg
}

// generational rebuilds a handler whenever the catalog's generation moves.
type generational struct {
	cat   *catalog.Catalog
	build func() http.Handler
	mu    sync.Mutex
	gen   int64
	h     http.Handler
}

func (g *generational) current() http.Handler {
	gen := g.cat.Generation()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.h == nil || g.gen != gen {
		g.h, g.gen = g.build(), gen
	}
	return g.h
}

func (g *generational) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.current().ServeHTTP(w, r)
}

// dynamicDiscovery serves discovery (legacy and aggregated) of the
// catalog as it is now.
func (s *Server) dynamicDiscovery() http.Handler {
	return &generational{cat: s.catalog, build: func() http.Handler {
		return discovery.Handler(s.catalog.All(), s.catalog.Groups())
	}}
}

// mountOpenAPI serves /openapi/v2 and /openapi/v3: the built-in kinds'
// documents, generated once, plus the served CustomResourceDefinitions'
// (apiextensions-apiserver's builder), merged again when they change.
func (s *Server) mountOpenAPI(r chi.Router) {
	static, err := openapi.Build(s.catalog.All(), s.catalog.Groups())
	if err != nil {
		panic(err) // a programming error the openapi tests catch
	}
	h := &generational{cat: s.catalog, build: func() http.Handler {
		var crds []*apiextensionsv1.CustomResourceDefinition
		if s.crds != nil {
			crds = s.crds.published()
		}
		if len(crds) == 0 {
			return openapi.NewHandler(static)
		}
		docs, err := withCustomResources(static, crds)
		if err != nil {
			s.log.Error("OpenAPI of custom resources not published", "err", err)
			return openapi.NewHandler(static)
		}
		return openapi.NewHandler(docs)
	}}
	r.Handle("/openapi/v2", h)
	r.Handle("/openapi/v3", h)
	r.Handle("/openapi/v3/*", h)
}

func withCustomResources(static *openapi.Documents, crds []*apiextensionsv1.CustomResourceDefinition) (*openapi.Documents, error) {
	v2, err := crd.MergeOpenAPIV2(static.V2, crds)
	if err != nil {
		return nil, err
	}
	v3, err := crd.OpenAPIV3(crds)
	if err != nil {
		return nil, err
	}
	docs := &openapi.Documents{V2: v2, V3: make(map[string][]byte, len(static.V3)+len(v3)), V3Hash: make(map[string]string, len(static.V3)+len(v3))}
	for k, v := range static.V3 {
		docs.V3[k], docs.V3Hash[k] = v, static.V3Hash[k]
	}
	for gv, b := range v3 {
		k := openapi.GroupVersionPath(gv)
		sum := sha512.Sum512(b)
		docs.V3[k], docs.V3Hash[k] = b, strings.ToUpper(hex.EncodeToString(sum[:]))
	}
	return docs, nil
}
