package kubelet_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/waggle-io/waggle/kubelet"
)

// BenchmarkPodStartup measures pod startup latency on real containerd,
// runc and waggle-cni: from the API create to the pod reported Running,
// and to Ready, over 100 echo pods created in a burst, image present.
// Kubernetes' SLO is p99 ≤ 5 s (image pull excluded).
//
//	go test -run '^$' -bench PodStartup -benchtime 1x ./kubelet/
func BenchmarkPodStartup(b *testing.B) { benchStartup(b, 100, false) }

// BenchmarkPodStartupSequential creates 30 pods one after another, each
// once the previous one is Ready: the latency of one pod on an idle node.
func BenchmarkPodStartupSequential(b *testing.B) { benchStartup(b, 30, true) }

// userPeriods sets back the periods the test harness (newNode) shortens so
// tests finish fast: a benchmark times what a user runs, the kubelet's
// defaults (those of `waggle kubelet` too): the 1 s resync and runtime
// relist (upstream's PLEG relist period) instead of the harness's 200 ms,
// and the CrashLoopBackOff bounds.
func userPeriods(c *kubelet.Config) {
	d := kubelet.Config{}.WithDefaults()
	c.SyncFrequency, c.BackoffBase, c.BackoffMax = d.SyncFrequency, d.BackoffBase, d.BackoffMax
}

func benchStartup(b *testing.B, pods int, sequential bool) {
	n := newNode(b, userPeriods)
	ctx := context.Background()
	w, err := n.client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	created := map[string]time.Time{}
	running := map[string]time.Duration{}
	ready := map[string]time.Duration{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Modified {
				continue
			}
			p, ok := ev.Object.(*v1.Pod)
			if !ok {
				continue
			}
			now := time.Now()
			mu.Lock()
			t0, ok := created[p.Name]
			if ok {
				if _, seen := running[p.Name]; !seen && p.Status.Phase == v1.PodRunning {
					running[p.Name] = now.Sub(t0)
				}
				if _, seen := ready[p.Name]; !seen && podCond(p, v1.PodReady) {
					ready[p.Name] = now.Sub(t0)
				}
			}
			finished := len(ready) == pods
			mu.Unlock()
			if finished {
				return
			}
		}
	}()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < pods; i++ {
		name := fmt.Sprintf("bench-%03d", i)
		mu.Lock()
		created[name] = time.Now()
		mu.Unlock()
		n.create(echoPod(n, name, nil))
		if sequential {
			for {
				mu.Lock()
				_, ok := ready[name]
				mu.Unlock()
				if ok {
					break
				}
				time.Sleep(5 * time.Millisecond) // poll interval of the readiness watch the benchmark times (its resolution)
			}
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d pods became Ready", len(ready), pods)
	}
	total := time.Since(start)
	b.StopTimer()
	pr, pd := percentiles(running), percentiles(ready)
	b.ReportMetric(pr(50).Seconds(), "running-p50-s")
	b.ReportMetric(pr(99).Seconds(), "running-p99-s")
	b.ReportMetric(pd(50).Seconds(), "ready-p50-s")
	b.ReportMetric(pd(99).Seconds(), "ready-p99-s")
	mode := "in a burst"
	if sequential {
		mode = "one after another"
	}
	b.Logf("pod startup, %d pods %s (all Ready after %s): create→Running p50 %s p99 %s; create→Ready p50 %s p99 %s",
		pods, mode, total.Round(time.Millisecond), pr(50).Round(time.Millisecond), pr(99).Round(time.Millisecond), pd(50).Round(time.Millisecond), pd(99).Round(time.Millisecond))
	// Clean up inside the timer-free part: delete every pod.
	n.client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	for name := range created {
		n.waitGone(name, 2*time.Minute)
	}
}

func percentiles(m map[string]time.Duration) func(p int) time.Duration {
	v := make([]time.Duration, 0, len(m))
	for _, d := range m {
		v = append(v, d)
	}
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	return func(p int) time.Duration {
		if len(v) == 0 {
			return 0
		}
		i := (len(v)*p + 99) / 100
		if i > 0 {
			i--
		}
		return v[min(i, len(v)-1)]
	}
}
