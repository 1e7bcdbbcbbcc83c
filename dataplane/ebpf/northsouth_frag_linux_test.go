package ebpf

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
)

// dontFragment lets the kernel fragment a UDP socket's datagrams larger than
// the path MTU (no DF bit, no EMSGSIZE), as an application sending large
// datagrams without path MTU discovery does.
func dontFragment(c syscall.Conn, v6 bool) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DONT)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
		}
	}); err != nil {
		return err
	}
	return serr
}

// serveBigUDP runs a UDP echo server on pod ip:port that answers each
// datagram with "<peer>\n" and the datagram, fragmented as the request was.
func (tp *nsTopo) serveBigUDP(ip string, port uint16) {
	t := tp.t
	var pc *net.UDPConn
	if err := tp.pods[ip].do(func() (err error) {
		pc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(ip), port)))
		if err != nil {
			return err
		}
		return dontFragment(pc, netip.MustParseAddr(ip).Is6())
	}); err != nil {
		t.Fatalf("UDP echo server on pod %s: %v", ip, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			pc.WriteToUDPAddrPort(append([]byte(from.String()+"\n"), buf[:n]...), from)
		}
	}()
}

// bigUDP sends msg in one datagram from the client's connected socket
// (fragmented: DF off) and returns the address the server saw, once the
// answer came back whole.
func (tp *nsTopo) bigUDP(to string, msg []byte) (seen string, err error) {
	ap := netip.MustParseAddrPort(to)
	err = tp.client.do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return err
		}
		defer c.Close()
		if err := dontFragment(c, ap.Addr().Is6()); err != nil {
			return err
		}
		buf := make([]byte, 65536)
		for range 5 {
			if _, err := c.Write(msg); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := c.Read(buf)
			if err != nil {
				continue
			}
			peer, rest, ok := bytes.Cut(buf[:n], []byte("\n"))
			if !ok || !bytes.Equal(rest, msg) {
				return fmt.Errorf("answer of %d bytes is not \"<peer>\\n\" and the %d bytes sent", n, len(msg))
			}
			p, err := netip.ParseAddrPort(string(peer))
			if err != nil {
				return fmt.Errorf("answer's peer %q: %w", peer, err)
			}
			seen = p.Addr().String()
			return nil
		}
		return errors.New("no answer to a fragmented datagram in 5 tries")
	})
	return seen, err
}

// TestNorthSouthFragmentedUDP: a UDP datagram larger than the MTU (3,000
// bytes; the client and the backends fragment it, DF off) to a NodePort is
// answered whole, IPv4 and IPv6, from a remote backend (DNAT + SNAT: the
// request's fragments on node1's ingress, the reply's on its ingress
// again) and from a local one (DNAT: the request on ingress, the reply's
// fragments on egress). Later fragments carry no ports: they are
// translated with their first fragment's (waggle_np_frag) and counted
// (frag_xlate); without that they reach node1's stack, which has no socket
// for them, and the datagram is lost. With XDP, which passes fragments on
// to tc, the same.
func TestNorthSouthFragmentedUDP(t *testing.T) {
	for _, accel := range []string{AccelDisabled, AccelGeneric} {
		t.Run("xdp="+accel, func(t *testing.T) { testFragmentedUDP(t, accel) })
	}
}

func testFragmentedUDP(t *testing.T, accel string) {
	tp := newNSTopoNet(t, nsTopoNet{prefix: "nsf", v4: "10.67", v6: "fd07"})
	for _, ip := range []string{"10.67.1.10", "10.67.2.10", "fd07:1::10", "fd07:2::10"} {
		tp.serveBigUDP(ip, 9090)
	}
	tp.clientWire(accel)
	tp.start(func(c *Config) { c.NorthSouth.Acceleration = accel })
	tp.sync(
		nodePortFrontend("10.67.0.1", 30090, dataplane.UDP, false, "10.67.2.10:9090"),
		nodePortFrontend("10.67.0.1", 30091, dataplane.UDP, false, "10.67.1.10:9090"),
		nodePortFrontend("fd07::1", 30090, dataplane.UDP, false, "[fd07:2::10]:9090"),
		nodePortFrontend("fd07::1", 30091, dataplane.UDP, false, "[fd07:1::10]:9090"),
	)
	msg := make([]byte, 3000)
	rand.Read(msg)
	before := tp.npStats()
	cases := []struct{ to, seen string }{
		{"10.67.0.1:30090", "10.67.0.1"},   // remote backend: SNAT to node1
		{"10.67.0.1:30091", "10.67.0.100"}, // local backend: the client
		{"[fd07::1]:30090", "fd07::1"},
		{"[fd07::1]:30091", "fd07::100"},
	}
	for _, c := range cases {
		seen, err := tp.bigUDP(c.to, msg)
		if err != nil {
			t.Errorf("%s: %v", c.to, err)
		} else if seen != c.seen {
			t.Errorf("%s: the backend saw %s, want %s", c.to, seen, c.seen)
		}
	}
	after := tp.npStats()
	// Three fragments each way: two later ones in each direction.
	if got, want := after["frag_xlate"]-before["frag_xlate"], uint64(4*len(cases)); got < want {
		t.Errorf("%d later fragments translated, want at least %d (stats %v)", got, want, after)
	}
}
