package ebpf

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metricsSource is what the collector reads at scrape time.
type metricsSource interface {
	// mapCounts returns the exact entries and capacity of every map.
	mapCounts() ([]MapPressure, error)
	// programStats returns the programs' counters and kernel run stats.
	programStats() (counters map[Stat]uint64, runs []ProgramRuns, err error)
}

// MapPressure is one map's fill level.
type MapPressure struct {
	Name       string `json:"name"`
	Entries    int    `json:"entries"`
	MaxEntries int    `json:"maxEntries"`
}

// ProgramRuns is a program's kernel-kept run statistics (only counted while
// kernel.bpf_stats_enabled is 1).
type ProgramRuns struct {
	Name    string        `json:"name"`
	Runs    uint64        `json:"runs"`
	RunTime time.Duration `json:"runTime"`
}

type metrics struct {
	src metricsSource

	syncDuration     prometheus.Histogram
	syncErrors       prometheus.Counter
	mapFull          prometheus.Counter
	socketsDestroyed prometheus.Counter
	frontends        prometheus.Gauge
	backends         prometheus.Gauge
	writes           prometheus.Counter

	entriesDesc, maxDesc, pressureDesc, statDesc, runsDesc, runTimeDesc *prometheus.Desc
}

func newMetricsFor(src metricsSource) *metrics {
	return &metrics{
		src: src,
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "waggle_ebpf_sync_duration_seconds", Help: "Time to program one desired state into the maps.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "waggle_ebpf_sync_errors_total", Help: "Syncs that failed or left frontends out."}),
		mapFull: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "waggle_ebpf_map_full_total", Help: "Frontends left out of a sync because a map was full."}),
		socketsDestroyed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "waggle_ebpf_sockets_destroyed_total", Help: "Connected UDP sockets destroyed because their backend went away."}),
		frontends: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "waggle_ebpf_frontends_programmed", Help: "Frontends (address, port, protocol) in the maps."}),
		backends: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "waggle_ebpf_backends_programmed", Help: "Distinct backends in the maps."}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "waggle_ebpf_map_operations_total", Help: "Map entries written or deleted by syncs."}),
		entriesDesc: prometheus.NewDesc("waggle_ebpf_map_entries", "Entries in a BPF map (exact).", []string{"map"}, nil),
		maxDesc:     prometheus.NewDesc("waggle_ebpf_map_max_entries", "Capacity of a BPF map.", []string{"map"}, nil),
		pressureDesc: prometheus.NewDesc("waggle_ebpf_map_pressure", "A BPF map's fill ratio, entries ÷ max entries (as Cilium's bpf_map_pressure); "+
			"a sync rejects frontends before the services or backends map reaches 1.", []string{"map"}, nil),
		statDesc:    prometheus.NewDesc("waggle_ebpf_events_total", "Events counted by the socket programs.", []string{"event"}, nil),
		runsDesc:    prometheus.NewDesc("waggle_ebpf_program_runs_total", "Program runs kept by the kernel (needs kernel.bpf_stats_enabled=1).", []string{"program"}, nil),
		runTimeDesc: prometheus.NewDesc("waggle_ebpf_program_run_seconds_total", "Program run time kept by the kernel (needs kernel.bpf_stats_enabled=1).", []string{"program"}, nil),
	}
}

func (m *metrics) observeSync(d time.Duration, res syncResult, fronts, backends int, err error) {
	m.syncDuration.Observe(d.Seconds())
	if err != nil {
		m.syncErrors.Inc()
	}
	m.mapFull.Add(float64(len(res.rejected)))
	m.frontends.Set(float64(fronts))
	m.backends.Set(float64(backends))
	m.writes.Add(float64(res.writes + res.deletes))
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.syncDuration, m.syncErrors, m.mapFull, m.socketsDestroyed, m.frontends, m.backends, m.writes}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
	ch <- m.entriesDesc
	ch <- m.maxDesc
	ch <- m.pressureDesc
	ch <- m.statDesc
	ch <- m.runsDesc
	ch <- m.runTimeDesc
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
	if counts, err := m.src.mapCounts(); err == nil {
		for _, c := range counts {
			ch <- prometheus.MustNewConstMetric(m.entriesDesc, prometheus.GaugeValue, float64(c.Entries), c.Name)
			ch <- prometheus.MustNewConstMetric(m.maxDesc, prometheus.GaugeValue, float64(c.MaxEntries), c.Name)
			if c.MaxEntries > 0 {
				ch <- prometheus.MustNewConstMetric(m.pressureDesc, prometheus.GaugeValue, float64(c.Entries)/float64(c.MaxEntries), c.Name)
			}
		}
	} else {
		ch <- prometheus.NewInvalidMetric(m.entriesDesc, err)
	}
	counters, runs, err := m.src.programStats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.statDesc, err)
		return
	}
	for _, s := range Stats() {
		ch <- prometheus.MustNewConstMetric(m.statDesc, prometheus.CounterValue, float64(counters[s]), s.String())
	}
	for _, r := range runs {
		ch <- prometheus.MustNewConstMetric(m.runsDesc, prometheus.CounterValue, float64(r.Runs), r.Name)
		ch <- prometheus.MustNewConstMetric(m.runTimeDesc, prometheus.CounterValue, r.RunTime.Seconds(), r.Name)
	}
}
