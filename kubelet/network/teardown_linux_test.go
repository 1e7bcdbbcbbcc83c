package network

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/internal/testutil"
)

// TestBusyNetNSKeepsTheAddress is the regression test of a pod whose
// network namespace cannot be removed: the namespace dir bind-mounted over
// itself after the namespace was made (what `ip netns` does to /run/netns)
// hides the namespace's mount, so unlinking it is EBUSY. TearDown must then
// fail with ErrNetNSBusy and never run CNI DEL (which would hand the address
// to another pod); once the dir is freed, a retry removes the namespace and
// releases the address.
func TestBusyNetNSKeepsTheAddress(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	nsDir, bin, conf := filepath.Join(dir, "netns"), filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	calls := filepath.Join(dir, "calls")
	for _, d := range []string{nsDir, bin, conf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A plugin that records what it is asked and answers like a plugin with
	// no address: enough to see whether DEL ran.
	script := "#!/bin/sh\necho \"$CNI_COMMAND netns=$CNI_NETNS\" >> " + calls + "\n" +
		"[ \"$CNI_COMMAND\" = VERSION ] && echo '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"1.0.0\"]}'\nexit 0\n"
	if err := os.WriteFile(filepath.Join(bin, "recorder"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "10-rec.conflist"), []byte(`{"cniVersion":"1.0.0","name":"rec","plugins":[{"type":"recorder"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c := NewCNI(CNIOptions{ConfDir: conf, BinDirs: []string{bin}, CacheDir: filepath.Join(dir, "cache"), NetNSDir: nsDir})
	pod := Pod{UID: "u1", Namespace: "default", Name: "busy"}
	sb := Sandbox{NetNS: filepath.Join(nsDir, "waggle-u1"), ContainerID: "u1"}
	if err := createNetNS(sb.NetNS); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(nsDir, nsDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	bound := true
	unbind := func() {
		if bound {
			unix.Unmount(nsDir, unix.MNT_DETACH)
			bound = false
		}
	}
	t.Cleanup(func() { unbind(); RemoveNetNS(sb.NetNS) })

	err := c.TearDown(context.Background(), pod, sb)
	if !errors.Is(err, ErrNetNSBusy) {
		t.Fatalf("TearDown of a busy netns = %v, want ErrNetNSBusy", err)
	}
	if b, _ := os.ReadFile(calls); strings.Contains(string(b), "DEL") {
		t.Fatalf("CNI DEL ran (the address was released) while the namespace could not be removed:\n%s", b)
	}
	unbind()
	if err := c.TearDown(context.Background(), pod, sb); err != nil {
		t.Fatalf("TearDown once the netns is free: %v", err)
	}
	if _, err := os.Stat(sb.NetNS); !os.IsNotExist(err) {
		t.Errorf("netns file left: %v", err)
	}
	if b, _ := os.ReadFile(calls); !strings.Contains(string(b), "DEL netns=\n") {
		t.Errorf("CNI DEL (without the removed netns) did not run after the retry:\n%s", b)
	}
}
