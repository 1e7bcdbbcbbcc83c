package controllers

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// BenchmarkEndpointSliceReaction measures the controller-manager's reaction
// time from "pod became ready (or unready)" — the pod status write returning
// — to "EndpointSlice updated" — a watcher of EndpointSlices seeing the
// endpoint's new ready condition — against a real API server with 100 pods
// behind one Service. It reports p50, p99 and max in milliseconds.
//
//	go test -run '^$' -bench EndpointSliceReaction -benchtime 1x ./controlplane/controllers/
func BenchmarkEndpointSliceReaction(b *testing.B) {
	c := newCluster(b)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	c.startManager("cm-bench", nil)
	const pods = 100
	samples := max(envInt("WAGGLE_BENCH_SAMPLES", 300), b.N)

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "bench"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	if _, err := c.cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	ready := make([]bool, pods)
	for i := 0; i < pods; i++ {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%03d", i), Namespace: "default", Labels: map[string]string{"app": "bench"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		created, err := c.cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		setReady(ctx, b, c, created, true, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1))
		ready[i] = true
	}

	type seen struct {
		pod   string
		ready bool
		at    time.Time
	}
	events := make(chan seen, 1<<16)
	w, err := c.cs.DiscoveryV1().EndpointSlices("default").Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for ev := range w.ResultChan() {
			at := time.Now()
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			for _, e := range s.Endpoints {
				if e.TargetRef != nil && e.Conditions.Ready != nil {
					events <- seen{e.TargetRef.Name, *e.Conditions.Ready, at}
				}
			}
		}
	}()
	waitFor := func(pod string, want bool, deadline time.Time) (time.Time, error) {
		for {
			select {
			case e := <-events:
				if e.pod == pod && e.ready == want {
					return e.at, nil
				}
			case <-time.After(time.Until(deadline)):
				return time.Time{}, fmt.Errorf("%s ready=%v not seen", pod, want)
			}
		}
	}
	// Warm up: every pod published ready.
	readySeen := map[string]bool{}
	for deadline := time.After(60 * time.Second); len(readySeen) < pods; {
		select {
		case e := <-events:
			if e.ready {
				readySeen[e.pod] = true
			}
		case <-deadline:
			b.Fatalf("only %d of %d pods published ready", len(readySeen), pods)
		}
	}
	lat := make([]time.Duration, 0, samples)
	b.ResetTimer()
	for n := 0; n < samples; n++ {
		i := n % pods
		name := fmt.Sprintf("bench-%03d", i)
		p, err := c.cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ready[i] = !ready[i]
		// Drain what earlier samples left behind.
		for len(events) > 0 {
			<-events
		}
		start := setReady(ctx, b, c, p, ready[i], "")
		at, err := waitFor(name, ready[i], time.Now().Add(30*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, at.Sub(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(pct(0.50)), "p50-ms")
	b.ReportMetric(ms(pct(0.99)), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("pod ready -> EndpointSlice updated, %d samples, %d pods behind the service: p50 %v, p99 %v, max %v",
		len(lat), pods, pct(0.50), pct(0.99), lat[len(lat)-1])
}

// setReady writes the pod's status (IP, Running, Ready=ready) and returns
// when the write returned.
func setReady(ctx context.Context, b testing.TB, c *cluster, p *corev1.Pod, ready bool, ip string) time.Time {
	p = p.DeepCopy()
	p.Status.Phase = corev1.PodRunning
	if ip != "" {
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}
	start := time.Now()
	if _, err := c.cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	return start
}

func envInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err != nil || n <= 0 {
		return def
	}
	return n
}
