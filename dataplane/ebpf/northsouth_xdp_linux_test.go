package ebpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/internal/ethtool"
	"github.com/waggle-io/waggle/internal/testutil"
)

// testAcceleration is the XDP mode every north-south test runs in:
// WAGGLE_TEST_NP_ACCELERATION=generic runs the whole suite with XDP (the
// client then sends full checksums, so XDP, not tc, serves what it can).
func testAcceleration() string { return os.Getenv("WAGGLE_TEST_NP_ACCELERATION") }

// clientWire makes the client and the pods send full checksums when XDP
// is on, as packets from another machine carry them: a veth's default
// (offload) leaves only the pseudo-header sum, which XDP leaves to tc.
// Packets the kernel builds itself (RSTs, ACKs of closed sockets) are
// fully checksummed either way.
func (tp *nsTopo) clientWire(accel string) {
	tp.t.Helper()
	if accel == "" || accel == AccelDisabled {
		return
	}
	for _, n := range append([]*nsNS{tp.client}, slices.Collect(maps.Values(tp.pods))...) {
		if err := n.do(func() error { return ethtool.SetTxChecksum("eth0", false) }); err != nil {
			tp.t.Fatalf("%s eth0: tx checksum off: %v", n.name, err)
		}
	}
}

func (tp *nsTopo) npStats() map[string]uint64 {
	tp.t.Helper()
	v, err := OpenPinned(tp.pinDir)
	if err != nil {
		tp.t.Fatal(err)
	}
	defer v.Close()
	st, err := v.NorthSouthStats()
	if err != nil {
		tp.t.Fatal(err)
	}
	return st
}

func (tp *nsTopo) xdpMode() (string, error) {
	var mode string
	err := tp.node1.do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		mode = xdpAttachMode(l.Attrs().Index)
		return nil
	})
	return mode, err
}

// TestNorthSouthXDP runs the north-south ingress in XDP on node1's eth0 (a
// veth), generic and native (its peer on the bridge then runs an XDP_PASS
// program, without which a veth's native XDP_TX is dropped), over each
// family: a NodePort with a remote backend is
// served by XDP (SNAT, XDP_TX back out of eth0, the replies too; over IPv6
// the 16-byte pseudo-header change applied to full checksums, verified by
// the receivers), one with a local backend by tc (XDP passes it on), before
// and after a backend change; a client whose checksums are left to offload
// (the pseudo-header sum in the field) is served by tc; turning
// acceleration off detaches the XDP program.
func TestNorthSouthXDP(t *testing.T) {
	for _, fam := range nsFamilies {
		for _, mode := range []string{AccelGeneric, AccelNative} {
			t.Run(fam.name+"/"+mode, func(t *testing.T) { testXDP(t, fam, mode) })
		}
	}
}

func testXDP(t *testing.T, fam nsFamily, accel string) {
	tp := fam.topo(t)
	ip := fam.ip(tp.net)
	node, client := ip(0, 1), ip(0, 100)
	tp.addPod(tp.net.ip4(2, 11), tp.node2, tp.net.ip4(0, 2)) // and ip6(2, 11) on the dual-stack topology
	tp.clientWire(accel)
	if accel == AccelNative {
		if err := tp.wire.do(func() error {
			l, err := netlink.LinkByName("n1")
			if err != nil {
				return err
			}
			pass, err := AttachPeerXDP(l.Attrs().Index)
			if err == nil {
				t.Cleanup(func() { pass.Close() })
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	tp.start(func(c *Config) { c.NorthSouth.Acceleration = accel })
	if mode, err := tp.xdpMode(); err != nil || mode != accel {
		t.Fatalf("node1 eth0 XDP mode %q (%v), want %s", mode, err, accel)
	}
	v, err := OpenPinned(tp.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := v.Devices()
	v.Close()
	if err != nil || len(devs) != 1 || devs[0].XDP != accel {
		t.Fatalf("devices %+v (%v), want eth0 with xdp %s", devs, err, accel)
	}
	sync := func(remote string) {
		tp.sync(nodePortFrontend(node, 30080, dataplane.TCP, false, hp(remote, 8080)),
			nodePortFrontend(node, 30081, dataplane.TCP, false, hp(ip(1, 10), 8080)),
			nodePortFrontend(node, 30080, dataplane.UDP, false, hp(ip(2, 10), 8080)))
	}
	sync(ip(2, 10))

	check := func(port int, wantPod, wantSeen string, byXDP bool) {
		t.Helper()
		to := hp(node, port)
		before := tp.npStats()
		conn, pod, seen, err := tp.dial(to)
		if err != nil {
			t.Fatalf("%s: %v", to, err)
		}
		if pod != wantPod || seen != wantSeen {
			t.Errorf("%s: answered by %s seeing %s, want %s seeing %s", to, pod, seen, wantPod, wantSeen)
		}
		if err := echo(conn, "hello over xdp"); err != nil {
			t.Errorf("%s: echo: %v", to, err)
		}
		if got := conn.RemoteAddr().String(); got != to {
			t.Errorf("client's peer %s, want %s", got, to)
		}
		conn.Close()
		after := tp.npStats()
		// SYN, SYN-ACK, ACK, data both ways, FIN...: at least the
		// handshake both ways.
		if fwd := after["xdp_fwd"] - before["xdp_fwd"]; byXDP && fwd < 6 {
			t.Errorf("%s: %d packets forwarded in XDP, want the flow's (stats %v)", to, fwd, after)
		} else if !byXDP && fwd > 2 {
			// The client's packets and the pod's reach tc; only what
			// the kernel checksums itself (a closed socket's ACK or
			// RST) may take XDP.
			t.Errorf("%s: %d packets forwarded in XDP, want tc's flow (stats %v)", to, fwd, after)
		}
	}
	check(30080, ip(2, 10), node, true)
	check(30081, ip(1, 10), client, false)
	before := tp.npStats()["xdp_fwd"]
	if pod, seen, err := tp.udp(hp(node, 30080)); err != nil || pod != ip(2, 10) || seen != node {
		t.Errorf("UDP NodePort: %s seeing %s, %v", pod, seen, err)
	}
	if tp.npStats()["xdp_fwd"] < before+2 {
		t.Errorf("UDP request and reply not forwarded in XDP")
	}

	// A backend change: new flows go to the new backend, still in XDP.
	sync(ip(2, 11))
	check(30080, ip(2, 11), node, true)

	// A client and pods whose checksums are offloaded: tc serves them,
	// XDP counts them.
	for _, n := range []*nsNS{tp.client, tp.pods[ip(2, 11)]} {
		if err := n.do(func() error { return ethtool.SetTxChecksum("eth0", true) }); err != nil {
			t.Fatal(err)
		}
	}
	partial := tp.npStats()["xdp_partial_csum"]
	check(30080, ip(2, 11), node, false)
	if tp.npStats()["xdp_partial_csum"] == partial {
		t.Errorf("offloaded checksums not counted as left to tc")
	}

	// Acceleration off: the XDP program goes, tc serves everything.
	tp.backend.Close()
	tp.cfg.NorthSouth.Acceleration = AccelDisabled
	b, err := New(tp.cfg)
	if err != nil {
		t.Fatalf("New without acceleration: %v", err)
	}
	tp.backend = b
	if mode, err := tp.xdpMode(); err != nil || mode != "" {
		t.Errorf("node1 eth0 XDP mode %q (%v) after turning acceleration off", mode, err)
	}
	check(30080, ip(2, 11), node, false)
}

// TestNorthSouthXDPModes: native XDP on a veth attaches (the driver has
// it), best-effort picks generic on a veth, and a bad mode is a clear error.
func TestNorthSouthXDPModes(t *testing.T) {
	if err := (&NorthSouth{Devices: []string{"eth0"}, Acceleration: "fast"}).validate(); err == nil {
		t.Errorf("acceleration \"fast\" accepted")
	}
	tp := newNSTopo(t)
	tp.start(func(c *Config) { c.NorthSouth.Acceleration = AccelBestEffort })
	if mode, err := tp.xdpMode(); err != nil || mode != AccelGeneric {
		t.Errorf("best-effort on a veth: %q (%v), want generic", mode, err)
	}
	// A restart in another mode re-attaches in that mode.
	tp.backend.Close()
	tp.cfg.NorthSouth.Acceleration = AccelNative
	b, err := New(tp.cfg)
	if err != nil {
		t.Fatalf("New with native XDP on a veth: %v", err)
	}
	tp.backend = b
	if mode, err := tp.xdpMode(); err != nil || mode != AccelNative {
		t.Errorf("native: %q (%v)", mode, err)
	}
	// A restart in the same mode swaps the program in the pinned link.
	tp.restart()
	if mode, err := tp.xdpMode(); err != nil || mode != AccelNative {
		t.Errorf("native after restart: %q (%v)", mode, err)
	}
	// Another proxy (its own pin directory) cannot take the device's XDP
	// slot: a clear error naming the device.
	other := tp.cfg
	other.PinDir = filepath.Join(testPinRoot, testutil.UniqueName("ns-"))
	t.Cleanup(func() { CleanupPinned(other.PinDir) })
	if b, err := New(other); err == nil {
		b.Close()
		t.Errorf("a second proxy attached XDP to a device that has it")
	} else if !strings.Contains(err.Error(), "another XDP program is attached to it") {
		t.Errorf("second proxy: %v, want a clear busy error", err)
	}
}

// xdpMD is struct xdp_md, the context BPF_PROG_RUN takes for XDP.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// csum16 is the Internet checksum's one's-complement sum of b (not
// complemented), starting from sum.
func csum16(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return sum
}

// pseudo is the IPv4 pseudo-header sum of an IP packet's L4 segment.
func pseudo(ip []byte) uint32 {
	l4 := len(ip) - 20
	return csum16(uint32(ip[9])+uint32(l4), ip[12:20])
}

// frame builds client -> dst Ethernet/IPv4/(TCP SYN | UDP) frame. l4sum:
// "full" (a complete checksum), "seed" (the pseudo-header sum only, as a
// sender with checksum offload leaves it) or "none" (UDP's 0).
func frame(dstMAC net.HardwareAddr, src, dst netip.AddrPort, tcp bool, l4sum string) []byte {
	var l4 []byte
	proto := byte(17)
	if tcp {
		proto = 6
		l4 = make([]byte, 20)
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN
		binary.BigEndian.PutUint16(l4[14:], 64240)
	} else {
		l4 = make([]byte, 8+5)
		copy(l4[8:], "hello")
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	binary.BigEndian.PutUint16(l4[0:], src.Port())
	binary.BigEndian.PutUint16(l4[2:], dst.Port())
	ip := make([]byte, 20, 20+len(l4))
	ip[0], ip[8], ip[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	binary.BigEndian.PutUint16(ip[10:], ^uint16(csum16(0, ip)))
	ip = append(ip, l4...)
	off := 20 + 16
	if !tcp {
		off = 20 + 6
	}
	switch l4sum {
	case "full":
		binary.BigEndian.PutUint16(ip[off:], ^uint16(csum16(pseudo(ip), ip[20:])))
	case "seed":
		binary.BigEndian.PutUint16(ip[off:], uint16(pseudo(ip)))
	}
	eth := make([]byte, 14, 14+len(ip))
	copy(eth[0:], dstMAC)
	copy(eth[6:], net.HardwareAddr{0x02, 0, 0, 0, 0x28, 0x30})
	binary.BigEndian.PutUint16(eth[12:], 0x0800)
	return append(eth, ip...)
}

// TestNorthSouthXDPChecksums runs the XDP program on crafted frames
// (BPF_PROG_RUN in node1, as if they arrived on eth0) and checks the
// checksums it fixed by hand: IPv4 header, TCP and UDP (full checksums
// stay valid, UDP's "no checksum" stays 0), and that a checksum left to
// offload is passed to tc untouched.
func TestNorthSouthXDPChecksums(t *testing.T) {
	tp := newNSTopo(t)
	tp.clientWire(AccelGeneric)
	tp.start(func(c *Config) { c.NorthSouth.Acceleration = AccelGeneric })
	tp.sync(nodePortFrontend("10.27.0.1", 30080, dataplane.TCP, false, "10.27.2.10:8080"),
		nodePortFrontend("10.27.0.1", 30080, dataplane.UDP, false, "10.27.2.10:8080"))
	// A real flow first, so node1 has node2's MAC (the FIB needs it).
	c, _, _, err := tp.dial("10.27.0.1:30080")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	var ifindex int
	var mac net.HardwareAddr
	if err := tp.node1.do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			ifindex, mac = l.Attrs().Index, l.Attrs().HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	front := netip.MustParseAddrPort("10.27.0.1:30080")
	for i, c := range []struct {
		tcp  bool
		sum  string
		want uint32 // XDP action
	}{
		{false, "none", 3}, {false, "full", 3}, {true, "full", 3}, {true, "seed", 2}, {false, "seed", 2},
	} {
		src := netip.AddrPortFrom(tp.clientIP, uint16(28301+i))
		in := frame(mac, src, front, c.tcp, c.sum)
		out := make([]byte, len(in)+64)
		var ret uint32
		err := tp.node1.do(func() (err error) {
			ret, err = tp.backend.np.objs.WaggleNpXdp.Run(&ebpf.RunOptions{Data: in, DataOut: out,
				Context: xdpMD{DataEnd: uint32(len(in)), IngressIfindex: uint32(ifindex)}})
			return err
		})
		if err != nil {
			t.Fatalf("case %d: run: %v", i, err)
		}
		name := fmt.Sprintf("case %d (tcp %v, checksum %s)", i, c.tcp, c.sum)
		if ret != c.want {
			t.Errorf("%s: XDP action %d, want %d", name, ret, c.want)
			continue
		}
		out = out[:len(in)]
		if ret == 2 {
			if !bytes.Equal(out, in) {
				t.Errorf("%s: passed on but changed", name)
			}
			continue
		}
		ip := out[14:]
		if got := netip.AddrFrom4([4]byte(ip[12:16])); got != tp.node1Addr {
			t.Errorf("%s: source %s, want node1 (SNAT)", name, got)
		}
		if got := netip.AddrFrom4([4]byte(ip[16:20])).String(); got != "10.27.2.10" {
			t.Errorf("%s: destination %s, want the backend", name, got)
		}
		if ip[8] != 63 {
			t.Errorf("%s: TTL %d, want 63", name, ip[8])
		}
		if s := csum16(0, ip[:20]); s != 0xffff {
			t.Errorf("%s: IP header checksum wrong (sum %#x)", name, s)
		}
		off := 6
		if c.tcp {
			off = 16
		}
		if c.sum == "none" {
			if ip[20+off] != 0 || ip[20+off+1] != 0 {
				t.Errorf("%s: UDP checksum %#x, want 0 (none)", name, ip[20+off:20+off+2])
			}
			continue
		}
		if s := csum16(pseudo(ip), ip[20:]); s != 0xffff {
			t.Errorf("%s: L4 checksum wrong after the rewrite (sum %#x)", name, s)
		}
	}
}

// TestNorthSouthRewriteChecksums runs the tc and XDP ingress programs
// (BPF_PROG_RUN in node1, as if the packets arrived on eth0) on many new
// flows and their replies — every address and port rewritten, the four
// changes folded into two checksum differences — with random ports,
// addresses and payloads, and checks every output's IPv4 header and L4
// checksums (full checksums, as a receiver verifies them).
func TestNorthSouthRewriteChecksums(t *testing.T) {
	tp := newNSTopo(t)
	tp.clientWire(AccelGeneric)
	tp.start()
	tp.sync(nodePortFrontend("10.27.0.1", 30080, dataplane.TCP, false, "10.27.2.10:8080", "10.27.2.11:8081"),
		nodePortFrontend("10.27.0.1", 30080, dataplane.UDP, false, "10.27.2.10:8080", "10.27.2.11:8081"))
	resolveNeigh(t, tp.node1, "10.27.0.2", "10.27.0.100")
	ifindex, mac := linkOf(t, tp.node1, "eth0")
	objs := tp.backend.np.objs
	front := netip.MustParseAddrPort("10.27.0.1:30080")
	rnd := rand.New(rand.NewPCG(1, 2))
	check := func(name string, out []byte) {
		t.Helper()
		ip := out[14:]
		if s := csum16(0, ip[:20]); s != 0xffff {
			t.Fatalf("%s: IP header checksum wrong (sum %#x)", name, s)
		}
		if s := csum16(pseudo(ip), ip[20:]); s != 0xffff {
			t.Fatalf("%s: L4 checksum wrong (sum %#x)", name, s)
		}
	}
	for i := range 2000 {
		tcp := i%2 == 0
		src := netip.AddrPortFrom(tp.clientIP, uint16(1024+rnd.IntN(60000))) // XDP forwards only to resolved neighbours
		in := frame(mac, src, front, tcp, "full")
		if !tcp {
			// a random payload, the checksum full again
			ip := in[14:]
			binary.BigEndian.PutUint16(ip[28:], uint16(rnd.Uint32()))
			ip[26], ip[27] = 0, 0
			binary.BigEndian.PutUint16(ip[26:], ^uint16(csum16(pseudo(ip), ip[20:])))
			if binary.BigEndian.Uint16(ip[26:]) == uint16(pseudo(ip)) {
				continue // taken for an offloaded checksum by XDP (1 in 65,536)
			}
		}
		xdp := i%4 < 2
		prog, want, ctx := objs.WaggleNpIngress, uint32(7), any(skbCtx{Ifindex: ifindex})
		if xdp {
			prog, want, ctx = objs.WaggleNpXdp, 3, any(xdpMD{DataEnd: uint32(len(in)), IngressIfindex: ifindex})
		}
		name := fmt.Sprintf("flow %d (tcp %v, xdp %v)", i, tcp, xdp)
		out := make([]byte, len(in))
		var ret uint32
		if err := tp.node1.do(func() (err error) { ret, _, err = runOnce(prog, in, out, ctx); return err }); err != nil {
			t.Fatal(err)
		}
		if ret != want {
			t.Fatalf("%s: verdict %d, want %d", name, ret, want)
		}
		check(name, out)
		// The reply: backend -> node1:SNAT port, translated back to the client.
		ip := out[14:]
		be := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(ip[22:]))
		snat := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(ip[20:]))
		rep := frame(mac, be, snat, tcp, "full")
		if tcp {
			rep = setTCPFlags(rep, 0x12)
		}
		if xdp {
			ctx = any(xdpMD{DataEnd: uint32(len(rep)), IngressIfindex: ifindex})
		}
		rout := make([]byte, len(rep))
		if err := tp.node1.do(func() (err error) { ret, _, err = runOnce(prog, rep, rout, ctx); return err }); err != nil {
			t.Fatal(err)
		}
		if ret != want {
			t.Fatalf("%s reply: verdict %d, want %d", name, ret, want)
		}
		check(name+" reply", rout)
		if got := netip.AddrPortFrom(netip.AddrFrom4([4]byte(rout[14+16:14+20])), binary.BigEndian.Uint16(rout[14+22:])); got != src {
			t.Fatalf("%s reply: to %s, want the client %s", name, got, src)
		}
	}
}
