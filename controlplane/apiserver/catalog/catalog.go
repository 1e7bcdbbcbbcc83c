// Package catalog lists every resource the API server serves: its group,
// version, plural and kind, scope, verbs, short names, categories,
// subresources and Go types. Routing, discovery, OpenAPI, table printing and
// storage all read this one list, so a resource is added in one place.
//
// It holds descriptions only; behaviour (validation, defaulting, status
// handling) lives with the registry in the apiserver package.
package catalog

import (
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// Verbs of a resource, as discovery names them.
var (
	allVerbs     = []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
	noCollection = []string{"create", "delete", "get", "list", "patch", "update", "watch"}
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

// EtcdPrefix is the key prefix of the resource's objects, as Kubernetes lays
// them out: /registry/<resource>/ followed by <namespace>/<name> or <name>.
func (r *Resource) EtcdPrefix() string { return "/registry/" + r.Resource + "/" }

var (
	statusSub = Subresource{Name: "status", Verbs: []string{"get", "patch", "update"}}
	scaleSub  = Subresource{Name: "scale", Kind: "Scale", Group: autoscalingv1.GroupName, Version: "v1", Verbs: []string{"get", "patch", "update"}}
)

func res(gv schema.GroupVersion, plural, singular, kind string, namespaced bool, newObj, newList func() runtime.Object) Resource {
	return Resource{
		GroupVersionResource: gv.WithResource(plural),
		Kind:                 kind,
		ListKind:             kind + "List",
		Singular:             singular,
		Namespaced:           namespaced,
		Verbs:                allVerbs,
		New:                  newObj,
		NewList:              newList,
	}
}

// All returns the catalog, ordered by group (core first) then resource.
func All() []Resource {
	core := corev1.SchemeGroupVersion
	apps := appsv1.SchemeGroupVersion
	disc := discoveryv1.SchemeGroupVersion
	coord := coordinationv1.SchemeGroupVersion

	namespaces := res(core, "namespaces", "namespace", "Namespace", false,
		func() runtime.Object { return &corev1.Namespace{} }, func() runtime.Object { return &corev1.NamespaceList{} })
	namespaces.Verbs = noCollection
	namespaces.ShortNames = []string{"ns"}
	namespaces.Subs = []Subresource{{Name: "finalize", Verbs: []string{"update"}}, statusSub}

	pods := res(core, "pods", "pod", "Pod", true,
		func() runtime.Object { return &corev1.Pod{} }, func() runtime.Object { return &corev1.PodList{} })
	pods.ShortNames = []string{"po"}
	pods.Categories = []string{"all"}
	pods.Subs = []Subresource{
		statusSub,
		{Name: "binding", Kind: "Binding", Verbs: []string{"create"}},
		{Name: "log", Kind: "Pod", Verbs: []string{"get"}},
		{Name: "exec", Kind: "PodExecOptions", Verbs: []string{"create", "get"}},
		{Name: "proxy", Kind: "PodProxyOptions", Verbs: []string{"create", "delete", "get", "patch", "update"}},
		{Name: "eviction", Kind: "Eviction", Group: "policy", Version: "v1", Verbs: []string{"create"}},
	}

	services := res(core, "services", "service", "Service", true,
		func() runtime.Object { return &corev1.Service{} }, func() runtime.Object { return &corev1.ServiceList{} })
	services.ShortNames = []string{"svc"}
	services.Categories = []string{"all"}
	services.Subs = []Subresource{statusSub, {Name: "proxy", Kind: "ServiceProxyOptions", Verbs: []string{"create", "delete", "get", "patch", "update"}}}

	endpoints := res(core, "endpoints", "endpoints", "Endpoints", true,
		func() runtime.Object { return &corev1.Endpoints{} }, func() runtime.Object { return &corev1.EndpointsList{} })
	endpoints.ShortNames = []string{"ep"}

	nodes := res(core, "nodes", "node", "Node", false,
		func() runtime.Object { return &corev1.Node{} }, func() runtime.Object { return &corev1.NodeList{} })
	nodes.ShortNames = []string{"no"}
	nodes.Subs = []Subresource{statusSub, {Name: "proxy", Kind: "NodeProxyOptions", Verbs: []string{"create", "delete", "get", "patch", "update"}}}

	events := res(core, "events", "event", "Event", true,
		func() runtime.Object { return &corev1.Event{} }, func() runtime.Object { return &corev1.EventList{} })
	events.ShortNames = []string{"ev"}

	configmaps := res(core, "configmaps", "configmap", "ConfigMap", true,
		func() runtime.Object { return &corev1.ConfigMap{} }, func() runtime.Object { return &corev1.ConfigMapList{} })
	configmaps.ShortNames = []string{"cm"}

	secrets := res(core, "secrets", "secret", "Secret", true,
		func() runtime.Object { return &corev1.Secret{} }, func() runtime.Object { return &corev1.SecretList{} })

	serviceaccounts := res(core, "serviceaccounts", "serviceaccount", "ServiceAccount", true,
		func() runtime.Object { return &corev1.ServiceAccount{} }, func() runtime.Object { return &corev1.ServiceAccountList{} })
	serviceaccounts.ShortNames = []string{"sa"}

	endpointslices := res(disc, "endpointslices", "endpointslice", "EndpointSlice", true,
		func() runtime.Object { return &discoveryv1.EndpointSlice{} }, func() runtime.Object { return &discoveryv1.EndpointSliceList{} })

	leases := res(coord, "leases", "lease", "Lease", true,
		func() runtime.Object { return &coordinationv1.Lease{} }, func() runtime.Object { return &coordinationv1.LeaseList{} })

	deployments := res(apps, "deployments", "deployment", "Deployment", true,
		func() runtime.Object { return &appsv1.Deployment{} }, func() runtime.Object { return &appsv1.DeploymentList{} })
	deployments.ShortNames = []string{"deploy"}
	deployments.Categories = []string{"all"}
	deployments.Subs = []Subresource{statusSub, scaleSub}

	replicasets := res(apps, "replicasets", "replicaset", "ReplicaSet", true,
		func() runtime.Object { return &appsv1.ReplicaSet{} }, func() runtime.Object { return &appsv1.ReplicaSetList{} })
	replicasets.ShortNames = []string{"rs"}
	replicasets.Categories = []string{"all"}
	replicasets.Subs = []Subresource{statusSub, scaleSub}

	daemonsets := res(apps, "daemonsets", "daemonset", "DaemonSet", true,
		func() runtime.Object { return &appsv1.DaemonSet{} }, func() runtime.Object { return &appsv1.DaemonSetList{} })
	daemonsets.ShortNames = []string{"ds"}
	daemonsets.Categories = []string{"all"}
	daemonsets.Subs = []Subresource{statusSub}

	return []Resource{
		configmaps, endpoints, events, namespaces, nodes, pods, secrets, serviceaccounts, services,
		daemonsets, deployments, replicasets,
		leases,
		endpointslices,
	}
}

// Groups returns the served API groups in discovery order, core ("") first.
func Groups() []schema.GroupVersion {
	return []schema.GroupVersion{
		corev1.SchemeGroupVersion,
		appsv1.SchemeGroupVersion,
		coordinationv1.SchemeGroupVersion,
		discoveryv1.SchemeGroupVersion,
	}
}

// Lookup finds a resource by group, version and plural name.
func Lookup(gvr schema.GroupVersionResource) (*Resource, bool) {
	for _, r := range All() {
		if r.GroupVersionResource == gvr {
			return &r, true
		}
	}
	return nil, false
}

// Scheme is the runtime scheme holding every served type (client-go's, which
// registers all of k8s.io/api). Codecs for the wire come from it.
var Scheme = scheme.Scheme

// ParameterCodec converts query parameters into option structs.
var ParameterCodec = runtime.NewParameterCodec(Scheme)

// Ensure metav1 options types are registered for every served version.
func init() {
	for _, gv := range Groups() {
		metav1.AddToGroupVersion(Scheme, gv)
	}
}
