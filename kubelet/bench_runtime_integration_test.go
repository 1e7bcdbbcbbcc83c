package kubelet_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/waggle-io/waggle/kubelet"
	"github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/network"
)

// BenchmarkPodStartupVsContainerd is the "runtime is the limit"
// figure: 100 pods created at once through the API until all are Running,
// beside 100 containers of the same image started at once by containerd +
// runc directly (the same private containerd, same snapshotter and shim;
// each in a new empty network namespace runc makes, no CNI, cgroup of its
// own, log, volumes, probes or API writes), and beside the same with a CNI
// ADD each first (the pod network every pod has), in one run: direct,
// direct + CNI, Waggle, direct. It prints the rates (pods or containers per
// second until the last one), the ratios, each side's p50/p99 from the
// burst's start, the CPU time each burst cost (cgroupCPU: run the
// benchmark in a cgroup of its own), and what the kubelet's histograms
// gained in its burst.
//
//	WAGGLE_PRIVILEGED_TESTS=1 go test -run '^$' -bench PodStartupVsContainerd -benchtime 1x ./kubelet/
func BenchmarkPodStartupVsContainerd(b *testing.B) {
	const count = 100
	n := newNode(b, func(c *kubelet.Config) {
		userPeriods(c)
		if v, err := strconv.Atoi(os.Getenv("WAGGLE_BENCH_PARALLEL_STARTS")); err == nil && v > 0 {
			c.ParallelStarts = v
		}
		// application/json: the kubelet's client as it was before it
		// spoke protobuf (an old/new comparison with one binary).
		c.KubeAPIContentType = os.Getenv("WAGGLE_BENCH_KUBE_API_CONTENT_TYPE")
	})
	b.Logf("kubelet ParallelStarts: %d (WAGGLE_BENCH_PARALLEL_STARTS; 0: no cap, the default)", n.cfg.ParallelStarts)
	b.Logf("kubelet API content type: %s (WAGGLE_BENCH_KUBE_API_CONTENT_TYPE)", n.cfg.WithDefaults().KubeAPIContentType)
	b.Logf("kubelet SyncFrequency %v, BackoffBase %v, BackoffMax %v (the kubelet's defaults)", n.cfg.SyncFrequency, n.cfg.BackoffBase, n.cfg.BackoffMax)
	// Each phase's CLOCK_MONOTONIC span, to cut a machine-wide profile
	// (perf record -a -k mono) to one side: perf report --time from,to.
	phase := func(name string, f func() burst) burst {
		t0 := monotonic()
		r := f()
		b.Logf("phase %s: monotonic %.6f,%.6f", name, t0, monotonic())
		return r
	}
	raw1 := phase("raw1", func() burst { return rawContainerdBurst(b, n, count, "raw1", false) })
	rawNet := phase("raw+cni", func() burst { return rawContainerdBurst(b, n, count, "rawnet", true) })
	before := gatherHistograms(b, n)
	pods := phase("waggle", func() burst { return waggleBurst(b, n, count) })
	logHistogramDeltas(b, before, gatherHistograms(b, n))
	logRequestDeltas(b, pods.requests, count)
	raw2 := phase("raw2", func() burst { return rawContainerdBurst(b, n, count, "raw2", false) })
	raw := raw1
	if raw2.total < raw1.total {
		raw = raw2 // the better of the two: the limit
	}
	rate := func(r burst) float64 { return float64(count) / r.total.Seconds() }
	b.ReportMetric(rate(pods), "pods-running/s")
	b.ReportMetric(rate(raw), "containers-started/s")
	b.ReportMetric(rate(pods)/rate(raw), "ratio")
	b.ReportMetric(rate(pods)/rate(rawNet), "ratio-to-direct-with-cni")
	if pods.cpu >= 0 && raw.cpu >= 0 {
		b.ReportMetric(pods.cpu.Seconds(), "waggle-cpu-s")
		b.ReportMetric(raw.cpu.Seconds(), "direct-cpu-s")
		b.ReportMetric(pods.self.Seconds(), "waggle-process-cpu-s")
	}
	b.ReportMetric(pods.p(99).Seconds(), "pod-p99-s")
	b.ReportMetric(raw.p(99).Seconds(), "container-p99-s")
	cpu := func(r burst) string {
		if r.cpu < 0 {
			return "?"
		}
		return fmt.Sprintf("%.1fs", r.cpu.Seconds())
	}
	row := "%-38s %10.1f %10s %10s %10s %12.2fs %10.2fs\n"
	b.Logf("\n%-38s %10s %10s %10s %10s %13s %11s\n"+row+row+row+row+"%-38s %10.2f×\n%-38s %10.2f×",
		fmt.Sprintf("%d at once", count), "per s", "p50", "p99", "CPU", "this process", "containerd",
		"containerd+runc direct (run 1)", rate(raw1), raw1.p(50).Round(time.Millisecond), raw1.p(99).Round(time.Millisecond), cpu(raw1), raw1.self.Seconds(), raw1.containerd.Seconds(),
		"containerd+runc direct + CNI ADD each", rate(rawNet), rawNet.p(50).Round(time.Millisecond), rawNet.p(99).Round(time.Millisecond), cpu(rawNet), rawNet.self.Seconds(), rawNet.containerd.Seconds(),
		"Waggle: API create → Running", rate(pods), pods.p(50).Round(time.Millisecond), pods.p(99).Round(time.Millisecond), cpu(pods), pods.self.Seconds(), pods.containerd.Seconds(),
		"containerd+runc direct (run 2)", rate(raw2), raw2.p(50).Round(time.Millisecond), raw2.p(99).Round(time.Millisecond), cpu(raw2), raw2.self.Seconds(), raw2.containerd.Seconds(),
		"Waggle ÷ best direct", rate(pods)/rate(raw),
		"Waggle ÷ direct + CNI ADD", rate(pods)/rate(rawNet))
}

type burst struct {
	total time.Duration
	each  []time.Duration
	// cpu is the CPU time the benchmark's cgroup used from the burst's
	// start to its last start (-1: unknown), see cgroupCPU.
	cpu time.Duration
	// self and containerd are what this process (API server, etcd,
	// kubelet or the direct side's client) and its containerd used of it.
	self, containerd time.Duration
	// requests is what the Waggle burst cost in API requests and etcd
	// operations (counter deltas, see countRequests).
	requests map[string]float64
}

// cgroupCPU is the CPU time used so far by this process's cgroup (cgroup v1
// cpuacct, else v2 cpu.stat), -1 if it cannot be read. Run the benchmark
// alone in a cgroup of its own and it counts everything a start costs
// outside the container's own cgroup: the kubelet, API server and etcd
// (this process), containerd (started by the test, so inside), the shims,
// runc until it joins the container's cgroup, the loggers and the CNI
// plugin. CPU time moves far less with the machine's load than a rate.
func cgroupCPU() time.Duration {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return -1
	}
	var v2 string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if slices.Contains(strings.Split(f[1], ","), "cpuacct") {
			if v, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", f[2], "cpuacct.usage")); err == nil {
				if ns, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64); err == nil {
					return time.Duration(ns)
				}
			}
		}
		if f[0] == "0" {
			v2 = f[2]
		}
	}
	v, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", v2, "cpu.stat"))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(v), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "usage_usec" {
			us, _ := strconv.ParseInt(f[1], 10, 64)
			return time.Duration(us) * time.Microsecond
		}
	}
	return -1
}

func cpuSince(t0 time.Duration) time.Duration {
	if t0 < 0 {
		return -1
	}
	return cgroupCPU() - t0
}

func (r burst) p(pct int) time.Duration {
	v := append([]time.Duration(nil), r.each...)
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	if len(v) == 0 {
		return 0
	}
	i := (len(v)*pct+99)/100 - 1
	return v[max(0, min(i, len(v)-1))]
}

// rawContainerdBurst creates and starts count containers of the echo image
// at once through containerd's client (rootfs snapshot, OCI spec from the
// image, runc shim), timing each until its task started; then removes them.
// Each gets a new, empty network namespace from runc (containerd's default
// spec), nothing in it but lo. With withCNI each instead joins a namespace
// set up first by the node's CNI plugin (the kubelet's network manager:
// netns bind-mounted under /run/netns, CNI ADD: veth, bridge, IPAM), what
// every pod has: the limit for pods, runtime and network together.
func rawContainerdBurst(b *testing.B, n *node, count int, prefix string, withCNI bool) burst {
	ctx := namespacesCtx(n)
	cl := n.ctrd.Client
	img, err := cl.GetImage(ctx, images.EchoImage)
	if err != nil {
		b.Fatal(err)
	}
	cni := network.NewCNI(network.CNIOptions{ConfDir: n.cfg.CNIConfDir, BinDirs: n.cfg.CNIBinDirs,
		CacheDir: n.cfg.CNICacheDir, NetNSPrefix: "wkbench-"})
	sandboxes := make([]network.Sandbox, count)
	benchPod := func(i int) network.Pod {
		return network.Pod{UID: fmt.Sprintf("%s-%s-%03d", n.name, prefix, i), Namespace: "bench", Name: fmt.Sprintf("%s-%03d", prefix, i)}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := burst{}
	var errs []error
	cpu0 := cgroupCPU()
	self0, ctrd0 := processCPU()
	start := time.Now()
	for i := 0; i < count; i++ {
		id := fmt.Sprintf("bench-%s-%03d", prefix, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithProcessArgs("/waggle-echo", "sleep", "3600")}
			var err error
			if withCNI {
				var sb network.Sandbox
				if sb, err = cni.SetUp(ctx, benchPod(i)); err == nil {
					sandboxes[i] = sb
					opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: sb.NetNS}))
				}
			}
			var ctr containerd.Container
			if err == nil {
				ctr, err = cl.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithSnapshotter("overlayfs"),
					containerd.WithNewSnapshot(id, img), containerd.WithRuntime("io.containerd.runc.v2", nil),
					containerd.WithNewSpec(opts...))
			}
			if err == nil {
				var task containerd.Task
				if task, err = ctr.NewTask(ctx, cio.NullIO); err == nil {
					err = task.Start(ctx)
				}
			}
			d := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			out.each = append(out.each, d)
		}()
	}
	wg.Wait()
	out.total = time.Since(start)
	out.cpu = cpuSince(cpu0)
	self1, ctrd1 := processCPU()
	out.self, out.containerd = self1-self0, ctrd1-ctrd0
	b.StopTimer()
	for i := 0; i < count; i++ {
		id := fmt.Sprintf("bench-%s-%03d", prefix, i)
		if ctr, err := cl.LoadContainer(ctx, id); err == nil {
			if t, err := ctr.Task(ctx, nil); err == nil {
				t.Delete(ctx, containerd.WithProcessKill)
			}
			ctr.Delete(ctx, containerd.WithSnapshotCleanup)
		}
		if sandboxes[i].NetNS != "" {
			if err := cni.TearDown(ctx, benchPod(i), sandboxes[i]); err != nil {
				b.Errorf("tear down %s: %v", sandboxes[i].NetNS, err)
			}
		}
	}
	if len(errs) > 0 {
		b.Fatalf("%d of %d direct starts failed, first: %v", len(errs), count, errs[0])
	}
	return out
}

// waggleBurst creates count echo pods at once (concurrently) and times
// each from the burst's start to Running (all containers started, as the pod's status in
// the API says); then deletes them.
func waggleBurst(b *testing.B, n *node, count int) burst {
	ctx := context.Background()
	w, err := n.client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	out := burst{}
	seen := map[string]bool{}
	// writes counts each pod's updates the watch saw until it was Running
	// (the kubelet's status writes; every one a GET and a PUT, stored and
	// sent to every watcher).
	writes := 0
	reqs0 := countRequests(b, n)
	stopProfile := startCPUProfile(b)
	writeAllocProfile(b, ".before")
	cpu0 := cgroupCPU()
	self0, ctrd0 := processCPU()
	start := time.Now()
	// All created at once, each by a goroutine of its own as the direct
	// side starts each container (one client creating them one after
	// another put up to 8 s of create round trips, at load ~30, before
	// the last pod's start).
	created := make(chan time.Duration, 1)
	var creates sync.WaitGroup
	for i := 0; i < count; i++ {
		creates.Add(1)
		go func() {
			defer creates.Done()
			p := echoPod(n, fmt.Sprintf("burst-%03d", i), nil)
			if _, err := n.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
				b.Error(err)
			}
		}()
	}
	go func() {
		creates.Wait()
		created <- time.Since(start)
	}()
	deadline := time.After(5 * time.Minute)
	for len(seen) < count {
		select {
		case ev := <-w.ResultChan():
			p, ok := ev.Object.(*v1.Pod)
			if !ok || ev.Type != watch.Modified || seen[p.Name] {
				continue
			}
			writes++
			if p.Status.Phase != v1.PodRunning {
				continue
			}
			seen[p.Name] = true
			out.each = append(out.each, time.Since(start))
		case <-deadline:
			b.Fatalf("only %d of %d pods Running", len(seen), count)
		}
	}
	out.total = time.Since(start)
	out.cpu = cpuSince(cpu0)
	self1, ctrd1 := processCPU()
	out.self, out.containerd = self1-self0, ctrd1-ctrd0
	stopProfile()
	writeAllocProfile(b, "")
	out.requests = countRequests(b, n)
	for k, v := range reqs0 {
		out.requests[k] -= v
	}
	b.Logf("pod updates until Running: %.2f per pod; the last of the %d creates returned after %v",
		float64(writes)/float64(count), count, (<-created).Round(time.Millisecond))
	n.client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	for i := 0; i < count; i++ {
		n.waitGone(fmt.Sprintf("burst-%03d", i), 2*time.Minute)
	}
	return out
}

func monotonic() float64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

// gatherHistograms reads the kubelet's histograms (count and sum by name
// and labels) and counters (value, sum -1) from its metrics registry: what
// /metrics serves.
func gatherHistograms(b *testing.B, n *node) map[string][2]float64 {
	mfs, err := n.kubelet.Health().Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string][2]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			if h := m.GetHistogram(); h != nil {
				out[key] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
			} else if c := m.GetCounter(); c != nil {
				// A counter (pod syncs, container starts): its count,
				// no time.
				out[key] = [2]float64{c.GetValue(), -1}
			}
		}
	}
	return out
}

// logHistogramDeltas prints what the kubelet's histograms gained during a
// phase: per operation its count, mean and summed time.
func logHistogramDeltas(b *testing.B, before, after map[string][2]float64) {
	var keys []string
	for k := range after {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	fmt.Fprintf(&sb, "kubelet metrics during the Waggle burst:\n%-80s %6s %9s %9s\n", "histogram", "count", "mean", "sum")
	for _, k := range keys {
		c, sum := after[k][0]-before[k][0], after[k][1]-before[k][1]
		if c == 0 {
			continue
		}
		if after[k][1] < 0 {
			fmt.Fprintf(&sb, "%-80s %6.0f\n", k, c)
			continue
		}
		fmt.Fprintf(&sb, "%-80s %6.0f %8.3fs %8.1fs\n", k, c, sum/c, sum)
	}
	b.Log(sb.String())
}

// startCPUProfile writes a CPU profile of this process (API server, etcd,
// kubelet and the benchmark's client) over the Waggle burst to the file
// WAGGLE_BENCH_CPUPROFILE names (go tool pprof); without it, nothing. The
// returned func stops it.
func startCPUProfile(b *testing.B) func() {
	path := os.Getenv("WAGGLE_BENCH_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	// 500 Hz rather than pprof's 100: a burst is a few CPU-seconds of
	// this process.
	runtime.SetCPUProfileRate(500)
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
		b.Logf("CPU profile of the Waggle burst: %s", path)
	}
}

// countRequests reads the API server's request counters (its /metrics,
// apiserver_request_total by verb, resource and subresource, every code)
// and the embedded etcd's (this process's default registry: puts, deletes,
// txns and ranges of its MVCC store), keyed "api <verb> <resource>[/<sub>]"
// "api→etcd <operation> <resource>" (the API server's etcd requests) and
// "etcd <counter>".
func countRequests(b *testing.B, n *node) map[string]float64 {
	out := map[string]float64{}
	raw, err := n.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("API server metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		b.Fatalf("API server metrics: %v", err)
	}
	for _, m := range mfs["apiserver_request_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		key := "api " + l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += m.GetCounter().GetValue()
	}
	for _, m := range mfs["etcd_request_duration_seconds"].GetMetric() {
		key := "api→etcd"
		for _, p := range m.GetLabel() {
			key += " " + p.GetValue()
		}
		out[key] += float64(m.GetHistogram().GetSampleCount())
	}
	local, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		b.Fatalf("etcd metrics: %v", err)
	}
	for _, mf := range local {
		switch mf.GetName() {
		case "etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total", "etcd_mvcc_range_total":
			for _, m := range mf.GetMetric() {
				out["etcd "+strings.TrimPrefix(mf.GetName(), "etcd_mvcc_")] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// logRequestDeltas prints what the Waggle burst (create to the last pod
// Running) cost in API requests and etcd operations, in all and per pod.
func logRequestDeltas(b *testing.B, d map[string]float64, pods int) {
	var keys []string
	for k, v := range d {
		if v != 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var sb strings.Builder
	fmt.Fprintf(&sb, "requests during the Waggle burst (create → last Running):\n%-50s %7s %8s\n", "request", "count", "per pod")
	for _, k := range keys {
		fmt.Fprintf(&sb, "%-50s %7.0f %8.2f\n", k, d[k], d[k]/float64(pods))
	}
	b.Log(sb.String())
}

// processCPU is the CPU time used so far by this process (all its
// threads) and by its containerd (a child named containerd).
func processCPU() (self, ctrd time.Duration) {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	ents, _ := os.ReadDir("/proc")
	me := os.Getpid()
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime (fields 14, 15), in
		// clock ticks (100 per second on Linux).
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || !bytes.HasSuffix(b[:i], []byte("(containerd")) {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 || f[1] != strconv.Itoa(me) {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ctrd += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return self, ctrd
}

// writeAllocProfile writes this process's allocations so far (pprof's
// allocs profile) to WAGGLE_BENCH_ALLOCPROFILE plus suffix, if set: the
// profiles before and after the Waggle burst, told apart with go tool
// pprof -sample_index=alloc_space -base <file>.before <file>. Unlike CPU
// time, what a burst allocates does not move with the machine's load.
func writeAllocProfile(b *testing.B, suffix string) {
	path := os.Getenv("WAGGLE_BENCH_ALLOCPROFILE")
	if path == "" {
		return
	}
	// The profile is as of the last GC: one now, so that it holds every
	// allocation until here.
	runtime.GC()
	f, err := os.Create(path + suffix)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		b.Error(err)
	}
}
