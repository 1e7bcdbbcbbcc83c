package server

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/waggle-io/waggle/kubelet/runtime/runtimetest"
)

type summaryProvider struct {
	fakeProvider
	sum *statsapi.Summary
}

func (p *summaryProvider) Summary(context.Context) (*statsapi.Summary, error) { return p.sum, nil }

func u64(v uint64) *uint64 { return &v }

// TestResourceMetricsAsMetricsServerReadsThem checks /metrics/resource
// against what metrics-server parses: upstream's names and labels, CPU in
// core-seconds and a sample timestamp on every usage figure.
func TestResourceMetricsAsMetricsServerReadsThem(t *testing.T) {
	at := metav1.NewTime(time.Unix(1700000000, 0))
	start := metav1.NewTime(time.Unix(1699999000, 0))
	p := &summaryProvider{fakeProvider: fakeProvider{rt: runtimetest.NewFake()}, sum: &statsapi.Summary{
		Node: statsapi.NodeStats{NodeName: "n1",
			CPU:    &statsapi.CPUStats{Time: at, UsageCoreNanoSeconds: u64(2_500_000_000)},
			Memory: &statsapi.MemoryStats{Time: at, WorkingSetBytes: u64(1 << 30)}},
		Pods: []statsapi.PodStats{{
			PodRef: statsapi.PodReference{Name: "web", Namespace: "default"},
			Containers: []statsapi.ContainerStats{{Name: "echo", StartTime: start,
				CPU:    &statsapi.CPUStats{Time: at, UsageCoreNanoSeconds: u64(500_000_000)},
				Memory: &statsapi.MemoryStats{Time: at, WorkingSetBytes: u64(4096)}}},
			CPU:    &statsapi.CPUStats{Time: at, UsageCoreNanoSeconds: u64(500_000_000)},
			Memory: &statsapi.MemoryStats{Time: at, WorkingSetBytes: u64(4096)},
		}},
	}}
	h := (&Server{p: p, cfg: Config{Auth: testAuth(map[string][]string{"scraper": {"metrics"}})}}).Handler()
	r := httptest.NewRequest("GET", "/metrics/resource", nil)
	r.Header.Set("Authorization", "Bearer scraper")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 {
		t.Fatalf("GET /metrics/resource = %d %s", w.Code, w.Body)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(w.Body.String()))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, w.Body)
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		value  float64
		stamp  bool
	}{
		{"node_cpu_usage_seconds_total", nil, 2.5, true},
		{"node_memory_working_set_bytes", nil, 1 << 30, true},
		{"container_cpu_usage_seconds_total", map[string]string{"container": "echo", "pod": "web", "namespace": "default"}, 0.5, true},
		{"container_memory_working_set_bytes", map[string]string{"container": "echo", "pod": "web", "namespace": "default"}, 4096, true},
		{"container_start_time_seconds", map[string]string{"container": "echo", "pod": "web", "namespace": "default"}, 1699999000, true},
		{"pod_cpu_usage_seconds_total", map[string]string{"pod": "web", "namespace": "default"}, 0.5, true},
		{"pod_memory_working_set_bytes", map[string]string{"pod": "web", "namespace": "default"}, 4096, true},
		{"resource_scrape_error", nil, 0, false},
	} {
		f := fams[tc.name]
		if f == nil || len(f.Metric) != 1 {
			t.Errorf("%s: family %v", tc.name, f)
			continue
		}
		m := f.Metric[0]
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range tc.labels {
			if got[k] != v {
				t.Errorf("%s: label %s=%q, want %q", tc.name, k, got[k], v)
			}
		}
		var v float64
		switch {
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		}
		if v != tc.value {
			t.Errorf("%s = %v, want %v", tc.name, v, tc.value)
		}
		if tc.stamp && m.GetTimestampMs() == 0 {
			t.Errorf("%s has no timestamp", tc.name)
		}
	}
	if tm := fams["node_cpu_usage_seconds_total"].Metric[0].GetTimestampMs(); tm != at.UnixMilli() {
		t.Errorf("node CPU timestamp %d, want %d", tm, at.UnixMilli())
	}
	r = httptest.NewRequest("GET", "/metrics/cadvisor", nil)
	r.Header.Set("Authorization", "Bearer scraper")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if !strings.Contains(w.Body.String(), `container_memory_working_set_bytes{container="echo",namespace="default",pod="web"} 4096`) {
		t.Errorf("/metrics/cadvisor:\n%s", w.Body)
	}
}
