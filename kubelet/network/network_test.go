package network

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/waggle-io/waggle/internal/testutil"
)

func TestHollowAllocatesUniqueAddressesAndReleases(t *testing.T) {
	f := NewHollow(netip.MustParsePrefix("10.1.0.0/29"))
	ctx := context.Background()
	seen := map[string]bool{}
	for _, uid := range []string{"a", "b", "c", "d", "e", "f"} {
		sb, err := f.SetUp(ctx, Pod{UID: uid})
		if err != nil {
			t.Fatalf("pod %s: %v", uid, err)
		}
		if seen[sb.IPs[0]] {
			t.Fatalf("address %s handed out twice", sb.IPs[0])
		}
		seen[sb.IPs[0]] = true
	}
	if again, _ := f.SetUp(ctx, Pod{UID: "a"}); !seen[again.IPs[0]] {
		t.Error("a repeated SetUp gave a new address")
	}
	if _, err := f.SetUp(ctx, Pod{UID: "g"}); err == nil {
		t.Error("exhausted prefix still allocates")
	}
	f.TearDown(ctx, Pod{UID: "a"}, Sandbox{})
	if f.InUse() != 5 {
		t.Errorf("in use = %d, want 5", f.InUse())
	}
	if _, err := f.SetUp(ctx, Pod{UID: "g"}); err != nil {
		t.Errorf("released address not reused: %v", err)
	}
}

func TestHollowIsNotReadyUntilConfigured(t *testing.T) {
	h := NewHollow(netip.Prefix{})
	if h.Ready() == nil {
		t.Fatal("unconfigured hollow network is Ready")
	}
	if _, err := h.SetUp(context.Background(), Pod{UID: "a"}); err == nil {
		t.Fatal("unconfigured hollow network allocates")
	}
	if changed, _ := h.Configure([]netip.Prefix{netip.MustParsePrefix("10.2.3.0/24")}, nil); !changed || h.Ready() != nil {
		t.Fatalf("Configure: changed=%v ready=%v", changed, h.Ready())
	}
	sb, err := h.SetUp(context.Background(), Pod{UID: "a"})
	if err != nil || !netip.MustParsePrefix("10.2.3.0/24").Contains(netip.MustParseAddr(sb.IPs[0])) {
		t.Fatalf("SetUp = %v, %v", sb, err)
	}
	if changed, _ := h.Configure([]netip.Prefix{netip.MustParsePrefix("10.2.3.0/24")}, nil); changed {
		t.Error("the same prefix again counts as a change")
	}
}

func TestNetNSCreateRemove(t *testing.T) {
	testutil.RequiresRoot(t)
	p := filepath.Join(t.TempDir(), "ns1")
	if err := createNetNS(p); err != nil {
		t.Fatal(err)
	}
	if err := createNetNS(p); err != nil {
		t.Errorf("second create of the same netns: %v", err)
	}
	if err := RemoveNetNS(p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("netns file left: %v", err)
	}
	if err := RemoveNetNS(p); err != nil {
		t.Errorf("removing a removed netns: %v", err)
	}
}

func TestCNIWithoutConfigIsNotReady(t *testing.T) {
	c := NewCNI(CNIOptions{ConfDir: t.TempDir()})
	if err := c.Ready(); err == nil {
		t.Error("ready without any config")
	}
	if _, err := c.SetUp(context.Background(), Pod{UID: "x"}); err == nil {
		t.Error("set up without any config")
	}
}
