package inspect

import (
	"context"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/internal/testutil"
)

// BenchmarkCommands10kServices measures reading and printing the pinned
// state of 10,000 frontends with 2 backends each (30,000 services-map
// entries): how long `waggle bpf` takes on a big node, excluding process
// start. Run: go test -run '^$' -bench Commands10k ./dataplane/ebpf/inspect
func BenchmarkCommands10kServices(b *testing.B) {
	testutil.RequiresRoot(b)
	testutil.RequiresKernelFeature(b, testutil.CgroupSockAddr)
	cg := testutil.NewCgroup(b)
	node := testutil.UniqueName("bench")
	dir := filepath.Join(testPinRoot, node)
	b.Cleanup(func() {
		ebpf.CleanupPinned(dir)
		os.Remove(testPinRoot)
	})
	be, err := ebpf.New(ebpf.Config{NodeName: node, CgroupPath: cg, PinDir: dir, MaxServices: 1 << 16, MaxBackends: 1 << 12})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	st := &dataplane.State{NodeName: node}
	for i := range 10000 {
		f := dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)}), Port: 80, Protocol: dataplane.TCP},
			Kind: dataplane.ClusterIP, Service: dataplane.ServicePortName{Namespace: "default", Name: "svc"}}
		for j := range 2 {
			f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 1, byte(i % 200), byte(j + 1)}), Port: 8080})
		}
		st.Frontends = append(st.Frontends, f)
	}
	if err := be.Sync(context.Background(), st); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cmd  []string
	}{
		{"status", []string{"status"}},
		{"lb-list", []string{"lb", "list"}},
		{"lb-get", []string{"lb", "get", "10.100.39.15:80"}},
		{"map-dump-raw", []string{"map", "dump", ebpf.MapServices, "--raw"}},
	} {
		cmd := c.cmd
		b.Run(c.name, func(b *testing.B) {
			cfg, err := ParseArgs(append(cmd, "--pin-dir", dir), io.Discard)
			if err != nil {
				b.Fatal(err)
			}
			cfg.Out = io.Discard
			for b.Loop() {
				if err := Run(context.Background(), cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
