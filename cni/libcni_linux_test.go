package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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

// TestPluginExecutableReportsErrorsAsCNIJSON runs the plugin as a runtime
// does (environment + stdin) with bad input and checks the spec's error
// object on stdout, its exit status, and that nothing was created.
func TestPluginExecutableReportsErrorsAsCNIJSON(t *testing.T) {
	nodeNS := testutil.NewNetNS(t)
	pod := testutil.NewNetNS(t)
	plugin := filepath.Join(testPluginDir(t), PluginType)
	dataDir := t.TempDir()
	good := `{"cniVersion":"1.0.0","name":"exe-test","type":"waggle","podCIDR":"10.94.1.0/24","dataDir":"` + dataDir + `"}`
	for _, tc := range []struct {
		name, cmd, ifname, conf string
		code                    uint
	}{
		{"interface name with a path separator", "ADD", "../eth0", good, types.ErrInvalidEnvironmentVariables},
		{"malformed config", "ADD", "eth0", `{"cniVersion":"1.0.0","name":`, types.ErrDecodingFailure},
		{"missing podCIDR", "ADD", "eth0", `{"cniVersion":"1.0.0","name":"exe-test","type":"waggle"}`, types.ErrInvalidNetworkConfig},
		{"invalid podCIDR", "ADD", "eth0", `{"cniVersion":"1.0.0","name":"exe-test","type":"waggle","podCIDR":"10.94.1.0/40"}`, types.ErrInvalidNetworkConfig},
		{"network name with a path separator", "ADD", "eth0", `{"cniVersion":"1.0.0","name":"a/b","type":"waggle","podCIDR":"10.94.1.0/24"}`, types.ErrInvalidNetworkConfig},
		{"unsupported version", "ADD", "eth0", `{"cniVersion":"0.2.0","name":"exe-test","type":"waggle","podCIDR":"10.94.1.0/24"}`, types.ErrIncompatibleCNIVersion},
		{"GC on a 1.0.0 config", "GC", "eth0", good, types.ErrIncompatibleCNIVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := exec.Command("ip", "netns", "exec", nodeNS.Name, plugin)
			c.Env = append(os.Environ(), "CNI_COMMAND="+tc.cmd, "CNI_CONTAINERID=exe1", "CNI_NETNS="+pod.Path(),
				"CNI_IFNAME="+tc.ifname, "CNI_PATH="+filepath.Dir(plugin))
			c.Stdin = strings.NewReader(tc.conf)
			out, err := c.Output()
			if err == nil {
				t.Fatalf("plugin exited 0 on bad input:\n%s", out)
			}
			var e types.Error
			if jerr := json.Unmarshal(out, &e); jerr != nil || e.Code != tc.code || e.Msg == "" {
				t.Fatalf("stdout %q: want a CNI error object with code %d and a message (%v)", out, tc.code, jerr)
			}
		})
	}
	if ls := links(t, nodeNS); len(ls) != 1 {
		t.Fatalf("bad input created links on the node: %v", ls)
	}
	if ls := links(t, pod); len(ls) != 1 {
		t.Fatalf("bad input created links in the pod: %v", ls)
	}
	if ents, _ := os.ReadDir(dataDir); len(ents) != 0 {
		t.Fatalf("bad input created IPAM state: %v", ents)
	}

	// VERSION needs no config and lists the spec versions.
	c := exec.Command(plugin)
	c.Env = append(os.Environ(), "CNI_COMMAND=VERSION")
	c.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
	out, err := c.Output()
	if err != nil || !strings.Contains(string(out), `"supportedVersions":["0.4.0","1.0.0","1.1.0"]`) {
		t.Fatalf("VERSION: %v\n%s", err, out)
	}
}

// TestConcurrentPluginProcessesGetDistinctAddresses runs 50 ADDs as 50
// plugin processes at once through libcni: the IPAM lock works across
// processes, not only across goroutines.
func TestConcurrentPluginProcessesGetDistinctAddresses(t *testing.T) {
	const count = 50
	nodeNS := testutil.NewNetNS(t)
	dataDir := t.TempDir()
	raw, _ := ConfList(netip.MustParsePrefix("10.95.1.0/24"), netip.Prefix{}, WithDataDir(dataDir), WithName("procs"))
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	cn := libcni.NewCNIConfigWithCacheDir([]string{testPluginDir(t)}, t.TempDir(), nil)
	pods := make([]*testutil.NetNS, count)
	for i := range pods {
		pods[i] = testutil.NewNetNS(t)
	}
	rt := func(i int) *libcni.RuntimeConf {
		return &libcni.RuntimeConf{ContainerID: fmt.Sprintf("proc-%d", i), NetNS: pods[i].Path(), IfName: "eth0"}
	}
	addrs := make([]string, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = nodeNS.Do(func(ns.NetNS) error {
				res, err := cn.AddNetworkList(context.Background(), list, rt(i))
				if err != nil {
					return err
				}
				r, err := current.NewResultFromResult(res)
				if err == nil {
					addrs[i] = r.IPs[0].Address.IP.String()
				}
				return err
			})
		}()
	}
	wg.Wait()
	seen := map[string]int{}
	for i := range count {
		if errs[i] != nil {
			t.Fatalf("ADD %d: %v", i, errs[i])
		}
		if j, dup := seen[addrs[i]]; dup {
			t.Fatalf("plugin processes %d and %d got the same %s", i, j, addrs[i])
		}
		seen[addrs[i]] = i
	}
	for i := range count {
		if err := nodeNS.Do(func(ns.NetNS) error { return cn.DelNetworkList(context.Background(), list, rt(i)) }); err != nil {
			t.Fatal(err)
		}
	}
	assertNothingLeft(t, &node{ns: nodeNS, dataDir: dataDir, name: "procs"}, pods...)
}
