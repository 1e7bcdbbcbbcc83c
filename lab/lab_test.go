package lab

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidateRefusesBadConfigsBeforeMakingAnything(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"no nodes":          func(c *Config) { c.Nodes = 0 },
		"no servers":        func(c *Config) { c.Servers = 0 },
		"too many servers":  func(c *Config) { c.Servers = 8 },
		"too many nodes":    func(c *Config) { c.Nodes = 201 },
		"IPv6 subnet":       func(c *Config) { c.Subnet = netip.MustParsePrefix("fd00::/64") },
		"subnet too small":  func(c *Config) { c.Subnet = netip.MustParsePrefix("10.250.0.0/28") },
		"long bridge name":  func(c *Config) { c.Bridge = "a-bridge-name-too-long" },
		"relative data dir": func(c *Config) { c.DataDir = "lab" },
		"name with a slash": func(c *Config) { c.Name = "a/b" },
		"upper-case name":   func(c *Config) { c.Name = "Lab" },
		"name too long":     func(c *Config) { c.Name = "ninechars" },
	} {
		t.Run(name, func(t *testing.T) {
			c := Defaults()
			mutate(&c)
			if err := c.Validate(); err == nil {
				t.Fatalf("config accepted: %+v", c)
			}
		})
	}
	d := Defaults()
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
}

func TestAddressesAndNamesFollowTheSubnetAndName(t *testing.T) {
	c := Defaults()
	c.Name, c.Subnet = "e2e", netip.MustParsePrefix("10.251.0.0/24")
	if got := c.BridgeAddr().String(); got != "10.251.0.1/24" {
		t.Errorf("bridge address %s", got)
	}
	if got := c.NodeAddr(2).String(); got != "10.251.0.12/24" {
		t.Errorf("node 2 address %s", got)
	}
	if c.NodeName(3) != "e2e-node3" || c.CgroupParent() != "waggle-e2e" {
		t.Errorf("names: %s %s", c.NodeName(3), c.CgroupParent())
	}
	if got := c.APIServer(); got != "https://10.251.0.1:6443" {
		t.Errorf("single-server API URL %s", got)
	}
	// The client sits between the last HA server (.8) and the first node (.11).
	if got := c.ClientAddr().String(); got != "10.251.0.9/24" || c.ClientName() != "e2e-client" {
		t.Errorf("client address %s, name %s", got, c.ClientName())
	}
	c.Servers = 3
	if got := c.ServerAddr(3).String(); got != "10.251.0.4/24" || c.ServerName(2) != "e2e-server2" {
		t.Errorf("server 3 address %s, server 2 name %s", got, c.ServerName(2))
	}
	if got := c.APIServer(); got != "https://10.251.0.2:6443" {
		t.Errorf("HA API URL %s, want the first server's", got)
	}
	if got := c.DefaultLoadBalancerPool(); got != "10.251.0.239-10.251.0.254" {
		t.Errorf("LoadBalancer pool %s", got)
	}
	c.Subnet = netip.MustParsePrefix("10.252.0.0/23")
	if got := c.DefaultLoadBalancerPool(); got != "10.252.1.239-10.252.1.254" {
		t.Errorf("LoadBalancer pool of a /23: %s", got)
	}
}

func TestStateRoundTripsAndAMissingLabIsErrNoLab(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadState(dir); !errors.Is(err, ErrNoLab) {
		t.Fatalf("empty dir: %v, want ErrNoLab", err)
	}
	st := &State{Initialized: true, Bridge: "wglab0", Processes: []Process{{Name: "proxy", Node: "lab-node1", PID: 42, Args: []string{"waggle", "proxy"}}}}
	if err := st.save(dir); err != nil {
		t.Fatal(err)
	}
	got, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if i, err := got.process("lab-node1", "proxy"); err != nil || got.Processes[i].PID != 42 {
		t.Fatalf("process lookup: %d %v", i, err)
	}
	if _, err := got.process("lab-node2", "proxy"); err == nil {
		t.Fatal("found a process the lab never started")
	}
	if err := os.WriteFile(filepath.Join(dir, "lab.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadState(dir); err == nil || !strings.Contains(err.Error(), "lab state") {
		t.Fatalf("corrupt state: %v", err)
	}
}

func TestDualStackLabNumbersItsIPv6HostsAsItsIPv4Ones(t *testing.T) {
	c := Defaults()
	if c.DualStack() || c.NodeIPs(1) != "10.250.0.11" || c.ClusterCIDRs() != "10.244.0.0/16" {
		t.Fatalf("the default lab is IPv4-only: dual %v, node IPs %q, cluster CIDRs %q", c.DualStack(), c.NodeIPs(1), c.ClusterCIDRs())
	}
	c.Name, c.Subnet = "lsix", netip.MustParsePrefix("10.251.6.0/24")
	c.EnableDualStack()
	if err := c.Validate(); err != nil {
		t.Fatalf("dual-stack defaults refused: %v", err)
	}
	for _, tc := range []struct{ got, want string }{
		{c.Subnet6.String(), "fd00:10:251:6::/64"},
		{c.Addr6(c.BridgeAddr()).String(), "fd00:10:251:6::1/64"},
		{c.Addr6(c.ServerAddr(2)).String(), "fd00:10:251:6::3/64"},
		{c.Addr6(c.ClientAddr()).String(), "fd00:10:251:6::9/64"},
		{c.NodeIPs(1), "10.251.6.11,fd00:10:251:6::11"},
		{c.NodeIPs(200), "10.251.6.210,fd00:10:251:6::210"},
		{c.ClusterCIDRs(), "10.244.0.0/16,fd00:10:244::/56"},
		{c.ServiceCIDRs(), "10.96.0.0/12,fd00:10:96::/112"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
	c.Subnet = netip.MustParsePrefix("10.252.0.0/23")
	c.Subnet6 = DefaultSubnet6(c.Subnet)
	if got := c.Addr6(netip.MustParsePrefix("10.252.1.4/23")).Addr().String(); got != "fd00:10:252::260" {
		t.Errorf("IPv6 of the 260th address of a /23: %s", got)
	}
}

func TestDualStackFlagsAndRangesAreChecked(t *testing.T) {
	v4, v6, err := ParseDualStack("--cluster-cidr", "10.244.0.0/16, fd00:10:244::/56")
	if err != nil || v4.String() != "10.244.0.0/16" || v6.String() != "fd00:10:244::/56" {
		t.Fatalf("IPv4,IPv6: %s %s %v", v4, v6, err)
	}
	if _, v6, err := ParseDualStack("--subnet", "10.250.0.0/24"); err != nil || v6.IsValid() {
		t.Fatalf("IPv4 alone: %s %v", v6, err)
	}
	for _, bad := range []string{"fd00::/64,10.0.0.0/8", "10.0.0.0/8,10.1.0.0/16", "10.0.0.0/8,fd00::/64,fd01::/64", "10.0.0.0/8,nope"} {
		if _, _, err := ParseDualStack("--subnet", bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for name, mutate := range map[string]func(*Config){
		"IPv6 subnet alone":       func(c *Config) { c.ClusterCIDR6, c.ServiceCIDR6 = netip.Prefix{}, netip.Prefix{} },
		"IPv4 as the IPv6 subnet": func(c *Config) { c.Subnet6 = netip.MustParsePrefix("10.9.0.0/24") },
		"IPv6 subnet too small":   func(c *Config) { c.Subnet6 = netip.MustParsePrefix("fd00::/124") },
		"pod network of one /64":  func(c *Config) { c.ClusterCIDR6 = netip.MustParsePrefix("fd00:10:244::/64") },
		"pod network too large":   func(c *Config) { c.ClusterCIDR6 = netip.MustParsePrefix("fd00::/40") },
		"service range too large": func(c *Config) { c.ServiceCIDR6 = netip.MustParsePrefix("fd00:10:96::/64") },
		"IPv6 primary cluster":    func(c *Config) { c.ClusterCIDR = netip.MustParsePrefix("fd00:1::/56") },
	} {
		t.Run(name, func(t *testing.T) {
			c := Defaults()
			c.EnableDualStack()
			mutate(&c)
			if err := c.Validate(); err == nil {
				t.Fatalf("config accepted: %+v", c)
			}
		})
	}
}
