package cni

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/internal/testutil"
)

// BenchmarkAddDel measures ADD and DEL latency through the plugin's functions
// in process (the binary adds its process start), on a node netns with
// masquerading on and off, one pod netns reused, and reports p50/p99 of each
// and the CPU time (user + system, this process and its children) of one
// ADD + DEL cycle. It checks that the cycles leave nothing behind. Run the
// 1,000-cycle form with
//
//	go test -run '^$' -bench AddDel -benchtime 1000x ./cni/
func BenchmarkAddDel(b *testing.B) {
	for _, masq := range []bool{true, false} {
		b.Run(fmt.Sprintf("masquerade=%v", masq), func(b *testing.B) { benchAddDel(b, masq) })
	}
}

func benchAddDel(b *testing.B, masq bool) {
	n := newNode(b, "10.90.0.0/22", "10.90.0.0/16", map[string]any{"masquerade": masq})
	pod := testutil.NewNetNS(b)
	adds := make([]time.Duration, 0, b.N)
	dels := make([]time.Duration, 0, b.N)
	// Warm up: the bridge and the nftables table are created once per node.
	if _, err := n.add("warm", "eth0", pod); err != nil {
		b.Fatal(err)
	}
	if err := n.del("warm", "eth0", pod); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := range b.N {
		id := fmt.Sprintf("bench-%d", i)
		t0 := time.Now()
		if _, err := n.add(id, "eth0", pod); err != nil {
			b.Fatalf("cycle %d ADD: %v", i, err)
		}
		t1 := time.Now()
		if err := n.del(id, "eth0", pod); err != nil {
			b.Fatalf("cycle %d DEL: %v", i, err)
		}
		adds = append(adds, t1.Sub(t0))
		dels = append(dels, time.Since(t1))
	}
	cpu := cpuTime().sub(cpu0)
	b.StopTimer()
	assertNothingLeft(b, n, pod)
	b.ReportMetric(pct(adds, 50), "add-p50-ms")
	b.ReportMetric(pct(adds, 99), "add-p99-ms")
	b.ReportMetric(pct(dels, 50), "del-p50-ms")
	b.ReportMetric(pct(dels, 99), "del-p99-ms")
	b.ReportMetric(ms(cpu.total())/float64(b.N), "cpu-ms/cycle")
}

// BenchmarkAddDelExec is what a pod's network costs a node: the real
// executable (built from cmd/waggle-cni) run by libcni, as the kubelet runs
// it, ADD into a pod netns and DEL without it (the kubelet removes the
// netns first), on a node that already has 100 pods attached (their
// addresses in the store, their veths on the bridge: what a burst of 100
// pods looks like half-way). Besides latency it reports the CPU time of
// each operation: "plugin" is the plugin process and what it runs (its
// rusage, as a waited-for child), "total" adds this process's (libcni's)
// share. The kernel's work in its own threads (e.g. freeing a veth after
// an RCU grace period) is in neither.
//
//	go test -run '^$' -bench AddDelExec -benchtime 300x ./cni/
func BenchmarkAddDelExec(b *testing.B) {
	testutil.RequiresRoot(b)
	goBin := testutil.RequiresBinary(b, "go")
	bin := b.TempDir()
	if out, err := exec.Command(goBin, "build", "-o", filepath.Join(bin, PluginType), "github.com/waggle-io/waggle/cmd/waggle-cni").CombinedOutput(); err != nil {
		b.Fatalf("go build cmd/waggle-cni: %v\n%s", err, out)
	}
	if fi, err := os.Stat(filepath.Join(bin, PluginType)); err == nil {
		b.Logf("waggle-cni: %.1f MB", float64(fi.Size())/1e6)
	}
	nodeNS := testutil.NewNetNS(b)
	pod, resident := testutil.NewNetNS(b), testutil.NewNetNS(b)
	dataDir := b.TempDir()
	raw, err := ConfList(netip.MustParsePrefix("10.96.0.0/22"), netip.MustParsePrefix("10.96.0.0/16"),
		WithDataDir(dataDir), WithName("bench-exec"))
	if err != nil {
		b.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		b.Fatal(err)
	}
	cn := libcni.NewCNIConfigWithCacheDir([]string{bin}, b.TempDir(), nil)
	ctx := context.Background()
	do := func(f func() error) error { return nodeNS.Do(func(ns.NetNS) error { return f() }) }
	// 100 pods already on the node: one netns, interfaces p0…p99.
	const pods = 100
	for i := range pods {
		rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("resident-%d", i), NetNS: resident.Path(), IfName: fmt.Sprintf("p%d", i)}
		if err := do(func() error { _, err := cn.AddNetworkList(ctx, list, rt); return err }); err != nil {
			b.Fatalf("resident pod %d: %v", i, err)
		}
	}
	adds := make([]time.Duration, 0, b.N)
	dels := make([]time.Duration, 0, b.N)
	var addCPU, delCPU rusage
	b.ResetTimer()
	for i := range b.N {
		rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("exec-%d", i), NetNS: pod.Path(), IfName: "eth0"}
		c0, t0 := cpuTime(), time.Now()
		if err := do(func() error { _, err := cn.AddNetworkList(ctx, list, rt); return err }); err != nil {
			b.Fatalf("cycle %d ADD: %v", i, err)
		}
		c1, t1 := cpuTime(), time.Now()
		rt.NetNS = ""
		if err := do(func() error { return cn.DelNetworkList(ctx, list, rt) }); err != nil {
			b.Fatalf("cycle %d DEL: %v", i, err)
		}
		c2, t2 := cpuTime(), time.Now()
		adds, dels = append(adds, t1.Sub(t0)), append(dels, t2.Sub(t1))
		addCPU, delCPU = addCPU.add(c1.sub(c0)), delCPU.add(c2.sub(c1))
	}
	b.StopTimer()
	for i := range pods {
		rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("resident-%d", i), IfName: fmt.Sprintf("p%d", i)}
		if err := do(func() error { return cn.DelNetworkList(ctx, list, rt) }); err != nil {
			b.Fatalf("resident pod %d DEL: %v", i, err)
		}
	}
	assertNothingLeft(b, &node{ns: nodeNS, dataDir: dataDir, name: "bench-exec"}, pod, resident)
	n := float64(b.N)
	b.ReportMetric(pct(adds, 50), "add-p50-ms")
	b.ReportMetric(pct(dels, 50), "del-p50-ms")
	b.ReportMetric(ms(addCPU.children)/n, "add-plugin-cpu-ms")
	b.ReportMetric(ms(addCPU.total())/n, "add-cpu-ms")
	b.ReportMetric(ms(delCPU.children)/n, "del-plugin-cpu-ms")
	b.ReportMetric(ms(delCPU.total())/n, "del-cpu-ms")
}

// rusage is CPU time (user + system) of this process and of its waited-for
// children (and theirs).
type rusage struct{ self, children time.Duration }

func cpuTime() rusage {
	get := func(who int) time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(who, &ru); err != nil {
			return 0
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return rusage{self: get(unix.RUSAGE_SELF), children: get(unix.RUSAGE_CHILDREN)}
}

func (r rusage) sub(o rusage) rusage  { return rusage{r.self - o.self, r.children - o.children} }
func (r rusage) add(o rusage) rusage  { return rusage{r.self + o.self, r.children + o.children} }
func (r rusage) total() time.Duration { return r.self + r.children }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func pct(d []time.Duration, p int) float64 {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return float64(s[i].Microseconds()) / 1000
}
