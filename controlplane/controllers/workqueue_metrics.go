package controllers

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// queueMetrics implements client-go's workqueue.MetricsProvider with the
// metric names kube-controller-manager exposes (workqueue_depth,
// workqueue_work_duration_seconds, ...), labelled by queue name, which is
// the controller's name.
//
// client-go takes one provider per process (workqueue.SetProvider), so the
// vectors are process-wide; every manager's registry registers the same
// collectors, which Prometheus allows.
type queueMetrics struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, work              *prometheus.HistogramVec
}

var (
	processQueueMetricsOnce sync.Once
	processQueueMetrics     *queueMetrics
)

// sharedQueueMetrics installs the provider (once per process) and returns it.
func sharedQueueMetrics() *queueMetrics {
	processQueueMetricsOnce.Do(func() {
		buckets := prometheus.ExponentialBuckets(10e-9, 10, 12)
		m := &queueMetrics{
			depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "depth",
				Help: "Current depth of the work queue of each controller."}, []string{"name"}),
			adds: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "adds_total",
				Help: "Total number of adds handled by each work queue."}, []string{"name"}),
			latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: "queue_duration_seconds",
				Help: "How long an item stays in a work queue before being processed.", Buckets: buckets}, []string{"name"}),
			work: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: "work_duration_seconds",
				Help: "How long processing an item from a work queue takes (one controller sync).", Buckets: buckets}, []string{"name"}),
			unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "unfinished_work_seconds",
				Help: "Seconds of work in progress not yet observed by work_duration."}, []string{"name"}),
			longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "longest_running_processor_seconds",
				Help: "Seconds the longest running processor of a work queue has been running."}, []string{"name"}),
			retries: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "retries_total",
				Help: "Total number of retries handled by each work queue."}, []string{"name"}),
		}
		workqueue.SetProvider(m)
		processQueueMetrics = m
	})
	return processQueueMetrics
}

func (m *queueMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.depth, m.adds, m.latency, m.work, m.unfinished, m.longest, m.retries}
}

func (m *queueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return m.depth.WithLabelValues(name)
}
func (m *queueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return m.adds.WithLabelValues(name)
}
func (m *queueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return m.latency.WithLabelValues(name)
}
func (m *queueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return m.work.WithLabelValues(name)
}
func (m *queueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.unfinished.WithLabelValues(name)
}
func (m *queueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.longest.WithLabelValues(name)
}
func (m *queueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return m.retries.WithLabelValues(name)
}
