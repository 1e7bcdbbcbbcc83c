package cni

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/internal/testutil"
)

// TestPluginBinaryStaysLean: the runtime starts waggle-cni twice per pod
// (ADD, DEL), so what it links is paid in process start, package init and
// page faults on every pod. It must not pull in the Kubernetes client,
// etcd, or nftables and iptables libraries (masquerading execs nft only
// when the chain must be written; reading it is a netlink dump).
func TestPluginBinaryStaysLean(t *testing.T) {
	goBin := testutil.RequiresBinary(t, "go")
	out, err := exec.Command(goBin, "list", "-deps", "github.com/waggle-io/waggle/cmd/waggle-cni").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"k8s.io/", "sigs.k8s.io/", "go.etcd.io/", "google.golang.org/grpc",
			"github.com/google/nftables", "github.com/coreos/go-iptables",
			"github.com/containernetworking/plugins/pkg/ip", "github.com/containernetworking/plugins/pkg/utils",
			"github.com/containernetworking/cni/pkg/invoke",
		} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("cmd/waggle-cni links %s", pkg)
			}
		}
	}
}
