package scheduler

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// benchNodes returns n simulated nodes of 32 CPUs, 128 GiB and 110 pods,
// in 10 zones.
func benchNodes(n int) []*v1.Node {
	out := make([]*v1.Node, n)
	for i := range out {
		out[i] = newNode(fmt.Sprintf("node-%04d", i), withLabels("topology.kubernetes.io/zone", fmt.Sprintf("zone-%d", i%10)),
			withAllocatable("32", "128Gi", "110"))
	}
	return out
}

// benchPod is a ReplicaSet-owned pod with small requests, as scheduler_perf's
// default pod template; 100 ReplicaSets, app=rs-N.
func benchPod(i int) *v1.Pod {
	rs := fmt.Sprintf("rs-%d", i%100)
	return newPod(fmt.Sprintf("pod-%05d", i), requests("100m", "500Mi"), ownedBy(rs), podLabels("app", rs))
}

// benchConstrainedPod is benchPod with, as scheduler_perf's
// TopologySpreading and SchedulingPodAntiAffinity workloads, a topology
// spread constraint over the zones (maxSkew 1, DoNotSchedule) and required
// anti-affinity on kubernetes.io/hostname, both on its ReplicaSet's pods.
func benchConstrainedPod(i int) *v1.Pod {
	p := benchPod(i)
	app := p.Labels["app"]
	spread(v1.LabelTopologyZone, 1, v1.DoNotSchedule, "app", app)(p)
	podAntiAffinity(v1.LabelHostname, "app", app)(p)
	return p
}

// loadavg is the machine's load, reported beside every figure.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// BenchmarkDecide measures one scheduling decision (all filters and scores
// over 1,000 nodes holding 5,000 pods), without the API server: plain pods,
// and pods with topology spread and anti-affinity among pods alike.
func BenchmarkDecide(b *testing.B) {
	for _, tc := range []struct {
		name string
		pod  func(int) *v1.Pod
	}{{"plain", benchPod}, {"spread+antiaffinity", benchConstrainedPod}} {
		b.Run(tc.name, func(b *testing.B) {
			nodes := benchNodes(1000)
			var pods []*v1.Pod
			for i := range 5000 {
				p := tc.pod(i)
				p.Spec.NodeName = nodes[i%len(nodes)].Name
				pods = append(pods, p)
			}
			s := &Scheduler{cache: cacheWith(nodes, pods), opts: Options{Parallelism: 16}}
			pod := tc.pod(99999)
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				if _, err := s.decide(ctx, pod); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			b.Logf("load average: %s", loadavg())
		})
	}
}

// BenchmarkSchedulingThroughput measures pods/s scheduled and bound through
// a real API server (embedded etcd, HTTPS): WAGGLE_BENCH_PODS pending pods
// (default 10,000) onto WAGGLE_BENCH_NODES simulated nodes (default 1,000),
// timed from the scheduler's caches being synced to the last binding.
// Kubernetes' scheduler_perf threshold for 5,000 nodes and 10,000 pods is
// 680 pods/s.
//
//	go test -run '^$' -bench SchedulingThroughput -benchtime 1x ./controlplane/scheduler
func BenchmarkSchedulingThroughput(b *testing.B) {
	nNodes, nPods := envInt("WAGGLE_BENCH_NODES", 1000), envInt("WAGGLE_BENCH_PODS", 10000)
	rc, _, _ := apiservertest.StartTestServer(b)
	rc.QPS, rc.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	parallelN := func(workers, n int, fn func(i int) error) {
		var wg sync.WaitGroup
		var next atomic.Int64
		var firstErr atomic.Value
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
					if err := fn(i); err != nil {
						firstErr.CompareAndSwap(nil, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err, ok := firstErr.Load().(error); ok {
			b.Fatal(err)
		}
	}
	parallel := func(n int, fn func(i int) error) { parallelN(16, n, fn) }
	nodes := benchNodes(nNodes)
	parallel(len(nodes), func(i int) error {
		n, err := cs.CoreV1().Nodes().Create(ctx, nodes[i], metav1.CreateOptions{})
		if err != nil {
			return err
		}
		n.Status.Allocatable = nodes[i].Status.Allocatable
		n.Status.Capacity = nodes[i].Status.Allocatable
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})

	// rawBinds is the physical limit, measured in the same run before and
	// after the scheduler (A B A, the machine is shared and noisy): the same
	// number of bindings posted straight to the API server, no scheduling,
	// as many in flight as the scheduler allows.
	inFlight := envInt("WAGGLE_BENCH_BIND_CONCURRENCY", DefaultBindConcurrency)
	rawBinds := func(ns string) time.Duration {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		parallel(nPods, func(i int) error {
			p := benchPod(i)
			p.Namespace, p.UID = ns, ""
			_, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		})
		start := time.Now()
		parallelN(inFlight, nPods, func(i int) error {
			return cs.CoreV1().Pods(ns).Bind(ctx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: benchPod(i).Name},
				Target: v1.ObjectReference{Kind: "Node", Name: nodes[i%len(nodes)].Name}}, metav1.CreateOptions{})
		})
		return time.Since(start)
	}

	// run schedules nPods pods made by mk in namespace ns with a fresh
	// scheduler: the time from its caches being synced to the last binding,
	// and the fewest and most pods per node.
	run := func(ns string, mk func(int) *v1.Pod) (time.Duration, int, int) {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		parallel(nPods, func(i int) error {
			p := mk(i)
			p.Namespace, p.UID = ns, ""
			_, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		})
		reg := prometheus.NewRegistry()
		factory := informers.NewSharedInformerFactory(cs, 0)
		s, err := New(cs, factory, quietLog(), Options{Registerer: reg, BindConcurrency: inFlight})
		if err != nil {
			b.Fatal(err)
		}
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { s.Run(sctx); close(done) }()
		for !s.Ready() {
			time.Sleep(time.Millisecond) // poll: Ready has no notification
		}
		b.StartTimer()
		start := time.Now()
		for counterValue(b, reg, "scheduler_schedule_attempts_total", resultScheduled) < float64(nPods) {
			if time.Since(start) > 20*time.Minute {
				b.Fatal("pods not all scheduled within 20 minutes")
			}
			time.Sleep(5 * time.Millisecond) // poll the counter; 5 ms is the timing's resolution
		}
		dur := time.Since(start)
		b.StopTimer()
		cancel()
		<-done
		factory.Shutdown()
		if u := counterValue(b, reg, "scheduler_schedule_attempts_total", resultUnschedulable); u > 0 {
			b.Fatalf("%v unschedulable attempts in a cluster with room for every pod", u)
		}
		// Check the bindings really landed, spread over the nodes.
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		perNode := map[string]int{}
		for _, p := range list.Items {
			if p.Spec.NodeName == "" {
				b.Fatalf("pod %s not bound", p.Name)
			}
			perNode[p.Spec.NodeName]++
		}
		lo, hi := nPods, 0
		for _, n := range nodes {
			lo, hi = min(lo, perNode[n.Name]), max(hi, perNode[n.Name])
		}
		return dur, lo, hi
	}

	for iter := range b.N {
		b.StopTimer()
		load0 := loadavg()
		rawBefore := rawBinds(fmt.Sprintf("raw-before-%d", iter))
		dur, lo, hi := run(fmt.Sprintf("bench-%d", iter), benchPod)
		cdur, clo, chi := run(fmt.Sprintf("bench-constrained-%d", iter), benchConstrainedPod)
		rawAfter := rawBinds(fmt.Sprintf("raw-after-%d", iter))
		rawDur := (rawBefore + rawAfter) / 2

		rate, crate, rawRate := float64(nPods)/dur.Seconds(), float64(nPods)/cdur.Seconds(), float64(nPods)/rawDur.Seconds()
		b.ReportMetric(rate, "pods/s")
		b.ReportMetric(crate, "constrained-pods/s")
		b.ReportMetric(rawRate, "raw-binds/s")
		b.Logf("%d pods onto %d nodes, same API server, same run (load average before %s, after %s):", nPods, nNodes, load0, loadavg())
		b.Logf("  plain pods:                               %v = %.0f pods/s (%.2f of bare binds); pods per node %d..%d", dur.Round(time.Millisecond), rate, rate/rawRate, lo, hi)
		b.Logf("  zone spread (maxSkew 1) + hostname anti-affinity per ReplicaSet: %v = %.0f pods/s (%.2f of bare binds, %.2f of plain); pods per node %d..%d",
			cdur.Round(time.Millisecond), crate, crate/rawRate, crate/rate, clo, chi)
		b.Logf("  bare pods/binding posts (%d in flight, no scheduling) before and after: %v and %v = %.0f and %.0f binds/s",
			inFlight, rawBefore.Round(time.Millisecond), rawAfter.Round(time.Millisecond), float64(nPods)/rawBefore.Seconds(), float64(nPods)/rawAfter.Seconds())
	}
}
