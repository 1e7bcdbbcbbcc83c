package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/modes"
	"github.com/waggle-io/waggle/internal/testutil"
)

// The proxy under test runs as its own process (this test binary,
// re-executed), so that its CPU time and RSS are its own.
const (
	envProxyKubeconfig = "DP_BENCH_PROXY_KUBECONFIG"
	envProxyCgroup     = "DP_BENCH_PROXY_CGROUP"
	envProxyPinDir     = "DP_BENCH_PROXY_PIN_DIR"
	envProxyMapMax     = "DP_BENCH_PROXY_MAP_MAX"
	// North-south: the proxy serves ExternalIPs on this device in this netns.
	envProxyNSDevice = "DP_BENCH_PROXY_NS_DEVICE"
	envProxyNSNetNS  = "DP_BENCH_PROXY_NS_NETNS"
	// The proxy answers GET /gc on this unix socket with its gcStats.
	envProxyStats = "DP_BENCH_PROXY_STATS"
	// DP_BENCH_PROXY_MEMLIMIT (bytes): a soft memory limit for the proxy
	// process only (debug.SetMemoryLimit; GOMEMLIMIT would reach the API
	// server's process too).
	envProxyMemLimit = "DP_BENCH_PROXY_MEMLIMIT"
)

// gcStats is what a process's runtime says about its garbage collector
// and its memory.
type gcStats struct {
	Cycles   uint64 `json:"cycles"`
	LiveHeap uint64 `json:"liveHeap"`
	// HeapInuse: heap spans in use (objects, live or not yet swept, and
	// the unused space in their spans), as MemStats.HeapInuse.
	HeapInuse uint64 `json:"heapInuse"`
	// HeapFree: heap memory free but not returned to the OS (it counts in
	// the RSS); Total: everything the Go runtime has mapped.
	HeapFree uint64 `json:"heapFree"`
	Total    uint64 `json:"total"`
}

func readGCStats() gcStats {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/free:bytes"}, {Name: "/memory/classes/total:bytes"}}
	metrics.Read(s)
	v := make([]uint64, len(s))
	for i := range s {
		if s[i].Value.Kind() == metrics.KindUint64 {
			v[i] = s[i].Value.Uint64()
		}
	}
	return gcStats{Cycles: v[0], LiveHeap: v[1], HeapInuse: v[2] + v[3], HeapFree: v[4], Total: v[5]}
}

// serveGCStats answers GET /gc (gcStats) and /heap (a heap profile) on
// the unix socket path, until the process ends.
func serveGCStats(path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/gc", func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(readGCStats())
	})
	mux.HandleFunc("/heap", func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC() // the profile shows the live heap as of now
		pprof.Lookup("heap").WriteTo(w, 0)
	})
	go http.Serve(ln, mux)
	return nil
}

// gcStatsClient reads a proxy's gcStats from its unix socket.
type gcStatsClient struct{ c *http.Client }

func newGCStatsClient(path string) *gcStatsClient {
	return &gcStatsClient{&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}}
}

// heapProfile saves the proxy's heap profile in path.
func (c *gcStatsClient) heapProfile(path string) error {
	resp, err := c.c.Get("http://proxy/heap")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (c *gcStatsClient) get() (gcStats, error) {
	var g gcStats
	resp, err := c.c.Get("http://proxy/gc")
	if err != nil {
		return g, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&g)
	return g, err
}

func TestMain(m *testing.M) {
	if mode := os.Getenv(envKPMode); mode != "" {
		os.Exit(runKubeProxyChild(mode))
	}
	if kc := os.Getenv(envProxyKubeconfig); kc != "" {
		os.Exit(runProxyChild(kc))
	}
	os.Exit(m.Run())
}

func runProxyChild(kubeconfig string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	max, _ := strconv.Atoi(os.Getenv(envProxyMapMax))
	if s := os.Getenv(envProxyMemLimit); s != "" {
		limit, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, "proxy:", envProxyMemLimit+":", err)
			return 1
		}
		debug.SetMemoryLimit(limit)
	}
	if p := os.Getenv(envProxyStats); p != "" {
		if err := serveGCStats(p); err != nil {
			fmt.Fprintln(os.Stderr, "proxy: gc stats:", err)
			return 1
		}
	}
	var devs []string
	if d := os.Getenv(envProxyNSDevice); d != "" {
		devs = []string{d}
	}
	err := dataplane.Run(ctx, dataplane.Config{
		NodePortDevices: devs, NodePortNetNS: os.Getenv(envProxyNSNetNS), NoL2Announcements: true,
		Kubeconfig: kubeconfig, NodeName: "dp-bench", Mode: dataplane.ModeEBPF, Modes: modes.All(),
		CgroupRoot: os.Getenv(envProxyCgroup), BPFPinDir: os.Getenv(envProxyPinDir),
		MaxServices: max, MaxBackends: max, NetworkPolicy: "off", HealthBindAddress: "0",
		SyncPeriod: 30 * time.Minute, MinSyncPeriod: time.Second,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		return 1
	}
	return 0
}

// BenchmarkEndpointChangeToMap times what a user waits for: from the API
// write of an EndpointSlice change (client-go Update against the real API
// server on real etcd) to the changed backend in the pinned eBPF maps, read
// by point lookups, through a real `waggle proxy` process in ebpf mode. At
// each Service count (DP_BENCH_SERVICES, default 1000,10000; the Services
// accumulate, 4 endpoints each) it reports p50/p99 over DP_BENCH_CHANGES
// (default 200) changes made one after another (after DP_BENCH_WARMUP,
// default 20, unrecorded ones), the proxy's CPU per change and its RSS,
// and where the time goes: the API call, the arrival of the change at a
// watch in this process (what any watcher could see: the limit) and the
// proxy's share after that, and whether a GC cycle ran in either process
// during each change. DP_BENCH_HEAP_PROFILES=dir saves the proxy's heap
// profile at each count there. Run it once: -benchtime 1x.
func BenchmarkEndpointChangeToMap(b *testing.B) {
	testutil.RequiresKernelFeature(b, testutil.CgroupSockAddr)
	counts := []int{1000, 10000}
	if s := os.Getenv("DP_BENCH_SERVICES"); s != "" {
		counts = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("DP_BENCH_SERVICES: %v", err)
			}
			counts = append(counts, n)
		}
	}
	changes := 200
	if s := os.Getenv("DP_BENCH_CHANGES"); s != "" {
		changes, _ = strconv.Atoi(s)
	}
	warmup := 20
	if s := os.Getenv("DP_BENCH_WARMUP"); s != "" {
		warmup, _ = strconv.Atoi(s)
	}
	// DP_BENCH_NORTHSOUTH=1: every Service also has an ExternalIP, the
	// proxy runs north-south load balancing, and a change counts as
	// programmed once the ExternalIP frontend's Maglev table was replaced.
	northSouth := os.Getenv("DP_BENCH_NORTHSOUTH") == "1"
	var nsEnv []string
	if northSouth {
		name := testutil.UniqueName("ns-lat")
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			b.Fatalf("ip netns add: %v: %s", err, out)
		}
		b.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
		for _, c := range [][]string{{"ip", "link", "add", "nsdummy0", "type", "veth", "peer", "name", "nsdummy1"}, {"ip", "addr", "add", "10.27.30.1/24", "dev", "nsdummy0"},
			{"ip", "link", "set", "nsdummy0", "up"}} {
			if out, err := exec.Command("ip", append([]string{"netns", "exec", name}, c...)...).CombinedOutput(); err != nil {
				b.Fatalf("%v: %v: %s", c, err, out)
			}
		}
		nsEnv = []string{envProxyNSDevice + "=nsdummy0", envProxyNSNetNS + "=/run/netns/" + name}
	}
	srv := apiservertest.Start(b, apiservertest.Options{})
	rc := *srv.Config
	rc.QPS, rc.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const perSvc = 4
	var vips []netip.Addr
	var names []string
	create := func(n int) {
		start := len(vips)
		vips = append(vips, make([]netip.Addr, n-start)...)
		for i := start; i < n; i++ {
			names = append(names, fmt.Sprintf("dp-%d", i))
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		work := make(chan int)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					if err := createService(ctx, cs, names[i], i, perSvc, &vips[i], northSouth); err != nil {
						mu.Lock()
						firstErr = cmpErr(firstErr, err)
						mu.Unlock()
					}
				}
			}()
		}
		for i := start; i < n; i++ {
			work <- i
		}
		close(work)
		wg.Wait()
		if firstErr != nil {
			b.Fatal(firstErr)
		}
	}

	cg := testutil.NewCgroup(b)
	pin := filepath.Join(ebpf.DefaultPinRoot, testutil.UniqueName("dp-bench"))
	maxEntries := 1 << 16
	for maxEntries < 2*counts[len(counts)-1]*(perSvc+2) {
		maxEntries <<= 1
	}
	kubeconfig := filepath.Join(srv.DataDir, "admin.kubeconfig")
	cmd := exec.Command(os.Args[0])
	statsPath := filepath.Join(b.TempDir(), "gc.sock")
	cmd.Env = append(os.Environ(), envProxyKubeconfig+"="+kubeconfig, envProxyCgroup+"="+cg, envProxyPinDir+"="+pin,
		envProxyMapMax+"="+strconv.Itoa(maxEntries), envProxyStats+"="+statsPath)
	proxyGC := newGCStatsClient(statsPath)
	cmd.Env = append(cmd.Env, nsEnv...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		ebpf.CleanupPinned(pin)
	})

	type row struct {
		services      int
		setup         time.Duration
		p50, p99, max time.Duration
		cpuPerChange  time.Duration
		rssMB         float64
		// The proxy's memory at the end: RSS anonymous and file-backed
		// (the binary's pages), and its runtime's view.
		rssAnonMB, rssFileMB float64
		mem                  gcStats
		changesWithErrors    int
		// Where the time goes, p50/p99 of each part: the Update call
		// (API server and etcd), until a watch of this process saw the
		// change (about when the proxy's informer gets it), and from
		// there to the map entry (the proxy's share).
		api, watch, proxy [2]time.Duration
		// Garbage collection during the changes: how many changes saw a
		// GC cycle start or end in the benchmark's process (API server
		// and etcd) and in the proxy's, the latency p50/p99 of those and
		// of the rest, and each process's live heap at the end.
		benchGC, proxyGC         int
		proxyOnlyGC, noGC        int
		withBenchGC, withProxyGC [2]time.Duration
		withoutGC                [2]time.Duration
		benchHeapMB, proxyHeapMB float64
		slowest                  []changeTimes
		// Run-queue wait of each process's threads during a change
		// (ready to run, no CPU free), p50/p99.
		benchWait, proxyWait [2]time.Duration
	}
	var rows []row
	next := 0 // unique endpoint addresses for changes
	for _, n := range counts {
		t0 := time.Now()
		create(n)
		// Wait until the proxy has programmed every frontend: the services
		// map holds n × ServiceEntries(perSvc) entries (and the kubernetes
		// Service's).
		var view *ebpf.View
		for deadline := time.Now().Add(5 * time.Minute); ; {
			if view == nil {
				view, _ = ebpf.OpenPinned(pin)
			}
			if view != nil {
				frontends := 1
				if northSouth {
					frontends = 2 // ClusterIP and ExternalIP
				}
				if maps, err := view.Maps(); err == nil && mapEntries(maps, ebpf.MapServices) >= frontends*n*ebpf.ServiceEntries(perSvc) {
					break
				}
			}
			select {
			case err := <-exited:
				b.Fatalf("proxy exited: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				b.Fatalf("the proxy did not program %d services in time", n)
			}
			time.Sleep(100 * time.Millisecond) // polling the kernel maps for a condition, with a deadline
		}
		setup := time.Since(t0)
		seen, stopWatch := watchSlices(ctx, b, cs)
		var cpu0 time.Duration
		var lat, apiLat, watchLat, proxyLat []time.Duration
		var withBench, withProxy, without []time.Duration
		var benchWait, proxyWait []time.Duration
		var all []changeTimes
		r := row{services: n, setup: setup}
		for i := range warmup + changes {
			if i == warmup {
				cpu0 = procCPU(b, cmd.Process.Pid)
			}
			j := (i * 7919) % n
			es, err := cs.DiscoveryV1().EndpointSlices("default").Get(ctx, names[j], metav1.GetOptions{})
			if err != nil {
				b.Fatal(err)
			}
			next++
			addr := netip.AddrFrom4([4]byte{10, 128 + byte(next>>16), byte(next >> 8), byte(next)})
			es.Endpoints[0].Addresses = []string{addr.String()}
			want := netip.AddrPortFrom(addr, 8080)
			k := dataplane.FrontendKey{Addr: vips[j], Port: 80, Protocol: dataplane.TCP}
			var oldTable uint32
			var svcID uint32
			if northSouth {
				svc, ok, err := view.Frontend(k)
				if err != nil || !ok {
					b.Fatalf("frontend %s: %v %v", k, ok, err)
				}
				svcID = svc.ID
				if oldTable, ok, err = view.NorthSouthTable(svcID); err != nil || !ok {
					b.Fatalf("north-south table of %s: %v %v", k, ok, err)
				}
			}
			brq0, prq0 := runDelay(os.Getpid()), runDelay(cmd.Process.Pid)
			bgc0 := readGCStats()
			pgc0, err := proxyGC.get()
			if err != nil {
				b.Fatalf("proxy gc stats: %v", err)
			}
			start := time.Now()
			upd, err := cs.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			apiDone := time.Now()
			for {
				svc, ok, err := view.Frontend(k)
				if err != nil {
					b.Fatal(err)
				}
				if ok && slices.ContainsFunc(svc.Slots, func(s ebpf.Slot) bool { return s.Backend == want }) {
					if !northSouth {
						break
					}
					if t, ok, err := view.NorthSouthTable(svcID); err == nil && ok && t != oldTable {
						break
					}
				}
				if time.Since(start) > 30*time.Second {
					r.changesWithErrors++
					break
				}
				time.Sleep(100 * time.Microsecond) // a poll of the kernel map, at 0.1 ms resolution
			}
			done := time.Now()
			brq1, prq1 := runDelay(os.Getpid()), runDelay(cmd.Process.Pid)
			bgc1 := readGCStats()
			pgc1, err := proxyGC.get()
			if err != nil {
				b.Fatalf("proxy gc stats: %v", err)
			}
			if i < warmup {
				continue
			}
			c := changeTimes{total: done.Sub(start), api: apiDone.Sub(start), benchGC: bgc1.Cycles != bgc0.Cycles, proxyGC: pgc1.Cycles != pgc0.Cycles,
				benchWait: brq1 - brq0, proxyWait: prq1 - prq0}
			benchWait, proxyWait = append(benchWait, c.benchWait), append(proxyWait, c.proxyWait)
			r.benchHeapMB, r.proxyHeapMB = float64(bgc1.LiveHeap)/(1<<20), float64(pgc1.LiveHeap)/(1<<20)
			lat = append(lat, c.total)
			apiLat = append(apiLat, c.api)
			if w, ok := seen.at(upd.ResourceVersion, 5*time.Second); ok {
				c.watch, c.proxy = w.Sub(start), done.Sub(w)
				watchLat = append(watchLat, c.watch)
				proxyLat = append(proxyLat, c.proxy)
			}
			switch {
			case c.benchGC:
				r.benchGC++
				withBench = append(withBench, c.total)
			case c.proxyGC:
				r.proxyOnlyGC++
				withProxy = append(withProxy, c.total)
			default:
				r.noGC++
				without = append(without, c.total)
			}
			if c.proxyGC {
				r.proxyGC++
			}
			all = append(all, c)
		}
		r.withBenchGC, r.withProxyGC, r.withoutGC = p50p99(withBench), p50p99(withProxy), p50p99(without)
		r.benchWait, r.proxyWait = p50p99(benchWait), p50p99(proxyWait)
		slices.SortFunc(all, func(a, b changeTimes) int { return cmp.Compare(b.total, a.total) })
		r.slowest = all[:min(5, len(all))]
		cpu := procCPU(b, cmd.Process.Pid) - cpu0
		stopWatch()
		r.api, r.watch, r.proxy = p50p99(apiLat), p50p99(watchLat), p50p99(proxyLat)
		slices.Sort(lat)
		r.p50, r.p99, r.max = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
		r.cpuPerChange = cpu / time.Duration(changes)
		r.rssMB = procRSSMB(b, cmd.Process.Pid)
		r.rssAnonMB, r.rssFileMB = procStatusMB(b, cmd.Process.Pid, "RssAnon:"), procStatusMB(b, cmd.Process.Pid, "RssFile:")
		if r.mem, err = proxyGC.get(); err != nil {
			b.Fatalf("proxy memory stats: %v", err)
		}
		if dir := os.Getenv("DP_BENCH_HEAP_PROFILES"); dir != "" {
			// After the RSS: collecting the profile runs a GC.
			if err := proxyGC.heapProfile(filepath.Join(dir, fmt.Sprintf("proxy-heap-%d.pb.gz", n))); err != nil {
				b.Errorf("proxy heap profile: %v", err)
			}
		}
		rows = append(rows, r)
		view.Close()
	}
	b.StopTimer()
	var sb strings.Builder
	what := "pinned eBPF map entry"
	if northSouth {
		what = "north-south Maglev table of the Service's ExternalIP frontend replaced"
	}
	fmt.Fprintf(&sb, "EndpointSlice update (API) → %s, through apiserver+etcd and a `waggle proxy` process; %d changes one after another (after %d unrecorded), %d endpoints per Service\n", what, changes, warmup, perSvc)
	fmt.Fprintf(&sb, "%9s %10s %9s %9s %9s %14s %10s %7s\n", "services", "setup", "p50", "p99", "max", "proxy CPU/chg", "proxy RSS", "errors")
	for _, r := range rows {
		fmt.Fprintf(&sb, "%9d %10s %9s %9s %9s %14s %8.0fMB %7d\n", r.services, r.setup.Round(time.Millisecond), r.p50.Round(10*time.Microsecond),
			r.p99.Round(10*time.Microsecond), r.max.Round(10*time.Microsecond), r.cpuPerChange.Round(10*time.Microsecond), r.rssMB, r.changesWithErrors)
	}
	fmt.Fprintf(&sb, "where the time goes (p50 / p99): the Update call; until a watch in the benchmark saw it; from there to the map (the proxy's part)\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "%9d %22s %22s %22s\n", r.services, pair(r.api), pair(r.watch), pair(r.proxy))
	}
	fmt.Fprintf(&sb, "garbage collection during the changes: changes that saw a GC cycle in the API server+etcd process (p50 / p99 of their latency), in the proxy only, in neither; live heaps at the end\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "%9d  apiserver GC %3d: %20s  proxy GC only %3d: %20s  neither %3d: %20s  (proxy GC in %d changes)  live heaps %4.0f / %4.0f MB\n",
			r.services, r.benchGC, pair(r.withBenchGC), r.proxyOnlyGC, pair(r.withProxyGC), r.noGC, pair(r.withoutGC), r.proxyGC, r.benchHeapMB, r.proxyHeapMB)
	}
	fmt.Fprintf(&sb, "the proxy's memory at the end (MB): RSS = anonymous + file-backed (the binary's pages); Go heap in use, live heap (at the last GC), heap free not returned to the OS, all the Go runtime has mapped\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "%9d  RSS %5.0f = %5.0f + %4.0f   heap in use %5.0f  live %5.0f  free %5.0f  runtime total %5.0f\n", r.services, r.rssMB, r.rssAnonMB, r.rssFileMB,
			mb(r.mem.HeapInuse), mb(r.mem.LiveHeap), mb(r.mem.HeapFree), mb(r.mem.Total))
	}
	fmt.Fprintf(&sb, "run-queue wait during a change, summed over each process's threads (p50 / p99): API server+etcd+benchmark process; proxy\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "%9d %22s %22s\n", r.services, pair(r.benchWait), pair(r.proxyWait))
	}
	fmt.Fprintf(&sb, "the slowest changes: total = Update call + rest; watch seen; proxy's part; GC in apiserver process / proxy; run-queue wait apiserver process / proxy\n")
	for _, r := range rows {
		for _, c := range r.slowest {
			fmt.Fprintf(&sb, "%9d %10s = %10s + %10s; watch %10s; proxy %10s; gc %v/%v; waited %10s / %10s\n", r.services, c.total.Round(10*time.Microsecond), c.api.Round(10*time.Microsecond),
				(c.total - c.api).Round(10*time.Microsecond), c.watch.Round(10*time.Microsecond), c.proxy.Round(10*time.Microsecond), c.benchGC, c.proxyGC,
				c.benchWait.Round(10*time.Microsecond), c.proxyWait.Round(10*time.Microsecond))
		}
	}
	// To stdout, not b.Log: a benchmark's log is cut after a few lines.
	fmt.Print(sb.String())
	last := rows[len(rows)-1]
	b.ReportMetric(float64(last.p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(last.p99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(last.cpuPerChange.Microseconds())/1000, "proxy-cpu-ms/change")
	b.ReportMetric(last.rssMB, "proxy-rss-MB")
	b.ReportMetric(mb(last.mem.HeapInuse), "proxy-heap-inuse-MB")
}

// changeTimes is one change: the whole, the Update call, until the
// benchmark's watch saw it, from there to the map; and whether a GC cycle
// ran in the benchmark's process (API server, etcd) or the proxy's.
type changeTimes struct {
	total, api, watch, proxy time.Duration
	benchGC, proxyGC         bool
	// benchWait, proxyWait: time the process's threads spent ready to
	// run but waiting for a CPU during the change (summed over threads).
	benchWait, proxyWait time.Duration
}

// runDelay is the time every thread of process pid has spent waiting on a
// run queue (schedstat's run_delay, summed over the threads).
func runDelay(pid int) time.Duration {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, t := range tasks {
		raw, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(raw)); len(f) >= 2 {
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}

func p50p99(d []time.Duration) [2]time.Duration {
	if len(d) == 0 {
		return [2]time.Duration{}
	}
	slices.Sort(d)
	return [2]time.Duration{d[len(d)/2], d[min(len(d)-1, len(d)*99/100)]}
}

func pair(d [2]time.Duration) string {
	return d[0].Round(10*time.Microsecond).String() + " / " + d[1].Round(10*time.Microsecond).String()
}

// sliceWatch records when a watch of this process received each
// EndpointSlice resourceVersion.
type sliceWatch struct {
	mu    sync.Mutex
	cond  *sync.Cond
	times map[string]time.Time
}

// at waits up to timeout for rv to arrive.
func (w *sliceWatch) at(rv string, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() { w.mu.Lock(); w.cond.Broadcast(); w.mu.Unlock() })
	defer timer.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if t, ok := w.times[rv]; ok {
			return t, true
		}
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		w.cond.Wait()
	}
}

func watchSlices(ctx context.Context, b *testing.B, cs kubernetes.Interface) (*sliceWatch, func()) {
	list, err := cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		b.Fatal(err)
	}
	wi, err := cs.DiscoveryV1().EndpointSlices("default").Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		b.Fatal(err)
	}
	w := &sliceWatch{times: map[string]time.Time{}}
	w.cond = sync.NewCond(&w.mu)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range wi.ResultChan() {
			now := time.Now()
			if es, ok := ev.Object.(*discoveryv1.EndpointSlice); ok {
				w.mu.Lock()
				w.times[es.ResourceVersion] = now
				w.cond.Broadcast()
				w.mu.Unlock()
			}
		}
	}()
	return w, func() { wi.Stop(); <-done }
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func createService(ctx context.Context, cs kubernetes.Interface, name string, i, perSvc int, vip *netip.Addr, externalIP bool) error {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	ext := netip.AddrFrom4([4]byte{10, 200 + byte(i>>16), byte(i >> 8), byte(i)})
	if externalIP {
		svc.Spec.ExternalIPs = []string{ext.String()}
	}
	got, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	a, err := netip.ParseAddr(got.Spec.ClusterIP)
	if err != nil {
		return fmt.Errorf("service %s got clusterIP %q: %w", name, got.Spec.ClusterIP, err)
	}
	*vip = a
	if externalIP {
		*vip = ext
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for j := range perSvc {
		k := i*perSvc + j
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{netip.AddrFrom4([4]byte{10, 64 + byte(k>>16), byte(k >> 8), byte(k)}).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpointslice %s: %w", name, err)
	}
	return nil
}

func mapEntries(maps []ebpf.MapInfo, name string) int {
	for _, m := range maps {
		if m.Name == name {
			return m.Entries
		}
	}
	return -1
}

// procCPU is a process's user+system CPU time (clock ticks of 10 ms).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func procRSSMB(b *testing.B, pid int) float64 { return procStatusMB(b, pid, "VmRSS:") }

func mb(n uint64) float64 { return float64(n) / (1 << 20) }

// procStatusMB reads a kB field of /proc/pid/status in MB.
func procStatusMB(b *testing.B, pid int, field string) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(l, field); ok {
			kb, _ := strconv.ParseFloat(strings.Fields(rest)[0], 64)
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkProgramFromScratch times programming DP_BENCH_PROGRAM
// (default 10000x10,100000x4: services × backends, all distinct) into empty
// kernel maps with one Sync, as `waggle bench dataplane` does, without the
// traffic part. Run it once: -benchtime 1x.
func BenchmarkProgramFromScratch(b *testing.B) {
	testutil.RequiresKernelFeature(b, testutil.CgroupSockAddr)
	spec := os.Getenv("DP_BENCH_PROGRAM")
	if spec == "" {
		spec = "10000x10,100000x4"
	}
	cg := testutil.NewCgroup(b)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%22s %12s %12s %16s\n", "programmed", "wall (med)", "CPU (med)", "services/s")
	for _, s := range strings.Split(spec, ",") {
		var n, m int
		if _, err := fmt.Sscanf(s, "%dx%d", &n, &m); err != nil {
			b.Fatalf("DP_BENCH_PROGRAM %q: %v", s, err)
		}
		cfg := Config{ProgramServices: n, ProgramBackends: m, ProgramRounds: 3, LatencySamples: 1}.withDefaults()
		rep := &Report{}
		if err := programBench(context.Background(), cfg, &topo{cgroup: filepath.Join(cg, "x"), suffix: testutil.UniqueName("dp")}, rep); err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(&sb, "%22s %11.3fs %11.3fs %16.0f\n", fmt.Sprintf("%d × %d", n, m), rep.Program.Median, rep.ProgramCPU.Median, float64(n)/rep.Program.Median)
		b.ReportMetric(rep.Program.Median, fmt.Sprintf("s/%dx%d", n, m))
	}
	b.Log("\n" + sb.String())
}
