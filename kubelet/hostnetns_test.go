package kubelet

import (
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/internal/testutil"
)

// TestHostNetNSNamesTheKubeletsNamespaceForGood: outside the init network
// namespace, hostNetNS names the namespace the kubelet was in when it
// asked, and keeps naming it after the asking thread switched to another
// (as in-process CNI and probe code does for a moment) — which
// /proc/<pid>/ns/net, the main thread's namespace of the moment, does not.
func TestHostNetNSNamesTheKubeletsNamespaceForGood(t *testing.T) {
	testutil.RequiresRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	node, err := netns.New() // creates and enters it (this thread only)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	defer netns.Set(orig)

	path, f := hostNetNS()
	if f == nil || path == "" {
		t.Fatalf("hostNetNS in a non-init namespace = %q: want the namespace's path", path)
	}
	defer f.Close()
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	var got, want unix.Stat_t
	if err := unix.Stat(path, &got); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(node), &want); err != nil {
		t.Fatal(err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		t.Fatalf("%s is no longer the node's namespace once the thread switched back", path)
	}

	// In the init namespace (as on a real node) it is "": the runtime's own.
	if root, err := netns.GetFromPath("/proc/1/ns/net"); err == nil {
		defer root.Close()
		if root.Equal(orig) {
			if p, f := hostNetNS(); p != "" || f != nil {
				t.Fatalf("hostNetNS in the init namespace = %q, want \"\"", p)
			}
		}
	}
}
