package ebpf

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
)

// BenchmarkConnectHook times the connect hook's share of a connect(): a
// UDP socket connected to a frontend of nb backends (translated: master
// entry, then the backend — plus a slot entry when the backends are not
// inline) against one connected to a backend directly (the hook's miss),
// socket creation and close included in both. No packet is sent.
// hook-ns/op is the connect4 program's own run time per call (the kernel's
// BPF_STATS_RUN_TIME), which the machine's load moves far less than ns/op.
func BenchmarkConnectHook(b *testing.B) {
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Skipf("BPF run-time stats: %v", err)
	}
	defer stats.Close()
	for _, nb := range []int{10, inlineBackends + 4} {
		e := newEnv(b)
		bes := e.backends(nb, 8080, false)
		e.sync(state(frontend("10.96.0.10:53", dataplane.UDP, bes...)))
		for _, c := range []struct {
			name string
			to   netip.AddrPort
		}{{"direct", ap(bes[0])}, {"frontend", ap("10.96.0.10:53")}} {
			b.Run(fmt.Sprintf("%d-backends/%s", nb, c.name), func(b *testing.B) {
				prog := e.b.objs.WaggleConnect4
				st0, err := prog.Stats()
				if err != nil {
					b.Fatal(err)
				}
				err = e.in(func() error {
					raddr := net.UDPAddrFromAddrPort(c.to)
					for b.Loop() {
						conn, err := net.DialUDP("udp4", nil, raddr)
						if err != nil {
							return err
						}
						conn.Close()
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				st1, err := prog.Stats()
				if err != nil {
					b.Fatal(err)
				}
				if n := st1.RunCount - st0.RunCount; n > 0 {
					b.ReportMetric(float64((st1.Runtime-st0.Runtime).Nanoseconds())/float64(n), "hook-ns/op")
				}
			})
		}
	}
}
