package testutil

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
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
