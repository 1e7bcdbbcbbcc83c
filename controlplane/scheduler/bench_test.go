package scheduler

import (
	"context"
	"fmt"
	"os"
	"strconv"
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
// default pod template.
func benchPod(i int) *v1.Pod {
	return newPod(fmt.Sprintf("pod-%05d", i), requests("100m", "500Mi"), ownedBy(fmt.Sprintf("rs-%d", i%100)))
}

// BenchmarkDecide measures one scheduling decision (all filters and scores
// over 1,000 nodes holding 5,000 pods), without the API server.
func BenchmarkDecide(b *testing.B) {
	nodes := benchNodes(1000)
	var pods []*v1.Pod
	for i := range 5000 {
		p := benchPod(i)
		p.Spec.NodeName = nodes[i%len(nodes)].Name
		pods = append(pods, p)
	}
	s := &Scheduler{cache: cacheWith(nodes, pods), opts: Options{Parallelism: 16}}
	pod := benchPod(99999)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if _, err := s.decide(ctx, pod); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
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

	for iter := range b.N {
		b.StopTimer()
		rawBefore := rawBinds(fmt.Sprintf("raw-before-%d", iter))
		ns := fmt.Sprintf("bench-%d", iter)
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		created := time.Now()
		parallel(nPods, func(i int) error {
			p := benchPod(i)
			p.Namespace, p.UID = ns, ""
			_, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		})
		createDur := time.Since(created)

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
			if time.Since(start) > 10*time.Minute {
				b.Fatal("pods not all scheduled within 10 minutes")
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

		rawAfter := rawBinds(fmt.Sprintf("raw-after-%d", iter))
		rawDur := (rawBefore + rawAfter) / 2

		rate, rawRate := float64(nPods)/dur.Seconds(), float64(nPods)/rawDur.Seconds()
		b.ReportMetric(rate, "pods/s")
		b.ReportMetric(rawRate, "raw-binds/s")
		b.Logf("%d pods onto %d nodes: scheduled and bound in %v = %.0f pods/s; pods per node %d..%d", nPods, nNodes, dur.Round(time.Millisecond), rate, lo, hi)
		b.Logf("same API server, same run, before and after: %d bare pods/binding posts (%d in flight, no scheduling) took %v and %v = %.0f and %.0f binds/s; scheduler / mean bare = %.2f",
			nPods, inFlight, rawBefore.Round(time.Millisecond), rawAfter.Round(time.Millisecond),
			float64(nPods)/rawBefore.Seconds(), float64(nPods)/rawAfter.Seconds(), rate/rawRate)
		b.Logf("creating the pods (16 clients) took %v = %.0f creates/s", createDur.Round(time.Millisecond), float64(nPods)/createDur.Seconds())
	}
}
