package cni

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"
)

// BenchmarkAddDel measures ADD and DEL latency through the plugin's functions
// in process (the binary adds ~2 ms of process start), on a node netns with
// masquerading on and off (one nft exec per ADD), one pod netns reused, and reports p50/p99 of each. It
// checks that the cycles leave nothing behind. Run the 1,000-cycle form with
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
	b.StopTimer()
	assertNothingLeft(b, n, pod)
	b.ReportMetric(pct(adds, 50), "add-p50-ms")
	b.ReportMetric(pct(adds, 99), "add-p99-ms")
	b.ReportMetric(pct(dels, 50), "del-p50-ms")
	b.ReportMetric(pct(dels, 99), "del-p99-ms")
}

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
