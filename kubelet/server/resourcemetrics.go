package server

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The /metrics/resource endpoint carries the kubelet's resource metrics
// under upstream's names, labels and sample timestamps (what metrics-server
// scrapes); /metrics/cadvisor a cAdvisor-style subset for each container.
// Both are read from the Summary at scrape time.

var (
	nodeCPUDesc = prometheus.NewDesc("node_cpu_usage_seconds_total",
		"[STABLE] Cumulative cpu time consumed by the node in core-seconds", nil, nil)
	nodeMemDesc = prometheus.NewDesc("node_memory_working_set_bytes",
		"[STABLE] Current working set of the node in bytes", nil, nil)
	ctrCPUDesc = prometheus.NewDesc("container_cpu_usage_seconds_total",
		"[STABLE] Cumulative cpu time consumed by the container in core-seconds", []string{"container", "pod", "namespace"}, nil)
	ctrMemDesc = prometheus.NewDesc("container_memory_working_set_bytes",
		"[STABLE] Current working set of the container in bytes", []string{"container", "pod", "namespace"}, nil)
	ctrStartDesc = prometheus.NewDesc("container_start_time_seconds",
		"[STABLE] Start time of the container since unix epoch in seconds", []string{"container", "pod", "namespace"}, nil)
	podCPUDesc = prometheus.NewDesc("pod_cpu_usage_seconds_total",
		"[STABLE] Cumulative cpu time consumed by the pod in core-seconds", []string{"pod", "namespace"}, nil)
	podMemDesc = prometheus.NewDesc("pod_memory_working_set_bytes",
		"[STABLE] Current working set of the pod in bytes", []string{"pod", "namespace"}, nil)
	scrapeErrDesc = prometheus.NewDesc("resource_scrape_error",
		"[STABLE] 1 if there was an error while getting container metrics, 0 otherwise", nil, nil)

	cadvCPUDesc = prometheus.NewDesc("container_cpu_usage_seconds_total",
		"Cumulative cpu time consumed in seconds.", []string{"container", "pod", "namespace"}, nil)
	cadvMemDesc = prometheus.NewDesc("container_memory_usage_bytes",
		"Current memory usage in bytes, including all memory regardless of when it was accessed", []string{"container", "pod", "namespace"}, nil)
	cadvWSDesc = prometheus.NewDesc("container_memory_working_set_bytes",
		"Current working set in bytes.", []string{"container", "pod", "namespace"}, nil)
	cadvRSSDesc = prometheus.NewDesc("container_memory_rss",
		"Size of RSS in bytes.", []string{"container", "pod", "namespace"}, nil)
	cadvStartDesc = prometheus.NewDesc("container_start_time_seconds",
		"Start time of the container since unix epoch in seconds.", []string{"container", "pod", "namespace"}, nil)
	cadvRxDesc = prometheus.NewDesc("container_network_receive_bytes_total",
		"Cumulative count of bytes received", []string{"interface", "pod", "namespace"}, nil)
	cadvTxDesc = prometheus.NewDesc("container_network_transmit_bytes_total",
		"Cumulative count of bytes transmitted", []string{"interface", "pod", "namespace"}, nil)
)

// summaryCollector collects one of the two metric sets from the Summary.
type summaryCollector struct {
	p       Provider
	cadvsor bool
}

func (c summaryCollector) Describe(ch chan<- *prometheus.Desc) {
	if c.cadvsor {
		for _, d := range []*prometheus.Desc{cadvCPUDesc, cadvMemDesc, cadvWSDesc, cadvRSSDesc, cadvStartDesc, cadvRxDesc, cadvTxDesc} {
			ch <- d
		}
		return
	}
	for _, d := range []*prometheus.Desc{nodeCPUDesc, nodeMemDesc, ctrCPUDesc, ctrMemDesc, ctrStartDesc, podCPUDesc, podMemDesc, scrapeErrDesc} {
		ch <- d
	}
}

func (c summaryCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sum, err := c.p.Summary(ctx)
	if !c.cadvsor {
		failed := 0.0
		if err != nil {
			failed = 1
		}
		ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, failed)
	}
	if err != nil {
		return
	}
	at := func(t time.Time, m prometheus.Metric) { ch <- prometheus.NewMetricWithTimestamp(t, m) }
	if c.cadvsor {
		for _, ps := range sum.Pods {
			for _, cs := range ps.Containers {
				l := []string{cs.Name, ps.PodRef.Name, ps.PodRef.Namespace}
				if cs.CPU != nil && cs.CPU.UsageCoreNanoSeconds != nil {
					at(cs.CPU.Time.Time, prometheus.MustNewConstMetric(cadvCPUDesc, prometheus.CounterValue, float64(*cs.CPU.UsageCoreNanoSeconds)/1e9, l...))
				}
				if m := cs.Memory; m != nil {
					for d, v := range map[*prometheus.Desc]*uint64{cadvMemDesc: m.UsageBytes, cadvWSDesc: m.WorkingSetBytes, cadvRSSDesc: m.RSSBytes} {
						if v != nil {
							at(m.Time.Time, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(*v), l...))
						}
					}
				}
				ch <- prometheus.MustNewConstMetric(cadvStartDesc, prometheus.GaugeValue, float64(cs.StartTime.Unix()), l...)
			}
			if n := ps.Network; n != nil && n.RxBytes != nil && n.TxBytes != nil {
				l := []string{n.Name, ps.PodRef.Name, ps.PodRef.Namespace}
				at(n.Time.Time, prometheus.MustNewConstMetric(cadvRxDesc, prometheus.CounterValue, float64(*n.RxBytes), l...))
				at(n.Time.Time, prometheus.MustNewConstMetric(cadvTxDesc, prometheus.CounterValue, float64(*n.TxBytes), l...))
			}
		}
		return
	}
	if cpu := sum.Node.CPU; cpu != nil && cpu.UsageCoreNanoSeconds != nil {
		at(cpu.Time.Time, prometheus.MustNewConstMetric(nodeCPUDesc, prometheus.CounterValue, float64(*cpu.UsageCoreNanoSeconds)/1e9))
	}
	if m := sum.Node.Memory; m != nil && m.WorkingSetBytes != nil {
		at(m.Time.Time, prometheus.MustNewConstMetric(nodeMemDesc, prometheus.GaugeValue, float64(*m.WorkingSetBytes)))
	}
	for _, ps := range sum.Pods {
		for _, cs := range ps.Containers {
			l := []string{cs.Name, ps.PodRef.Name, ps.PodRef.Namespace}
			if cs.CPU != nil && cs.CPU.UsageCoreNanoSeconds != nil {
				at(cs.CPU.Time.Time, prometheus.MustNewConstMetric(ctrCPUDesc, prometheus.CounterValue, float64(*cs.CPU.UsageCoreNanoSeconds)/1e9, l...))
			}
			if cs.Memory != nil && cs.Memory.WorkingSetBytes != nil {
				at(cs.Memory.Time.Time, prometheus.MustNewConstMetric(ctrMemDesc, prometheus.GaugeValue, float64(*cs.Memory.WorkingSetBytes), l...))
			}
			at(cs.StartTime.Time, prometheus.MustNewConstMetric(ctrStartDesc, prometheus.GaugeValue, float64(cs.StartTime.UnixNano())/1e9, l...))
		}
		l := []string{ps.PodRef.Name, ps.PodRef.Namespace}
		if ps.CPU != nil && ps.CPU.UsageCoreNanoSeconds != nil {
			at(ps.CPU.Time.Time, prometheus.MustNewConstMetric(podCPUDesc, prometheus.CounterValue, float64(*ps.CPU.UsageCoreNanoSeconds)/1e9, l...))
		}
		if ps.Memory != nil && ps.Memory.WorkingSetBytes != nil {
			at(ps.Memory.Time.Time, prometheus.MustNewConstMetric(podMemDesc, prometheus.GaugeValue, float64(*ps.Memory.WorkingSetBytes), l...))
		}
	}
}

// summaryMetrics serves one metric set in the Prometheus text format.
func summaryMetrics(p Provider, cadvisor bool) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(summaryCollector{p: p, cadvsor: cadvisor})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
