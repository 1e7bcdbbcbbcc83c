package metrics

import (
	"context"
	"fmt"
	"time"

	dto "github.com/prometheus/client_model/go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// The qualified resources of metrics-server's NotFound errors.
var (
	nodeMetricsGR = schema.GroupResource{Group: metricsv1beta1.GroupName, Resource: "nodemetrics"}
	podMetricsGR  = schema.GroupResource{Group: metricsv1beta1.GroupName, Resource: "podmetrics"}
)

// GetNodeMetrics answers GET .../nodes/<name>.
func (s *Store) GetNodeMetrics(ctx context.Context, name string) (*metricsv1beta1.NodeMetrics, error) {
	n, err := s.cfg.Source.Node(ctx, name)
	if apierrors.IsNotFound(err) {
		return nil, apierrors.NewNotFound(nodeMetricsGR, name)
	}
	if err != nil {
		return nil, err
	}
	m, ok := s.nodeMetrics(n)
	if !ok {
		return nil, apierrors.NewNotFound(nodeMetricsGR, name)
	}
	return m, nil
}

// ListNodeMetrics answers a LIST of nodes: every matching node with
// metrics.
func (s *Store) ListNodeMetrics(ctx context.Context, sel labels.Selector) (*metricsv1beta1.NodeMetricsList, error) {
	nodes, err := s.cfg.Source.Nodes(ctx, sel)
	if err != nil {
		return nil, err
	}
	out := &metricsv1beta1.NodeMetricsList{TypeMeta: metav1.TypeMeta{Kind: "NodeMetricsList", APIVersion: metricsv1beta1.SchemeGroupVersion.String()},
		Items: []metricsv1beta1.NodeMetrics{}}
	for _, n := range nodes {
		if m, ok := s.nodeMetrics(n); ok {
			out.Items = append(out.Items, *m)
		}
	}
	return out, nil
}

// GetPodMetrics answers GET .../namespaces/<ns>/pods/<name>.
func (s *Store) GetPodMetrics(ctx context.Context, ns, name string) (*metricsv1beta1.PodMetrics, error) {
	p, err := s.cfg.Source.Pod(ctx, ns, name)
	if apierrors.IsNotFound(err) {
		return nil, apierrors.NewNotFound(podMetricsGR, name)
	}
	if err != nil {
		return nil, err
	}
	m, ok := s.podMetrics(p)
	if !ok {
		return nil, apierrors.NewNotFound(podMetricsGR, fmt.Sprintf("%s/%s", ns, name))
	}
	return m, nil
}

// ListPodMetrics answers a LIST of pods in ns ("" for all namespaces):
// every matching pod whose containers all have metrics.
func (s *Store) ListPodMetrics(ctx context.Context, ns string, sel labels.Selector) (*metricsv1beta1.PodMetricsList, error) {
	pods, err := s.cfg.Source.Pods(ctx, ns, sel)
	if err != nil {
		return nil, err
	}
	out := &metricsv1beta1.PodMetricsList{TypeMeta: metav1.TypeMeta{Kind: "PodMetricsList", APIVersion: metricsv1beta1.SchemeGroupVersion.String()},
		Items: []metricsv1beta1.PodMetrics{}}
	for _, p := range pods {
		if m, ok := s.podMetrics(p); ok {
			out.Items = append(out.Items, *m)
		}
	}
	return out, nil
}

// famT is a parsed metric family.
type famT = dto.MetricFamily

type sample struct {
	labels map[string]string
	value  float64
	ts     int64 // ms; 0 when the sample has none
}

// t is the sample's time, or now when the kubelet gave none.
func (m sample) t(now time.Time) time.Time {
	if m.ts == 0 {
		return now
	}
	return time.UnixMilli(m.ts)
}

func metricsOf(fams map[string]*famT, name string) []sample {
	f := fams[name]
	if f == nil {
		return nil
	}
	out := make([]sample, 0, len(f.Metric))
	for _, m := range f.Metric {
		s := sample{labels: map[string]string{}, ts: m.GetTimestampMs()}
		for _, l := range m.Label {
			s.labels[l.GetName()] = l.GetValue()
		}
		switch {
		case m.Counter != nil:
			s.value = m.Counter.GetValue()
		case m.Gauge != nil:
			s.value = m.Gauge.GetValue()
		case m.Untyped != nil:
			s.value = m.Untyped.GetValue()
		default:
			continue
		}
		out = append(out, s)
	}
	return out
}
