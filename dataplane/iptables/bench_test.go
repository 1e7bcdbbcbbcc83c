package iptables_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/waggle-io/waggle/dataplane/iptables"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/internal/testutil"
)

// bigState is services ClusterIP services with backends endpoints each.
func bigState(services, backends int) *dataplane.State {
	st := &dataplane.State{NodeName: "bench"}
	for i := range services {
		f := dataplane.Frontend{
			FrontendKey: dataplane.FrontendKey{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Protocol: dataplane.TCP},
			Kind:        dataplane.ClusterIP,
			Service:     dataplane.ServicePortName{Namespace: "bench", Name: "svc", Port: "p"},
		}
		for j := range backends {
			n := i*backends + j
			f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(n >> 8), byte(n)}), Port: 8080})
		}
		st.Frontends = append(st.Frontends, f)
	}
	return st
}

// BenchmarkRender10kServices measures building the iptables-restore input
// for 10,000 services × 10 endpoints (no kernel).
func BenchmarkRender10kServices(b *testing.B) {
	st := bigState(10000, 10)
	b.ResetTimer()
	for range b.N {
		_ = iptables.Render(st, iptables.IPv4, iptables.RenderOptions{}).RestoreInput()
	}
}

// BenchmarkRealSync10kServices measures a full sync of 10,000 services × 10
// endpoints from scratch into a fresh network namespace (root), and then a
// partial sync after one endpoint changed.
//
//	sudo go test -run '^$' -bench RealSync -benchtime 1x ./dataplane/iptables/
func BenchmarkRealSync10kServices(b *testing.B) {
	testutil.RequiresRoot(b)
	testutil.RequiresBinary(b, "iptables-restore")
	n := testutil.NewNetNS(b)
	st := bigState(10000, 10)
	ctx := context.Background()
	for range b.N {
		be, err := iptables.New(iptables.Config{NetNSPath: filepath.Join("/run/netns", n.Name)})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := be.Sync(ctx, st); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "full-sync-s")
		st.Frontends[0].Endpoints = st.Frontends[0].Endpoints[1:]
		start = time.Now()
		if err := be.Sync(ctx, st); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "partial-sync-s")
		if err := be.Cleanup(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
