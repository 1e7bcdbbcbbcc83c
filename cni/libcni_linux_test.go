package cni

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/waggle-io/waggle/internal/testutil"
)

// testPluginDir is a CNI_PATH holding "waggle": this test binary, which acts
// as the plugin through skel when run with CNI_COMMAND (see TestMain).
func testPluginDir(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(exe, filepath.Join(dir, PluginType)); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLibcniDrivesThePlugin(t *testing.T) {
	for _, v := range []string{"1.0.0", "0.4.0"} {
		t.Run("cniVersion "+v, func(t *testing.T) {
			nodeNS := testutil.NewNetNS(t)
			pod := testutil.NewNetNS(t)
			dataDir := t.TempDir()
			raw, err := ConfList(netip.MustParsePrefix("10.91.1.0/24"), netip.MustParsePrefix("10.91.0.0/16"),
				WithCNIVersion(v), WithDataDir(dataDir), WithName("libcni-test"))
			if err != nil {
				t.Fatal(err)
			}
			list, err := libcni.ConfListFromBytes(raw)
			if err != nil {
				t.Fatal(err)
			}
			cn := libcni.NewCNIConfigWithCacheDir([]string{testPluginDir(t)}, t.TempDir(), nil)
			rt := &libcni.RuntimeConf{ContainerID: "libcni-1", NetNS: pod.Path(), IfName: "eth0"}
			ctx := context.Background()
			do := func(f func() error) error { return nodeNS.Do(func(ns.NetNS) error { return f() }) }

			var res types.Result
			if err := do(func() (err error) { res, err = cn.AddNetworkList(ctx, list, rt); return err }); err != nil {
				t.Fatalf("libcni ADD: %v", err)
			}
			if res.Version() != v {
				t.Fatalf("result version %s, want %s", res.Version(), v)
			}
			r100, err := current.NewResultFromResult(res)
			if err != nil || len(r100.IPs) != 1 || !strings.HasPrefix(r100.IPs[0].Address.String(), "10.91.1.") {
				t.Fatalf("ADD result %v, %v", res, err)
			}
			if err := do(func() error { return cn.CheckNetworkList(ctx, list, rt) }); err != nil {
				t.Fatalf("libcni CHECK of a healthy pod: %v", err)
			}
			pod.Run(t, "ip", "route", "del", "default")
			if err := do(func() error { return cn.CheckNetworkList(ctx, list, rt) }); err == nil {
				t.Fatal("libcni CHECK passed without the default route")
			}
			if v == "1.0.0" {
				if err := do(func() error { return cn.GetStatusNetworkList(ctx, list) }); err != nil {
					t.Fatalf("libcni STATUS: %v", err)
				}
			}
			if err := do(func() error { return cn.DelNetworkList(ctx, list, rt) }); err != nil {
				t.Fatalf("libcni DEL: %v", err)
			}
			if err := do(func() error { return cn.DelNetworkList(ctx, list, rt) }); err != nil {
				t.Fatalf("repeated libcni DEL: %v", err)
			}
			n := &node{ns: nodeNS, dataDir: dataDir, name: "libcni-test"}
			assertNothingLeft(t, n, pod)
		})
	}
}

func TestLibcniGCReleasesWhatIsNotValid(t *testing.T) {
	nodeNS := testutil.NewNetNS(t)
	keep, drop := testutil.NewNetNS(t), testutil.NewNetNS(t)
	dataDir := t.TempDir()
	raw, _ := ConfList(netip.MustParsePrefix("10.92.1.0/24"), netip.Prefix{}, WithDataDir(dataDir), WithName("gc-test"), WithCNIVersion("1.1.0"))
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	cn := libcni.NewCNIConfigWithCacheDir([]string{testPluginDir(t)}, t.TempDir(), nil)
	ctx := context.Background()
	rtKeep := &libcni.RuntimeConf{ContainerID: "keep", NetNS: keep.Path(), IfName: "eth0"}
	rtDrop := &libcni.RuntimeConf{ContainerID: "drop", NetNS: drop.Path(), IfName: "eth0"}
	err = nodeNS.Do(func(ns.NetNS) error {
		for _, rt := range []*libcni.RuntimeConf{rtKeep, rtDrop} {
			if _, err := cn.AddNetworkList(ctx, list, rt); err != nil {
				return err
			}
		}
		return cn.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	if ls := links(t, drop); len(ls) != 1 {
		t.Fatalf("GC left the dropped pod's links %v", ls)
	}
	if err := nodeNS.Do(func(ns.NetNS) error { return cn.CheckNetworkList(ctx, list, rtKeep) }); err != nil {
		t.Fatalf("GC broke the valid attachment: %v", err)
	}
	nodeNS.Do(func(ns.NetNS) error { return cn.DelNetworkList(ctx, list, rtKeep) })
	assertNothingLeft(t, &node{ns: nodeNS, dataDir: dataDir, name: "gc-test"}, keep, drop)
}

// TestCnitoolDrivesTheBuiltPlugin builds cnitool from the cni module and the
// real cmd/waggle-cni, and runs add, check, status and del.
func TestCnitoolDrivesTheBuiltPlugin(t *testing.T) {
	testutil.RequiresRoot(t)
	goBin := testutil.RequiresBinary(t, "go")
	bin := t.TempDir()
	for pkg, out := range map[string]string{
		"github.com/containernetworking/cni/cnitool": "cnitool",
		"github.com/waggle-io/waggle/cmd/waggle-cni": PluginType,
	} {
		if b, err := exec.Command(goBin, "build", "-o", filepath.Join(bin, out), pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	nodeNS := testutil.NewNetNS(t)
	pod := testutil.NewNetNS(t)
	dataDir := t.TempDir()
	netName := testutil.UniqueName("cnitool-")
	raw, err := ConfList(netip.MustParsePrefix("10.93.1.0/24"), netip.MustParsePrefix("10.93.0.0/16"),
		WithDataDir(dataDir), WithName(netName), WithCNIVersion("1.1.0"))
	if err != nil {
		t.Fatal(err)
	}
	confDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(confDir, "10-waggle.conflist"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	// cnitool keeps libcni's result cache in /var/lib/cni; DEL removes it, and
	// so does this cleanup if the test fails half-way.
	t.Cleanup(func() {
		m, _ := filepath.Glob(filepath.Join(libcni.CacheDir, "results", netName+"-*"))
		for _, f := range m {
			os.Remove(f)
		}
	})
	run := func(cmd string) (string, error) {
		c := exec.Command("ip", "netns", "exec", nodeNS.Name, filepath.Join(bin, "cnitool"), cmd, netName, pod.Path())
		c.Env = append(os.Environ(), "NETCONFPATH="+confDir, "CNI_PATH="+bin)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	out, err := run("add")
	if err != nil || !strings.Contains(out, "10.93.1.") {
		t.Fatalf("cnitool add: %v\n%s", err, out)
	}
	for _, cmd := range []string{"check", "status"} {
		if out, err := run(cmd); err != nil {
			t.Fatalf("cnitool %s: %v\n%s", cmd, err, out)
		}
	}
	pod.Run(t, "ip", "addr", "flush", "dev", "eth0")
	if out, err := run("check"); err == nil {
		t.Fatalf("cnitool check passed without the pod's address:\n%s", out)
	}
	if out, err := run("del"); err != nil {
		t.Fatalf("cnitool del: %v\n%s", err, out)
	}
	assertNothingLeft(t, &node{ns: nodeNS, dataDir: dataDir, name: netName}, pod)
}
