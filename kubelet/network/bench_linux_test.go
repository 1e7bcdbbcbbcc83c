package network

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	wcni "github.com/waggle-io/waggle/cni"
	"github.com/waggle-io/waggle/internal/testutil"
)

// BenchmarkSetUpTearDown is a pod's network as the kubelet makes it: SetUp
// (a netns bind-mounted in a dir, CNI ADD through libcni running the real
// waggle-cni built from cmd/waggle-cni) and TearDown (the netns removed,
// CNI DEL), one pod at a time on a node netns. It reports each step's p50
// and CPU time (user + system): "plugin" is the plugin process and what it
// runs (its rusage as a waited-for child), the other adds this process's
// share (libcni, the netns). The kernel's work in its own threads (the
// netns freed by a workqueue, RCU) is in neither.
//
//	WAGGLE_PRIVILEGED_TESTS=1 go test -run '^$' -bench SetUpTearDown -benchtime 300x ./kubelet/network/
func BenchmarkSetUpTearDown(b *testing.B) {
	testutil.RequiresRoot(b)
	goBin := testutil.RequiresBinary(b, "go")
	dir := b.TempDir()
	bin := filepath.Join(dir, "bin")
	if out, err := exec.Command(goBin, "build", "-o", filepath.Join(bin, wcni.PluginType), "github.com/waggle-io/waggle/cmd/waggle-cni").CombinedOutput(); err != nil {
		b.Fatalf("go build cmd/waggle-cni: %v\n%s", err, out)
	}
	confDir := filepath.Join(dir, "net.d")
	if _, err := WriteConfig(confDir, netip.MustParsePrefix("10.97.0.0/22"), netip.MustParsePrefix("10.97.0.0/16"),
		wcni.WithDataDir(filepath.Join(dir, "ipam")), wcni.WithName("bench-kubelet")); err != nil {
		b.Fatal(err)
	}
	c := NewCNI(CNIOptions{ConfDir: confDir, BinDirs: []string{bin}, CacheDir: filepath.Join(dir, "cache"),
		NetNSDir: filepath.Join(dir, "netns"), NetNSPrefix: "wgbench-"})
	node := testutil.NewNetNS(b)
	ctx := context.Background()
	var ups, downs []time.Duration
	var upCPU, downCPU [2]time.Duration // self, children
	b.ResetTimer()
	for i := range b.N {
		pod := Pod{UID: fmt.Sprintf("bench-%d", i), Namespace: "default", Name: fmt.Sprintf("p%d", i)}
		var sb Sandbox
		s0, c0, t0 := rusageOf(unix.RUSAGE_SELF), rusageOf(unix.RUSAGE_CHILDREN), time.Now()
		err := node.Do(func(ns.NetNS) (err error) { sb, err = c.SetUp(ctx, pod); return err })
		if err != nil {
			b.Fatalf("pod %d SetUp: %v", i, err)
		}
		s1, c1, t1 := rusageOf(unix.RUSAGE_SELF), rusageOf(unix.RUSAGE_CHILDREN), time.Now()
		if err := node.Do(func(ns.NetNS) error { return c.TearDown(ctx, pod, sb) }); err != nil {
			b.Fatalf("pod %d TearDown: %v", i, err)
		}
		s2, c2, t2 := rusageOf(unix.RUSAGE_SELF), rusageOf(unix.RUSAGE_CHILDREN), time.Now()
		ups, downs = append(ups, t1.Sub(t0)), append(downs, t2.Sub(t1))
		upCPU[0], upCPU[1] = upCPU[0]+s1-s0, upCPU[1]+c1-c0
		downCPU[0], downCPU[1] = downCPU[0]+s2-s1, downCPU[1]+c2-c1
	}
	b.StopTimer()
	n := float64(b.N)
	msOf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(p50(ups), "setup-p50-ms")
	b.ReportMetric(p50(downs), "teardown-p50-ms")
	b.ReportMetric(msOf(upCPU[1])/n, "setup-plugin-cpu-ms")
	b.ReportMetric(msOf(upCPU[0]+upCPU[1])/n, "setup-cpu-ms")
	b.ReportMetric(msOf(downCPU[1])/n, "teardown-plugin-cpu-ms")
	b.ReportMetric(msOf(downCPU[0]+downCPU[1])/n, "teardown-cpu-ms")
}

func rusageOf(who int) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func p50(d []time.Duration) float64 {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[len(s)/2].Microseconds()) / 1000
}
