package ebpf

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/internal/testutil"
)

// startNode2 loads a second Backend for node2 (north-south on its eth0),
// in the given mode: the backend node's side of direct server return. It
// returns node2's pin directory.
func (tp *nsTopo) startNode2(mode string) string {
	t := tp.t
	node := testutil.UniqueName("ns2-")
	cfg := Config{NodeName: node, CgroupPath: testutil.NewCgroup(t), PinDir: filepath.Join(testPinRoot, node),
		MaxServices: 1 << 12, MaxBackends: 1 << 12, MaxAffinity: 1024, MaxReverseSockets: 1024,
		NorthSouth: &NorthSouth{Devices: []string{"eth0"}, NetNS: tp.node2.path(), MaglevTableSize: 251, LBMode: mode},
		Log:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	cfg.NorthSouth.Acceleration = testAcceleration()
	t.Cleanup(func() {
		if err := CleanupPinned(cfg.PinDir); err != nil {
			t.Errorf("cleanup node2's pinned state: %v", err)
		}
	})
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New (node2): %v", err)
	}
	t.Cleanup(func() { b.Close() })
	tp.node2Backend = b
	return cfg.PinDir
}

// wireCounters counts, on the wire's bridge, the TCP and UDP packets node1
// sends to the client and the ones node2 sends to the client with node1's
// address node1 as source, per protocol; dropA drops node1's packets of
// those protocols to the client (its return path broken).
func (tp *nsTopo) wireCounters(node1 netip.Addr, dropA ...string) func(name string) int {
	t := tp.t
	tp.wire.run(t, "nft", "add table bridge dsrw")
	tp.wire.run(t, "nft", "add chain bridge dsrw fw { type filter hook forward priority 0 ; }")
	for _, proto := range []string{"tcp", "udp"} {
		verdict := ""
		for _, d := range dropA {
			if d == proto {
				verdict = " drop"
			}
		}
		tp.wire.run(t, "nft", "add counter bridge dsrw a2c_"+proto)
		tp.wire.run(t, "nft", "add counter bridge dsrw b2c_"+proto)
		fam := "ip"
		if node1.Is6() {
			fam = "ip6"
		}
		tp.wire.run(t, "nft", `add rule bridge dsrw fw iifname "n1" oifname "c0" meta l4proto `+proto+" counter name a2c_"+proto+verdict)
		tp.wire.run(t, "nft", `add rule bridge dsrw fw iifname "n2" oifname "c0" `+fam+" saddr "+node1.String()+
			" meta l4proto "+proto+" counter name b2c_"+proto)
	}
	re := regexp.MustCompile(`packets (\d+)`)
	return func(name string) int {
		t.Helper()
		out := tp.wire.run(t, "nft", "list counter bridge dsrw "+name)
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("counter %s: %q", name, out)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
}

// TestNorthSouthDirectServerReturn: a client reaches a NodePort on node1
// whose backend is on node2. In DSR mode node1 forwards the client's
// packets with the client's address and the NodePort in an IP option;
// node2's program records the flow and answers the client directly with
// node1's NodePort as the source: the conversation works while node1's
// packets to the client are dropped on the wire, node2's link carries the
// replies, and the pod sees the client's address. Hybrid mode does that for
// TCP and SNATs UDP; SNAT mode sends every reply back through node1 (the
// pod sees node1). IPv4 (the option) and IPv6 (a destination-options
// header), each in a dual-stack network.
func TestNorthSouthDirectServerReturn(t *testing.T) {
	for _, c := range []struct {
		mode           string
		tcpDSR, udpDSR bool
	}{
		{LBModeDSR, true, true},
		{LBModeHybrid, true, false},
		{LBModeSNAT, false, false},
	} {
		for _, fam := range []string{"IPv4", "IPv6"} {
			t.Run(c.mode+"/"+fam, func(t *testing.T) {
				tp := newNSTopoNet(t, nsTopoNet{prefix: "dsr", v4: "10.71", v6: "fd71"})
				ip := tp.net.ip4
				if fam == "IPv6" {
					ip = tp.net.ip6
				}
				node, client, pod := ip(0, 1), ip(0, 100), ip(2, 10)
				var drop []string
				if c.tcpDSR {
					drop = append(drop, "tcp")
				}
				if c.udpDSR {
					drop = append(drop, "udp")
				}
				count := tp.wireCounters(netip.MustParseAddr(node), drop...)
				tp.start(func(cfg *Config) { cfg.NorthSouth.LBMode = c.mode })
				node2Pins := tp.startNode2(c.mode)
				to := net.JoinHostPort(node, "30080")
				tp.sync(
					nodePortFrontend(node, 30080, dataplane.TCP, false, net.JoinHostPort(pod, "8080")),
					nodePortFrontend(node, 30080, dataplane.UDP, false, net.JoinHostPort(pod, "8080")),
				)
				want := func(dsr bool) string {
					if dsr {
						return client // the client's address kept
					}
					return node // SNAT
				}
				for i := 0; i < 3; i++ {
					conn, answered, seen, err := tp.dial(to)
					if err != nil {
						t.Fatalf("TCP %s (connection %d): %v", to, i, err)
					}
					if answered != pod || seen != want(c.tcpDSR) {
						t.Errorf("TCP %s: answered by %s seeing %s, want %s seeing %s", to, answered, seen, pod, want(c.tcpDSR))
					}
					// More than an MTU each way: segments after the
					// handshake carry no option.
					if err := echo(conn, strings.Repeat("direct ", 300)); err != nil {
						t.Errorf("TCP %s: echo: %v", to, err)
					}
					if got := conn.RemoteAddr().String(); got != to {
						t.Errorf("client's peer %s, want %s", got, to)
					}
					conn.Close()
				}
				if c.tcpDSR {
					// node2's state of a DSR flow ends with it: right after
					// a DSR connection is reset, a direct connection to the
					// pod from the same client port (no option) gets its own
					// replies, not the NodePort's address.
					direct := net.JoinHostPort(pod, "8080")
					err := tp.client.do(func() error {
						for _, target := range []string{to, direct} {
							d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(client), Port: 41234}}
							conn, err := d.Dial("tcp", target)
							if err != nil {
								return fmt.Errorf("%s from port 41234: %w", target, err)
							}
							conn.SetDeadline(time.Now().Add(10 * time.Second))
							line, err := bufio.NewReader(conn).ReadString('\n')
							if err != nil || !strings.HasPrefix(line, pod+" ") {
								conn.Close()
								return fmt.Errorf("%s from port 41234: greeting %q, %v", target, line, err)
							}
							conn.(*net.TCPConn).SetLinger(0) // RST: no TIME_WAIT, the port is free at once
							conn.Close()
						}
						return nil
					})
					if err != nil {
						t.Errorf("a DSR connection, then a direct one on the same tuple: %v", err)
					}
				}
				answered, seen, err := tp.udp(to)
				if err != nil || answered != pod || seen != want(c.udpDSR) {
					t.Errorf("UDP %s: %s seeing %s, %v; want %s seeing %s", to, answered, seen, err, pod, want(c.udpDSR))
				}

				for _, p := range []struct {
					proto string
					dsr   bool
				}{{"tcp", c.tcpDSR}, {"udp", c.udpDSR}} {
					a, b := count("a2c_"+p.proto), count("b2c_"+p.proto)
					if p.dsr && (a != 0 || b == 0) {
						t.Errorf("%s, DSR: node1 sent %d packets to the client (dropped), node2 %d from the NodePort; want 0 and some", p.proto, a, b)
					}
					if !p.dsr && (a == 0 || b != 0) {
						t.Errorf("%s, SNAT: node1 sent %d packets to the client, node2 %d from the NodePort; want some and 0", p.proto, a, b)
					}
				}

				st1 := tp.npStats()
				v2, err := OpenPinned(node2Pins)
				if err != nil {
					t.Fatal(err)
				}
				defer v2.Close()
				st2, err := v2.NorthSouthStats()
				if err != nil {
					t.Fatal(err)
				}
				dsrFlows := 0
				if c.tcpDSR {
					dsrFlows += 4 // 3, and the one from port 41234
				}
				if c.udpDSR {
					dsrFlows++
				}
				if int(st1["xlate_dsr"]) != dsrFlows || (dsrFlows > 0) != (st1["dsr_opt"] > 0 && st2["dsr_recv"] > 0) {
					t.Errorf("%d DSR flows: node1 %v, node2 %v", dsrFlows, st1, st2)
				}
				if testAcceleration() != "" && st1["xdp_fwd"] == 0 {
					t.Errorf("XDP forwarded nothing on node1: %v", st1)
				}
				if mode, err := v2.LBMode(); err != nil || mode != c.mode {
					t.Errorf("node2's mode %q, %v; want %s", mode, err, c.mode)
				}
				// node2 recorded the TCP flows: reply entries restoring the NodePort.
				ct, err := v2.Conntrack()
				if err != nil {
					t.Fatal(err)
				}
				var recorded []string
				for _, e := range ct {
					if e.DSR && e.Direction == "reply" && e.Protocol == dataplane.TCP {
						recorded = append(recorded, fmt.Sprintf("%s->%s as %s", e.Src, e.Dst, e.NAT))
						if e.NAT.String() != to || e.Addr.Addr().String() != client {
							t.Errorf("node2's entry %+v: want the NodePort %s restored toward %s", e, to, client)
						}
					}
				}
				if c.tcpDSR != (len(recorded) == 3) {
					t.Errorf("node2's DSR reply entries: %v", recorded)
				}
			})
		}
	}
}

// TestNorthSouthDSRWithoutRoomForTheOption: in DSR mode, a new UDP flow
// whose first datagram would exceed the MTU with the 8-byte option (a
// 1,500-byte packet) or is fragmented is SNATed instead (dsr_mtu); a big
// datagram of an established DSR flow goes without the option, and the
// backend's node, which recorded the flow from the first datagram, still
// answers the client directly.
func TestNorthSouthDSRWithoutRoomForTheOption(t *testing.T) {
	tp := newNSTopoNet(t, nsTopoNet{prefix: "dsr", v4: "10.71"})
	ip := tp.net.ip4
	node, client, pod := ip(0, 1), ip(0, 100), ip(2, 10)
	count := tp.wireCounters(tp.node1Addr)
	tp.start(func(cfg *Config) { cfg.NorthSouth.LBMode = LBModeDSR })
	tp.startNode2(LBModeDSR)
	tp.serveBigUDP(pod, 8081)
	tp.sync(nodePortFrontend(node, 30081, dataplane.UDP, false, net.JoinHostPort(pod, "8081")))
	to := net.JoinHostPort(node, "30081")
	full := bytes.Repeat([]byte("m"), 1500-20-8) // one 1,500-byte packet
	for _, msg := range [][]byte{full, bytes.Repeat([]byte("f"), 3000)} {
		seen, err := tp.bigUDP(to, msg)
		if err != nil || seen != node {
			t.Errorf("UDP %d bytes as a new flow: the pod saw %s, %v; want %s (SNAT)", len(msg), seen, err, node)
		}
	}
	if st := tp.npStats(); st["dsr_mtu"] < 2 || st["xlate_dsr"] != 0 {
		t.Errorf("stats %v: want two flows SNATed for the MTU, none DSR", st)
	}
	viaA := count("a2c_udp")

	// An established DSR flow: a small datagram, then a full one.
	err := tp.client.do(func() error {
		c, err := net.Dial("udp", to)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for _, msg := range [][]byte{[]byte("small"), full} {
			var n int
			for range 5 {
				if _, err = c.Write(msg); err != nil {
					return err
				}
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				if n, err = c.Read(buf); err == nil {
					break
				}
			}
			if err != nil {
				return fmt.Errorf("%d bytes: %w", len(msg), err)
			}
			peer, rest, _ := bytes.Cut(buf[:n], []byte("\n"))
			if !strings.HasPrefix(string(peer), client+":") || !bytes.Equal(rest, msg) {
				return fmt.Errorf("%d bytes: answer %q..., want the client %s seen and the datagram back", len(msg), buf[:min(n, 40)], client)
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("established DSR flow: %v", err)
	}
	if got := count("a2c_udp"); got != viaA {
		t.Errorf("node1 sent %d more UDP packets to the client: want the DSR flow's answers from node2 only", got-viaA)
	}
	if b := count("b2c_udp"); b < 2 {
		t.Errorf("node2 sent %d UDP packets from the NodePort to the client, want 2", b)
	}
	if st := tp.npStats(); st["xlate_dsr"] != 1 || st["dsr_mtu"] < 3 {
		t.Errorf("stats %v: want one DSR flow and its full datagram sent without the option", st)
	}
}
