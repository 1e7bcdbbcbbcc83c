package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/waggle-io/waggle/cni/ipam"
	"github.com/waggle-io/waggle/internal/testutil"
)

// TestMain lets the test binary act as the plugin executable when a CNI
// runtime (libcni, cnitool) runs it, so those tests drive the real skel path.
func TestMain(m *testing.M) {
	if os.Getenv("CNI_COMMAND") != "" {
		skel.PluginMainFuncs(Funcs(), SupportedVersions, "waggle-cni (test binary)")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// node is a simulated node: a fresh netns where the plugin runs.
type node struct {
	ns      *testutil.NetNS
	conf    []byte
	dataDir string
	name    string
	bridge  string
}

func newNode(t testing.TB, podCIDR, clusterCIDR string, extra map[string]any) *node {
	t.Helper()
	n := &node{ns: testutil.NewNetNS(t), dataDir: t.TempDir(), name: "wgtest", bridge: "waggle0"}
	c := map[string]any{"cniVersion": "1.0.0", "name": n.name, "type": "waggle", "podCIDR": podCIDR, "dataDir": n.dataDir}
	if clusterCIDR != "" {
		c["clusterCIDR"] = clusterCIDR
	}
	for k, v := range extra {
		c[k] = v
	}
	n.conf, _ = json.Marshal(c)
	return n
}

func (n *node) args(id, ifname string, pod *testutil.NetNS) *skel.CmdArgs {
	a := &skel.CmdArgs{ContainerID: id, IfName: ifname, StdinData: n.conf}
	if pod != nil {
		a.Netns = pod.Path()
	}
	return a
}

func (n *node) add(id, ifname string, pod *testutil.NetNS) (res *current.Result, err error) {
	err = n.ns.Do(func(ns.NetNS) error {
		r, _, err := Attach(n.args(id, ifname, pod))
		res = r
		return err
	})
	return res, err
}

func (n *node) mustAdd(t testing.TB, id, ifname string, pod *testutil.NetNS) *current.Result {
	t.Helper()
	res, err := n.add(id, ifname, pod)
	if err != nil {
		t.Fatalf("ADD %s/%s: %v", id, ifname, err)
	}
	return res
}

func (n *node) del(id, ifname string, pod *testutil.NetNS) error {
	return n.ns.Do(func(ns.NetNS) error { return Del(n.args(id, ifname, pod)) })
}

func (n *node) check(id, ifname string, pod *testutil.NetNS, prev *current.Result) error {
	a := n.args(id, ifname, pod)
	a.StdinData = withPrevResult(n.conf, prev)
	return n.ns.Do(func(ns.NetNS) error { return Check(a) })
}

func withPrevResult(conf []byte, prev *current.Result) []byte {
	var m map[string]any
	json.Unmarshal(conf, &m)
	m["prevResult"] = prev
	out, _ := json.Marshal(m)
	return out
}

func podAddr(t testing.TB, res *current.Result) netip.Addr {
	t.Helper()
	if len(res.IPs) == 0 {
		t.Fatal("result has no IPs")
	}
	a, _ := netip.AddrFromSlice(res.IPs[0].Address.IP)
	return a.Unmap()
}

// serve starts a TCP server in pod's netns that writes the caller's address
// back to each client, and returns its port.
func serve(t testing.TB, pod *testutil.NetNS, addr netip.Addr) int {
	t.Helper()
	var l net.Listener
	err := pod.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", pod.Name, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, c.RemoteAddr().String()+"\n")
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// dial connects from pod to addr:port with a timeout and returns the source
// address the server saw.
func dial(pod *testutil.NetNS, addr netip.Addr, port int) (seen string, err error) {
	err = pod.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, uint16(port)).String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		b, err := io.ReadAll(c)
		seen = strings.TrimSpace(string(b))
		return err
	})
	return seen, err
}

func links(t testing.TB, n *testutil.NetNS) []string {
	t.Helper()
	var names []string
	err := n.Do(func(ns.NetNS) error {
		ls, err := netlink.LinkList()
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	return names
}

func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// assertNothingLeft checks that no allocation, temporary file, host veth or
// pod interface is left on the node and in the pods.
func assertNothingLeft(t testing.TB, n *node, pods ...*testutil.NetNS) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(n.dataDir, n.name))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip.") {
			t.Errorf("IPAM store keeps %s", e.Name())
		}
	}
	for _, l := range links(t, n.ns) {
		if strings.HasPrefix(l, "wv") {
			t.Errorf("node keeps veth %s", l)
		}
	}
	for _, p := range pods {
		if ls := links(t, p); len(ls) != 1 || ls[0] != "lo" {
			t.Errorf("pod %s keeps links %v", p.Name, ls)
		}
	}
}

func TestTwoPodsOnOneNodeReachEachOtherUnmasqueraded(t *testing.T) {
	n := newNode(t, "10.77.1.0/24", "10.77.0.0/16", map[string]any{"mtu": 1400})
	a, b := testutil.NewNetNS(t), testutil.NewNetNS(t)
	ra := n.mustAdd(t, "pod-a", "eth0", a)
	rb := n.mustAdd(t, "pod-b", "eth0", b)
	ipA, ipB := podAddr(t, ra), podAddr(t, rb)
	if ipA == ipB {
		t.Fatalf("both pods got %s", ipA)
	}
	port := serve(t, b, ipB)
	seen, err := dial(a, ipB, port)
	if err != nil {
		t.Fatalf("pod a -> pod b %s:%d: %v", ipB, port, err)
	}
	if host, _, _ := net.SplitHostPort(seen); host != ipA.String() {
		t.Fatalf("pod b saw %s, want pod a's own address %s (no masquerade inside the cluster)", seen, ipA)
	}
	// The pod's end has the configured MTU and a default route via the gateway;
	// the host end is on the bridge with hairpin mode on.
	err = a.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if l.Attrs().MTU != 1400 {
			return fmt.Errorf("eth0 MTU %d, want 1400", l.Attrs().MTU)
		}
		rs, err := netlink.RouteGet(net.ParseIP("192.0.2.1"))
		if err != nil || len(rs) == 0 || !rs[0].Gw.Equal(net.ParseIP("10.77.1.1")) {
			return fmt.Errorf("route to 192.0.2.1 = %v, %v; want via 10.77.1.1", rs, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = n.ns.Do(func(ns.NetNS) error {
		host, err := netlink.LinkByName(ra.Interfaces[ifHost].Name)
		if err != nil {
			return err
		}
		pi, err := netlink.LinkGetProtinfo(host)
		if err != nil {
			return err
		}
		if !pi.Hairpin {
			return errors.New("hairpin mode is off on the bridge port")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestPodTrafficLeavingTheClusterIsMasqueraded(t *testing.T) {
	n := newNode(t, "10.78.1.0/24", "10.78.0.0/16", nil)
	ext := testutil.NewNetNS(t) // a host outside the cluster, with no route to the pods
	n.ns.Run(t, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1", "netns", ext.Name)
	n.ns.Run(t, "ip", "addr", "add", "192.168.77.1/24", "dev", "up0")
	n.ns.Run(t, "ip", "link", "set", "up0", "up")
	ext.Run(t, "ip", "addr", "add", "192.168.77.2/24", "dev", "up1")
	ext.Run(t, "ip", "link", "set", "up1", "up")
	pod := testutil.NewNetNS(t)
	n.mustAdd(t, "pod", "eth0", pod)
	port := serve(t, ext, netip.MustParseAddr("192.168.77.2"))
	seen, err := dial(pod, netip.MustParseAddr("192.168.77.2"), port)
	if err != nil {
		t.Fatalf("pod -> external host: %v", err)
	}
	if host, _, _ := net.SplitHostPort(seen); host != "192.168.77.1" {
		t.Fatalf("external host saw %s, want the node's 192.168.77.1", seen)
	}
	rules := n.ns.Run(t, "nft", "list", "table", "inet", MasqueradeTable)
	if !strings.Contains(rules, "ip saddr 10.78.1.0/24 ip daddr != 10.78.0.0/16") {
		t.Fatalf("masquerade chain:\n%s", rules)
	}
	if err := n.ns.Do(func(ns.NetNS) error { return RemoveMasquerade(n.name) }); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(n.ns, "nft", "list", "table", "inet", MasqueradeTable); err == nil {
		t.Fatalf("table survived RemoveMasquerade:\n%s", out)
	}
}

// TestRemoveMasqueradeKeepsOtherNetworksChains: with two networks on a
// node, removing one's chain leaves the table and the other's chain; the
// table goes with the last chain.
func TestRemoveMasqueradeKeepsOtherNetworksChains(t *testing.T) {
	a := newNode(t, "10.78.2.0/24", "10.78.0.0/16", nil)
	b := &node{ns: a.ns, dataDir: t.TempDir(), name: "wgtest2", bridge: "waggle1"}
	b.conf, _ = json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": b.name, "type": "waggle",
		"podCIDR": "10.78.3.0/24", "clusterCIDR": "10.78.0.0/16", "bridge": b.bridge, "dataDir": b.dataDir})
	pod := testutil.NewNetNS(t)
	for _, n := range []*node{a, b} {
		n.mustAdd(t, "c1", "eth1", pod)
		if err := n.del("c1", "eth1", pod); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ns.Do(func(ns.NetNS) error { return RemoveMasquerade(a.name) }); err != nil {
		t.Fatal(err)
	}
	out, err := execIn(a.ns, "nft", "list", "table", "inet", MasqueradeTable)
	if err != nil || strings.Contains(out, "masq-"+a.name+" ") || !strings.Contains(out, "masq-"+b.name+" ") {
		t.Fatalf("after removing %s's chain (%v):\n%s", a.name, err, out)
	}
	if err := a.ns.Do(func(ns.NetNS) error { return RemoveMasquerade(a.name) }); err != nil {
		t.Fatalf("removing a removed chain: %v", err)
	}
	if err := a.ns.Do(func(ns.NetNS) error { return RemoveMasquerade(b.name) }); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(a.ns, "nft", "list", "table", "inet", MasqueradeTable); err == nil {
		t.Fatalf("table survived its last chain:\n%s", out)
	}
	if err := a.ns.Do(func(ns.NetNS) error { return RemoveMasquerade(b.name) }); err != nil {
		t.Fatalf("removing from a missing table: %v", err)
	}
}

func execIn(n *testutil.NetNS, name string, args ...string) (string, error) {
	var out []byte
	err := n.Do(func(ns.NetNS) error {
		var err error
		out, err = execCommand(name, args...)
		return err
	})
	return string(out), err
}

func TestRepeatedAddReturnsTheSameAddress(t *testing.T) {
	n := newNode(t, "10.79.1.0/24", "", nil)
	pod := testutil.NewNetNS(t)
	first := podAddr(t, n.mustAdd(t, "c1", "eth0", pod))
	second := podAddr(t, n.mustAdd(t, "c1", "eth0", pod))
	if first != second {
		t.Fatalf("repeated ADD gave %s then %s", first, second)
	}
	if err := n.del("c1", "eth0", pod); err != nil {
		t.Fatal(err)
	}
	if err := n.del("c1", "eth0", pod); err != nil {
		t.Fatalf("second DEL: %v (must be idempotent)", err)
	}
	assertNothingLeft(t, n, pod)
}

// TestRepeatedAddKeepsTheHostVethMAC: the host end's MAC follows from its
// name (ADD reports it without asking the kernel), so a pod set up again
// gets the same MAC on the bridge, and the result and the link agree.
func TestRepeatedAddKeepsTheHostVethMAC(t *testing.T) {
	n := newNode(t, "10.79.2.0/24", "", nil)
	pod := testutil.NewNetNS(t)
	var macs []string
	for i := range 2 {
		res := n.mustAdd(t, "c1", "eth0", pod)
		err := n.ns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(res.Interfaces[ifHost].Name)
			if err != nil {
				return err
			}
			if got := l.Attrs().HardwareAddr.String(); got != res.Interfaces[ifHost].Mac {
				return fmt.Errorf("host veth MAC %s, the result says %s", got, res.Interfaces[ifHost].Mac)
			}
			if want := HostVethAlias([]netip.Addr{podAddr(t, res)}); l.Attrs().Alias != want {
				return fmt.Errorf("host veth alias %q, want %q", l.Attrs().Alias, want)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
		macs = append(macs, res.Interfaces[ifHost].Mac)
		if err := n.del("c1", "eth0", pod); err != nil {
			t.Fatal(err)
		}
	}
	if macs[0] != macs[1] {
		t.Fatalf("the host veth of the same attachment got MAC %s, then %s", macs[0], macs[1])
	}
	assertNothingLeft(t, n, pod)
}

// ruleHandles returns the handles of the rules of the network's masquerade
// chain ("" when the chain is missing) and the chain's listing.
func ruleHandles(t *testing.T, n *node) (string, string) {
	t.Helper()
	out, err := execIn(n.ns, "nft", "-a", "list", "chain", "inet", MasqueradeTable, "masq-"+n.name)
	if err != nil {
		return "", out
	}
	var hs []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "masquerade") && strings.Contains(l, "# handle ") {
			hs = append(hs, l[strings.LastIndex(l, "# handle ")+9:])
		}
	}
	return strings.Join(hs, ","), out
}

// TestMasqueradeChainIsWrittenOnlyWhenItDiffers: an ADD reads the chain
// back (cheaply, over netlink) and runs nft only when the chain is not as
// it would write it, so the rules of a healthy chain keep their handles
// across ADDs; a rule removed or added by hand, or a table deleted, is
// repaired by the next ADD.
func TestMasqueradeChainIsWrittenOnlyWhenItDiffers(t *testing.T) {
	n := newNode(t, "10.79.3.0/24", "10.79.0.0/16", nil)
	pod := testutil.NewNetNS(t)
	add := func(id string) {
		t.Helper()
		n.mustAdd(t, id, "eth0", pod)
		if err := n.del(id, "eth0", pod); err != nil {
			t.Fatal(err)
		}
	}
	add("c1")
	first, listing := ruleHandles(t, n)
	if first == "" || !strings.Contains(listing, "ip saddr 10.79.3.0/24 ip daddr != 10.79.0.0/16") {
		t.Fatalf("no masquerade rule after the first ADD:\n%s", listing)
	}
	add("c2")
	if again, listing := ruleHandles(t, n); again != first {
		t.Fatalf("a second ADD rewrote a healthy chain (rule handles %s, then %s):\n%s", first, again, listing)
	}

	for _, tc := range []struct{ name, script string }{
		{"rule removed", "delete rule inet " + MasqueradeTable + " masq-" + n.name + " handle " + first},
		{"rule added", "add rule inet " + MasqueradeTable + " masq-" + n.name + " counter"},
		{"table deleted", "delete table inet " + MasqueradeTable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := ruleHandles(t, n)
			if out, err := execIn(n.ns, "nft", tc.script); err != nil {
				t.Fatalf("nft %s: %v: %s", tc.script, err, out)
			}
			add("c3")
			after, listing := ruleHandles(t, n)
			if after == "" || after == before || strings.Contains(listing, "counter") ||
				strings.Count(listing, "masquerade comment") != 1 {
				t.Fatalf("the next ADD did not restore the chain (handles %s, then %s):\n%s", before, after, listing)
			}
		})
	}
	assertNothingLeft(t, n, pod)
}

func cycles(def int) int {
	if s := os.Getenv("WAGGLE_CNI_CYCLES"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n
		}
	}
	return def
}

// TestAddDelCyclesLeaveNothingBehind runs 1,000 ADD/DEL cycles, as the
// issue asks (WAGGLE_CNI_CYCLES overrides the count), through the plugin's
// functions in process.
func TestAddDelCyclesLeaveNothingBehind(t *testing.T) {
	n := newNode(t, "10.80.0.0/22", "", nil)
	pod := testutil.NewNetNS(t)
	for i := range cycles(1000) {
		id := fmt.Sprintf("cycle-%d", i)
		if _, err := n.add(id, "eth0", pod); err != nil {
			t.Fatalf("cycle %d ADD: %v", i, err)
		}
		if err := n.del(id, "eth0", pod); err != nil {
			t.Fatalf("cycle %d DEL: %v", i, err)
		}
	}
	assertNothingLeft(t, n, pod)
}

func TestConcurrentAddsGetDistinctAddresses(t *testing.T) {
	const count = 50
	n := newNode(t, "10.81.1.0/24", "10.81.0.0/16", nil)
	pods := make([]*testutil.NetNS, count)
	for i := range pods {
		pods[i] = testutil.NewNetNS(t)
	}
	addrs := make([]netip.Addr, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := n.add(fmt.Sprintf("c%d", i), "eth0", pods[i])
			errs[i] = err
			if err == nil {
				a, _ := netip.AddrFromSlice(res.IPs[0].Address.IP)
				addrs[i] = a.Unmap()
			}
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i := range count {
		if errs[i] != nil {
			t.Fatalf("ADD %d: %v", i, errs[i])
		}
		if j, dup := seen[addrs[i]]; dup {
			t.Fatalf("pods %d and %d share %s", i, j, addrs[i])
		}
		seen[addrs[i]] = i
	}
	for i := range count {
		if err := n.del(fmt.Sprintf("c%d", i), "eth0", pods[i]); err != nil {
			t.Fatal(err)
		}
	}
	assertNothingLeft(t, n, pods...)
}

func TestCheckDetectsARemovedAddressOrRoute(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, n *node, pod *testutil.NetNS, res *current.Result)
	}{
		{"default route removed", func(t *testing.T, n *node, pod *testutil.NetNS, res *current.Result) {
			pod.Run(t, "ip", "route", "del", "default")
		}},
		{"pod address removed", func(t *testing.T, n *node, pod *testutil.NetNS, res *current.Result) {
			pod.Run(t, "ip", "addr", "del", res.IPs[0].Address.String(), "dev", "eth0")
		}},
		{"gateway address removed from the bridge", func(t *testing.T, n *node, pod *testutil.NetNS, res *current.Result) {
			n.ns.Run(t, "ip", "addr", "del", "10.82.1.1/24", "dev", n.bridge)
		}},
		{"host veth detached from the bridge", func(t *testing.T, n *node, pod *testutil.NetNS, res *current.Result) {
			n.ns.Run(t, "ip", "link", "set", res.Interfaces[ifHost].Name, "nomaster")
		}},
		{"address released in the IPAM store", func(t *testing.T, n *node, pod *testutil.NetNS, res *current.Result) {
			os.Remove(filepath.Join(n.dataDir, n.name, podAddr(t, res).String()))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, "10.82.1.0/24", "", nil)
			pod := testutil.NewNetNS(t)
			res := n.mustAdd(t, "c1", "eth0", pod)
			if err := n.check("c1", "eth0", pod, res); err != nil {
				t.Fatalf("CHECK of a healthy attachment: %v", err)
			}
			tc.break_(t, n, pod, res)
			if err := n.check("c1", "eth0", pod, res); err == nil {
				t.Fatal("CHECK passed after the attachment was broken")
			} else if cniCode(err) == 0 {
				t.Fatalf("CHECK error without a CNI code: %v", err)
			}
		})
	}
}

func TestBadInputIsACNIErrorAndLeavesNothing(t *testing.T) {
	n := newNode(t, "10.83.1.0/24", "", nil)
	pod := testutil.NewNetNS(t)
	for _, tc := range []struct {
		name string
		args *skel.CmdArgs
		code uint
	}{
		{"interface name with a path separator", n.args("c1", "../eth0", pod), types.ErrInvalidEnvironmentVariables},
		{"container ID with a path separator", n.args("a/b", "eth0", pod), types.ErrInvalidEnvironmentVariables},
		{"missing netns", n.args("c1", "eth0", nil), types.ErrInvalidEnvironmentVariables},
		{"netns that does not exist", &skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/nope-waggle", StdinData: n.conf}, types.ErrInvalidNetNS},
		{"malformed config", &skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: pod.Path(), StdinData: []byte("{")}, types.ErrDecodingFailure},
		{"invalid CIDR", &skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: pod.Path(),
			StdinData: []byte(`{"cniVersion":"1.0.0","name":"wgtest","type":"waggle","podCIDR":"10.83.1.0/33"}`)}, types.ErrInvalidNetworkConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := n.ns.Do(func(ns.NetNS) error { _, _, err := Attach(tc.args); return err })
			if got := cniCode(err); got != tc.code {
				t.Fatalf("ADD error = %v (code %d), want code %d", err, got, tc.code)
			}
		})
	}
	os.MkdirAll(filepath.Join(n.dataDir, n.name), 0o755)
	assertNothingLeft(t, n, pod)
}

func TestExhaustedPoolIsTryAgainLaterAndRollsBack(t *testing.T) {
	n := newNode(t, "10.84.1.0/30", "", nil) // one pod address: .2
	p1, p2 := testutil.NewNetNS(t), testutil.NewNetNS(t)
	n.mustAdd(t, "c1", "eth0", p1)
	_, err := n.add("c2", "eth0", p2)
	if cniCode(err) != ErrCodePoolExhausted {
		t.Fatalf("ADD on a full pool = %v, want code %d", err, ErrCodePoolExhausted)
	}
	if err := n.ns.Do(func(ns.NetNS) error { return Status(n.args("", "", nil)) }); cniCode(err) != ErrPluginNotAvailable {
		t.Fatalf("STATUS on a full pool = %v, want code %d", err, ErrPluginNotAvailable)
	}
	if ls := links(t, p2); len(ls) != 1 {
		t.Fatalf("failed ADD left links in the pod: %v", ls)
	}
	if err := n.del("c1", "eth0", p1); err != nil {
		t.Fatal(err)
	}
	if err := n.ns.Do(func(ns.NetNS) error { return Status(n.args("", "", nil)) }); err != nil {
		t.Fatalf("STATUS with a free address: %v", err)
	}
	assertNothingLeft(t, n, p1, p2)
}

func TestFailedAddRollsBackAddressAndVeth(t *testing.T) {
	n := newNode(t, "10.85.1.0/24", "", nil)
	pod := testutil.NewNetNS(t)
	// The pod already has an eth0 that is not Waggle's: ADD must fail cleanly.
	pod.Run(t, "ip", "link", "add", "eth0", "type", "bridge")
	if _, err := n.add("c1", "eth0", pod); cniCode(err) != types.ErrInvalidEnvironmentVariables {
		t.Fatalf("ADD over a foreign eth0 = %v, want code %d", err, types.ErrInvalidEnvironmentVariables)
	}
	pod.Run(t, "ip", "link", "del", "eth0")
	assertNothingLeft(t, n, pod)
}

// TestCrashHalfWayIsCleanedByTheNextAddDelOrGC simulates an ADD killed after
// it allocated an address and created the veth pair but before it finished.
func TestCrashHalfWayIsCleanedByTheNextAddDelOrGC(t *testing.T) {
	crash := func(t *testing.T, n *node, pod *testutil.NetNS, id string) netip.Addr {
		st, err := ipam.Open(n.dataDir, n.name)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		st.Lock()
		a, err := st.Allocate(id, "eth0", netip.MustParsePrefix("10.86.1.0/24"), 0)
		st.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		// A half-written allocation (the writer died before the link).
		os.WriteFile(filepath.Join(n.dataDir, n.name, ".tmp-crashed"), []byte(id), 0o600)
		// The veth pair exists, unattached and down.
		pod.Run(t, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", HostVethName(n.name, id, "eth0"), "netns", n.ns.Name)
		return a
	}
	t.Run("next ADD", func(t *testing.T) {
		n := newNode(t, "10.86.1.0/24", "", nil)
		pod := testutil.NewNetNS(t)
		a := crash(t, n, pod, "c1")
		// The stale pair has the deterministic host name: ADD removes it first.
		if err := n.ns.Do(func(ns.NetNS) error { return deleteLink(HostVethName(n.name, "c1", "eth0")) }); err != nil {
			t.Fatal(err)
		}
		res := n.mustAdd(t, "c1", "eth0", pod)
		if podAddr(t, res) != a {
			t.Fatalf("ADD after a crash got %s, want the already allocated %s", podAddr(t, res), a)
		}
		n.del("c1", "eth0", pod)
		assertNothingLeft(t, n, pod)
	})
	t.Run("DEL", func(t *testing.T) {
		n := newNode(t, "10.86.1.0/24", "", nil)
		pod := testutil.NewNetNS(t)
		crash(t, n, pod, "c1")
		if err := n.del("c1", "eth0", pod); err != nil {
			t.Fatal(err)
		}
		assertNothingLeft(t, n, pod)
	})
	t.Run("GC", func(t *testing.T) {
		n := newNode(t, "10.86.1.0/24", "", nil)
		keep := testutil.NewNetNS(t)
		kept := n.mustAdd(t, "keep", "eth0", keep)
		pod := testutil.NewNetNS(t)
		crash(t, n, pod, "c1")
		n.ns.Run(t, "ip", "link", "set", HostVethName(n.name, "c1", "eth0"), "master", n.bridge)
		var gc map[string]any
		json.Unmarshal(n.conf, &gc)
		gc["cni.dev/valid-attachments"] = []map[string]string{{"containerID": "keep", "ifname": "eth0"}}
		conf, _ := json.Marshal(gc)
		if err := n.ns.Do(func(ns.NetNS) error { return GC(&skel.CmdArgs{StdinData: conf}) }); err != nil {
			t.Fatal(err)
		}
		if err := n.check("keep", "eth0", keep, kept); err != nil {
			t.Fatalf("GC broke a valid attachment: %v", err)
		}
		n.del("keep", "eth0", keep)
		assertNothingLeft(t, n, keep, pod)
	})
}

func TestDualStackPodGetsOneAddressPerFamily(t *testing.T) {
	n := newNode(t, "10.87.1.0/24", "10.87.0.0/16", map[string]any{"podCIDRs": []string{"fd00:87:1::/64"}, "clusterCIDRs": []string{"fd00:87::/32"}})
	a, b := testutil.NewNetNS(t), testutil.NewNetNS(t)
	ra := n.mustAdd(t, "a", "eth0", a)
	rb := n.mustAdd(t, "b", "eth0", b)
	if len(ra.IPs) != 2 || len(ra.Routes) != 2 {
		t.Fatalf("dual-stack result: %v", ra)
	}
	v6a, _ := netip.AddrFromSlice(ra.IPs[1].Address.IP)
	v6b, _ := netip.AddrFromSlice(rb.IPs[1].Address.IP)
	gw6, _ := netip.AddrFromSlice(ra.IPs[1].Gateway)
	// The plugin adds IPv6 addresses without duplicate address detection,
	// and the kernel routes them locally only after the RTM_NEWADDR returns
	// (testutil.NetNS.WaitLocalAddrs): the single dial below must not meet
	// that gap.
	a.WaitLocalAddrs(t, v6a)
	b.WaitLocalAddrs(t, v6b)
	n.ns.WaitLocalAddrs(t, gw6)
	port := serve(t, b, v6b)
	if _, err := dial(a, v6b, port); err != nil {
		t.Fatalf("pod a -> pod b over IPv6 %s: %v", v6b, err)
	}
	if err := n.check("a", "eth0", a, ra); err != nil {
		t.Fatal(err)
	}
	n.del("a", "eth0", a)
	n.del("b", "eth0", b)
	assertNothingLeft(t, n, a, b)
}

// TestPodReachesItselfThroughAServiceOnlyWithHairpin DNATs a Service-like
// address to the pod itself, as a proxy would: the packet comes back out of
// the bridge port it came in by, which the bridge allows only in hairpin mode.
func TestPodReachesItselfThroughAServiceOnlyWithHairpin(t *testing.T) {
	for _, hairpin := range []bool{true, false} {
		t.Run(fmt.Sprintf("hairpinMode=%v", hairpin), func(t *testing.T) {
			n := newNode(t, "10.88.1.0/24", "10.88.0.0/16", map[string]any{"hairpinMode": hairpin})
			pod := testutil.NewNetNS(t)
			ip := podAddr(t, n.mustAdd(t, "self", "eth0", pod))
			port := serve(t, pod, ip)
			rules := fmt.Sprintf(`table ip svc {
	chain pre { type nat hook prerouting priority dstnat; ip daddr 10.96.0.10 tcp dport 80 dnat to %s:%d; }
	chain post { type nat hook postrouting priority srcnat; ip saddr %s ip daddr %s masquerade; }
}`, ip, port, ip, ip)
			err := n.ns.Do(func(ns.NetNS) error {
				c := exec.Command("nft", "-f", "-")
				c.Stdin = strings.NewReader(rules)
				if out, err := c.CombinedOutput(); err != nil {
					return fmt.Errorf("nft: %v: %s", err, out)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			_, err = dial(pod, netip.MustParseAddr("10.96.0.10"), 80)
			if hairpin && err != nil {
				t.Fatalf("pod -> service -> itself with hairpin on: %v", err)
			}
			if !hairpin && err == nil {
				t.Fatal("pod reached itself through the service without hairpin: the test proves nothing")
			}
		})
	}
}
