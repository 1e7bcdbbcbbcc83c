package iptables_test

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/iptables"

	"github.com/waggle-io/waggle/internal/testutil"
)

// realBackend returns a backend programming a fresh network namespace.
func realBackend(t *testing.T) (*iptables.Backend, *iptables.ExecRunner, *testutil.NetNS) {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "iptables-restore")
	testutil.RequiresBinary(t, "nsenter")
	n := testutil.NewNetNS(t)
	path := filepath.Join("/run/netns", n.Name)
	b, err := iptables.New(iptables.Config{NetNSPath: path})
	if err != nil {
		t.Fatal(err)
	}
	return b, &iptables.ExecRunner{NetNSPath: path}, n
}

// saveWaggle returns iptables-save's Waggle lines (chains without
// counters, rules as the kernel reports them) of filter and nat.
func saveWaggle(t *testing.T, r *iptables.ExecRunner, fam iptables.Family) string {
	t.Helper()
	var b strings.Builder
	for _, table := range []string{"filter", "nat"} {
		out, err := r.Save(context.Background(), fam, table)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("*" + table + "\n")
		for _, l := range strings.Split(string(out), "\n") {
			if !strings.Contains(l, "WAGGLE") {
				continue
			}
			if strings.HasPrefix(l, ":") {
				l = l[:strings.LastIndex(l, " ")]
			}
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestRealIPTablesSaveGolden syncs the sample state into a real kernel and
// compares iptables-save with the golden file: the rules the kernel
// accepted, as it prints them.
func TestRealIPTablesSaveGolden(t *testing.T) {
	b, r, _ := realBackend(t)
	ctx := context.Background()
	if err := b.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	golden(t, "iptables-save-ipv4.golden", saveWaggle(t, r, iptables.IPv4))
	golden(t, "iptables-save-ipv6.golden", saveWaggle(t, r, iptables.IPv6))
	// A second backend (a restarted proxy) syncing the same state changes
	// nothing, and neither does a forced full sync.
	before := saveWaggle(t, r, iptables.IPv4) + saveWaggle(t, r, iptables.IPv6)
	b2, err := iptables.New(iptables.Config{NetNSPath: r.NetNSPath})
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	b2.RequestFullSync()
	if err := b2.Sync(ctx, sampleState()); err != nil {
		t.Fatal(err)
	}
	if after := saveWaggle(t, r, iptables.IPv4) + saveWaggle(t, r, iptables.IPv6); after != before {
		t.Errorf("restarted backend changed the rules:\n%s\nvs\n%s", before, after)
	}
	if err := b2.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if left := saveWaggle(t, r, iptables.IPv4) + saveWaggle(t, r, iptables.IPv6); strings.Count(left, "WAGGLE") != 0 {
		t.Errorf("cleanup left:\n%s", left)
	}
}

// TestRealIPTablesCoexistsAndNeverSetsRouteLocalnet puts foreign rules in
// the tables, syncs, partially syncs and cleans up, and checks the foreign
// rules survive and route_localnet stays off (CVE-2020-8558).
func TestRealIPTablesCoexistsAndNeverSetsRouteLocalnet(t *testing.T) {
	b, r, n := realBackend(t)
	ctx := context.Background()
	n.Run(t, "iptables", "-w", "-t", "nat", "-N", "OTHER")
	n.Run(t, "iptables", "-w", "-t", "nat", "-A", "OTHER", "-d", "172.17.0.2/32", "-j", "RETURN")
	n.Run(t, "iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-j", "OTHER")
	n.Run(t, "iptables", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
	st := sampleState()
	if err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	st.Frontends[0].Endpoints = st.Frontends[0].Endpoints[:1]
	if err := b.Sync(ctx, st); err != nil { // partial
		t.Fatal(err)
	}
	if err := b.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	nat, _ := r.Save(ctx, iptables.IPv4, "nat")
	filter, _ := r.Save(ctx, iptables.IPv4, "filter")
	for _, want := range []string{"-A OTHER -d 172.17.0.2/32 -j RETURN", "-A OUTPUT -j OTHER"} {
		if !strings.Contains(string(nat), want) {
			t.Errorf("foreign nat rule %q lost:\n%s", want, nat)
		}
	}
	if !strings.Contains(string(filter), "--dport 22 -j ACCEPT") {
		t.Errorf("foreign filter rule lost:\n%s", filter)
	}
	for _, f := range []string{"all", "default", "lo"} {
		v := strings.TrimSpace(n.Run(t, "cat", "/proc/sys/net/ipv4/conf/"+f+"/route_localnet"))
		if v != "0" {
			t.Errorf("route_localnet on %s is %s", f, v)
		}
	}
	if _, err := os.Stat("/proc/self"); err != nil {
		t.Fatal(err)
	}
}

// TestRealIPTablesLoadBalancerSourceRanges: a client outside the node
// reaches a LoadBalancer IP from an address inside
// loadBalancerSourceRanges and is dropped from one outside (kube-proxy's
// KUBE-FW chain and firewall DROP), on the real kernel:
//
//	client 10.27.50.100, .101 ── node (iptables, forwarding) ── pod 10.27.51.10:8080
func TestRealIPTablesLoadBalancerSourceRanges(t *testing.T) {
	b, r, node := realBackend(t)
	ctx := context.Background()
	client, pod := testutil.NewNetNS(t), testutil.NewNetNS(t)
	for _, x := range []struct {
		peer      *testutil.NetNS
		dev, addr string
		peerAddr  []string
	}{{client, "nsxc", "10.27.50.1/24", []string{"10.27.50.100/24", "10.27.50.101/24"}}, {pod, "nsxp", "10.27.51.1/24", []string{"10.27.51.10/24"}}} {
		node.Run(t, "ip", "link", "add", x.dev, "type", "veth", "peer", "name", "eth0", "netns", x.peer.Name)
		node.Run(t, "ip", "addr", "add", x.addr, "dev", x.dev)
		node.Run(t, "ip", "link", "set", x.dev, "up")
		for _, a := range x.peerAddr {
			x.peer.Run(t, "ip", "addr", "add", a, "dev", "eth0", "nodad")
		}
		x.peer.Run(t, "ip", "link", "set", "eth0", "up")
	}
	node.Run(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	pod.Run(t, "ip", "route", "add", "default", "via", "10.27.51.1")
	client.Run(t, "ip", "route", "add", "10.27.60.50/32", "via", "10.27.50.1")
	var l net.Listener
	if err := pod.Do(func(ns.NetNS) (err error) { l, err = net.Listen("tcp", "10.27.51.10:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello\n"))
			c.Close()
		}
	}()
	dial := func(from string, timeout time.Duration) error {
		return client.Do(func(ns.NetNS) error {
			d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
			c, err := d.Dial("tcp", "10.27.60.50:80")
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = bufio.NewReader(c).ReadString('\n')
			return err
		})
	}
	lb := dataplane.Frontend{
		FrontendKey: dataplane.FrontendKey{Addr: netip.MustParseAddr("10.27.60.50"), Port: 80, Protocol: dataplane.TCP},
		Kind:        dataplane.LoadBalancer, Service: dataplane.ServicePortName{Namespace: "default", Name: "lb"},
		Endpoints:    []dataplane.Endpoint{{Addr: netip.MustParseAddr("10.27.51.10"), Port: 8080}},
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.27.50.101/32"), netip.MustParsePrefix("192.0.2.0/24")},
	}
	if err := b.Sync(ctx, &dataplane.State{Frontends: []dataplane.Frontend{lb}}); err != nil {
		t.Fatal(err)
	}
	save := saveWaggle(t, r, iptables.IPv4)
	for _, want := range []string{"-A WAGGLE-FW-", "-s 10.27.50.101/32", `"default/lb traffic not accepted by loadBalancerSourceRanges" -m tcp --dport 80 -j DROP`} {
		if !strings.Contains(save, want) {
			t.Errorf("iptables-save lacks %q:\n%s", want, save)
		}
	}
	// Positive marker first, then the negative check.
	testutil.Eventually(t, 30*time.Second, func() error { return dial("10.27.50.101", 2*time.Second) })
	if err := dial("10.27.50.100", time.Second); err == nil {
		t.Fatal("10.27.50.100 reached the LoadBalancer IP outside loadBalancerSourceRanges")
	}
	// Ranges removed (a partial sync): every source again, no firewall chain left.
	lb.SourceRanges = nil
	if err := b.Sync(ctx, &dataplane.State{Frontends: []dataplane.Frontend{lb}}); err != nil {
		t.Fatal(err)
	}
	if err := dial("10.27.50.100", 5*time.Second); err != nil {
		t.Fatalf("no ranges, 10.27.50.100: %v", err)
	}
	if save := saveWaggle(t, r, iptables.IPv4); strings.Contains(save, "WAGGLE-FW-") {
		t.Errorf("firewall chain left after the ranges went:\n%s", save)
	}
}
