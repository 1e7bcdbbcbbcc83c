package apiserver

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/initializer"
	mutatingpolicy "k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	validatingpolicy "k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	webhookinit "k8s.io/apiserver/pkg/admission/plugin/webhook/initializer"
	mutatingwebhook "k8s.io/apiserver/pkg/admission/plugin/webhook/mutating"
	validatingwebhook "k8s.io/apiserver/pkg/admission/plugin/webhook/validating"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	utilcompatibility "k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/apiserver/pkg/util/proxy"
	webhookutil "k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/apiserver/pkg/warning"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
)

// dynamicAdmission is kube-apiserver's dynamic admission, made of
// k8s.io/apiserver's own plugins in upstream's order:
// MutatingAdmissionPolicy and MutatingAdmissionWebhook in the mutating
// phase (reinvoked as their reinvocationPolicy asks), then
// ValidatingAdmissionPolicy and ValidatingAdmissionWebhook in the
// validating phase, after the strategy's validation. Their configuration
// objects come from informers over the server's own loopback client, as in
// kube-apiserver.
type dynamicAdmission struct {
	chain     admission.Interface
	informers informers.SharedInformerFactory
	stop      chan struct{}
	stopOnce  sync.Once
	// started is set once Serve has started the informers: the server's
	// own start-up writes (in New, before anything listens) skip dynamic
	// admission, as no client could have configured it for them.
	started atomic.Bool
	// synced reports the informers of every plugin as synced.
	synced func() bool
	// configs are the informers of the plugins' configuration objects
	// (webhook configurations, policies and their bindings).
	configs []cache.SharedIndexInformer
	ifaces  *admissionSchemes
}

// dynamicPlugins are the plugin names, in kube-apiserver's order.
var dynamicPlugins = []string{
	mutatingpolicy.PluginName,
	mutatingwebhook.PluginName,
	validatingpolicy.PluginName,
	validatingwebhook.PluginName,
}

// loopbackConfig is the client configuration of the server's own clients.
func (s *Server) loopbackConfig() *rest.Config {
	cfg := &rest.Config{
		Host:        s.url,
		BearerToken: s.loopback.Token(),
		UserAgent:   "waggle-apiserver-loopback",
		QPS:         1000,
		Burst:       2000,
	}
	if ca := s.bundle.CAPEM(); len(ca) > 0 {
		cfg.TLSClientConfig.CAData = ca
	} else {
		cfg.TLSClientConfig.Insecure = true
	}
	return cfg
}

func (s *Server) setupDynamicAdmission() error {
	cfg := s.loopbackConfig()
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	d := &dynamicAdmission{
		informers: informers.NewSharedInformerFactory(client, 0),
		stop:      make(chan struct{}),
		ifaces:    &admissionSchemes{cat: s.catalog},
	}
	svcInf := d.informers.Core().V1().Services()
	sliceInf := d.informers.Discovery().V1().EndpointSlices()
	slices, err := proxy.NewEndpointSliceListerGetter(sliceInf.Lister())
	if err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	resolver := &endpointServiceResolver{services: svcInf.Lister(), slices: slices}
	s.webhookServices = resolver

	plugins := admission.NewPlugins()
	mutatingpolicy.Register(plugins)
	mutatingwebhook.Register(plugins)
	validatingpolicy.Register(plugins)
	validatingwebhook.Register(plugins)
	inits := admission.PluginInitializers{
		webhookinit.NewPluginInitializer(nil, resolver),
		initializer.New(client, dyn, d.informers, authorizerAdapter{s}, utilfeature.DefaultFeatureGate,
			utilcompatibility.DefaultBuildEffectiveVersion(), d.stop, &catalogRESTMapper{cat: s.catalog}),
	}
	// Each plugin's audit annotations (webhooks' auditAnnotations,
	// policies' auditAnnotations and Audit actions) go into the request's
	// audit event, as kube-apiserver decorates its chain.
	chain, err := plugins.NewFromPlugins(dynamicPlugins, noConfig{}, inits, admission.DecoratorFunc(func(h admission.Interface, _ string) admission.Interface {
		return admission.WithAudit(h)
	}))
	if err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	d.chain = chain
	ar := d.informers.Admissionregistration().V1()
	d.configs = []cache.SharedIndexInformer{
		ar.MutatingWebhookConfigurations().Informer(),
		ar.ValidatingWebhookConfigurations().Informer(),
		ar.MutatingAdmissionPolicies().Informer(),
		ar.MutatingAdmissionPolicyBindings().Informer(),
		ar.ValidatingAdmissionPolicies().Informer(),
		ar.ValidatingAdmissionPolicyBindings().Informer(),
	}
	// Informers the plugins did not ask for but the service resolver
	// needs, then the sync check of them all.
	svcInf.Informer()
	sliceInf.Informer()
	d.synced = func() bool {
		for _, ok := range d.informers.WaitForCacheSync(closedChan) {
			if !ok {
				return false
			}
		}
		return true
	}
	s.dynAdmission = d
	return nil
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// start starts the informers (Serve calls it once the listener serves).
func (d *dynamicAdmission) start() {
	d.informers.Start(d.stop)
	d.started.Store(true)
}

func (d *dynamicAdmission) close() {
	d.stopOnce.Do(func() { close(d.stop) })
}

type noConfig struct{}

func (noConfig) ConfigFor(string) (io.Reader, error) { return nil, nil }

// attributes converts one write to k8s.io/apiserver's admission record.
func (d *dynamicAdmission) attributes(ctx context.Context, a *AdmissionAttributes) admission.Attributes {
	res := a.Resource
	kind := res.GroupVersionKind()
	if a.Subresource != "" {
		if sub, ok := res.Sub(a.Subresource); ok && sub.Kind != "" {
			kind = schema.GroupVersionKind{Group: res.Group, Version: res.Version, Kind: sub.Kind}
			if sub.Group != "" || sub.Version != "" {
				kind.Group, kind.Version = sub.Group, sub.Version
			}
		}
	}
	if o := a.Object; o != nil {
		// The object passed is what the endpoint writes; its own kind wins
		// when the subresource's kind is not the stored one.
		if gvks, _, err := legacyscheme.Scheme.ObjectKinds(o); err == nil && len(gvks) > 0 && !containsGVK(gvks, kind) {
			kind = gvks[0]
		}
	}
	var opts runtime.Object
	var dry []string
	if a.DryRun {
		dry = []string{metav1.DryRunAll}
	}
	switch a.Operation {
	case OpCreate:
		opts = &metav1.CreateOptions{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "CreateOptions"}, DryRun: dry}
	case OpUpdate:
		opts = &metav1.UpdateOptions{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "UpdateOptions"}, DryRun: dry}
	case OpDelete:
		opts = &metav1.DeleteOptions{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "DeleteOptions"}, DryRun: dry}
	}
	var info user.Info = &user.DefaultInfo{Name: "system:apiserver", Groups: []string{"system:masters", authn.GroupAuthenticated}}
	if u, ok := authn.UserFrom(ctx); ok {
		info = &user.DefaultInfo{Name: u.Name, UID: u.UID, Groups: u.Groups}
	}
	return admission.NewAttributesRecord(a.Object, a.OldObject, kind, a.Namespace, a.Name, res.GroupVersionResource,
		a.Subresource, admission.Operation(a.Operation), opts, a.DryRun, info)
}

func containsGVK(l []schema.GroupVersionKind, k schema.GroupVersionKind) bool {
	for _, g := range l {
		if g == k {
			return true
		}
	}
	return false
}

// active reports whether dynamic admission applies to requests now.
func (d *dynamicAdmission) active() bool { return d != nil && d.started.Load() }

// idle reports whether no webhook configuration, admission policy or
// binding exists, as the synced informers the plugins read them from see
// it. The chain then neither changes nor rejects anything, yet costs every
// write (the mutating webhook plugin deep-copies the object to notice
// reinvocation changes): about 0.02 ms of CPU and 9 KiB of garbage per pod
// create. Before the informers have synced the chain runs, and answers as
// its plugins do when they are not ready.
func (d *dynamicAdmission) idle() bool {
	for _, inf := range d.configs {
		if !inf.HasSynced() || len(inf.GetStore().ListKeys()) > 0 {
			return false
		}
	}
	return len(d.configs) > 0
}

// admitDynamic runs the mutating phase: mutating policies and webhooks may
// change a.Object in place.
func (s *Server) admitDynamic(ctx context.Context, a *AdmissionAttributes) error {
	d := s.dynAdmission
	if !d.active() || d.idle() {
		return nil
	}
	m, ok := d.chain.(admission.MutationInterface)
	if !ok || !m.Handles(admission.Operation(a.Operation)) {
		return nil
	}
	if err := m.Admit(ctx, d.attributes(ctx, a), d.ifaces); err != nil {
		return err
	}
	// A custom resource a webhook or policy changed is pruned and
	// defaulted again, as upstream's CRD handler converts the mutated
	// object back through its schema.
	if u, ok := a.Object.(*unstructured.Unstructured); ok {
		if reg := s.lookupRegistry(regKey(a.Resource)); reg != nil && reg.cr != nil {
			if _, err := reg.cr.Coerce(u, false); err != nil {
				return apierrors.NewBadRequest(err.Error())
			}
			reg.cr.Default(u)
		}
	}
	return nil
}

// validateDynamic runs the validating phase: validating policies and
// webhooks see the object as it will be stored.
func (s *Server) validateDynamic(ctx context.Context, a *AdmissionAttributes) error {
	d := s.dynAdmission
	if !d.active() || d.idle() {
		return nil
	}
	v, ok := d.chain.(admission.ValidationInterface)
	if !ok || !v.Handles(admission.Operation(a.Operation)) {
		return nil
	}
	return v.Validate(ctx, d.attributes(ctx, a), d.ifaces)
}

// admissionSchemes gives the plugins the scheme operations they need over
// Waggle's served (versioned) objects: kube-apiserver's scheme for types,
// defaults and conversions between versions of a kind, and the catalog for
// which resources are the same objects (matchPolicy: Equivalent).
type admissionSchemes struct {
	cat *catalog.Catalog
	mu  sync.Mutex
	gen int64
	eq  runtime.EquivalentResourceMapper
}

func (o *admissionSchemes) GetObjectCreater() runtime.ObjectCreater     { return creater{} }
func (o *admissionSchemes) GetObjectTyper() runtime.ObjectTyper         { return legacyscheme.Scheme }
func (o *admissionSchemes) GetObjectDefaulter() runtime.ObjectDefaulter { return legacyscheme.Scheme }
func (o *admissionSchemes) GetObjectConvertor() runtime.ObjectConvertor { return convertor{} }

// GetEquivalentResourceMapper maps each served resource to those sharing
// its store (events in core/v1 and events.k8s.io/v1, HPAs in autoscaling
// v1 and v2), rebuilt when the catalog changes.
func (o *admissionSchemes) GetEquivalentResourceMapper() runtime.EquivalentResourceMapper {
	o.mu.Lock()
	defer o.mu.Unlock()
	if g := o.cat.Generation(); o.eq == nil || g != o.gen {
		all := o.cat.All()
		ident := map[schema.GroupResource]string{}
		for _, r := range all {
			st := r.StorageResource()
			ident[r.GroupResource()] = st.Group + "/" + st.Resource
		}
		reg := runtime.NewEquivalentResourceRegistryWithIdentity(func(gr schema.GroupResource) string {
			if id, ok := ident[gr]; ok {
				return id
			}
			return gr.String()
		})
		for _, r := range all {
			reg.RegisterKindFor(r.GroupVersionResource, "", r.GroupVersionKind())
			for _, sub := range r.Subs {
				k := r.GroupVersionKind()
				if sub.Kind != "" {
					k = schema.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: sub.Kind}
					if sub.Group != "" || sub.Version != "" {
						k.Group, k.Version = sub.Group, sub.Version
					}
				}
				reg.RegisterKindFor(r.GroupVersionResource, sub.Name, k)
			}
		}
		o.eq, o.gen = reg, g
	}
	return o.eq
}

// creater makes built-in kinds from kube-apiserver's scheme and anything
// else (custom resources) as Unstructured.
type creater struct{}

func (creater) New(gvk schema.GroupVersionKind) (runtime.Object, error) {
	if o, err := legacyscheme.Scheme.New(gvk); err == nil {
		return o, nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// convertor converts between served versions: the same type is a deep
// copy (Waggle's objects are already versioned, unlike kube-apiserver's
// internal ones), unstructured objects go through the unstructured
// converter, two versions of a built-in kind through its internal type.
type convertor struct{}

func (convertor) Convert(in, out, ctx interface{}) error {
	if reflect.TypeOf(in) == reflect.TypeOf(out) {
		if ro, ok := in.(runtime.Object); ok {
			reflect.ValueOf(out).Elem().Set(reflect.ValueOf(ro.DeepCopyObject()).Elem())
			return nil
		}
	}
	if u, ok := out.(*unstructured.Unstructured); ok {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(in)
		if err != nil {
			return err
		}
		gvk := u.GroupVersionKind()
		u.Object = m
		if !gvk.Empty() {
			u.SetGroupVersionKind(gvk)
		}
		return nil
	}
	if u, ok := in.(*unstructured.Unstructured); ok {
		return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out)
	}
	ro, ok := in.(runtime.Object)
	if !ok {
		return fmt.Errorf("admission: cannot convert %T", in)
	}
	gvks, _, err := legacyscheme.Scheme.ObjectKinds(ro)
	if err != nil || len(gvks) == 0 {
		return fmt.Errorf("admission: cannot convert %T: %v", in, err)
	}
	internal, err := legacyscheme.Scheme.ConvertToVersion(ro.DeepCopyObject(), schema.GroupVersion{Group: gvks[0].Group, Version: runtime.APIVersionInternal})
	if err != nil {
		return err
	}
	return legacyscheme.Scheme.Convert(internal, out, ctx)
}

func (convertor) ConvertToVersion(in runtime.Object, gv runtime.GroupVersioner) (runtime.Object, error) {
	return legacyscheme.Scheme.ConvertToVersion(in, gv)
}

func (convertor) ConvertFieldLabel(gvk schema.GroupVersionKind, label, value string) (string, string, error) {
	return legacyscheme.Scheme.ConvertFieldLabel(gvk, label, value)
}

// catalogRESTMapper maps kinds and resources from the catalog (paramKind
// of admission policies), including resources added at run time.
type catalogRESTMapper struct {
	cat *catalog.Catalog
	mu  sync.Mutex
	gen int64
	m   meta.RESTMapper
}

func (c *catalogRESTMapper) mapper() meta.RESTMapper {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.cat.Generation(); c.m == nil || g != c.gen {
		m := meta.NewDefaultRESTMapper(c.cat.Groups())
		for _, r := range c.cat.All() {
			scope := meta.RESTScopeRoot
			if r.Namespaced {
				scope = meta.RESTScopeNamespace
			}
			singular := r.GroupVersionResource
			singular.Resource = r.Singular
			if singular.Resource == "" {
				singular.Resource = strings.ToLower(r.Kind)
			}
			m.AddSpecific(r.GroupVersionKind(), r.GroupVersionResource, singular, scope)
		}
		c.m, c.gen = m, g
	}
	return c.m
}

func (c *catalogRESTMapper) KindFor(r schema.GroupVersionResource) (schema.GroupVersionKind, error) {
	return c.mapper().KindFor(r)
}
func (c *catalogRESTMapper) KindsFor(r schema.GroupVersionResource) ([]schema.GroupVersionKind, error) {
	return c.mapper().KindsFor(r)
}
func (c *catalogRESTMapper) ResourceFor(r schema.GroupVersionResource) (schema.GroupVersionResource, error) {
	return c.mapper().ResourceFor(r)
}
func (c *catalogRESTMapper) ResourcesFor(r schema.GroupVersionResource) ([]schema.GroupVersionResource, error) {
	return c.mapper().ResourcesFor(r)
}
func (c *catalogRESTMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	return c.mapper().RESTMapping(gk, versions...)
}
func (c *catalogRESTMapper) RESTMappings(gk schema.GroupKind, versions ...string) ([]*meta.RESTMapping, error) {
	return c.mapper().RESTMappings(gk, versions...)
}
func (c *catalogRESTMapper) ResourceSingularizer(resource string) (string, error) {
	return c.mapper().ResourceSingularizer(resource)
}

// authorizerAdapter gives k8s.io/apiserver's plugins (the authorizer
// variable of CEL expressions) the server's authorizer.
type authorizerAdapter struct{ s *Server }

func (a authorizerAdapter) Authorize(ctx context.Context, at authorizer.Attributes) (authorizer.Decision, string, error) {
	var u *authn.User
	if ui := at.GetUser(); ui != nil {
		u = &authn.User{Name: ui.GetName(), UID: ui.GetUID(), Groups: ui.GetGroups()}
	}
	allowed, reason, err := a.s.authz.Authorize(ctx, authz.Attributes{
		User: u, Verb: at.GetVerb(), APIGroup: at.GetAPIGroup(), APIVersion: at.GetAPIVersion(),
		Resource: at.GetResource(), Subresource: at.GetSubresource(), Namespace: at.GetNamespace(), Name: at.GetName(),
		Path: at.GetPath(), ResourceRequest: at.IsResourceRequest(),
	})
	if allowed {
		return authorizer.DecisionAllow, reason, err
	}
	return authorizer.DecisionNoOpinion, reason, err
}

func (a authorizerAdapter) ConditionsAwareAuthorize(ctx context.Context, at authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(a.Authorize(ctx, at))
}

func (authorizerAdapter) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}

// endpointServiceResolver resolves a webhook's (or APIService's) service
// reference to one of its ready endpoints, as kube-apiserver with
// --enable-aggregator-routing: the API server reaches pod IPs directly and
// needs no Service proxy on its host.
type endpointServiceResolver struct {
	services corelisters.ServiceLister
	slices   proxy.EndpointSliceGetter
}

var _ webhookutil.ServiceResolver = (*endpointServiceResolver)(nil)

func (r *endpointServiceResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	return proxy.ResolveEndpoint(r.services, r.slices, namespace, name, port)
}

// headerWarnings records warnings from admission (webhooks, policies with
// validationActions Warn) as Warning headers of the response, deduplicated,
// as kube-apiserver's recorder.
type headerWarnings struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	seen map[string]bool
}

func withWarnings(ctx context.Context, w http.ResponseWriter) context.Context {
	return warning.WithWarningRecorder(ctx, &headerWarnings{w: w, seen: map[string]bool{}})
}

func (h *headerWarnings) AddWarning(_, text string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if text == "" || h.seen[text] {
		return
	}
	h.seen[text] = true
	if hv, err := utilnet.NewWarningHeader(299, "-", text); err == nil {
		h.w.Header().Add("Warning", hv)
	}
}

// WebhookClientManager is a client for calling webhooks configured by API
// objects (a WebhookClientConfig: url, or service reference resolved as
// admission webhooks' are, with caBundle), for the API server's other
// webhook callers such as CustomResourceDefinition conversion: gvs and
// addToSchemes are the review types it speaks, as
// k8s.io/apiserver/pkg/util/webhook.NewClientManager takes them.
func (s *Server) WebhookClientManager(gvs []schema.GroupVersion, addToSchemes ...func(*runtime.Scheme) error) (*webhookutil.ClientManager, error) {
	cm, err := webhookutil.NewClientManager(gvs, addToSchemes...)
	if err != nil {
		return nil, err
	}
	auth, err := webhookutil.NewDefaultAuthenticationInfoResolver("")
	if err != nil {
		return nil, err
	}
	cm.SetAuthenticationInfoResolver(auth)
	if s.webhookServices != nil {
		cm.SetServiceResolver(s.webhookServices)
	}
	return &cm, cm.Validate()
}
