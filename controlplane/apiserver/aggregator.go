package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apiextensionsinformers "k8s.io/apiextensions-apiserver/pkg/client/informers/externalversions"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/util/proxy"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	apiregistrationv1helper "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1/helper"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	aggregatorinformers "k8s.io/kube-aggregator/pkg/client/informers/externalversions"
	apiservicelisters "k8s.io/kube-aggregator/pkg/client/listers/apiregistration/v1"
	"k8s.io/kube-aggregator/pkg/controllers/autoregister"
	localavailability "k8s.io/kube-aggregator/pkg/controllers/status/local"
	availabilitymetrics "k8s.io/kube-aggregator/pkg/controllers/status/metrics"
	remoteavailability "k8s.io/kube-aggregator/pkg/controllers/status/remote"
	"k8s.io/kubernetes/pkg/controlplane/controller/crdregistration"
)

// aggregator is kube-apiserver's aggregation layer over APIService objects:
// a local APIService for every served group version, requests for a
// remote one proxied to its Service with the front-proxy client
// certificate and X-Remote-* headers, discovery and OpenAPI v3 merged, and
// kube-aggregator's own availability controllers writing the Available
// condition.
type aggregator struct {
	s       *Server
	fp      *pki.FrontProxy
	client  aggregatorclient.Interface
	factory aggregatorinformers.SharedInformerFactory
	lister  apiservicelisters.APIServiceLister
	local   *localavailability.AvailableConditionController
	remote  *remoteavailability.AvailableConditionController
	// crdFactory feeds upstream's crdregistration controller, which keeps
	// a local APIService for every CRD group version through the
	// autoregister controller, as in kube-apiserver.
	crdFactory apiextensionsinformers.SharedInformerFactory
	autoreg    interface {
		Run(int, <-chan struct{})
		AddAPIServiceToSyncOnStart(*apiregistrationv1.APIService)
		crdregistration.AutoAPIServiceRegistration
	}
	crdreg   interface{ Run(int, <-chan struct{}) }
	stop     chan struct{}
	stopOnce sync.Once

	mu         sync.Mutex
	transports map[string]http.RoundTripper // by the APIService's TLS settings
	// discovery of remote group versions, fetched by the discovery merge.
	resources map[string]cachedResources
}

type cachedResources struct {
	at   time.Time
	list *metav1.APIResourceList
}

// apiServicePriorities are kube-apiserver's group and version priorities
// of its built-in group versions (cmd/kube-apiserver/app/aggregator.go and
// pkg/controlplane/apiserver/aggregator.go), which order discovery.
var apiServicePriorities = map[schema.GroupVersion][2]int32{
	{Group: "", Version: "v1"}:                             {18000, 1},
	{Group: "apiregistration.k8s.io", Version: "v1"}:       {18000, 15},
	{Group: "apps", Version: "v1"}:                         {17800, 15},
	{Group: "events.k8s.io", Version: "v1"}:                {17750, 15},
	{Group: "authentication.k8s.io", Version: "v1"}:        {17700, 15},
	{Group: "authorization.k8s.io", Version: "v1"}:         {17600, 15},
	{Group: "autoscaling", Version: "v2"}:                  {17500, 30},
	{Group: "autoscaling", Version: "v1"}:                  {17500, 15},
	{Group: "batch", Version: "v1"}:                        {17400, 15},
	{Group: "certificates.k8s.io", Version: "v1"}:          {17300, 15},
	{Group: "networking.k8s.io", Version: "v1"}:            {17200, 15},
	{Group: "policy", Version: "v1"}:                       {17100, 15},
	{Group: "rbac.authorization.k8s.io", Version: "v1"}:    {17000, 15},
	{Group: "storage.k8s.io", Version: "v1"}:               {16800, 15},
	{Group: "apiextensions.k8s.io", Version: "v1"}:         {16700, 15},
	{Group: "admissionregistration.k8s.io", Version: "v1"}: {16700, 15},
	{Group: "scheduling.k8s.io", Version: "v1"}:            {16600, 15},
	{Group: "coordination.k8s.io", Version: "v1"}:          {16500, 15},
	{Group: "node.k8s.io", Version: "v1"}:                  {16300, 15},
	{Group: "discovery.k8s.io", Version: "v1"}:             {16200, 15},
	{Group: "resource.k8s.io", Version: "v1"}:              {16200, 21},
	{Group: "flowcontrol.apiserver.k8s.io", Version: "v1"}: {16100, 21},
	{Group: "storagemigration.k8s.io", Version: "v1"}:      {15800, 15},
}

func apiServiceName(gv schema.GroupVersion) string { return gv.Version + "." + gv.Group }

func (s *Server) setupAggregator() error {
	fp, err := pki.EnsureFrontProxy(filepath.Join(s.cfg.DataDir, "pki"))
	if err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	client, err := aggregatorclient.NewForConfig(s.loopbackConfig())
	if err != nil {
		return fmt.Errorf("apiserver: aggregator: %w", err)
	}
	a := &aggregator{s: s, fp: fp, client: client, stop: make(chan struct{}),
		factory:    aggregatorinformers.NewSharedInformerFactory(client, 0),
		transports: map[string]http.RoundTripper{}, resources: map[string]cachedResources{}}
	inf := a.factory.Apiregistration().V1().APIServices()
	a.lister = inf.Lister()
	m := availabilitymetrics.New()
	if a.local, err = localavailability.New(inf, client.ApiregistrationV1(), m); err != nil {
		return fmt.Errorf("apiserver: aggregator: %w", err)
	}
	core := s.dynAdmission.informers
	if a.remote, err = remoteavailability.New(inf, core.Core().V1().Services(), core.Discovery().V1().EndpointSlices(),
		client.ApiregistrationV1(), nil, func() ([]byte, []byte) { return fp.ClientCert, fp.ClientKey }, s.webhookServices, m); err != nil {
		return fmt.Errorf("apiserver: aggregator: %w", err)
	}
	if _, ok := s.catalog.Lookup(apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")); ok {
		ec, err := apiextensionsclient.NewForConfig(s.loopbackConfig())
		if err != nil {
			return fmt.Errorf("apiserver: aggregator: %w", err)
		}
		a.crdFactory = apiextensionsinformers.NewSharedInformerFactory(ec, 0)
		a.autoreg = autoregister.NewAutoRegisterController(inf, client.ApiregistrationV1())
		a.crdreg = crdregistration.NewCRDRegistrationController(a.crdFactory.Apiextensions().V1().CustomResourceDefinitions(), a.autoreg)
	}
	s.agg = a
	return nil
}

func (a *aggregator) start() {
	a.factory.Start(a.stop)
	go a.local.Run(1, a.stop)
	go a.remote.Run(2, a.stop)
	if a.crdFactory != nil {
		a.crdFactory.Start(a.stop)
		go a.autoreg.Run(1, a.stop)
		go a.crdreg.Run(1, a.stop)
	}
}

func (a *aggregator) close() { a.stopOnce.Do(func() { close(a.stop) }) }

func (a *aggregator) synced() bool {
	for _, ok := range a.factory.WaitForCacheSync(closedChan) {
		if !ok {
			return false
		}
	}
	return true
}

// registerLocalAPIServices writes the APIService of every group version
// the server serves itself (spec.service unset), as kube-apiserver's
// autoregister controller at start.
func (s *Server) registerLocalAPIServices(ctx context.Context) error {
	if s.registries["apiservices"] == nil {
		return nil
	}
	groups := s.catalog.Groups()
	for i, gv := range groups {
		p, ok := apiServicePriorities[gv]
		if !ok {
			// Not in upstream's table: after the last, in catalog order.
			p = [2]int32{int32(15000 - 100*i), 15}
		}
		want := &apiregistrationv1.APIService{
			ObjectMeta: metav1.ObjectMeta{Name: apiServiceName(gv), Labels: map[string]string{"kube-aggregator.kubernetes.io/automanaged": "onstart"}},
			Spec:       apiregistrationv1.APIServiceSpec{Group: gv.Group, Version: gv.Version, GroupPriorityMinimum: p[0], VersionPriority: p[1]},
		}
		if s.agg != nil && s.agg.autoreg != nil {
			// The autoregister controller keeps what it was given at start
			// and removes other "onstart" APIServices, as upstream.
			s.agg.autoreg.AddAPIServiceToSyncOnStart(want.DeepCopy())
		}
		if err := s.upsert(ctx, "apiservices", want, func(cur runtime.Object) bool {
			c := cur.(*apiregistrationv1.APIService)
			if c.Spec.Service == nil && c.Spec.GroupPriorityMinimum == want.Spec.GroupPriorityMinimum && c.Spec.VersionPriority == want.Spec.VersionPriority {
				return false
			}
			c.Spec = want.Spec
			return true
		}); err != nil {
			return err
		}
	}
	return nil
}

// publishExtensionAuthentication writes kube-system/extension-apiserver-
// authentication as kube-apiserver does: the client CA extension servers
// verify users' certificates with, and the requestheader settings under
// which they trust the front proxy's X-Remote-* headers.
func (s *Server) publishExtensionAuthentication(ctx context.Context) error {
	if s.agg == nil {
		return nil
	}
	list := func(v ...string) string { b, _ := json.Marshal(v); return string(b) }
	data := map[string]string{
		"requestheader-client-ca-file":       string(s.agg.fp.CA.CAPEM()),
		"requestheader-allowed-names":        list(pki.FrontProxyClientName),
		"requestheader-username-headers":     list("X-Remote-User"),
		"requestheader-uid-headers":          list("X-Remote-Uid"),
		"requestheader-group-headers":        list("X-Remote-Group"),
		"requestheader-extra-headers-prefix": list("X-Remote-Extra-"),
	}
	if ca := s.bundle.CAPEM(); len(ca) > 0 {
		data["client-ca-file"] = string(ca)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "extension-apiserver-authentication", Namespace: "kube-system"}, Data: data}
	return s.upsert(ctx, "configmaps", cm, func(cur runtime.Object) bool {
		c := cur.(*corev1.ConfigMap)
		if mapsEqual(c.Data, data) {
			return false
		}
		c.Data = data
		return true
	})
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// remoteFor returns the APIService serving group/version when it is not
// this server.
func (a *aggregator) remoteFor(group, version string) *apiregistrationv1.APIService {
	if a == nil || group == "" {
		return nil
	}
	svc, err := a.lister.Get(version + "." + group)
	if err != nil || svc.Spec.Service == nil {
		return nil
	}
	return svc
}

// remotes lists the remote APIServices.
func (a *aggregator) remotes() []*apiregistrationv1.APIService {
	if a == nil {
		return nil
	}
	all, _ := a.lister.List(labels.Everything())
	var out []*apiregistrationv1.APIService
	for _, svc := range all {
		if svc.Spec.Service != nil {
			out = append(out, svc)
		}
	}
	return out
}

// transportFor is the TLS transport to an APIService's backend: its
// caBundle (or insecureSkipTLSVerify) for the server's name
// <service>.<namespace>.svc, and the front-proxy client certificate.
func (a *aggregator) transportFor(svc *apiregistrationv1.APIService) (http.RoundTripper, error) {
	ref := svc.Spec.Service
	key := fmt.Sprintf("%s/%s/%v/%x", ref.Namespace, ref.Name, svc.Spec.InsecureSkipTLSVerify, svc.Spec.CABundle)
	a.mu.Lock()
	defer a.mu.Unlock()
	if rt, ok := a.transports[key]; ok {
		return rt, nil
	}
	cfg := &rest.Config{TLSClientConfig: rest.TLSClientConfig{
		Insecure: svc.Spec.InsecureSkipTLSVerify, ServerName: ref.Name + "." + ref.Namespace + ".svc",
		CertData: a.fp.ClientCert, KeyData: a.fp.ClientKey, CAData: svc.Spec.CABundle,
	}}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	a.transports[key] = rt
	return rt, nil
}

// proxy serves one request for a remote APIService, as kube-aggregator's
// proxy handler: 503 "service unavailable" until the APIService is
// Available, else to a ready endpoint of its Service, the caller's identity
// in X-Remote-User/-Uid/-Group/-Extra-* and its credentials removed.
func (a *aggregator) proxy(w http.ResponseWriter, r *http.Request, svc *apiregistrationv1.APIService) {
	if !apiregistrationv1helper.IsAPIServiceConditionTrue(svc, apiregistrationv1.Available) {
		http.Error(w, "service unavailable", http.StatusServiceUnavailable)
		return
	}
	u, ok := authn.UserFrom(r.Context())
	if !ok {
		http.Error(w, "missing user", http.StatusInternalServerError)
		return
	}
	rt, err := a.transportFor(svc)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	ref := svc.Spec.Service
	port := int32(443)
	if ref.Port != nil {
		port = *ref.Port
	}
	loc, err := a.s.webhookServices.ResolveEndpoint(ref.Namespace, ref.Name, port)
	if err != nil {
		a.s.log.Debug("aggregator: resolve", "apiservice", svc.Name, "err", err)
		http.Error(w, "service unavailable", http.StatusServiceUnavailable)
		return
	}
	location := &url.URL{Scheme: "https", Host: loc.Host, Path: r.URL.Path, RawQuery: r.URL.Query().Encode()}
	req := r.Clone(r.Context())
	req.Header.Del("Authorization")
	for h := range req.Header {
		if strings.HasPrefix(h, "Impersonate-") || strings.HasPrefix(h, "X-Remote-") {
			req.Header.Del(h)
		}
	}
	req.URL, req.Host = location, location.Host
	upgrade := httpstream.IsUpgradeRequest(req)
	rt = transport.NewAuthProxyRoundTripper(u.Name, u.UID, u.Groups, nil, rt)
	if upgrade {
		transport.SetAuthProxyHeaders(req, u.Name, u.UID, u.Groups, nil)
	}
	h := proxy.NewUpgradeAwareHandler(location, rt, true, upgrade, proxyResponder{w})
	h.ServeHTTP(w, req)
}

type proxyResponder struct{ w http.ResponseWriter }

func (p proxyResponder) Error(_ http.ResponseWriter, _ *http.Request, err error) {
	http.Error(p.w, err.Error(), http.StatusServiceUnavailable)
}

// serveAggregated routes the paths of remote APIServices to them and
// merges their groups into discovery; everything else goes to next.
func (s *Server) serveAggregated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := s.agg
		p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		switch {
		case a == nil:
		case len(p) >= 3 && p[0] == "apis":
			if svc := a.remoteFor(p[1], p[2]); svc != nil {
				a.proxy(w, r, svc)
				return
			}
		case len(p) == 2 && p[0] == "apis" && r.Method == http.MethodGet:
			if g := a.remoteGroup(p[1]); g != nil && !s.servesGroup(p[1]) {
				writeJSONValue(w, http.StatusOK, g)
				return
			}
		case len(p) == 1 && p[0] == "apis" && r.Method == http.MethodGet:
			if rs := a.remotes(); len(rs) > 0 {
				a.mergeDiscovery(w, r, next, rs)
				return
			}
		case len(p) >= 4 && p[0] == "openapi" && p[1] == "v3" && p[2] == "apis" && r.Method == http.MethodGet:
			if len(p) >= 5 {
				if svc := a.remoteFor(p[3], p[4]); svc != nil {
					a.proxy(w, r, svc)
					return
				}
			}
		case len(p) == 2 && p[0] == "openapi" && p[1] == "v3" && r.Method == http.MethodGet:
			if rs := a.remotes(); len(rs) > 0 {
				a.mergeOpenAPIIndex(w, r, next, rs)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) servesGroup(group string) bool {
	for _, gv := range s.catalog.Groups() {
		if gv.Group == group {
			return true
		}
	}
	return false
}

// byPriority sorts APIServices as kube-aggregator orders discovery: group
// priority (highest first), then group name, then version priority, then
// Kubernetes version order.
func byPriority(rs []*apiregistrationv1.APIService) {
	sort.SliceStable(rs, func(i, j int) bool {
		a, b := rs[i].Spec, rs[j].Spec
		if a.GroupPriorityMinimum != b.GroupPriorityMinimum {
			return a.GroupPriorityMinimum > b.GroupPriorityMinimum
		}
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.VersionPriority != b.VersionPriority {
			return a.VersionPriority > b.VersionPriority
		}
		return version.CompareKubeAwareVersionStrings(a.Version, b.Version) > 0
	})
}

// remoteGroup is the APIGroup of a group served (only) by remote
// APIServices.
func (a *aggregator) remoteGroup(group string) *metav1.APIGroup {
	var rs []*apiregistrationv1.APIService
	for _, svc := range a.remotes() {
		if svc.Spec.Group == group {
			rs = append(rs, svc)
		}
	}
	if len(rs) == 0 {
		return nil
	}
	byPriority(rs)
	g := &metav1.APIGroup{TypeMeta: metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}, Name: group}
	for _, svc := range rs {
		g.Versions = append(g.Versions, metav1.GroupVersionForDiscovery{GroupVersion: svc.Spec.Group + "/" + svc.Spec.Version, Version: svc.Spec.Version})
	}
	g.PreferredVersion = g.Versions[0]
	return g
}

// mergeDiscovery adds the remote groups to the local /apis document, in
// its legacy (APIGroupList) or aggregated (APIGroupDiscoveryList) form.
func (a *aggregator) mergeDiscovery(w http.ResponseWriter, r *http.Request, local http.Handler, rs []*apiregistrationv1.APIService) {
	aggregated := strings.Contains(r.Header.Get("Accept"), "as=APIGroupDiscoveryList")
	lr := r.Clone(r.Context())
	if aggregated {
		lr.Header.Set("Accept", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
	} else {
		lr.Header.Set("Accept", "application/json")
	}
	rec := httptest.NewRecorder()
	local.ServeHTTP(rec, lr)
	if rec.Code != http.StatusOK {
		copyResponse(w, rec)
		return
	}
	byPriority(rs)
	groups := map[string][]*apiregistrationv1.APIService{}
	var order []string
	for _, svc := range rs {
		if a.s.servesGroup(svc.Spec.Group) {
			continue
		}
		if _, ok := groups[svc.Spec.Group]; !ok {
			order = append(order, svc.Spec.Group)
		}
		groups[svc.Spec.Group] = append(groups[svc.Spec.Group], svc)
	}
	if !aggregated {
		var list metav1.APIGroupList
		if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil {
			copyResponse(w, rec)
			return
		}
		for _, name := range order {
			list.Groups = append(list.Groups, *a.remoteGroup(name))
		}
		writeJSONValue(w, http.StatusOK, &list)
		return
	}
	var list apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil {
		copyResponse(w, rec)
		return
	}
	for _, name := range order {
		g := apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, svc := range groups[name] {
			v := apidiscoveryv2.APIVersionDiscovery{Version: svc.Spec.Version, Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}
			res, err := a.remoteResources(r.Context(), svc)
			if err != nil {
				v.Freshness = apidiscoveryv2.DiscoveryFreshnessStale
			}
			if res != nil {
				v.Resources = toDiscoveryResources(res)
			}
			g.Versions = append(g.Versions, v)
		}
		list.Items = append(list.Items, g)
	}
	w.Header().Set("Content-Type", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
	w.Header().Set("Vary", "Accept")
	b, _ := json.Marshal(&list)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// remoteResources fetches (and caches for 10 s) a remote group version's
// resource list through the proxy path, as the user asking.
func (a *aggregator) remoteResources(ctx context.Context, svc *apiregistrationv1.APIService) (*metav1.APIResourceList, error) {
	key := svc.Spec.Group + "/" + svc.Spec.Version
	a.mu.Lock()
	c, ok := a.resources[key]
	a.mu.Unlock()
	if ok && time.Since(c.at) < 10*time.Second {
		return c.list, nil
	}
	if !apiregistrationv1helper.IsAPIServiceConditionTrue(svc, apiregistrationv1.Available) {
		return c.list, errors.New("unavailable")
	}
	req, err := http.NewRequestWithContext(authn.WithUser(ctx, &authn.LoopbackUser), http.MethodGet, "/apis/"+key, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	rec := httptest.NewRecorder()
	a.proxy(rec, req, svc)
	if rec.Code != http.StatusOK {
		return c.list, fmt.Errorf("discovery of %s: %d", key, rec.Code)
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil {
		return c.list, err
	}
	a.mu.Lock()
	a.resources[key] = cachedResources{at: time.Now(), list: &list}
	a.mu.Unlock()
	return &list, nil
}

// toDiscoveryResources converts a legacy resource list to aggregated
// discovery's form (subresources under their parent).
func toDiscoveryResources(l *metav1.APIResourceList) []apidiscoveryv2.APIResourceDiscovery {
	var out []apidiscoveryv2.APIResourceDiscovery
	idx := map[string]int{}
	for _, r := range l.APIResources {
		if strings.Contains(r.Name, "/") {
			continue
		}
		scope := apidiscoveryv2.ScopeCluster
		if r.Namespaced {
			scope = apidiscoveryv2.ScopeNamespace
		}
		gv, _ := schema.ParseGroupVersion(l.GroupVersion)
		group, version := r.Group, r.Version
		if group == "" {
			group = gv.Group
		}
		if version == "" {
			version = gv.Version
		}
		idx[r.Name] = len(out)
		out = append(out, apidiscoveryv2.APIResourceDiscovery{
			Resource: r.Name, ResponseKind: &metav1.GroupVersionKind{Group: group, Version: version, Kind: r.Kind},
			Scope: scope, SingularResource: r.SingularName, Verbs: r.Verbs, ShortNames: r.ShortNames, Categories: r.Categories,
		})
	}
	for _, r := range l.APIResources {
		parent, sub, ok := strings.Cut(r.Name, "/")
		i, found := idx[parent]
		if !ok || !found {
			continue
		}
		out[i].Subresources = append(out[i].Subresources, apidiscoveryv2.APISubresourceDiscovery{
			Subresource: sub, ResponseKind: &metav1.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: r.Kind}, Verbs: r.Verbs,
		})
	}
	return out
}

// mergeOpenAPIIndex adds each remote group version to /openapi/v3's index;
// its document is proxied to the extension server.
func (a *aggregator) mergeOpenAPIIndex(w http.ResponseWriter, r *http.Request, local http.Handler, rs []*apiregistrationv1.APIService) {
	rec := httptest.NewRecorder()
	local.ServeHTTP(rec, r)
	if rec.Code != http.StatusOK {
		copyResponse(w, rec)
		return
	}
	var idx struct {
		Paths map[string]struct {
			ServerRelativeURL string `json:"serverRelativeURL"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &idx); err != nil || idx.Paths == nil {
		copyResponse(w, rec)
		return
	}
	for _, svc := range rs {
		if !apiregistrationv1helper.IsAPIServiceConditionTrue(svc, apiregistrationv1.Available) {
			continue
		}
		p := "apis/" + svc.Spec.Group + "/" + svc.Spec.Version
		idx.Paths[p] = struct {
			ServerRelativeURL string `json:"serverRelativeURL"`
		}{"/openapi/v3/" + p + "?hash=" + svc.ResourceVersion}
	}
	writeJSONValue(w, http.StatusOK, &idx)
}

func copyResponse(w http.ResponseWriter, rec *httptest.ResponseRecorder) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

func writeJSONValue(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeStatus(w, apierrors.NewInternalError(err), notFoundGR, "")
		return
	}
	writeJSON(w, code, bytes.TrimSpace(b))
}
