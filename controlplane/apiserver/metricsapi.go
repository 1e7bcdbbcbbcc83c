package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	metricsapi "github.com/waggle-io/waggle/controlplane/metrics"
)

// The resource metrics API is served natively rather than through an
// aggregated APIService: the scraper (package controlplane/metrics) runs in
// the API server, reads nodes and pods from its registries and reaches the
// kubelets with the client certificate pods/log already uses, so `kubectl
// top` works without deploying anything. When an aggregated metrics server
// is wanted instead, --metrics-api=off removes these two entries and an
// APIService for v1beta1.metrics.k8s.io takes the group.

// metricsResources are the two read-only metrics.k8s.io/v1beta1 entries.
func metricsResources() []catalog.Resource {
	gv := metricsv1beta1.SchemeGroupVersion
	entry := func(plural string, namespaced bool, obj, list runtime.Object) catalog.Resource {
		ot, lt := reflect.TypeOf(obj).Elem(), reflect.TypeOf(list).Elem()
		return catalog.Resource{
			GroupVersionResource: gv.WithResource(plural),
			Kind:                 ot.Name(),
			ListKind:             lt.Name(),
			Namespaced:           namespaced,
			Verbs:                []string{"get", "list"},
			New:                  func() runtime.Object { return reflect.New(ot).Interface().(runtime.Object) },
			NewList:              func() runtime.Object { return reflect.New(lt).Interface().(runtime.Object) },
			Virtual:              true,
		}
	}
	return []catalog.Resource{
		entry("nodes", false, &metricsv1beta1.NodeMetrics{}, &metricsv1beta1.NodeMetricsList{}),
		entry("pods", true, &metricsv1beta1.PodMetrics{}, &metricsv1beta1.PodMetricsList{}),
	}
}

// setupMetricsAPI adds the metrics.k8s.io entries and the scraper when
// MetricsAPI is native.
func (s *Server) setupMetricsAPI() error {
	switch s.cfg.MetricsAPI {
	case "", "off":
		return nil
	case "native":
	default:
		return fmt.Errorf("apiserver: --metrics-api=%q: want native or off", s.cfg.MetricsAPI)
	}
	for _, r := range metricsResources() {
		if err := s.catalog.Add(r); err != nil {
			return fmt.Errorf("apiserver: %w", err)
		}
	}
	rt, err := s.kubeletRT()
	if err != nil {
		return fmt.Errorf("apiserver: kubelet client: %w", err)
	}
	s.metricsStore = metricsapi.New(metricsapi.Config{Source: registrySource{s}, Transport: rt,
		Resolution: s.cfg.MetricsResolution, Log: s.log.With("subsystem", "metrics"), Registerer: s.health.Registry})
	return nil
}

// serveMetrics answers GET and LIST of metrics.k8s.io nodes and pods.
func (s *Server) serveMetrics(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, verb string) error {
	if s.metricsStore == nil || (verb != "get" && verb != "list") {
		return apierrors.NewMethodNotSupported(req.reg.gr, r.Method)
	}
	pods := req.reg.res.Resource == "pods"
	if verb == "get" {
		var obj runtime.Object
		var err error
		if pods {
			obj, err = s.metricsStore.GetPodMetrics(ctx, req.ns, req.name)
		} else {
			obj, err = s.metricsStore.GetNodeMetrics(ctx, req.name)
		}
		if err != nil {
			return err
		}
		return s.writeObject(w, r, req.reg, http.StatusOK, obj)
	}
	q := r.URL.Query()
	sel := labels.Everything()
	if ls := q.Get("labelSelector"); ls != "" {
		var err error
		if sel, err = labels.Parse(ls); err != nil {
			return apierrors.NewBadRequest(fmt.Sprintf("unable to parse requirement: %v", err))
		}
	}
	fsel := fields.Everything()
	if fs := q.Get("fieldSelector"); fs != "" {
		var err error
		if fsel, err = fields.ParseSelector(fs); err != nil {
			return apierrors.NewBadRequest(fmt.Sprintf("invalid field selector: %v", err))
		}
		for _, rq := range fsel.Requirements() {
			if rq.Field != "metadata.name" && (!pods || rq.Field != "metadata.namespace") {
				return apierrors.NewBadRequest("field label not supported: " + rq.Field)
			}
		}
	}
	match := func(m metav1.ObjectMeta) bool {
		return fsel.Matches(fields.Set{"metadata.name": m.Name, "metadata.namespace": m.Namespace})
	}
	if pods {
		list, err := s.metricsStore.ListPodMetrics(ctx, req.ns, sel)
		if err != nil {
			return err
		}
		items := list.Items[:0]
		for _, m := range list.Items {
			if match(m.ObjectMeta) {
				items = append(items, m)
			}
		}
		list.Items = items
		return s.writeObject(w, r, req.reg, http.StatusOK, list)
	}
	list, err := s.metricsStore.ListNodeMetrics(ctx, sel)
	if err != nil {
		return err
	}
	items := list.Items[:0]
	for _, m := range list.Items {
		if match(m.ObjectMeta) {
			items = append(items, m)
		}
	}
	list.Items = items
	return s.writeObject(w, r, req.reg, http.StatusOK, list)
}

// registrySource is the metrics scraper's view of nodes and pods: the API
// server's own watch caches.
type registrySource struct{ s *Server }

func (src registrySource) list(ctx context.Context, res, ns string, sel labels.Selector) ([]runtime.Object, error) {
	reg := src.s.registries[res]
	if reg == nil {
		return nil, fmt.Errorf("%s are not served", res)
	}
	opts := &metav1.ListOptions{ResourceVersion: "0"}
	if sel != nil && !sel.Empty() {
		opts.LabelSelector = sel.String()
	}
	lr, err := reg.list(ctx, ns, opts)
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Object, 0, len(lr.items))
	for _, o := range lr.items {
		out = append(out, o.Obj)
	}
	return out, nil
}

func (src registrySource) Nodes(ctx context.Context, sel labels.Selector) ([]*corev1.Node, error) {
	objs, err := src.list(ctx, "nodes", "", sel)
	out := make([]*corev1.Node, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*corev1.Node))
	}
	return out, err
}

func (src registrySource) Node(ctx context.Context, name string) (*corev1.Node, error) {
	return src.s.node(ctx, name)
}

func (src registrySource) Pods(ctx context.Context, ns string, sel labels.Selector) ([]*corev1.Pod, error) {
	objs, err := src.list(ctx, "pods", ns, sel)
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*corev1.Pod))
	}
	return out, err
}

func (src registrySource) Pod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	o, err := src.s.registries["pods"].get(ctx, ns, name, "")
	if err != nil {
		return nil, err
	}
	return o.Obj.(*corev1.Pod), nil
}
