package kubelet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Upstream's kubelet metrics of a pod's way to Running, by their upstream
// names, so that a user sees where a pod's start time goes (the runtime's
// operations, the network plugin, the status writes) as on any kubelet.
type opMetrics struct {
	// runtimeOps is kubelet_runtime_operations_duration_seconds by
	// operation_type: upstream's names for the runtime's calls
	// (image_status, pull_image, create_container, start_container,
	// list_containers, ...).
	runtimeOps *prometheus.HistogramVec
	// networkOps is kubelet_network_plugin_operations_duration_seconds by
	// operation_type (set_up_pod, tear_down_pod).
	networkOps *prometheus.HistogramVec
	// statusSync is kubelet_pod_status_sync_duration_seconds: one write of
	// a pod's status to the API server.
	statusSync prometheus.Histogram
	// startSLI is kubelet_pod_start_sli_duration_seconds: from the pod's
	// creation (its creationTimestamp, to the second) to all its
	// containers started, image pulls excluded.
	startSLI prometheus.Histogram
	// startWait is waggle_kubelet_container_start_wait_seconds: how long a
	// container start waited for a slot (when Config.ParallelStarts caps
	// them).
	startWait prometheus.Histogram
}

func newOpMetrics() opMetrics {
	return opMetrics{
		runtimeOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "kubelet", Name: "runtime_operations_duration_seconds",
			Help: "Duration in seconds of runtime operations. Broken down by operation type.", Buckets: prometheus.ExponentialBuckets(.005, 2.5, 14)},
			[]string{"operation_type"}),
		networkOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "kubelet", Name: "network_plugin_operations_duration_seconds",
			Help: "Latency in seconds of network plugin operations. Broken down by operation type.", Buckets: prometheus.DefBuckets},
			[]string{"operation_type"}),
		statusSync: prometheus.NewHistogram(prometheus.HistogramOpts{Subsystem: "kubelet", Name: "pod_status_sync_duration_seconds",
			Help:    "Duration in seconds to sync a pod status update. Measures time from the kubelet's write to the API server's answer.",
			Buckets: []float64{0.010, 0.050, 0.100, 0.500, 1, 5, 10, 20, 30, 45, 60}}),
		startSLI: prometheus.NewHistogram(prometheus.HistogramOpts{Subsystem: "kubelet", Name: "pod_start_sli_duration_seconds",
			Help:    "Duration in seconds to start a pod, excluding time to pull images, measured from pod creation timestamp to when all its containers are reported as started.",
			Buckets: []float64{0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600}}),
		startWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "waggle_kubelet_container_start_wait_seconds",
			Help: "How long a container start waited for one of the ParallelStarts slots.", Buckets: prometheus.ExponentialBuckets(.001, 2.5, 14)}),
	}
}

func (m opMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.runtimeOps, m.networkOps, m.statusSync, m.startSLI, m.startWait}
}

// observeRuntime records one runtime operation.
func (m opMetrics) observeRuntime(op string, d time.Duration) {
	m.runtimeOps.WithLabelValues(op).Observe(d.Seconds())
}
