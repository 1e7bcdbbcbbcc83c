package conformance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/iptables"
	"github.com/waggle-io/waggle/internal/testutil"
)

// topology is the real fixture: a "node" network namespace (the client, and
// the rules of the backend under test) joined by a veth to a "pods"
// namespace holding the endpoints' echo servers.
type topology struct {
	node, pods *testutil.NetNS
}

const dialTimeout = 500 * time.Millisecond

func newTopology(t *testing.T) *topology {
	t.Helper()
	tp := &topology{node: testutil.NewNetNS(t), pods: testutil.NewNetNS(t)}
	tp.node.Run(t, "ip", "link", "add", "wgn0", "type", "veth", "peer", "name", "wgp0", "netns", tp.pods.Name)
	tp.node.Run(t, "ip", "addr", "add", nodeIP.String()+"/24", "dev", "wgn0")
	tp.node.Run(t, "ip", "link", "set", "wgn0", "up")
	tp.node.Run(t, "ip", "route", "add", "default", "via", testEPs[0].Addr().String())
	for _, e := range testEPs {
		tp.pods.Run(t, "ip", "addr", "add", e.Addr().String()+"/24", "dev", "wgp0")
	}
	tp.pods.Run(t, "ip", "link", "set", "wgp0", "up")
	for _, e := range testEPs {
		tp.serve(t, e)
	}
	return tp
}

// serve runs TCP and UDP echo servers on e in the pods namespace that answer
// every request with their own address.
func (tp *topology) serve(t *testing.T, e netip.AddrPort) {
	t.Helper()
	var ln net.Listener
	var pc *net.UDPConn
	err := tp.pods.Do(func(ns.NetNS) error {
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

// connect dials from the node namespace, sends one request and returns the
// address the endpoint announced.
func (tp *topology) connect(proto dataplane.Protocol, addr netip.AddrPort) (netip.AddrPort, error) {
	var c net.Conn
	err := tp.node.Do(func(ns.NetNS) error {
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

// udpFlow opens one connected UDP socket from the node namespace.
func (tp *topology) udpFlow(addr netip.AddrPort) (func() (netip.AddrPort, error), func(), error) {
	var c net.Conn
	err := tp.node.Do(func(ns.NetNS) error {
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

func TestRealIPTables(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "iptables-restore")
	testutil.RequiresBinary(t, "nsenter")
	Run(t, func(t *testing.T) *Target {
		tp := newTopology(t)
		path := filepath.Join("/run/netns", tp.node.Name)
		b, err := iptables.New(iptables.Config{NetNSPath: path, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b.Cleanup(context.Background()); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
		runner := &iptables.ExecRunner{NetNSPath: path}
		return &Target{
			Backend: b, Endpoints: testEPs, NodeIP: nodeIP, Connect: tp.connect, UDPFlow: tp.udpFlow,
			Dump: func() string {
				var out string
				for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
					for _, table := range []string{"filter", "nat"} {
						d, err := runner.Save(context.Background(), fam, table)
						if err != nil {
							return fmt.Sprintf("iptables-save: %v", err)
						}
						out += waggleLines(string(d))
					}
				}
				return out
			},
		}
	})
}

func TestRealEBPF(t *testing.T) {
	testutil.RequiresKernelFeature(t, testutil.CgroupSockAddr)
	testutil.RequiresKernelFeature(t, testutil.BTF)
	Run(t, func(t *testing.T) *Target {
		tp := newTopology(t)
		cg := testutil.NewCgroup(t)
		node := testutil.UniqueName("conf")
		pin := filepath.Join("/sys/fs/bpf/waggle-conformance", node)
		b, err := ebpf.New(ebpf.Config{NodeName: node, CgroupPath: cg, PinDir: pin,
			MaxServices: 1024, MaxBackends: 1024, MaxAffinity: 1024, MaxReverseSockets: 1024,
			Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b.Cleanup(context.Background()); err != nil && !errors.Is(err, ebpf.ErrClosed) {
				t.Errorf("cleanup: %v", err)
			}
			ebpf.CleanupPinned(pin)
			syscall.Rmdir("/sys/fs/bpf/waggle-conformance")
		})
		testutil.EnterCgroup(t, cg)
		return &Target{Backend: b, Endpoints: testEPs, NodeIP: nodeIP, Connect: tp.connect, UDPFlow: tp.udpFlow}
	})
}
