package ebpf

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/internal/testutil"
)

// nsTopo is a lab-style network for north-south tests, all in fresh
// network namespaces (nothing in the host's): a "wire" namespace holding a
// bridge, a client namespace outside every node, two node namespaces on the
// bridge (eth0), and pod namespaces behind each node's veths.
//
//	client 10.27.0.100 ─┐
//	node1  10.27.0.1   ─┼─ br0 (wire)      node1: pod 10.27.1.10, 10.27.1.11
//	node2  10.27.0.2   ─┘                  node2: pod 10.27.2.10
//
// newNSTopoNet builds the same network from other prefixes, and dual-stack
// with an IPv6 prefix P (wire P::/64, node1's pods P:1::/64, node2's
// P:2::/64, the same host numbers: client P::100, node1 P::1, pod P:1::10).
type nsTopo struct {
	t                   testing.TB
	net                 nsTopoNet
	wire, client        *nsNS
	node1, node2        *nsNS
	pods                map[string]*nsNS // by pod IP
	node1Addr           netip.Addr
	node2Addr, clientIP netip.Addr
	backend             *Backend
	node2Backend        *Backend // startNode2's
	cfg                 Config
	pinDir              string
	cgroup              string
}

// nsTopoNet names a topology's namespaces and addresses.
type nsTopoNet struct {
	prefix string // of the network namespaces' names
	v4     string // the first two octets: "10.27"
	v6     string // "" (IPv4 only) or the first group: "fd06"
}

// ip4 and ip6 are host h of subnet n (0: the wire, 1 and 2: node1's and
// node2's pods).
func (n nsTopoNet) ip4(sub, h int) string { return fmt.Sprintf("%s.%d.%d", n.v4, sub, h) }
func (n nsTopoNet) ip6(sub, h int) string {
	if sub == 0 {
		return fmt.Sprintf("%s::%d", n.v6, h)
	}
	return fmt.Sprintf("%s:%d::%d", n.v6, sub, h)
}

// nsNS is a north-south test's network namespace: testutil.NetNS with
// the short-hands these tests use (name is NetNS.Name).
type nsNS struct {
	*testutil.NetNS
	name string
}

func (n *nsNS) path() string { return filepath.Join("/run/netns", n.name) }

func newNSNetNS(t testing.TB, role string) *nsNS { return newNSNetNSNamed(t, "nsx", role) }

// newNSNetNSNamed makes a namespace named <prefix>-<role>-<random>.
func newNSNetNSNamed(t testing.TB, prefix, role string) *nsNS {
	t.Helper()
	n := testutil.NewNetNSNamed(t, prefix+"-"+role+"-")
	return &nsNS{NetNS: n, name: n.Name}
}

func (n *nsNS) run(t testing.TB, args ...string) string {
	t.Helper()
	return n.Run(t, args[0], args[1:]...)
}

func (n *nsNS) do(fn func() error) error { return n.Do(func(ns.NetNS) error { return fn() }) }

// plug connects a veth from `from` (named fromName) to `to` (named toName).
func plug(t testing.TB, from *nsNS, fromName string, to *nsNS, toName string) {
	t.Helper()
	tmp := "nsv" + hex.EncodeToString([]byte(toName))[:6]
	from.run(t, "ip", "link", "add", fromName, "type", "veth", "peer", "name", tmp)
	from.run(t, "ip", "link", "set", tmp, "netns", to.name)
	to.run(t, "ip", "link", "set", tmp, "name", toName)
	from.run(t, "ip", "link", "set", fromName, "up")
	to.run(t, "ip", "link", "set", toName, "up")
}

func newNSTopo(t testing.TB) *nsTopo { return newNSTopoNet(t, nsTopoNet{prefix: "nsx", v4: "10.27"}) }

// newNSTopo6 is the dual-stack topology (10.66.0.0/16, fd06::/16).
func newNSTopo6(t testing.TB) *nsTopo {
	return newNSTopoNet(t, nsTopoNet{prefix: "ns6", v4: "10.66", v6: "fd06"})
}

func newNSTopoNet(t testing.TB, n nsTopoNet) *nsTopo {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresKernelFeature(t, testutil.CgroupSockAddr)
	testutil.RequiresKernelFeature(t, testutil.BTF)
	tp := &nsTopo{t: t, net: n, pods: map[string]*nsNS{},
		node1Addr: netip.MustParseAddr(n.ip4(0, 1)), node2Addr: netip.MustParseAddr(n.ip4(0, 2)),
		clientIP: netip.MustParseAddr(n.ip4(0, 100))}
	tp.wire = newNSNetNSNamed(t, n.prefix, "wire")
	tp.client = newNSNetNSNamed(t, n.prefix, "client")
	tp.node1 = newNSNetNSNamed(t, n.prefix, "node1")
	tp.node2 = newNSNetNSNamed(t, n.prefix, "node2")
	tp.wire.run(t, "ip", "link", "add", "br0", "type", "bridge")
	tp.wire.run(t, "ip", "link", "set", "br0", "up")
	for _, x := range []struct {
		n    *nsNS
		port string
		host int
	}{{tp.client, "c0", 100}, {tp.node1, "n1", 1}, {tp.node2, "n2", 2}} {
		plug(t, tp.wire, x.port, x.n, "eth0")
		tp.wire.run(t, "ip", "link", "set", x.port, "master", "br0")
		x.n.run(t, "ip", "addr", "add", n.ip4(0, x.host)+"/24", "dev", "eth0")
		if n.v6 != "" {
			x.n.run(t, "ip", "addr", "add", n.ip6(0, x.host)+"/64", "dev", "eth0", "nodad")
			x.n.WaitLocalAddrs(t, netip.MustParseAddr(n.ip6(0, x.host)))
		}
	}
	for _, node := range []*nsNS{tp.node1, tp.node2} {
		node.run(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		if n.v6 != "" {
			node.run(t, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
		}
	}
	route := func(in *nsNS, to, via string) {
		if strings.Contains(to, ":") {
			in.run(t, "ip", "-6", "route", "add", to, "via", via)
		} else {
			in.run(t, "ip", "route", "add", to, "via", via)
		}
	}
	nets := []func(sub, h int) string{n.ip4}
	if n.v6 != "" {
		nets = append(nets, n.ip6)
	}
	for _, ip := range nets {
		pfx := "/24"
		if strings.Contains(ip(0, 1), ":") {
			pfx = "/64"
		}
		route(tp.node1, ip(2, 0)+pfx, ip(0, 2))
		route(tp.node2, ip(1, 0)+pfx, ip(0, 1))
		// The client reaches pod IPs directly only for the "direct" comparison.
		route(tp.client, ip(2, 0)+pfx, ip(0, 2))
		route(tp.client, ip(1, 0)+pfx, ip(0, 1))
	}
	tp.addPod(n.ip4(1, 10), tp.node1, n.ip4(0, 1))
	tp.addPod(n.ip4(1, 11), tp.node1, n.ip4(0, 1))
	tp.addPod(n.ip4(2, 10), tp.node2, n.ip4(0, 2))
	return tp
}

// addPod adds a pod with address ip behind node (gw: the node's address);
// in a dual-stack topology the pod has the IPv6 address of the same host
// number too (its gateway: fe80::1 on the node's side of its veth).
func (tp *nsTopo) addPod(ip string, node *nsNS, gw string) {
	t := tp.t
	p := newNSNetNSNamed(t, tp.net.prefix, "pod")
	host := "p" + strings.ReplaceAll(ip, ".", "")[4:]
	plug(t, node, host, p, "eth0")
	p.run(t, "ip", "addr", "add", ip+"/32", "dev", "eth0")
	p.run(t, "ip", "route", "add", gw, "dev", "eth0", "scope", "link")
	p.run(t, "ip", "route", "add", "default", "via", gw, "dev", "eth0")
	node.run(t, "ip", "route", "add", ip+"/32", "dev", host)
	tp.pods[ip] = p
	tp.serve(p, ip)
	if tp.net.v6 == "" {
		return
	}
	a := netip.MustParseAddr(ip).As4()
	ip6 := tp.net.ip6(int(a[2]), int(a[3]))
	node.run(t, "ip", "addr", "add", "fe80::1/64", "dev", host, "nodad")
	p.run(t, "ip", "addr", "add", ip6+"/128", "dev", "eth0", "nodad")
	p.WaitLocalAddrs(t, netip.MustParseAddr(ip6))
	p.run(t, "ip", "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0")
	node.run(t, "ip", "-6", "route", "add", ip6+"/128", "dev", host)
	tp.pods[ip6] = p
	tp.serve(p, ip6)
}

// serve runs a TCP server on pod ip:8080 that writes "<pod ip> <peer>\n"
// and then echoes, and a UDP server answering "<pod ip> <peer>".
func (tp *nsTopo) serve(p *nsNS, ip string) {
	t := tp.t
	var ln net.Listener
	var pc net.PacketConn
	if err := p.do(func() (err error) {
		if ln, err = net.Listen("tcp", net.JoinHostPort(ip, "8080")); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", net.JoinHostPort(ip, "8080"))
		return err
	}); err != nil {
		t.Fatalf("listen in pod %s: %v", ip, err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s %s\n", ip, c.RemoteAddr())
				io.Copy(c, c)
			}()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(fmt.Sprintf("%s %s", ip, from)), from)
		}
	}()
}

// start loads the programs for node1, with north-south on its eth0.
func (tp *nsTopo) start(tweak ...func(*Config)) {
	t := tp.t
	tp.cgroup = testutil.NewCgroup(t)
	node := testutil.UniqueName("ns-")
	tp.pinDir = filepath.Join(testPinRoot, node)
	cfg := Config{NodeName: node, CgroupPath: tp.cgroup, PinDir: tp.pinDir, MaxServices: 1 << 12,
		MaxBackends: 1 << 12, MaxAffinity: 1024, MaxReverseSockets: 1024,
		NorthSouth: &NorthSouth{Devices: []string{"eth0"}, NetNS: tp.node1.path(), MaglevTableSize: 251},
		Log:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if a := testAcceleration(); a != "" {
		cfg.NorthSouth.Acceleration = a
		tp.clientWire(a)
	}
	for _, f := range tweak {
		f(&cfg)
	}
	t.Cleanup(func() {
		if err := CleanupPinned(cfg.PinDir); err != nil {
			t.Errorf("cleanup pinned state: %v", err)
		}
	})
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tp.backend.Close() })
	tp.backend, tp.cfg = b, cfg
}

// restart replaces the backend by a new one on the same pinned state.
func (tp *nsTopo) restart() {
	tp.t.Helper()
	tp.backend.Close()
	b, err := New(tp.cfg)
	if err != nil {
		tp.t.Fatalf("New after restart: %v", err)
	}
	tp.backend = b
}

// dialFrom is dial from a given client address (the client namespace has
// several).
func (tp *nsTopo) dialFrom(from, to string, timeout time.Duration) (c net.Conn, pod string, err error) {
	err = tp.client.do(func() error {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err = d.Dial("tcp", to)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return nil, "", fmt.Errorf("read greeting: %w", err)
	}
	return c, strings.Fields(line)[0], nil
}

func nodePortFrontend(addr string, port uint16, proto dataplane.Protocol, local bool, backends ...string) dataplane.Frontend {
	f := dataplane.Frontend{
		FrontendKey: dataplane.FrontendKey{Addr: netip.MustParseAddr(addr), Port: port, Protocol: proto},
		Kind:        dataplane.NodePort, LocalOnly: local,
		Service: dataplane.ServicePortName{Namespace: "default", Name: fmt.Sprintf("np%d", port)},
	}
	for _, b := range backends {
		ap := netip.MustParseAddrPort(b)
		f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: ap.Addr(), Port: ap.Port()})
	}
	return f
}

func (tp *nsTopo) sync(fs ...dataplane.Frontend) {
	tp.t.Helper()
	slices.SortFunc(fs, func(a, b dataplane.Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
	if err := tp.backend.Sync(tp.t.Context(), &dataplane.State{Frontends: fs}); err != nil {
		tp.t.Fatalf("Sync: %v", err)
	}
}

// dial connects from the client namespace and reads the greeting: which
// pod answered and which source address it saw.
func (tp *nsTopo) dial(to string) (c net.Conn, pod, seen string, err error) {
	err = tp.client.do(func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err = d.Dial("tcp", to)
		return err
	})
	if err != nil {
		return nil, "", "", err
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return nil, "", "", fmt.Errorf("read greeting: %w", err)
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		c.Close()
		return nil, "", "", fmt.Errorf("greeting %q", line)
	}
	host, _, _ := net.SplitHostPort(f[1])
	return c, f[0], host, nil
}

// echo checks an established connection still reaches its backend.
func echo(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo %q, want %q", buf, msg)
	}
	return nil
}

func (tp *nsTopo) udp(to string) (pod, seen string, err error) {
	err = tp.client.do(func() error {
		c, err := net.Dial("udp", to)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256)
		for i := 0; i < 5; i++ {
			c.Write([]byte("hi"))
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := c.Read(buf)
			if err == nil {
				f := strings.Fields(string(buf[:n]))
				host, _, _ := net.SplitHostPort(f[1])
				pod, seen = f[0], host
				return nil
			}
		}
		return errors.New("no UDP answer")
	})
	return pod, seen, err
}

// nsFamily is one address family of the north-south tests: the topology
// to build (IPv6 needs the dual-stack one), its host addresses (ip(sub, h):
// nsTopoNet.ip4 or ip6), their prefix length on the wire and the nft
// family. The tests that run per family range over nsFamilies, one
// subtest each.
type nsFamily struct {
	name, nft string
	topo      func(testing.TB) *nsTopo
	ip        func(nsTopoNet) func(sub, h int) string
	pfx, host string // the wire's prefix length, a host's
	doc       string // a documentation range (RFC 5737, RFC 3849): no host of the topology
}

var nsFamilies = []nsFamily{
	{"IPv4", "ip", newNSTopo, func(n nsTopoNet) func(int, int) string { return n.ip4 }, "/24", "/32", "192.0.2.0/24"},
	{"IPv6", "ip6", newNSTopo6, func(n nsTopoNet) func(int, int) string { return n.ip6 }, "/64", "/128", "2001:db8::/32"},
}

// addClientAddr adds an address of the wire to the client namespace.
func (tp *nsTopo) addClientAddr(fam nsFamily, addr string) {
	args := []string{"ip", "addr", "add", addr + fam.pfx, "dev", "eth0"}
	if fam.name == "IPv6" {
		args = append(args, "nodad")
	}
	tp.client.run(tp.t, args...)
	tp.client.WaitLocalAddrs(tp.t, netip.MustParseAddr(addr))
}

// hp is addr:port, bracketed for an IPv6 address.
func hp(addr string, port int) string { return net.JoinHostPort(addr, strconv.Itoa(port)) }

// TestNorthSouthNodePortToLocalAndRemoteBackends serves NodePorts from an
// external client over each family: a remote backend (SNAT to the node),
// a local one (DNAT only) and ETP Local (the client's address kept), TCP and
// UDP, with offloaded and with full checksums; then the reject of a Cluster
// frontend without endpoints and the drop of a Local one without local
// endpoints, and the counters, conntrack and device entries behind them.
func TestNorthSouthNodePortToLocalAndRemoteBackends(t *testing.T) {
	for _, fam := range nsFamilies {
		t.Run(fam.name, func(t *testing.T) {
			tp := fam.topo(t)
			ip := fam.ip(tp.net)
			node, client := ip(0, 1), ip(0, 100)
			// As waggle-cni does: pod traffic leaving for outside the pod
			// network is masqueraded by the node's netfilter, before tc
			// egress sees a local backend's reply.
			tp.node1.run(t, "nft", "add table "+fam.nft+" nsmasq")
			tp.node1.run(t, "nft", "add chain "+fam.nft+" nsmasq post { type nat hook postrouting priority 100 ; }")
			tp.node1.run(t, "nft", "add rule "+fam.nft+" nsmasq post "+fam.nft+" saddr "+ip(1, 0)+fam.pfx+" oifname eth0 masquerade")
			tp.start()
			tp.sync(
				// Cluster policy, the backend on another node: SNAT to node1.
				nodePortFrontend(node, 30080, dataplane.TCP, false, hp(ip(2, 10), 8080)),
				// Cluster policy, the backend on this node: DNAT only.
				nodePortFrontend(node, 30081, dataplane.TCP, false, hp(ip(1, 10), 8080)),
				// Local policy: the client's address kept.
				nodePortFrontend(node, 30082, dataplane.TCP, true, hp(ip(1, 11), 8080)),
				nodePortFrontend(node, 30080, dataplane.UDP, false, hp(ip(2, 10), 8080)),
				nodePortFrontend(node, 30081, dataplane.UDP, false, hp(ip(1, 10), 8080)),
				// Local, no local endpoint: dropped.
				nodePortFrontend(node, 30083, dataplane.TCP, true),
				// Cluster, no endpoint: the node's stack rejects.
				nodePortFrontend(node, 30084, dataplane.TCP, false),
			)
			check := func(when string) {
				t.Helper()
				for _, c := range []struct{ to, pod, seen string }{
					{hp(node, 30080), ip(2, 10), node},   // SNAT: the pod sees node1
					{hp(node, 30081), ip(1, 10), client}, // a local backend: the client
					{hp(node, 30082), ip(1, 11), client}, // ETP Local: the client
				} {
					conn, pod, seen, err := tp.dial(c.to)
					if err != nil {
						t.Fatalf("%s: %s: %v", when, c.to, err)
					}
					if pod != c.pod || seen != c.seen {
						t.Errorf("%s: %s: answered by %s seeing %s, want %s seeing %s", when, c.to, pod, seen, c.pod, c.seen)
					}
					// More than an MTU: a GSO packet, which the FIB lookup
					// must not call too big (and send through the stack,
					// whose masquerade then remaps the client's port: a
					// reset).
					if err := echo(conn, strings.Repeat("hello ", 300)); err != nil {
						t.Errorf("%s: %s: echo: %v", when, c.to, err)
					}
					// The client sees the NodePort as its peer (reverse NAT).
					if got := conn.RemoteAddr().String(); got != c.to {
						t.Errorf("%s: client's peer %s, want %s", when, got, c.to)
					}
					conn.Close()
				}
				for _, c := range []struct{ to, pod, seen string }{
					{hp(node, 30080), ip(2, 10), node},
					{hp(node, 30081), ip(1, 10), client},
				} {
					pod, seen, err := tp.udp(c.to)
					if err != nil || pod != c.pod || seen != c.seen {
						t.Errorf("%s: UDP %s: %s seeing %s, %v; want %s seeing %s", when, c.to, pod, seen, err, c.pod, c.seen)
					}
				}
			}
			check("offloaded checksums")
			// Full checksums, verified by every receiver: the incremental
			// updates (the pseudo-header's addresses, the ports) are right.
			tp.fullChecksums()
			check("full checksums")

			// Cluster without endpoints: a reset from the node (connection refused).
			if _, _, _, err := tp.dial(hp(node, 30084)); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("no endpoints, Cluster: %v, want connection refused", err)
			}
			// Local without local endpoints: dropped (a timeout), after the
			// program counted it.
			err := tp.client.do(func() error {
				c, err := net.DialTimeout("tcp", hp(node, 30083), 500*time.Millisecond)
				if err == nil {
					c.Close()
					return errors.New("connected")
				}
				return nil
			})
			if err != nil {
				t.Errorf("no local endpoints, Local: %v", err)
			}
			v, err := OpenPinned(tp.pinDir)
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			st, err := v.NorthSouthStats()
			if err != nil {
				t.Fatal(err)
			}
			if st["local_drop"] == 0 || st["xlate_snat"] == 0 || st["xlate_local"] == 0 || st["reply"] == 0 {
				t.Errorf("stats %v", st)
			}
			ct, err := v.Conntrack()
			if err != nil || len(ct) == 0 {
				t.Fatalf("conntrack: %d entries, %v", len(ct), err)
			}
			var snat bool
			for _, e := range ct {
				if e.SNAT && e.Direction == "reply" && e.Src.String() == hp(ip(2, 10), 8080) && e.Dst.Addr().String() == node {
					snat = true
				}
			}
			if !snat {
				t.Errorf("no SNAT reply entry for %s in %+v", hp(ip(2, 10), 8080), ct)
			}
			devs, err := v.Devices()
			want6 := netip.Addr{}
			if fam.name == "IPv6" {
				want6 = netip.MustParseAddr(node)
			}
			if err != nil || len(devs) != 1 || devs[0].SNATAddr.String() != tp.net.ip4(0, 1) || devs[0].SNATAddr6 != want6 {
				t.Errorf("devices %+v, %v; want eth0 with SNAT addresses %s and %v", devs, err, tp.net.ip4(0, 1), want6)
			}
		})
	}
}

func TestNorthSouthEstablishedFlowsSurviveBackendChanges(t *testing.T) {
	tp := newNSTopo(t)
	tp.start()
	bes := []string{"10.27.1.10:8080", "10.27.2.10:8080"}
	tp.sync(nodePortFrontend("10.27.0.1", 30090, dataplane.TCP, false, bes...))
	type flow struct {
		c   net.Conn
		pod string
	}
	var flows []flow
	used := map[string]int{}
	for i := 0; i < 24; i++ {
		c, pod, _, err := tp.dial("10.27.0.1:30090")
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		flows = append(flows, flow{c, pod})
		used[pod]++
	}
	if v, err := OpenPinned(tp.pinDir); err == nil {
		mg, err := v.Maglev()
		t.Logf("Maglev tables: %+v (%v)", mg, err)
		if err != nil || len(mg) != 1 || len(mg[0].Share) != 2 {
			t.Errorf("Maglev view: %+v, %v", mg, err)
		}
		v.Close()
	}
	if len(used) != 2 {
		t.Errorf("24 flows reached %v, want both backends", used)
	}
	// A backend added: Maglev moves about a third of new flows to it, but
	// every established flow keeps its backend (conntrack).
	tp.sync(nodePortFrontend("10.27.0.1", 30090, dataplane.TCP, false, append(bes, "10.27.1.11:8080")...))
	for i, f := range flows {
		if err := echo(f.c, fmt.Sprintf("after add %d", i)); err != nil {
			t.Errorf("flow %d to %s after a backend was added: %v", i, f.pod, err)
		}
	}
	// The remote backend removed: flows to the others go on.
	tp.sync(nodePortFrontend("10.27.0.1", 30090, dataplane.TCP, false, "10.27.1.10:8080", "10.27.1.11:8080"))
	for i, f := range flows {
		if f.pod == "10.27.2.10" {
			continue
		}
		if err := echo(f.c, fmt.Sprintf("after remove %d", i)); err != nil {
			t.Errorf("flow %d to %s after another backend was removed: %v", i, f.pod, err)
		}
	}
	// New flows reach only the remaining backends.
	for i := 0; i < 8; i++ {
		c, pod, _, err := tp.dial("10.27.0.1:30090")
		if err != nil {
			t.Fatalf("dial after removal: %v", err)
		}
		c.Close()
		if pod == "10.27.2.10" {
			t.Errorf("new flow %d reached the removed backend", i)
		}
	}
	// A restart of the proxy keeps established flows (pinned conntrack,
	// Maglev refilled before the programs are swapped).
	tp.backend.Close()
	pinDir := tp.pinDir
	tp.start(func(c *Config) { c.NodeName, c.PinDir = filepath.Base(pinDir), pinDir })
	tp.pinDir = pinDir
	for i, f := range flows {
		if f.pod == "10.27.2.10" {
			continue
		}
		if err := echo(f.c, fmt.Sprintf("after restart %d", i)); err != nil {
			t.Errorf("flow %d after a proxy restart: %v", i, err)
		}
	}
}

func TestNorthSouthClientIPAffinity(t *testing.T) {
	tp := newNSTopo(t)
	tp.start()
	f := nodePortFrontend("10.27.0.1", 30095, dataplane.TCP, false, "10.27.1.10:8080", "10.27.1.11:8080", "10.27.2.10:8080")
	f.AffinityTimeout = time.Hour
	tp.sync(f)
	first := ""
	for i := 0; i < 10; i++ {
		c, pod, _, err := tp.dial("10.27.0.1:30095")
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if first == "" {
			first = pod
		} else if pod != first {
			t.Fatalf("connection %d reached %s, want %s (ClientIP affinity)", i, pod, first)
		}
	}
}

// loadBalancerSourceRanges: new flows to a LoadBalancer IP from outside the
// ranges are dropped (as kube-proxy's KUBE-PROXY-FIREWALL), flows already
// established stay, a change of ranges applies to the next connection, and
// a restarted proxy keeps enforcing them before its first sync.
// A frame for a LoadBalancer IP that the switch floods to node1 but that is
// addressed to another machine's MAC (the announcing node's, whose port
// went down) is left to the stack, which drops it: only the node the
// client's ARP entry names serves the IP. In tc (pkt_type) and in XDP (the
// device's MAC in waggle_np_devices), for a new flow to a remote backend
// (which XDP would forward itself), to a local one (which XDP leaves to
// tc), and for the packets of an established flow (a conntrack hit).
func TestNorthSouthServesOnlyFramesAddressedToTheNode(t *testing.T) {
	for _, accel := range []string{AccelDisabled, AccelGeneric} {
		t.Run("xdp="+accel, func(t *testing.T) { testServesOnlyFramesAddressedToTheNode(t, accel) })
	}
}

func testServesOnlyFramesAddressedToTheNode(t *testing.T, accel string) {
	tp := newNSTopoNet(t, nsTopoNet{prefix: "nsf", v4: "10.67"})
	tp.clientWire(accel)
	tp.start(func(c *Config) { c.NorthSouth.Acceleration = accel })
	remote := nodePortFrontend("10.67.0.50", 80, dataplane.TCP, false, "10.67.2.10:8080")
	local := nodePortFrontend("10.67.0.51", 80, dataplane.TCP, false, "10.67.1.10:8080")
	remote.Kind, local.Kind = dataplane.LoadBalancer, dataplane.LoadBalancer
	tp.sync(remote, local)
	mac := func(n *nsNS) string {
		f := strings.Fields(n.run(t, "cat", "/sys/class/net/eth0/address"))
		if len(f) != 1 {
			t.Fatalf("eth0 address of %s: %q", n.name, f)
		}
		return f[0]
	}
	neigh := func(lladdr string) {
		for _, ip := range []string{"10.67.0.50", "10.67.0.51"} {
			tp.client.run(t, "ip", "neigh", "replace", ip, "lladdr", lladdr, "dev", "eth0", "nud", "permanent")
		}
	}
	v, err := OpenPinned(tp.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := v.Devices()
	v.Close()
	if err != nil || len(devs) != 1 || devs[0].MAC != mac(tp.node1) {
		t.Fatalf("devices %+v (%v): want eth0 with its MAC %s", devs, err, mac(tp.node1))
	}
	// Positive markers first: with the client's neighbour entries naming
	// node1, node1 serves both IPs (the remote backend's flow in XDP when
	// XDP is on).
	neigh(mac(tp.node1))
	fwd := tp.npStats()["xdp_fwd"]
	var est net.Conn
	for _, to := range []string{"10.67.0.50:80", "10.67.0.51:80"} {
		testutil.Eventually(t, 30*time.Second, func() error {
			c, _, err := tp.dialFrom("10.67.0.100", to, 2*time.Second)
			if err != nil {
				return err
			}
			if est == nil {
				est = c
			} else {
				c.Close()
			}
			return nil
		})
	}
	defer est.Close()
	if err := echo(est, "before"); err != nil {
		t.Fatalf("established flow: %v", err)
	}
	if accel == AccelGeneric && tp.npStats()["xdp_fwd"] == fwd {
		t.Fatalf("the remote backend's flow was not forwarded in XDP: the check below would test tc only")
	}

	// A MAC no port of the bridge has: every frame to it is flooded, so
	// node1's eth0 receives it (PACKET_OTHERHOST).
	other := tp.npStats()["other_host"]
	neigh("02:00:5e:00:00:99")
	for _, to := range []string{"10.67.0.50:80", "10.67.0.51:80"} {
		if c, _, err := tp.dialFrom("10.67.0.100", to, time.Second); err == nil {
			c.Close()
			t.Errorf("node1 served a new flow to %s in a flooded frame addressed to another MAC", to)
		}
	}
	est.SetDeadline(time.Now().Add(time.Second))
	if _, err := est.Write([]byte("flood")); err != nil {
		t.Fatal(err)
	}
	if n, err := est.Read(make([]byte, 16)); err == nil {
		t.Errorf("node1 served %d bytes of an established flow in a flooded frame addressed to another MAC", n)
	}
	if n := tp.npStats()["other_host"]; n == other {
		t.Errorf("flooded frames not counted as other_host (%d)", n)
	}
	// node1's MAC again: the established flow goes on (the client
	// retransmits what the flood lost).
	neigh(mac(tp.node1))
	est.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, len("flood"))
	if _, err := io.ReadFull(est, buf); err != nil || string(buf) != "flood" {
		t.Errorf("established flow after the flood: %q, %v", buf, err)
	}
}

// TestNorthSouthLoadBalancerSourceRanges enforces loadBalancerSourceRanges
// over each family (the LPM trie's IPv4 and IPv6 keys): an allowed source
// served, another dropped and counted, the NodePort of the same source
// open, the ranges shown, a range change keeping the established flow, a
// restart enforcing before the first sync, and no entry left without
// ranges.
func TestNorthSouthLoadBalancerSourceRanges(t *testing.T) {
	for _, fam := range nsFamilies {
		t.Run(fam.name, func(t *testing.T) { testLoadBalancerSourceRanges(t, fam) })
	}
}

func testLoadBalancerSourceRanges(t *testing.T, fam nsFamily) {
	tp := fam.topo(t)
	ip := fam.ip(tp.net)
	tp.addClientAddr(fam, ip(0, 101))
	tp.addClientAddr(fam, ip(0, 102))
	tp.client.run(t, "ip", "route", "add", ip(9, 50)+fam.host, "via", ip(0, 1))
	tp.start()
	lb := nodePortFrontend(ip(9, 50), 80, dataplane.TCP, false, hp(ip(1, 10), 8080), hp(ip(2, 10), 8080))
	lb.Kind = dataplane.LoadBalancer
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix(ip(0, 101) + fam.host), netip.MustParsePrefix(fam.doc)}
	np := nodePortFrontend(ip(0, 1), 30096, dataplane.TCP, false, hp(ip(1, 10), 8080))
	tp.sync(lb, np)
	allowed, denied, to := ip(0, 101), ip(0, 100), hp(ip(9, 50), 80)
	// Positive marker first: the allowed source is served.
	var kept net.Conn
	testutil.Eventually(t, 30*time.Second, func() error {
		c, _, err := tp.dialFrom(allowed, to, 2*time.Second)
		if err == nil {
			kept = c
		}
		return err
	})
	defer kept.Close()
	if c, _, err := tp.dialFrom(denied, to, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s reached the LoadBalancer IP outside loadBalancerSourceRanges", denied)
	}
	// Ranges apply to LoadBalancer frontends only, as upstream: the NodePort
	// of the same source stays open.
	c, _, err := tp.dialFrom(denied, hp(ip(0, 1), 30096), 5*time.Second)
	if err != nil {
		t.Fatalf("NodePort from %s: %v", denied, err)
	}
	c.Close()
	v, err := OpenPinned(tp.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if st, err := v.NorthSouthStats(); err != nil || st["src_range_drop"] == 0 {
		t.Errorf("src_range_drop not counted: %v %v", st, err)
	}
	// waggle bpf nodeport maglev shows them.
	mg, err := v.Maglev()
	if err != nil {
		t.Fatal(err)
	}
	shown := 0
	// In address order, as the trie holds them.
	want := slices.SortedFunc(slices.Values(lb.SourceRanges), func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	for _, e := range mg {
		if len(e.SourceRanges) > 0 {
			shown++
			if !slices.Equal(e.SourceRanges, want) {
				t.Errorf("%s: source ranges %v, want %v", e.Frontend, e.SourceRanges, want)
			}
		}
	}
	if shown != 1 {
		t.Errorf("%d frontends with source ranges in %+v, want 1", shown, mg)
	}

	// Swap the ranges: the established flow stays, new flows follow.
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix(ip(0, 100) + map[string]string{"IPv4": "/31", "IPv6": "/127"}[fam.name])}
	tp.sync(lb, np)
	if err := echo(kept, "still here"); err != nil {
		t.Fatalf("established flow cut by a source range change: %v", err)
	}
	c, _, err = tp.dialFrom(denied, to, 5*time.Second)
	if err != nil {
		t.Fatalf("%s after it was allowed: %v", denied, err)
	}
	c.Close()

	// A restart keeps enforcing before the new proxy's first sync.
	tp.restart()
	c, _, err = tp.dialFrom(allowed, to, 5*time.Second)
	if err != nil {
		t.Fatalf("%s after a restart: %v", allowed, err)
	}
	c.Close()
	if c, _, err := tp.dialFrom(ip(0, 102), to, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s served after a restart", ip(0, 102))
	}
	// Without ranges every source is served again, and nothing is left
	// in the trie.
	lb.SourceRanges = nil
	tp.sync(lb, np)
	c, _, err = tp.dialFrom(allowed, to, 5*time.Second)
	if err != nil {
		t.Fatalf("no ranges, %s: %v", allowed, err)
	}
	c.Close()
	m, err := v.npMap(MapNPSourceRanges)
	if err != nil {
		t.Fatal(err)
	}
	var k nodePortNpSrcRangeKey
	var val uint8
	if it := m.Iterate(); it.Next(&k, &val) {
		t.Errorf("source range entry left: %+v", k)
	}
}

// An ICMP error a backend sends about a north-south flow (here: port
// unreachable, nothing listens on the backend's port) reaches the client
// translated, over each family, so its connected UDP socket gets
// ECONNREFUSED at once instead of waiting for a timeout: a remote
// backend's error comes in SNATed (ingress), a local one's leaves DNAT-only
// (egress). Over IPv6, neighbour discovery keeps working through the
// programs meanwhile (every north-south test resolves its neighbours
// through them).
func TestNorthSouthICMPErrorsReachTheClient(t *testing.T) {
	for _, fam := range nsFamilies {
		t.Run(fam.name, func(t *testing.T) {
			tp := fam.topo(t)
			ip := fam.ip(tp.net)
			node := ip(0, 1)
			tp.start()
			// A served port first (the positive marker), then the two
			// whose backends have no socket.
			tp.sync(nodePortFrontend(node, 30097, dataplane.UDP, false, hp(ip(2, 10), 8080)),
				nodePortFrontend(node, 30098, dataplane.UDP, false, hp(ip(2, 10), 9999)),
				nodePortFrontend(node, 30099, dataplane.UDP, false, hp(ip(1, 10), 9999)))
			testutil.Eventually(t, 30*time.Second, func() error { _, _, err := tp.udp(hp(node, 30097)); return err })
			for _, port := range []int{30098, 30099} {
				refused(t, tp, hp(node, port))
			}
			if st := tp.npStats(); st["icmp_error"] < 2 {
				t.Errorf("icmp_error not counted twice: %v", st)
			}
		})
	}
}

// refused checks that a connected UDP socket to addr gets ECONNREFUSED.
func refused(t *testing.T, tp *nsTopo, to string) {
	t.Helper()
	err := tp.client.do(func() error {
		c, err := net.Dial("udp", to)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for i := 0; i < 5; i++ {
			c.Write([]byte("hi"))
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(buf)
			if errors.Is(err, syscall.ECONNREFUSED) {
				return nil
			}
		}
		return fmt.Errorf("read: %v, want ECONNREFUSED from the translated port unreachable", err)
	})
	if err != nil {
		t.Fatalf("%s: %v", to, err)
	}
}

func TestNorthSouthUnknownDeviceIsAClearError(t *testing.T) {
	tp := newNSTopo(t)
	node := testutil.UniqueName("ns-")
	dir := filepath.Join(testPinRoot, node)
	t.Cleanup(func() { CleanupPinned(dir) })
	_, err := New(Config{NodeName: node, CgroupPath: testutil.NewCgroup(t), PinDir: dir,
		NorthSouth: &NorthSouth{Devices: []string{"nope0"}, NetNS: tp.node1.path()}})
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), `"nope0"`) || !strings.Contains(err.Error(), "eth0") {
		t.Fatalf("New with a missing device: %v; want ErrNoDevice naming it and the devices there are", err)
	}
	t.Log(err)
}

// TestNorthSouthAsTCFilters: with DisableTCX (what a kernel before 6.6
// gets), the programs are clsact filters and serve as the tcx links do; a
// restart replaces them in place, and a later start with tcx removes them.
func TestNorthSouthAsTCFilters(t *testing.T) {
	tp := newNSTopo(t)
	tp.start(func(c *Config) { c.NorthSouth.DisableTCX = true })
	tp.sync(nodePortFrontend("10.27.0.1", 30080, dataplane.TCP, false, "10.27.2.10:8080"))
	filters := func() string {
		return tp.node1.run(t, "tc", "filter", "show", "dev", "eth0", "ingress") +
			tp.node1.run(t, "tc", "filter", "show", "dev", "eth0", "egress")
	}
	if f := filters(); !strings.Contains(f, "waggle_np_ingress") || !strings.Contains(f, "waggle_np_egress") || !strings.Contains(f, "direct-action") {
		t.Fatalf("no waggle tc filters on node1's eth0:\n%s", f)
	}
	// (The XDP link, np-eth0-xdp, is pinned with acceleration: it is no tcx link.)
	for _, dir := range []string{"ingress", "egress"} {
		if links, _ := filepath.Glob(filepath.Join(tp.pinDir, LinkDir, npLinkName("*", dir))); len(links) != 0 {
			t.Errorf("tcx links pinned beside the tc filters: %v", links)
		}
	}
	dial := func(when string) {
		t.Helper()
		conn, pod, seen, err := tp.dial("10.27.0.1:30080")
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		defer conn.Close()
		if pod != "10.27.2.10" || seen != "10.27.0.1" {
			t.Errorf("%s: answered by %s seeing %s, want 10.27.2.10 seeing 10.27.0.1 (SNAT)", when, pod, seen)
		}
		if err := echo(conn, "hello"); err != nil {
			t.Errorf("%s: echo: %v", when, err)
		}
	}
	dial("tc filters")
	tp.restart()
	if f := filters(); strings.Count(f, "handle 0x1 waggle_np_") != 2 {
		t.Errorf("after a restart, want the two filters replaced in place:\n%s", f)
	}
	dial("tc filters after a restart")
	tp.cfg.NorthSouth.DisableTCX = false
	tp.restart()
	if f := filters(); strings.Contains(f, "waggle_np_") {
		t.Errorf("started with tcx, the tc filters stayed:\n%s", f)
	}
	dial("tcx after tc filters")
}
