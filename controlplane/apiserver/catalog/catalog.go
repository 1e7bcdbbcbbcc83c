// Package catalog lists every resource the API server serves: its group,
// version, plural and kind, scope, verbs, short names, categories,
// subresources and Go types. Routing, discovery, OpenAPI, table printing and
// storage all read this one list, so a resource is added in one place.
//
// The built-in resources (Builtin) are those kube-apiserver of the same
// version serves by default: every GA group version and no beta or alpha
// one. A Catalog also takes entries at run time (Add), which is how
// CustomResourceDefinitions join the same layer.
//
// It holds descriptions only; behaviour (validation, defaulting, status
// handling, conversion between versions of one store) lives with the
// registry in the apiserver package.
package catalog

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// Verbs of a resource, as discovery names them.
var (
	allVerbs     = []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
	noCollection = []string{"create", "delete", "get", "list", "patch", "update", "watch"}
	createOnly   = []string{"create"}
)

// Subresource describes one subresource of a resource (status, scale, ...).
type Subresource struct {
	// Name is the path segment: "status", "scale", "binding", "log", ...
	Name string
	// Kind served by the subresource, and its group and version when they
	// differ from the parent's (scale is autoscaling/v1 Scale).
	Kind    string
	Group   string
	Version string
	Verbs   []string
}

// Resource describes one served resource.
type Resource struct {
	schema.GroupVersionResource
	Kind       string
	ListKind   string
	Singular   string
	Namespaced bool
	Verbs      []string
	ShortNames []string
	Categories []string
	Subs       []Subresource
	// New returns an empty object of the resource's type; NewList an empty
	// list.
	New     func() runtime.Object
	NewList func() runtime.Object

	// StoredAs, when set, is the resource whose store this one shares:
	// objects live in etcd in that resource's type and are converted on
	// every read and write (events.k8s.io/v1 events are core/v1 events,
	// autoscaling/v1 HorizontalPodAutoscalers are autoscaling/v2 ones, as
	// in kube-apiserver).
	StoredAs *schema.GroupVersionResource
	// Virtual resources are never stored: a create is answered by a
	// handler (TokenReview, SubjectAccessReview, ...) and nothing else is
	// served, or, with a list type, they are read-only and computed when
	// read (componentstatuses).
	Virtual bool
	// Prefix, when set, is the etcd key prefix of the resource's objects
	// instead of /registry/<resource>/ (custom resources live under
	// /registry/<group>/<resource>/, as in kube-apiserver; all versions of
	// one custom resource share it).
	Prefix string
	// CustomResourceDefinition names the CRD a custom resource is served
	// for ("" for built-in resources). Such objects are
	// *unstructured.Unstructured; their OpenAPI comes from the CRD's schema.
	CustomResourceDefinition string
}

// GroupVersionKind of the resource's objects.
func (r *Resource) GroupVersionKind() schema.GroupVersionKind {
	return r.GroupVersion().WithKind(r.Kind)
}

// Sub returns the subresource named name, if the resource has it.
func (r *Resource) Sub(name string) (Subresource, bool) {
	for _, s := range r.Subs {
		if s.Name == name {
			return s, true
		}
	}
	return Subresource{}, false
}

// HasVerb reports whether the resource serves verb.
func (r *Resource) HasVerb(verb string) bool { return slices.Contains(r.Verbs, verb) }

// StorageResource is the resource whose store holds this one's objects:
// StoredAs, or the resource itself.
func (r *Resource) StorageResource() schema.GroupVersionResource {
	if r.StoredAs != nil {
		return *r.StoredAs
	}
	return r.GroupVersionResource
}

// EtcdPrefix is the key prefix of the resource's objects, as Kubernetes lays
// them out: /registry/<resource>/ followed by <namespace>/<name> or <name>.
// Resources sharing a store share the prefix. Prefix overrides it.
func (r *Resource) EtcdPrefix() string {
	if r.Prefix != "" {
		return r.Prefix
	}
	return "/registry/" + r.StorageResource().Resource + "/"
}

// Catalog is a set of served resources and the order of their group
// versions. It is safe for concurrent use; entries may be added and removed
// while the server runs.
type Catalog struct {
	mu        sync.RWMutex
	resources []Resource
	groups    []schema.GroupVersion
	// generation counts changes, so that derived documents (discovery,
	// OpenAPI) know when to rebuild.
	generation int64
}

// New returns a catalog of resources; groups gives the discovery order of
// their group versions (preferred version first within a group).
func New(groups []schema.GroupVersion, resources ...Resource) (*Catalog, error) {
	c := &Catalog{groups: slices.Clone(groups)}
	for _, r := range resources {
		if err := c.add(r); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Add serves a new resource. Its group version joins the discovery order
// after the known ones when new.
func (c *Catalog) Add(r Resource) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.add(r)
}

func (c *Catalog) add(r Resource) error {
	if r.Resource == "" || r.Kind == "" || r.Version == "" || r.New == nil || (r.NewList == nil && !r.Virtual) {
		return fmt.Errorf("catalog: resource %v: resource, kind, version and types are required", r.GroupVersionResource)
	}
	for _, have := range c.resources {
		if have.GroupVersionResource == r.GroupVersionResource {
			return fmt.Errorf("catalog: %s is already served", r.GroupVersionResource)
		}
	}
	if r.ListKind == "" {
		r.ListKind = r.Kind + "List"
	}
	if r.Singular == "" {
		r.Singular = strings.ToLower(r.Kind)
	}
	if r.Verbs == nil {
		r.Verbs = allVerbs
	}
	if !slices.Contains(c.groups, r.GroupVersion()) {
		c.groups = append(c.groups, r.GroupVersion())
	}
	c.resources = append(c.resources, r)
	c.generation++
	return nil
}

// Set serves r, replacing the entry of the same group, version and
// resource in place (a CustomResourceDefinition changed) or adding it.
func (c *Catalog) Set(r Resource) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.resources {
		if c.resources[i].GroupVersionResource != r.GroupVersionResource {
			continue
		}
		old := c.resources[i]
		c.resources = slices.Delete(c.resources, i, i+1)
		if err := c.add(r); err != nil {
			c.resources = slices.Insert(c.resources, i, old)
			return err
		}
		last := c.resources[len(c.resources)-1]
		c.resources = slices.Insert(c.resources[:len(c.resources)-1], i, last)
		return nil
	}
	return c.add(r)
}

// Remove stops serving a resource; its group version leaves the discovery
// order when it has no resource left.
func (c *Catalog) Remove(gvr schema.GroupVersionResource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resources = slices.DeleteFunc(c.resources, func(r Resource) bool { return r.GroupVersionResource == gvr })
	gv := gvr.GroupVersion()
	if !slices.ContainsFunc(c.resources, func(r Resource) bool { return r.GroupVersion() == gv }) {
		c.groups = slices.DeleteFunc(c.groups, func(g schema.GroupVersion) bool { return g == gv })
	}
	c.generation++
}

// All returns a copy of the catalog's resources in insertion order.
func (c *Catalog) All() []Resource {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return slices.Clone(c.resources)
}

// Groups returns the served group versions in discovery order.
func (c *Catalog) Groups() []schema.GroupVersion {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]schema.GroupVersion, 0, len(c.groups))
	for _, gv := range c.groups {
		if slices.ContainsFunc(c.resources, func(r Resource) bool { return r.GroupVersion() == gv }) {
			out = append(out, gv)
		}
	}
	return out
}

// Generation changes whenever a resource is added or removed.
func (c *Catalog) Generation() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.generation
}

// Lookup finds a resource by group, version and plural name.
func (c *Catalog) Lookup(gvr schema.GroupVersionResource) (*Resource, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := range c.resources {
		if c.resources[i].GroupVersionResource == gvr {
			r := c.resources[i]
			return &r, true
		}
	}
	return nil, false
}

// builtin is the catalog of built-in resources, made once.
var builtin = sync.OnceValue(func() *Catalog {
	c, err := New(builtinGroups(), builtinResources()...)
	if err != nil {
		panic(err)
	}
	return c
})

// Builtin returns a new catalog of the built-in resources, for a server
// to extend with its own.
func Builtin() *Catalog {
	c, err := New(builtinGroups(), builtinResources()...)
	if err != nil {
		panic(err)
	}
	return c
}

// All returns the built-in resources, ordered by group (core first).
func All() []Resource { return builtin().All() }

// Groups returns the built-in group versions in discovery order, core ("")
// first.
func Groups() []schema.GroupVersion { return builtin().Groups() }

// Lookup finds a built-in resource by group, version and plural name.
func Lookup(gvr schema.GroupVersionResource) (*Resource, bool) { return builtin().Lookup(gvr) }

// Scheme is Waggle's runtime scheme: every k8s.io/api type (client-go's
// set) and kube-aggregator's APIService, with the meta/v1 option types (ListOptions, DeleteOptions, ...)
// registered in every served group version. Codecs for the wire come from
// it. It is Waggle's own, so nothing here changes client-go's global
// scheme.
var Scheme = newScheme()

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	utilruntime.Must(apiregistrationv1.AddToScheme(s))
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	for _, gv := range builtinGroups() {
		metav1.AddToGroupVersion(s, gv)
	}
	return s
}

// ParameterCodec converts query parameters into option structs.
var ParameterCodec = runtime.NewParameterCodec(Scheme)

// QuotaIgnored returns the resources ResourceQuota never counts, for the
// quota admission and the ResourceQuota controller alike (upstream's
// install.DefaultIgnoredResources: the virtual review kinds, bindings,
// componentstatuses, and events).
func QuotaIgnored() map[schema.GroupResource]struct{} {
	return map[schema.GroupResource]struct{}{
		{Group: "", Resource: "bindings"}:                                      {},
		{Group: "", Resource: "componentstatuses"}:                             {},
		{Group: "authentication.k8s.io", Resource: "tokenreviews"}:             {},
		{Group: "authentication.k8s.io", Resource: "selfsubjectreviews"}:       {},
		{Group: "authorization.k8s.io", Resource: "subjectaccessreviews"}:      {},
		{Group: "authorization.k8s.io", Resource: "selfsubjectaccessreviews"}:  {},
		{Group: "authorization.k8s.io", Resource: "localsubjectaccessreviews"}: {},
		{Group: "authorization.k8s.io", Resource: "selfsubjectrulesreviews"}:   {},
		{Group: "", Resource: "events"}:                                        {},
		{Group: "events.k8s.io", Resource: "events"}:                           {},
	}
}
