package iptables_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
