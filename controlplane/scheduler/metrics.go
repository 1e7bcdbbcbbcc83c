package scheduler

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Scheduling attempt results, the label values of the attempt metrics.
const (
	resultScheduled     = "scheduled"
	resultUnschedulable = "unschedulable"
	resultError         = "error"
)

type metrics struct {
	attempts   *prometheus.CounterVec
	attemptDur *prometheus.HistogramVec
	e2e        prometheus.Histogram
}

// newMetrics registers the scheduler's metrics on reg (nil: not exported),
// named as Kubernetes names them.
func newMetrics(reg prometheus.Registerer, q *queue) *metrics {
	m := &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_schedule_attempts_total",
			Help: "Scheduling attempts by result: scheduled, unschedulable (fits no node) or error.",
		}, []string{"result"}),
		attemptDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "scheduler_scheduling_attempt_duration_seconds",
			Help:    "Time to decide a pod's node (filters and scores), by result.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"result"}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_pod_scheduling_duration_seconds",
			Help:    "Time from a pod entering the queue to its successful binding, over all attempts.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}),
	}
	if reg == nil {
		return m
	}
	pending := func(part string, pick func(a, b, u int) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "scheduler_pending_pods",
			Help:        "Pods waiting in the scheduling queue, by part: active, backoff, unschedulable.",
			ConstLabels: prometheus.Labels{"queue": part},
		}, func() float64 { a, b, u := q.Len(); return float64(pick(a, b, u)) })
	}
	reg.MustRegister(m.attempts, m.attemptDur, m.e2e,
		pending("active", func(a, _, _ int) int { return a }),
		pending("backoff", func(_, b, _ int) int { return b }),
		pending("unschedulable", func(_, _, u int) int { return u }),
	)
	for _, r := range []string{resultScheduled, resultUnschedulable, resultError} {
		m.attempts.WithLabelValues(r)
	}
	return m
}

func (m *metrics) attempt(result string, d time.Duration) {
	m.attempts.WithLabelValues(result).Inc()
	m.attemptDur.WithLabelValues(result).Observe(d.Seconds())
}
