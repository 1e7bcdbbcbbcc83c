package apiserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// benchPod is a pod of realistic size (~1.5 KiB stored).
func benchPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "bench", "tier": "web", "pod-template-hash": "5d4f8b9c7"},
			Annotations: map[string]string{"example.com/owner": "benchmark"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "web", Image: "registry.example.com/web:1.2.3",
			Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Env:            []corev1.EnvVar{{Name: "MODE", Value: "production"}, {Name: "LOG", Value: "info"}},
			Resources:      corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intOrStr(8080)}}},
		}}},
	}
}

// processCPU is the CPU time (user and system) the test process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

// BenchmarkAPIServer measures, on a real server (embedded etcd with fsync,
// HTTPS, client-go): create throughput, write latency at a fixed 200
// creates/s, LIST latency over 10,000 pods, and watch fan-out to 100
// watchers. It runs once per invocation (make bench uses -benchtime 1x) and
// prints a table and a JSON line.
func BenchmarkAPIServer(b *testing.B) {
	for i := 0; i < b.N; i++ {
		runAPIServerBench(b)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := bytes.Fields(b)
	if len(f) < 3 {
		return "unknown"
	}
	return string(bytes.Join(f[:3], []byte(" ")))
}

func runAPIServerBench(b *testing.B) {
	loadBefore := loadavg()
	srv := apiservertest.Start(b, apiservertest.Options{Configure: func(c *apiserver.Config) { c.EtcdUnsafeNoFsync = false }})
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ctx := context.Background()
	results := map[string]any{}
	var rows [][2]string
	add := func(k, v string, raw any) { rows = append(rows, [2]string{k, v}); results[k] = raw }

	create := func(ns string, from, to, workers int) (time.Duration, []time.Duration, int64) {
		took, lats, errs, _ := concurrently(workers, to-from, func(i int) error {
			_, err := cs.CoreV1().Pods(ns).Create(ctx, benchPod(fmt.Sprintf("p-%06d", from+i)), metav1.CreateOptions{})
			return err
		})
		return took, lats, errs
	}

	// 1. Create throughput: 16 concurrent clients.
	const nThroughput = 3000
	took, lats, errs := create("default", 0, nThroughput, 16)
	add("creates_per_second", fmt.Sprintf("%.0f /s (%d creates, 16 clients, %d errors, p50 %s, p99 %s)", float64(nThroughput)/took.Seconds(), nThroughput, errs, ms(percentile(lats, .5)), ms(percentile(lats, .99))),
		float64(nThroughput)/took.Seconds())

	// 2. Latency of single-object writes at a steady 200 creates/s.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "paced"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	resetEtcdBaseline(srv)
	const rate, paced = 200, 1000
	var pl []time.Duration
	var pmu sync.Mutex
	var perrs atomic.Int64
	var pwg sync.WaitGroup
	tick := time.NewTicker(time.Second / rate)
	for i := 0; i < paced; i++ {
		<-tick.C
		pwg.Add(1)
		go func(i int) {
			defer pwg.Done()
			t0 := time.Now()
			if _, err := cs.CoreV1().Pods("paced").Create(ctx, benchPod(fmt.Sprintf("q-%06d", i)), metav1.CreateOptions{}); err != nil {
				perrs.Add(1)
			}
			d := time.Since(t0)
			pmu.Lock()
			pl = append(pl, d)
			pmu.Unlock()
		}(i)
	}
	tick.Stop()
	pwg.Wait()
	add("write_latency_at_200_per_s_p50_ms", ms(percentile(pl, .5)), float64(percentile(pl, .5).Microseconds())/1000)
	add("write_latency_at_200_per_s_p99_ms", ms(percentile(pl, .99))+fmt.Sprintf(" (%d creates, %d errors)", paced, perrs.Load()), float64(percentile(pl, .99).Microseconds())/1000)
	add("etcd_share_of_those_writes", etcdCreateQuantiles(srv), etcdCreateQuantiles(srv))

	// 3. LIST of 10,000 pods.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "list"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, _, errs := create("list", 0, 10000, 16); errs > 0 {
		b.Fatalf("%d creates failed", errs)
	}
	hc, err := rest.HTTPClientFor(srv.Config)
	if err != nil {
		b.Fatal(err)
	}
	listOnce := func(query string, check bool) time.Duration {
		t0 := time.Now()
		resp, err := hc.Get(srv.Config.Host + "/api/v1/namespaces/list/pods" + query)
		if err != nil {
			b.Fatal(err)
		}
		// Read the whole body; count the items only when asked (not timed).
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		if check {
			var l struct {
				Items []json.RawMessage `json:"items"`
			}
			if err := json.Unmarshal(body, &l); err != nil || len(l.Items) != 10000 {
				b.Fatalf("LIST%s returned %d items: %v", query, len(l.Items), err)
			}
		}
		return d
	}
	// Warm up with a checked consistent LIST (it waits until the cache has
	// every create), then interleave the two kinds: A B A B ...
	listOnce("", true)
	listOnce("?resourceVersion=0", true)
	var cons, zero []time.Duration
	for r := 0; r < 7; r++ {
		cons = append(cons, listOnce("", false))
		zero = append(zero, listOnce("?resourceVersion=0", false))
	}
	dc, d0 := percentile(cons, .5), percentile(zero, .5)
	add("list_10000_pods_rv0_ms", ms(d0)+" (median of 7 interleaved, watch cache, HTTPS, whole body read)", float64(d0.Microseconds())/1000)
	add("list_10000_pods_consistent_ms", ms(dc)+" (median of 7 interleaved, cache after revision check)", float64(dc.Microseconds())/1000)
	var typed []time.Duration
	for r := 0; r < 3; r++ {
		t0 := time.Now()
		l, err := cs.CoreV1().Pods("list").List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 10000 {
			b.Fatalf("typed list: %v", err)
		}
		typed = append(typed, time.Since(t0))
	}
	add("list_10000_pods_clientgo_ms", ms(percentile(typed, .5))+" (client-go, decoded into Pods)", float64(percentile(typed, .5).Microseconds())/1000)

	// 4. Watch fan-out: 100 watchers replay the last 5,000 pod events from
	// the watch cache (server-side fan-out and encoding, not etcd's write
	// rate), then take live events while pods are written.
	fanOut := func(from string, events int, live func()) (float64, int64) {
		const watchers = 100
		var delivered atomic.Int64
		var wg sync.WaitGroup
		ready := make(chan struct{}, watchers)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		start := time.Now()
		for i := 0; i < watchers; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(wctx, "GET", srv.Config.Host+"/api/v1/namespaces/list/pods?watch=1&resourceVersion="+from, nil)
				resp, err := hc.Do(req)
				if err != nil {
					ready <- struct{}{}
					return
				}
				defer resp.Body.Close()
				ready <- struct{}{}
				r := bufio.NewReaderSize(resp.Body, 256<<10)
				n := 0
				for n < events {
					line, err := r.ReadSlice('\n')
					if err == bufio.ErrBufferFull {
						continue
					}
					if err != nil {
						return
					}
					if bytes.HasPrefix(line, []byte(`{"type":"`)) {
						n++
						delivered.Add(1)
					}
				}
			}()
		}
		for i := 0; i < watchers; i++ {
			<-ready
		}
		if live != nil {
			start = time.Now()
			live()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(120 * time.Second):
		}
		el := time.Since(start)
		return float64(delivered.Load()) / el.Seconds(), delivered.Load()
	}
	l, err := cs.CoreV1().Pods("list").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		b.Fatal(err)
	}
	_ = l
	// The revision 5,000 list creates ago: replay from history.
	items, err := cs.CoreV1().Pods("list").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		b.Fatal(err)
	}
	var revs []int64
	for _, p := range items.Items {
		var rv int64
		fmt.Sscan(p.ResourceVersion, &rv)
		revs = append(revs, rv)
	}
	sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
	from := fmt.Sprint(revs[len(revs)-5001])
	rateReplay, n := fanOut(from, 5000, nil)
	add("watch_fanout_replay_events_per_s", fmt.Sprintf("%.0f /s (100 watchers x 5,000 events, %d delivered)", rateReplay, n), rateReplay)
	rateLive, n := fanOut(fmt.Sprint(revs[len(revs)-1]), 1000, func() {
		for i := 0; i < 1000; i += 100 {
			var wg sync.WaitGroup
			for j := i; j < i+100; j++ {
				wg.Add(1)
				go func(j int) {
					defer wg.Done()
					cs.CoreV1().Pods("list").Patch(ctx, fmt.Sprintf("p-%06d", j), types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{})
				}(j)
			}
			wg.Wait()
		}
	})
	add("watch_fanout_live_events_per_s", fmt.Sprintf("%.0f /s (100 watchers x 1,000 live updates, %d delivered; bound by the write rate)", rateLive, n), rateLive)

	fmt.Fprintf(os.Stdout, "\nwaggle apiserver benchmark (embedded etcd with fsync, HTTPS, client-go; %s; load average before %s, after %s on %d CPUs)\n",
		time.Now().Format(time.RFC3339), loadBefore, loadavg(), runtime.NumCPU())
	results["loadavg_before"], results["loadavg_after"] = loadBefore, loadavg()
	for _, r := range rows {
		fmt.Fprintf(os.Stdout, "  %-36s %s\n", r[0], r[1])
	}
	j, _ := json.Marshal(results)
	fmt.Fprintf(os.Stdout, "BENCH_JSON %s\n", j)
}

func intOrStr(p int) intstr.IntOrString { return intstr.FromInt32(int32(p)) }

// etcd create latency as the server saw it (its histogram), to tell the
// store's share of the write latency from the rest of the path.
var etcdBaseline map[float64]uint64
var etcdBaseCount uint64

func etcdCreateBuckets(srv *apiservertest.Server) (map[float64]uint64, uint64) {
	mfs, _ := srv.Registry().Gather()
	for _, mf := range mfs {
		if mf.GetName() != "etcd_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			op, typ := "", ""
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "operation":
					op = l.GetValue()
				case "type":
					typ = l.GetValue()
				}
			}
			if op == "create" && typ == "pods" {
				out := map[float64]uint64{}
				for _, b := range m.GetHistogram().GetBucket() {
					out[b.GetUpperBound()] = b.GetCumulativeCount()
				}
				return out, m.GetHistogram().GetSampleCount()
			}
		}
	}
	return nil, 0
}

func resetEtcdBaseline(srv *apiservertest.Server) {
	etcdBaseline, etcdBaseCount = etcdCreateBuckets(srv)
}

func etcdCreateQuantiles(srv *apiservertest.Server) string {
	now, n := etcdCreateBuckets(srv)
	n -= etcdBaseCount
	if n == 0 {
		return "n/a"
	}
	var bounds []float64
	for b := range now {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	q := func(p float64) string {
		for _, b := range bounds {
			if float64(now[b]-etcdBaseline[b]) >= p*float64(n) {
				return fmt.Sprintf("<= %g ms", b*1000)
			}
		}
		return "> 10 s"
	}
	return fmt.Sprintf("etcd txn of those creates: p50 %s, p99 %s (histogram buckets)", q(.5), q(.99))
}

// concurrently runs op(0) … op(n-1) on workers goroutines, each taking the
// next index as it finishes one, and returns how long all took, every
// call's latency, how many failed and the first failure.
func concurrently(workers, n int, op func(i int) error) (took time.Duration, lats []time.Duration, errs int64, first error) {
	var next, failed atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					break
				}
				t0 := time.Now()
				if err := op(i); err != nil && failed.Add(1) == 1 {
					mu.Lock()
					first = err
					mu.Unlock()
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return time.Since(start), lats, failed.Load(), first
}

// BenchmarkWritePathVsEtcd measures, in one run on one server (embedded
// etcd with fsync), single-object creates through the whole API server
// (HTTPS, client-go, authn, admission, defaulting, validation, managed
// fields, the watch caches of every served kind) beside the embedded
// etcd's own puts of the same bytes at the same concurrency, and prints
// both rates, their p50/p99, the ratio and the process CPU per write. The
// two alternate in rounds so that the shared machine's load weighs on both
// alike.
//
//	go test -run '^$' -bench WritePathVsEtcd -benchtime 1x ./controlplane/apiserver/
func BenchmarkWritePathVsEtcd(b *testing.B) {
	for i := 0; i < b.N; i++ {
		runWritePathVsEtcd(b)
	}
}

func runWritePathVsEtcd(b *testing.B) {
	const workers, perRound, rounds = 16, 500, 4
	loadBefore := loadavg()
	srv := apiservertest.Start(b, apiservertest.Options{Configure: func(c *apiserver.Config) { c.EtcdUnsafeNoFsync = false }})
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	kv := srv.Store().Client()
	ctx := context.Background()
	// The raw puts write what the API server stores for such a pod
	// (defaults, managedFields and all), so both write the same bytes.
	if _, err := cs.CoreV1().Pods("default").Create(ctx, benchPod("template"), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	got, err := kv.Get(ctx, "/registry/pods/default/template")
	if err != nil || len(got.Kvs) != 1 {
		b.Fatalf("read the stored pod: %v", err)
	}
	value := got.Kvs[0].Value
	run := func(n int, op func(i int) error) (time.Duration, []time.Duration, int64) {
		took, lats, errs, _ := concurrently(workers, n, op)
		return took, lats, errs
	}
	var apiTook, etcdTook, apiCPU, etcdCPU time.Duration
	var apiLat, etcdLat []time.Duration
	var apiErrs, etcdErrs int64
	seq := 0
	for r := 0; r < rounds; r++ {
		base := seq
		cpu0 := processCPU(b)
		took, lats, errs := run(perRound, func(i int) error {
			_, err := cs.CoreV1().Pods("default").Create(ctx, benchPod(fmt.Sprintf("w-%06d", base+i)), metav1.CreateOptions{})
			return err
		})
		cpu1 := processCPU(b)
		apiTook, apiLat, apiErrs, apiCPU = apiTook+took, append(apiLat, lats...), apiErrs+errs, apiCPU+cpu1-cpu0
		took, lats, errs = run(perRound, func(i int) error {
			_, err := kv.Put(ctx, fmt.Sprintf("/bench/raw/w-%06d", base+i), string(value))
			return err
		})
		etcdTook, etcdLat, etcdErrs, etcdCPU = etcdTook+took, append(etcdLat, lats...), etcdErrs+errs, etcdCPU+processCPU(b)-cpu1
		seq += perRound
	}
	n := float64(perRound * rounds)
	apiRate, etcdRate := n/apiTook.Seconds(), n/etcdTook.Seconds()
	// The CPU the process (client-go, the API server, etcd and its client
	// alike) spent per write: what the shared machine's load does not
	// change much, where the rates follow the other tenants.
	apiCPUms, etcdCPUms := float64(apiCPU.Microseconds())/1000/n, float64(etcdCPU.Microseconds())/1000/n
	fmt.Fprintf(os.Stdout, "\nwrite path vs raw etcd (%d writes each, %d concurrent, %d rounds alternating, %d-byte objects, fsync on; %d kinds served; load average before %s, after %s on %d CPUs)\n",
		int(n), workers, rounds, len(value), len(srv.Catalog().All()), loadBefore, loadavg(), runtime.NumCPU())
	fmt.Fprintf(os.Stdout, "  %-26s %6.0f /s  p50 %s  p99 %s  (%d errors)\n", "API server creates", apiRate, ms(percentile(apiLat, .5)), ms(percentile(apiLat, .99)), apiErrs)
	fmt.Fprintf(os.Stdout, "  %-26s %6.0f /s  p50 %s  p99 %s  (%d errors)\n", "embedded etcd puts", etcdRate, ms(percentile(etcdLat, .5)), ms(percentile(etcdLat, .99)), etcdErrs)
	fmt.Fprintf(os.Stdout, "  %-26s %.2f×\n", "API server / etcd", apiRate/etcdRate)
	fmt.Fprintf(os.Stdout, "  %-26s %.3f ms per create, %.3f ms per put (whole process: client, server, etcd)\n", "process CPU", apiCPUms, etcdCPUms)
	j, _ := json.Marshal(map[string]any{
		"api_cpu_ms_per_create": apiCPUms, "etcd_cpu_ms_per_put": etcdCPUms,
		"api_creates_per_s": apiRate, "api_p50_ms": float64(percentile(apiLat, .5).Microseconds()) / 1000, "api_p99_ms": float64(percentile(apiLat, .99).Microseconds()) / 1000,
		"etcd_puts_per_s": etcdRate, "etcd_p50_ms": float64(percentile(etcdLat, .5).Microseconds()) / 1000, "etcd_p99_ms": float64(percentile(etcdLat, .99).Microseconds()) / 1000,
		"ratio": apiRate / etcdRate, "loadavg_before": loadBefore, "loadavg_after": loadavg(),
	})
	fmt.Fprintf(os.Stdout, "BENCH_JSON %s\n", j)
	if apiErrs > 0 || etcdErrs > 0 {
		b.Fatalf("%d API server and %d etcd writes failed", apiErrs, etcdErrs)
	}
}
