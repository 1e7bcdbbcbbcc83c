package testutil

import (
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetNS is a named network namespace made for one test.
type NetNS struct {
	// Name is the name under /run/netns (usable with `ip netns exec`).
	Name string
	ns.NetNS
}

// NewNetNS creates a fresh named network namespace with its loopback up and
// removes it when t ends. It implies RequiresRoot.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	return NewNetNSNamed(t, "wgt")
}

// NewNetNSNamed is NewNetNS with the namespace's name starting with prefix
// (and a random suffix), so that a test's namespaces say whose and what they
// are in `ip netns list`.
func NewNetNSNamed(t testing.TB, prefix string) *NetNS {
	t.Helper()
	RequiresRoot(t)
	name := UniqueName(prefix)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	h, err := ns.GetNS(filepath.Join("/run/netns", name))
	if err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close() })
	n := &NetNS{Name: name, NetNS: h}
	n.Run(t, "ip", "link", "set", "lo", "up")
	return n
}

// Run runs a command inside the namespace and fails t on error. It returns
// the combined output.
func (n *NetNS) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("in netns %s: %s %s: %v: %s", n.Name, name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// WaitLocalAddrs waits until the namespace routes each of addrs to itself
// (the route a lookup finds is of type local), as a connect to it needs.
//
// An IPv6 address is listed, and can be bound, as soon as `ip addr add`
// returns, but the kernel inserts its route in the local table afterwards,
// from its address-configuration work queue, even with nodad; on a loaded
// machine that can be after the test's first connect. Such a connect leaves
// on the address's prefix route instead (via lo a route the kernel discards
// on output), and a TCP connect then fails with ENETUNREACH at its first SYN
// retransmit, a second later. (An IPv4 address's local route is in place when
// the command returns: waiting for it costs one lookup.)
func (n *NetNS) WaitLocalAddrs(t testing.TB, addrs ...netip.Addr) {
	t.Helper()
	for _, a := range addrs {
		Eventually(t, 10*time.Second, func() error {
			return n.Do(func(ns.NetNS) error {
				rs, err := netlink.RouteGet(a.AsSlice())
				if err != nil {
					return fmt.Errorf("in netns %s: route get %s: %w", n.Name, a, err)
				}
				if len(rs) == 0 || rs[0].Type != unix.RTN_LOCAL {
					return fmt.Errorf("in netns %s: %s has no local route yet (%v)", n.Name, a, rs)
				}
				return nil
			})
		})
	}
}
