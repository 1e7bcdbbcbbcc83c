//go:build linux

package conformance

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/internal/testutil"
)

// The real topology's addresses: the node's, and four endpoints with TCP
// and UDP echo servers on port 8080.
var (
	NodeIP    = netip.MustParseAddr("10.99.0.254")
	Endpoints = []netip.AddrPort{
		netip.MustParseAddrPort("10.99.0.1:8080"), netip.MustParseAddrPort("10.99.0.2:8080"),
		netip.MustParseAddrPort("10.99.0.3:8080"), netip.MustParseAddrPort("10.99.0.4:8080"),
	}
	NodeIP6    = netip.MustParseAddr("fd00:99::fe")
	Endpoints6 = []netip.AddrPort{
		netip.MustParseAddrPort("[fd00:99::1]:8080"), netip.MustParseAddrPort("[fd00:99::2]:8080"),
	}
)

// Topology is the real fixture: a "node" network namespace (the client, and
// the rules of the backend under test) joined by a veth to a "pods"
// namespace holding the endpoints' echo servers.
type Topology struct {
	Node, Pods *testutil.NetNS
}

// dialTimeout is generous: the machines running these tests are shared and
// loaded, and a timeout here must mean "not served", not "slow".
const dialTimeout = 2 * time.Second

func NewTopology(t *testing.T) *Topology {
	t.Helper()
	testutil.RequiresRoot(t)
	tp := &Topology{Node: testutil.NewNetNS(t), Pods: testutil.NewNetNS(t)}
	tp.Node.Run(t, "ip", "link", "add", "wgn0", "type", "veth", "peer", "name", "wgp0", "netns", tp.Pods.Name)
	// No duplicate address detection: link-local addresses are usable at
	// once (neighbour discovery needs them).
	tp.Node.Run(t, "sysctl", "-qw", "net.ipv6.conf.wgn0.accept_dad=0")
	tp.Pods.Run(t, "sysctl", "-qw", "net.ipv6.conf.wgp0.accept_dad=0")
	tp.Node.Run(t, "ip", "addr", "add", NodeIP.String()+"/24", "dev", "wgn0")
	tp.Node.Run(t, "ip", "link", "set", "wgn0", "up")
	tp.Node.Run(t, "ip", "route", "add", "default", "via", Endpoints[0].Addr().String())
	tp.Node.Run(t, "ip", "addr", "add", NodeIP6.String()+"/64", "dev", "wgn0", "nodad")
	for _, e := range Endpoints {
		tp.Pods.Run(t, "ip", "addr", "add", e.Addr().String()+"/24", "dev", "wgp0")
	}
	for _, e := range Endpoints6 {
		tp.Pods.Run(t, "ip", "addr", "add", e.Addr().String()+"/64", "dev", "wgp0", "nodad")
	}
	tp.Pods.Run(t, "ip", "link", "set", "wgp0", "up")
	tp.Node.Run(t, "ip", "-6", "route", "add", "default", "via", Endpoints6[0].Addr().String())
	// Connections that no backend translated reach the pods namespace with
	// a service address: answer them at once with "no route to host"
	// instead of letting them time out.
	tp.Pods.Run(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	tp.Pods.Run(t, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	for _, p := range []string{"10.96.0.0/12", "203.0.113.0/24"} {
		tp.Pods.Run(t, "ip", "route", "add", "prohibit", p)
	}
	tp.Pods.Run(t, "ip", "-6", "route", "add", "prohibit", "fd00:96::/64")
	all := append(slices.Clone(Endpoints), Endpoints6...)
	for _, e := range all {
		tp.serve(t, e)
	}
	// Warm up: resolve the neighbours and check every echo server answers
	// directly before any backend is involved.
	for _, e := range all {
		for deadline := time.Now().Add(15 * time.Second); ; {
			got, err := tp.Connect(dataplane.TCP, e)
			if err == nil && got == e {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("direct connection to %s: %s, %v", e, got, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return tp
}

// serve runs TCP and UDP echo servers on e in the pods namespace that answer
// every request with their own address.
func (tp *Topology) serve(t *testing.T, e netip.AddrPort) {
	t.Helper()
	var ln net.Listener
	var pc *net.UDPConn
	err := tp.Pods.Do(func(ns.NetNS) error {
		var err error
		if ln, err = net.Listen("tcp", e.String()); err != nil {
			return err
		}
		pc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(e))
		return err
	})
	if err != nil {
		t.Fatalf("echo server on %s: %v", e, err)
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
				c.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 64)
				if _, err := c.Read(buf); err == nil {
					c.Write([]byte(e.String()))
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			pc.WriteToUDPAddrPort([]byte(e.String()), from)
		}
	}()
}

// Connect dials from the node namespace, sends one request and returns the
// address the endpoint announced.
func (tp *Topology) Connect(proto dataplane.Protocol, addr netip.AddrPort) (netip.AddrPort, error) {
	var c net.Conn
	err := tp.Node.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout(strings.ToLower(string(proto)), addr.String(), dialTimeout)
		return err
	})
	if err != nil {
		return netip.AddrPort{}, classify(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * dialTimeout))
	if _, err := c.Write([]byte("who")); err != nil {
		return netip.AddrPort{}, classify(err)
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return netip.AddrPort{}, classify(err)
	}
	return netip.ParseAddrPort(string(buf[:n]))
}

// UDPFlow opens one connected UDP socket from the node namespace.
func (tp *Topology) UDPFlow(addr netip.AddrPort) (func() (netip.AddrPort, error), func(), error) {
	var c net.Conn
	err := tp.Node.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("udp", addr.String(), dialTimeout)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	ask := func() (netip.AddrPort, error) {
		c.SetDeadline(time.Now().Add(2 * dialTimeout))
		if _, err := c.Write([]byte("who")); err != nil {
			return netip.AddrPort{}, classify(err)
		}
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		if err != nil {
			return netip.AddrPort{}, classify(err)
		}
		return netip.ParseAddrPort(string(buf[:n]))
	}
	return ask, func() { c.Close() }, nil
}

func classify(err error) error {
	return Classify(err, errors.Is(err, syscall.ECONNREFUSED))
}

// Reset forgets the connection tracking state of earlier cases (a UDP
// socket reusing a source port would otherwise follow an old translation).
func (tp *Topology) Reset(t *testing.T) {
	t.Helper()
	nsh, err := netns.GetFromName(tp.Node.Name)
	if err != nil {
		t.Fatalf("open netns %s: %v", tp.Node.Name, err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatalf("netlink in netns %s: %v", tp.Node.Name, err)
	}
	defer h.Close()
	// Every TCP, UDP and ICMP flow of both families (an empty filter
	// matches nothing).
	var filters []netlink.CustomConntrackFilter
	for _, p := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6} {
		f := &netlink.ConntrackFilter{}
		f.AddProtocol(p)
		filters = append(filters, f)
	}
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if _, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filters...); err != nil {
			t.Fatalf("flush conntrack: %v", err)
		}
	}
}
