package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/internal/testutil"
)

// skbCtx is the head of struct __sk_buff that BPF_PROG_RUN lets a tc
// program's run set (the rest is zero): the device it runs on and the
// device the packet arrived on.
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority uint32
	IngressIfindex, Ifindex                                                               uint32
}

// progRunAttr is union bpf_attr's test member (BPF_PROG_TEST_RUN).
type progRunAttr struct {
	ProgFD, Retval            uint32
	DataSizeIn, DataSizeOut   uint32
	DataIn, DataOut           uint64
	Repeat, Duration          uint32
	CtxSizeIn, CtxSizeOut     uint32
	CtxIn, CtxOut             uint64
	Flags, CPU, BatchSize, _p uint32
}

// runOnce runs prog once on a fresh copy of in (the kernel builds a new
// skb or xdp_buff each call) with ctx, and returns its verdict and the
// kernel's own measure of the run in ns (cilium/ebpf's Run does not return
// it, and its Benchmark takes no context).
func runOnce(prog *ebpf.Program, in, out []byte, ctx any) (ret, ns uint32, err error) {
	c, err := binary.Append(nil, binary.NativeEndian, ctx)
	if err != nil {
		return 0, 0, err
	}
	attr := progRunAttr{ProgFD: uint32(prog.FD()), DataSizeIn: uint32(len(in)), DataSizeOut: uint32(len(out)),
		DataIn: uint64(uintptr(unsafe.Pointer(&in[0]))), DataOut: uint64(uintptr(unsafe.Pointer(&out[0]))),
		Repeat: 1, CtxSizeIn: uint32(len(c)), CtxIn: uint64(uintptr(unsafe.Pointer(&c[0])))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return 0, 0, fmt.Errorf("BPF_PROG_TEST_RUN: %w", errno)
	}
	return attr.Retval, attr.Duration, nil
}

// setTCPFlags turns a frame of frame() into a TCP segment with flags,
// with its checksum made full again.
func setTCPFlags(f []byte, flags byte) []byte {
	ip := f[14:]
	ip[20+13] = flags
	ip[20+16], ip[20+17] = 0, 0
	binary.BigEndian.PutUint16(ip[20+16:], ^uint16(csum16(pseudo(ip), ip[20:])))
	return f
}

// BenchmarkNorthSouthProgram measures what the north-south programs cost
// per packet, by the kernel's clock (BPF_PROG_RUN, one fresh packet per
// run, in node1's namespace as if the packet arrived on its eth0): a new
// flow to a remote backend (DNAT + SNAT), a packet of an established flow,
// its reply, and the egress program on a packet the ingress forwarded —
// tc, and the same ingress in XDP. The metric is prog-ns/pkt (ns/op also
// counts the syscall). Every run's verdict is checked, so a path that
// stopped forwarding fails instead of timing something else.
func BenchmarkNorthSouthProgram(b *testing.B) {
	tp := newNSTopo(b)
	tp.clientWire(AccelGeneric) // full checksums, so XDP forwards too
	tp.start()
	// 64 backends behind node2 (only the first answers a real client;
	// BPF_PROG_RUN needs only their route): new flows share 64 × 4,536 SNAT
	// ports instead of 4,536.
	var bes []string
	for i := range 64 {
		bes = append(bes, fmt.Sprintf("10.27.2.%d:8080", 10+i))
	}
	tp.sync(nodePortFrontend("10.27.0.1", 30080, dataplane.TCP, false, bes...),
		nodePortFrontend("10.27.0.1", 30080, dataplane.UDP, false, bes...))
	// node1 resolves node2's and the client's MACs (the FIB needs them).
	resolveNeigh(b, tp.node1, "10.27.0.2", "10.27.0.100")
	ifindex, mac := linkOf(b, tp.node1, "eth0")
	front := netip.MustParseAddrPort("10.27.0.1:30080")
	objs := tp.backend.np.objs
	tcCtx := skbCtx{Ifindex: ifindex}
	xdpCtx := func(n int) xdpMD { return xdpMD{DataEnd: uint32(n), IngressIfindex: ifindex} }
	const tcRedirect, xdpTX = 7, 3

	// established: the first run makes the flow; the output is the
	// translated packet (node1:snat -> backend), whose source is the flow's
	// SNAT address.
	est := frame(mac, netip.AddrPortFrom(tp.clientIP, 40000), front, false, "full")
	fwd := make([]byte, len(est)+64)
	var snat netip.AddrPort
	if err := tp.node1.do(func() error {
		if ret, _, err := runOnce(objs.WaggleNpIngress, est, fwd, tcCtx); err != nil || ret != tcRedirect {
			return fmt.Errorf("first packet: verdict %d (%v), want redirect", ret, err)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	fwd = fwd[:len(est)]
	snat = netip.AddrPortFrom(netip.AddrFrom4([4]byte(fwd[14+12:14+16])), binary.BigEndian.Uint16(fwd[14+20:]))
	backend := netip.AddrPortFrom(netip.AddrFrom4([4]byte(fwd[14+16:14+20])), binary.BigEndian.Uint16(fwd[14+22:]))
	reply := frame(mac, backend, snat, false, "full")

	run := func(name string, prog *ebpf.Program, want uint32, pkt func(i int) []byte, ctx func(n int) any) {
		progCase(b, tp.node1, name, prog, want, pkt, ctx)
	}
	tc := func(int) any { return tcCtx }
	xdp := func(n int) any { return xdpCtx(n) }
	same := func(f []byte) func(int) []byte { return func(int) []byte { return f } }
	// A new flow per run: client ports and addresses not seen before.
	newUDP := func(i int) []byte {
		src := netip.AddrFrom4([4]byte{10, 27, 0, byte(100 + i/60000%100)})
		f := frame(mac, netip.AddrPortFrom(src, uint16(1024+i%60000)), front, false, "full")
		if ip := f[14:]; binary.BigEndian.Uint16(ip[26:]) == uint16(pseudo(ip)) {
			// a full checksum equal to the pseudo-header sum: XDP takes
			// it for an offloaded one (1 in 65,536) and passes it to tc
			binary.BigEndian.PutUint16(ip[28:], 'X'<<8|'X')
			binary.BigEndian.PutUint16(ip[26:], 0)
			binary.BigEndian.PutUint16(ip[26:], ^uint16(csum16(pseudo(ip), ip[20:])))
		}
		return f
	}
	newSYN := newSYNs(mac, front)
	ack := setTCPFlags(frame(mac, netip.AddrPortFrom(tp.clientIP, 40001), front, true, "full"), 0x10)
	if err := tp.node1.do(func() error { // the TCP flow, made by its SYN
		_, _, err := runOnce(objs.WaggleNpIngress, frame(mac, netip.AddrPortFrom(tp.clientIP, 40001), front, true, "full"), make([]byte, 256), tcCtx)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	run("tc/udp-established", objs.WaggleNpIngress, tcRedirect, same(est), tc)
	run("tc/udp-reply", objs.WaggleNpIngress, tcRedirect, same(reply), tc)
	run("tc/tcp-ack-established", objs.WaggleNpIngress, tcRedirect, same(ack), tc)
	run("tc/udp-new-flow", objs.WaggleNpIngress, tcRedirect, newUDP, tc)
	run("tc/tcp-syn-new-flow", objs.WaggleNpIngress, tcRedirect, newSYN, tc)
	// The egress program on what the ingress forwarded out of eth0.
	run("tc-egress/forwarded", objs.WaggleNpEgress, uint32(1<<32-1), same(fwd),
		func(int) any { return skbCtx{Ifindex: ifindex, IngressIfindex: ifindex} })
	run("xdp/udp-established", objs.WaggleNpXdp, xdpTX, same(est), xdp)
	run("xdp/udp-reply", objs.WaggleNpXdp, xdpTX, same(reply), xdp)
	run("xdp/udp-new-flow", objs.WaggleNpXdp, xdpTX, func(i int) []byte { return newUDP(i + 1<<22) }, xdp)

	// DSR (--bpf-lb-mode=dsr): node1 puts the option into each new flow's
	// SYN; node2 records the flow and strips the option, and its egress
	// gives the backend's reply the NodePort's address.
	dp := newNSTopo(b)
	dp.start(func(c *Config) { c.NorthSouth.LBMode = LBModeDSR })
	dp.startNode2(LBModeDSR)
	dp.sync(nodePortFrontend("10.27.0.1", 30080, dataplane.TCP, false, bes...))
	resolveNeigh(b, dp.node1, "10.27.0.2")
	if1, mac1 := linkOf(b, dp.node1, "eth0")
	if2, _ := linkOf(b, dp.node2, "eth0")
	pod, _ := linkOf(b, dp.node2, "p210")
	client := netip.AddrPortFrom(dp.clientIP, 40002)
	syn := frame(mac1, client, front, true, "full")
	opt := make([]byte, len(syn)+8)
	if err := dp.node1.do(func() error {
		if ret, _, err := runOnce(dp.backend.np.objs.WaggleNpIngress, syn, opt, skbCtx{Ifindex: if1}); err != nil || ret != tcRedirect || opt[14] != 0x47 {
			return fmt.Errorf("DSR SYN: verdict %d (%v), IP header %#x, want redirect with the option (0x47)", ret, err, opt[14])
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	be := netip.AddrPortFrom(netip.AddrFrom4([4]byte(opt[14+16:14+20])), binary.BigEndian.Uint16(opt[14+28+2:]))
	synAck := setTCPFlags(frame(mac1, be, client, true, "full"), 0x12)
	progCase(b, dp.node1, "tc-dsr/tcp-syn-new-flow", dp.backend.np.objs.WaggleNpIngress, tcRedirect, newSYNs(mac1, front),
		func(int) any { return skbCtx{Ifindex: if1} })
	progCase(b, dp.node2, "tc-dsr-backend-node/tcp-syn-with-option", dp.node2Backend.np.objs.WaggleNpIngress, uint32(1<<32-1),
		func(int) []byte { return opt }, func(int) any { return skbCtx{Ifindex: if2} })
	progCase(b, dp.node2, "tc-dsr-backend-node/egress-reply", dp.node2Backend.np.objs.WaggleNpEgress, uint32(1<<32-1),
		func(int) []byte { return synAck }, func(int) any { return skbCtx{Ifindex: if2, IngressIfindex: pod} })
}

// newSYNs makes run i's TCP SYN of a new flow to front: client ports and
// addresses not seen before.
func newSYNs(mac net.HardwareAddr, front netip.AddrPort) func(i int) []byte {
	return func(i int) []byte {
		src := netip.AddrFrom4([4]byte{10, 27, 0, byte(100 + i/60000%100)})
		return frame(mac, netip.AddrPortFrom(src, uint16(1024+i%60000)), front, true, "full")
	}
}

// progCase runs prog once per benchmark iteration in namespace n on pkt(i)
// with ctx, checks each verdict and reports the kernel's run time.
func progCase(b *testing.B, n *nsNS, name string, prog *ebpf.Program, want uint32, pkt func(i int) []byte, ctx func(n int) any) {
	b.Run(name, func(b *testing.B) {
		var total uint64
		out := make([]byte, 256)
		if err := n.do(func() error {
			i := 0
			for b.Loop() {
				in := pkt(i)
				ret, ns, err := runOnce(prog, in, out, ctx(len(in)))
				if err != nil {
					return err
				}
				if ret != want {
					return fmt.Errorf("run %d: verdict %d, want %d", i, ret, want)
				}
				total += uint64(ns)
				i++
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(total)/float64(b.N), "prog-ns/pkt")
	})
}

// resolveNeigh makes namespace n resolve the MACs of addrs (the FIB of a
// program run there needs them).
func resolveNeigh(tb testing.TB, n *nsNS, addrs ...string) {
	for _, a := range addrs {
		testutil.WaitFor(tb, 10*time.Second, n.name+"'s neighbour entry of "+a, func() bool {
			return n.do(func() error {
				c, err := net.Dial("udp", a+":9")
				if err != nil {
					return err
				}
				c.Write([]byte("x"))
				c.Close()
				ns, err := netlink.NeighList(0, unix.AF_INET)
				for _, e := range ns {
					if e.IP.String() == a && e.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY) != 0 {
						return nil
					}
				}
				if err == nil {
					err = errors.New("not resolved")
				}
				return err
			}) == nil
		})
	}
}

// linkOf returns the ifindex and MAC of device name in namespace n.
func linkOf(tb testing.TB, n *nsNS, name string) (ifindex uint32, mac net.HardwareAddr) {
	if err := n.do(func() error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			ifindex, mac = uint32(l.Attrs().Index), l.Attrs().HardwareAddr
		}
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return ifindex, mac
}
