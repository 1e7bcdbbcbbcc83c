package metrics

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// source is a fixed set of nodes and pods.
type source struct {
	nodes []*corev1.Node
	pods  []*corev1.Pod
}

func (s source) Nodes(_ context.Context, sel labels.Selector) ([]*corev1.Node, error) {
	var out []*corev1.Node
	for _, n := range s.nodes {
		if sel.Matches(labels.Set(n.Labels)) {
			out = append(out, n)
		}
	}
	return out, nil
}

func (s source) Node(_ context.Context, name string) (*corev1.Node, error) {
	for _, n := range s.nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, name)
}

func (s source) Pods(_ context.Context, ns string, sel labels.Selector) ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	for _, p := range s.pods {
		if (ns == "" || p.Namespace == ns) && sel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out, nil
}

func (s source) Pod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	for _, p := range s.pods {
		if p.Namespace == ns && p.Name == name {
			return p, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
}

// kubelet serves /metrics/resource whose counters advance by one core
// (node) and a quarter core (container) per second of sample time.
func kubelet(t *testing.T) (*corev1.Node, *atomic.Int64) {
	var scrape atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics/resource" {
			http.NotFound(w, r)
			return
		}
		n := scrape.Add(1)
		ts := int64(1700000000000) + n*10000 // 10 s apart
		fmt.Fprintf(w, "# TYPE node_cpu_usage_seconds_total counter\nnode_cpu_usage_seconds_total %d %d\n", n*10, ts)
		fmt.Fprintf(w, "# TYPE node_memory_working_set_bytes gauge\nnode_memory_working_set_bytes %d %d\n", 1<<30, ts)
		fmt.Fprintf(w, "# TYPE container_cpu_usage_seconds_total counter\ncontainer_cpu_usage_seconds_total{container=\"c\",namespace=\"default\",pod=\"web\"} %g %d\n", float64(n)*2.5, ts)
		fmt.Fprintf(w, "# TYPE container_memory_working_set_bytes gauge\ncontainer_memory_working_set_bytes{container=\"c\",namespace=\"default\",pod=\"web\"} 4096 %d\n", ts)
		fmt.Fprintf(w, "# TYPE container_start_time_seconds gauge\ncontainer_start_time_seconds{container=\"c\",namespace=\"default\",pod=\"web\"} 1.6999e+09 %d\n", ts)
	}))
	t.Cleanup(srv.Close)
	host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"role": "worker"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(p)}}}}
	return n, &scrape
}

func TestRatesFromTwoScrapesAsMetricsServer(t *testing.T) {
	node, _ := kubelet(t)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	s := New(Config{Source: source{nodes: []*corev1.Node{node}, pods: []*corev1.Pod{pod}},
		Transport: &http.Transport{TLSClientConfig: insecure()}, Resolution: time.Hour})
	ctx := context.Background()

	s.ScrapeOnce(ctx)
	if _, err := s.GetNodeMetrics(ctx, "n1"); !apierrors.IsNotFound(err) {
		t.Fatalf("after one scrape: %v, want NotFound (no window yet)", err)
	}
	if l, _ := s.ListPodMetrics(ctx, "default", labels.Everything()); len(l.Items) != 0 {
		t.Fatalf("after one scrape: %d pod metrics, want none", len(l.Items))
	}
	s.ScrapeOnce(ctx)
	nm, err := s.GetNodeMetrics(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if cpu := nm.Usage[corev1.ResourceCPU]; cpu.Cmp(resource.MustParse("1")) != 0 {
		t.Errorf("node CPU %s, want 1 core", cpu.String())
	}
	if mem := nm.Usage[corev1.ResourceMemory]; mem.Value() != 1<<30 {
		t.Errorf("node memory %s", mem.String())
	}
	if nm.Window.Duration != 10*time.Second || nm.Labels["role"] != "worker" {
		t.Errorf("window %v labels %v", nm.Window, nm.Labels)
	}
	pl, err := s.ListPodMetrics(ctx, "default", labels.SelectorFromSet(labels.Set{"app": "web"}))
	if err != nil || len(pl.Items) != 1 {
		t.Fatalf("pod metrics %v %v", pl, err)
	}
	c := pl.Items[0].Containers[0]
	if cpu := c.Usage[corev1.ResourceCPU]; c.Name != "c" || cpu.MilliValue() != 250 {
		t.Errorf("container %s CPU %s, want c 250m", c.Name, cpu.String())
	}
	if l, _ := s.ListPodMetrics(ctx, "default", labels.SelectorFromSet(labels.Set{"app": "other"})); len(l.Items) != 0 {
		t.Errorf("a selector matching nothing gave %d items", len(l.Items))
	}
	_, err = s.GetPodMetrics(ctx, "default", "missing")
	if !apierrors.IsNotFound(err) || err.Error() != `podmetrics.metrics.k8s.io "missing" not found` {
		t.Errorf("missing pod: %v", err)
	}
	_, err = s.GetNodeMetrics(ctx, "n9")
	if !apierrors.IsNotFound(err) || err.Error() != `nodemetrics.metrics.k8s.io "n9" not found` {
		t.Errorf("missing node: %v", err)
	}
}

func TestRestartedContainerWaitsForANewWindow(t *testing.T) {
	var sr series
	t0 := time.Unix(1000, 0)
	sr.add(point{t: t0, cpu: 5, hasCPU: true, start: t0})
	sr.add(point{t: t0.Add(10 * time.Second), cpu: 6, hasCPU: true, start: t0})
	if cpu, _, _, _, ok := sr.usage(); !ok || cpu != 100_000_000 {
		t.Fatalf("usage %d %v, want 100m", cpu, ok)
	}
	// Restarted: a new start time and a counter that began anew.
	sr.add(point{t: t0.Add(20 * time.Second), cpu: 0.1, hasCPU: true, start: t0.Add(15 * time.Second)})
	if _, _, _, _, ok := sr.usage(); ok {
		t.Fatal("a restarted container has a rate before its second sample")
	}
}

func insecure() *tls.Config { return &tls.Config{InsecureSkipVerify: true} } //nolint:gosec // test server
