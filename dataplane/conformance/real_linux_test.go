package conformance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/iptables"
	"github.com/waggle-io/waggle/dataplane/ipvs"
	"github.com/waggle-io/waggle/internal/testutil"
)

func TestRealIPTables(t *testing.T) { realIPTables(t, 0) }

// TestRealIPTablesCompact runs the suite with the compact layout whenever
// a state has more than one endpoint (so cases also switch layouts).
func TestRealIPTablesCompact(t *testing.T) { realIPTables(t, 1) }

func realIPTables(t *testing.T, compactAbove int) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "iptables-restore")
	testutil.RequiresBinary(t, "nsenter")
	tp := NewTopology(t) // shared by the cases; each starts from no conntrack state
	Run(t, func(t *testing.T) *Target {
		tp.Reset(t)
		path := filepath.Join("/run/netns", tp.Node.Name)
		b, err := iptables.New(iptables.Config{NetNSPath: path, CompactAbove: compactAbove, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b.Cleanup(context.Background()); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
		runner := &iptables.ExecRunner{NetNSPath: path}
		return &Target{
			Backend: b, Endpoints: testEPs, Endpoints6: Endpoints6, NodeIP: nodeIP, Connect: tp.Connect, UDPFlow: tp.UDPFlow,
			Dump: func() string {
				var out string
				for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
					for _, table := range []string{"filter", "nat"} {
						d, err := runner.Save(context.Background(), fam, table)
						if err != nil {
							return fmt.Sprintf("iptables-save: %v", err)
						}
						out += waggleLines(string(d))
					}
				}
				return out
			},
		}
	})
}

func TestRealEBPF(t *testing.T) {
	testutil.RequiresKernelFeature(t, testutil.CgroupSockAddr)
	testutil.RequiresKernelFeature(t, testutil.BTF)
	tp := NewTopology(t) // shared by the cases; each starts from no conntrack state
	Run(t, func(t *testing.T) *Target {
		tp.Reset(t)
		cg := testutil.NewCgroup(t)
		node := testutil.UniqueName("conf")
		pin := filepath.Join("/sys/fs/bpf/waggle-conformance", node)
		b, err := ebpf.New(ebpf.Config{NodeName: node, CgroupPath: cg, PinDir: pin,
			MaxServices: 1024, MaxBackends: 1024, MaxAffinity: 1024, MaxReverseSockets: 1024,
			Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b.Cleanup(context.Background()); err != nil && !errors.Is(err, ebpf.ErrClosed) {
				t.Errorf("cleanup: %v", err)
			}
			ebpf.CleanupPinned(pin)
			syscall.Rmdir("/sys/fs/bpf/waggle-conformance")
		})
		testutil.EnterCgroup(t, cg)
		return &Target{Backend: b, Endpoints: testEPs, Endpoints6: Endpoints6, NodeIP: nodeIP, Connect: tp.Connect, UDPFlow: tp.UDPFlow}
	})
}

// TestRealIPVS runs the suite on a kernel with IPVS (skipped, with the
// reason, where there is none, as on Waggle's CI machine).
func TestRealIPVS(t *testing.T) {
	testutil.RequiresKernelFeature(t, testutil.IPVS)
	tp := NewTopology(t) // shared by the cases; each starts from no conntrack state
	Run(t, func(t *testing.T) *Target {
		tp.Reset(t)
		path := filepath.Join("/run/netns", tp.Node.Name)
		b, err := ipvs.New(ipvs.Config{NetNSPath: path, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b.Cleanup(context.Background()); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
		return &Target{Backend: b, Endpoints: testEPs, Endpoints6: Endpoints6, NodeIP: nodeIP, Connect: tp.Connect}
	})
}
