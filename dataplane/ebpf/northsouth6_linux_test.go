package ebpf

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
)

// IPv6 north-south, on the dual-stack topology (newNSTopo6):
//
//	client fd06::100 ─┐
//	node1  fd06::1   ─┼─ br0      node1: pods fd06:1::10, fd06:1::11
//	node2  fd06::2   ─┘           node2: pod  fd06:2::10
//
// (and 10.66.0.0/16 beside it).

// fullChecksums makes the client and the pods send full TCP/UDP checksums,
// as a machine on a wire does, so every receiver verifies what the programs
// rewrote (a veth's offload leaves the checksum unchecked).
func (tp *nsTopo) fullChecksums() { tp.clientWire(AccelGeneric) }

// A dual-stack Service answers on both families, each with its family's
// endpoints: NodePorts and ExternalIPs, with ClientIP affinity per family.
func TestNorthSouthDualStackService(t *testing.T) {
	tp := newNSTopo6(t)
	tp.client.run(t, "ip", "-6", "route", "add", "fd06:8::80/128", "via", "fd06::1")
	tp.client.run(t, "ip", "route", "add", "10.66.8.80/32", "via", "10.66.0.1")
	tp.start()
	var fs []dataplane.Frontend
	for _, fam := range []struct {
		node, ext string
		bes       []string
	}{
		{"10.66.0.1", "10.66.8.80", []string{"10.66.1.10:8080", "10.66.1.11:8080", "10.66.2.10:8080"}},
		{"fd06::1", "fd06:8::80", []string{"[fd06:1::10]:8080", "[fd06:1::11]:8080", "[fd06:2::10]:8080"}},
	} {
		np := nodePortFrontend(fam.node, 30090, dataplane.TCP, false, fam.bes...)
		np.Service.Name = "ds"
		ext := nodePortFrontend(fam.ext, 80, dataplane.TCP, false, fam.bes...)
		ext.Service.Name, ext.Kind = "ds", dataplane.ExternalIP
		aff := nodePortFrontend(fam.node, 30091, dataplane.TCP, false, fam.bes...)
		aff.AffinityTimeout = time.Hour
		fs = append(fs, np, ext, aff)
	}
	tp.sync(fs...)
	for _, to := range []string{"10.66.0.1:30090", "[fd06::1]:30090", "10.66.8.80:80", "[fd06:8::80]:80"} {
		want6 := strings.HasPrefix(to, "[")
		seen := map[string]bool{}
		for i := 0; i < 12; i++ {
			c, pod, _, err := tp.dial(to)
			if err != nil {
				t.Fatalf("%s: %v", to, err)
			}
			c.Close()
			if netip.MustParseAddr(pod).Is6() != want6 {
				t.Errorf("%s answered by %s, another family", to, pod)
			}
			seen[pod] = true
		}
		if len(seen) < 2 {
			t.Errorf("12 flows to %s reached only %v (Maglev should spread them)", to, seen)
		}
	}
	for _, to := range []string{"10.66.0.1:30091", "[fd06::1]:30091"} {
		first := ""
		for i := 0; i < 8; i++ {
			c, pod, _, err := tp.dial(to)
			if err != nil {
				t.Fatalf("%s: %v", to, err)
			}
			c.Close()
			if first == "" {
				first = pod
			} else if pod != first {
				t.Fatalf("%s: connection %d reached %s, want %s (ClientIP affinity)", to, i, pod, first)
			}
		}
	}
}

// IPv6 extension headers: hop-by-hop and destination options headers
// before the UDP header are skipped (the L4 offset follows them, the
// checksum update lands in the right place), so such datagrams are
// translated like any other.
func TestNorthSouthIPv6SkipsOptionsHeaders(t *testing.T) {
	tp := newNSTopo6(t)
	tp.start()
	tp.sync(nodePortFrontend("fd06::1", 30080, dataplane.UDP, false, "[fd06:2::10]:8080"),
		nodePortFrontend("fd06::1", 30081, dataplane.UDP, false, "[fd06:1::10]:8080"))
	tp.fullChecksums()
	// An options header of 8 bytes: next header (set by the kernel),
	// length 0, a PadN option of 4 bytes.
	opts := string([]byte{0, 0, 1, 4, 0, 0, 0, 0})
	for _, c := range []struct{ to, pod, seen string }{
		{"[fd06::1]:30080", "fd06:2::10", "fd06::1"},
		{"[fd06::1]:30081", "fd06:1::10", "fd06::100"},
	} {
		var pod, seen string
		err := tp.client.do(func() error {
			conn, err := net.Dial("udp", c.to)
			if err != nil {
				return err
			}
			defer conn.Close()
			rc, err := conn.(*net.UDPConn).SyscallConn()
			if err != nil {
				return err
			}
			var serr error
			rc.Control(func(fd uintptr) {
				if serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, unix.IPV6_HOPOPTS, opts); serr == nil {
					serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, opts)
				}
			})
			if serr != nil {
				return fmt.Errorf("set options headers: %w", serr)
			}
			buf := make([]byte, 256)
			for i := 0; i < 5; i++ {
				conn.Write([]byte("hi"))
				conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				n, err := conn.Read(buf)
				if err == nil {
					f := strings.Fields(string(buf[:n]))
					pod = f[0]
					seen, _, _ = net.SplitHostPort(f[1])
					return nil
				}
			}
			return errors.New("no UDP answer")
		})
		if err != nil || pod != c.pod || seen != c.seen {
			t.Errorf("UDP %s with hop-by-hop and destination options headers: %s seeing %s, %v; want %s seeing %s", c.to, pod, seen, err, c.pod, c.seen)
		}
	}
	v, err := OpenPinned(tp.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if st, err := v.NorthSouthStats(); err != nil || st["ipv6_exthdr"] != 0 || st["xlate_snat"] == 0 || st["xlate_local"] == 0 {
		t.Errorf("stats %v, %v: want the datagrams translated, none left to the stack", st, err)
	}
}

// Path MTU discovery through the NodePort: a router between node1 and a
// remote backend (node2, its route to the pod locked at 1280 bytes) sends
// "packet too big" to node1's SNAT address; node1 translates it back to
// the client, whose TCP lowers its segment size and gets through. Without
// the translation the client never learns the MTU and the large echo
// times out.
func TestNorthSouthIPv6PacketTooBigReachesTheClient(t *testing.T) {
	tp := newNSTopo6(t)
	tp.node2.run(t, "ip", "-6", "route", "replace", "fd06:2::10/128", "dev", "p210", "mtu", "lock", "1280")
	tp.start()
	tp.sync(nodePortFrontend("fd06::1", 30085, dataplane.TCP, false, "[fd06:2::10]:8080"))
	conn, pod, _, err := tp.dial("[fd06::1]:30085")
	if err != nil || pod != "fd06:2::10" {
		t.Fatalf("dial: %s, %v", pod, err)
	}
	defer conn.Close()
	if err := echo(conn, strings.Repeat("0123456789", 400)); err != nil {
		t.Fatalf("4,000 bytes over a 1,280-byte hop: %v (packet too big not translated?)", err)
	}
	v, err := OpenPinned(tp.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if st, err := v.NorthSouthStats(); err != nil || st["icmp_error"] == 0 {
		t.Errorf("icmp_error not counted: %v %v", st, err)
	}
}
