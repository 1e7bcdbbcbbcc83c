// Package lab runs a multi-node Waggle cluster on one machine: a control
// plane in the host's network namespace and N nodes, each in its own network
// namespace on a lab bridge, with its own kubelet, proxy, CNI bridge, pinned
// BPF state and cgroup v2 subtree. `waggle lab up|status|down` drive it.
//
// Everything the lab makes is recorded in a state file under the data dir as
// it is made, so `waggle lab down` removes exactly that — namespaces, links,
// cgroups, pinned BPF objects and processes — even after a half-finished up.
// A dual-stack lab (Config.EnableDualStack, `waggle lab up --dual-stack`)
// gives the bridge, every node, server and the client an IPv6 address on a
// second lab subnet besides the IPv4 one, and runs the cluster as a
// Kubernetes user runs a dual-stack one: --cluster-cidr and
// --service-cluster-ip-range of one CIDR per family (IPv4 the primary), a
// pod CIDR of each family per node, kubelets with an IPv4,IPv6 --node-ip.
//
// It is not a VM lab: see the Vagrantfile and docs/lab.md for that.
package lab

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Config describes a lab.
type Config struct {
	// Name prefixes the lab's nodes (<name>-node1, ...) and names its cgroup
	// (waggle-<name>), so two labs with different names and subnets can
	// coexist (the end-to-end tests run one beside a user's).
	Name string
	// Nodes is the number of worker nodes.
	Nodes int
	// Servers is the number of control plane servers. One runs in the
	// host's network namespace on the bridge address; more make an HA
	// control plane: server i runs in its own network namespace
	// (<name>-server<i> at ServerAddr(i)), the first with --cluster-init,
	// the others joining it with a server token, each an etcd member, an
	// API server and a standby scheduler and controller-manager.
	Servers int
	// DataDir holds the state file, logs, the control plane's data and each
	// node's files.
	DataDir string
	// Binary is the waggle executable the lab's processes run.
	Binary string
	// CNIBinDir holds waggle-cni (named "waggle" for CNI's lookup).
	CNIBinDir string
	// Bridge is the host-side lab bridge joining the nodes.
	Bridge string
	// Subnet is the lab network: the bridge takes the first address, node i
	// the address 10+i.
	Subnet netip.Prefix
	// ClusterCIDR is the pod network; each node gets a /24 of it from the
	// controller-manager.
	ClusterCIDR netip.Prefix
	// ServiceCIDR is the Service ClusterIP range.
	ServiceCIDR netip.Prefix
	// Subnet6, ClusterCIDR6 and ServiceCIDR6 are the IPv6 halves of a
	// dual-stack lab (all set, or none: an IPv4-only lab). Subnet6 numbers
	// its hosts as Subnet does, the IPv4 host number's decimal digits
	// written in hex (node 1, 10.250.0.11, is fd00:10:250:0::11); each
	// node gets a /64 of ClusterCIDR6; ServiceCIDR6 is the second
	// --service-cluster-ip-range, so Services may be IPv6 or dual-stack
	// (IPv4 stays the primary family: single-stack Services are IPv4).
	Subnet6, ClusterCIDR6, ServiceCIDR6 netip.Prefix
	// APIPort, SchedulerPort and ControllerManagerPort are the control
	// plane's ports. It listens on the bridge address only, so two labs
	// with different subnets may keep the defaults; different ports let a
	// lab run beside a `waggle up` (which listens on every address).
	APIPort, SchedulerPort, ControllerManagerPort int
	// ProxyMode is passed to every node's proxy (auto, ebpf, iptables).
	ProxyMode string
	// ImageDir holds OCI image archives every node imports at start.
	ImageDir string
	// LocalRegistries are passed to every kubelet: registries whose images
	// the nodes have only from ImageDir (imagePullPolicy Always then takes
	// the imported copy instead of asking the registry).
	LocalRegistries []string
	// LoadBalancerIPPool is the controller-manager's --loadbalancer-ip-pool
	// (default: DefaultLoadBalancerPool of the lab subnet).
	LoadBalancerIPPool string
	// NodeMonitorGracePeriod is passed to the controller-manager.
	NodeMonitorGracePeriod time.Duration
	// ReadyTimeout bounds how long up waits for every node to be Ready.
	ReadyTimeout time.Duration
}

// Defaults returns the configuration of `waggle lab up` without flags.
func Defaults() Config {
	return Config{
		Nodes:                  3,
		Servers:                1,
		DataDir:                "/var/lib/waggle-lab",
		Bridge:                 "wglab0",
		Subnet:                 netip.MustParsePrefix("10.250.0.0/24"),
		ClusterCIDR:            netip.MustParsePrefix("10.244.0.0/16"),
		ServiceCIDR:            netip.MustParsePrefix("10.96.0.0/12"),
		Name:                   "lab",
		ProxyMode:              "auto",
		APIPort:                6443,
		SchedulerPort:          10259,
		ControllerManagerPort:  10257,
		ReadyTimeout:           3 * time.Minute,
		NodeMonitorGracePeriod: 40 * time.Second,
	}
}

// The IPv6 ranges of a dual-stack lab, as a Kubernetes user writes them
// (and as the kind and kubeadm docs do); the lab subnet's is derived from
// the IPv4 one (DefaultSubnet6).
var (
	DefaultClusterCIDR6 = netip.MustParsePrefix("fd00:10:244::/56")
	DefaultServiceCIDR6 = netip.MustParsePrefix("fd00:10:96::/112")
)

// DualStack reports whether the lab is dual-stack.
func (c *Config) DualStack() bool { return c.Subnet6.IsValid() }

// EnableDualStack makes the lab dual-stack, filling each IPv6 range not set
// with its default.
func (c *Config) EnableDualStack() {
	if !c.Subnet6.IsValid() {
		c.Subnet6 = DefaultSubnet6(c.Subnet)
	}
	if !c.ClusterCIDR6.IsValid() {
		c.ClusterCIDR6 = DefaultClusterCIDR6
	}
	if !c.ServiceCIDR6.IsValid() {
		c.ServiceCIDR6 = DefaultServiceCIDR6
	}
}

// DefaultSubnet6 is a dual-stack lab's IPv6 subnet for the IPv4 subnet v4:
// fd00::/16 followed by v4's first three octets, each written in decimal
// digits read as hex, in a /64 (10.250.0.0/24 gives fd00:10:250:0::/64), so
// that labs on different IPv4 subnets get different IPv6 ones and a reader
// sees which goes with which.
func DefaultSubnet6(v4 netip.Prefix) netip.Prefix {
	b := v4.Masked().Addr().As4()
	s := fmt.Sprintf("fd00:%d:%d:%d::/64", b[0], b[1], b[2])
	return netip.MustParsePrefix(s)
}

// ParseDualStack parses a flag of one CIDR or two comma-separated CIDRs,
// an IPv4 one first and then an IPv6 one (as --cluster-cidr
// 10.244.0.0/16,fd00:10:244::/56); v6 is invalid when only one is given.
func ParseDualStack(flag, s string) (v4, v6 netip.Prefix, err error) {
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return v4, v6, fmt.Errorf("%s %q: want an IPv4 CIDR, or IPv4,IPv6 for a dual-stack lab", flag, s)
	}
	if v4, err = netip.ParsePrefix(strings.TrimSpace(parts[0])); err != nil {
		return v4, v6, fmt.Errorf("%s: %w", flag, err)
	}
	if len(parts) == 2 {
		if v6, err = netip.ParsePrefix(strings.TrimSpace(parts[1])); err != nil {
			return v4, v6, fmt.Errorf("%s: %w", flag, err)
		}
		if !v4.Addr().Is4() || !v6.Addr().Is6() || v6.Addr().Is4In6() {
			return v4, v6, fmt.Errorf("%s %q: want the IPv4 CIDR first, then the IPv6 one", flag, s)
		}
	}
	return v4, v6, nil
}

// Validate checks a configuration before anything is made.
func (c *Config) Validate() error {
	if err := c.validate6(); err != nil {
		return err
	}
	switch {
	case c.Nodes < 1 || c.Nodes > 200:
		return fmt.Errorf("--nodes %d: want 1 to 200", c.Nodes)
	case c.Servers < 1 || c.Servers > 7:
		return fmt.Errorf("--servers %d: want 1 to 7 (3 or 5 for an HA control plane)", c.Servers)
	case !c.Subnet.Addr().Is4() || c.Subnet.Bits() > 24:
		return fmt.Errorf("lab subnet %s: want an IPv4 prefix of /24 or larger", c.Subnet)
	case c.Bridge == "" || len(c.Bridge) > 15:
		return fmt.Errorf("bridge name %q: want 1 to 15 characters", c.Bridge)
	case c.DataDir == "" || !filepath.IsAbs(c.DataDir):
		return fmt.Errorf("data dir %q: want an absolute path", c.DataDir)
	case !validPort(c.APIPort) || !validPort(c.SchedulerPort) || !validPort(c.ControllerManagerPort):
		return fmt.Errorf("ports %d, %d, %d: want 1 to 65535", c.APIPort, c.SchedulerPort, c.ControllerManagerPort)
	case !labName.MatchString(c.Name):
		return fmt.Errorf("lab name %q: want 1 to 8 lower-case letters and digits", c.Name)
	case !c.ClusterCIDR.Addr().Is4() || !c.ServiceCIDR.Addr().Is4():
		return fmt.Errorf("--cluster-cidr %s, --service-cidr %s: the lab's primary family is IPv4 (add an IPv6 CIDR after a comma for dual-stack)", c.ClusterCIDR, c.ServiceCIDR)
	}
	return nil
}

// validate6 checks a dual-stack lab's IPv6 ranges: all or none, IPv6, and
// of sizes the components take.
func (c *Config) validate6() error {
	set := 0
	for _, p := range []netip.Prefix{c.Subnet6, c.ClusterCIDR6, c.ServiceCIDR6} {
		if p.IsValid() {
			set++
			if !p.Addr().Is6() || p.Addr().Is4In6() {
				return fmt.Errorf("%s: the second CIDR of a dual-stack lab must be IPv6", p)
			}
		}
	}
	switch {
	case set == 0:
		return nil
	case set != 3:
		return fmt.Errorf("a dual-stack lab needs an IPv6 lab subnet, cluster CIDR and service CIDR (have %s, %s, %s): use --dual-stack for the defaults",
			orUnset(c.Subnet6), orUnset(c.ClusterCIDR6), orUnset(c.ServiceCIDR6))
	case c.Subnet6.Bits() < 64 || c.Subnet6.Bits() > 120:
		return fmt.Errorf("IPv6 lab subnet %s: want a prefix of /64 to /120", c.Subnet6)
	case c.ClusterCIDR6.Bits() > 63 || 64-c.ClusterCIDR6.Bits() > 16 || 1<<(64-c.ClusterCIDR6.Bits()) < c.Nodes:
		return fmt.Errorf("IPv6 cluster CIDR %s: want room for a /64 per node (%d nodes) and at most 16 bits more than /64 (as upstream's node IPAM)", c.ClusterCIDR6, c.Nodes)
	case c.ServiceCIDR6.Bits() < 108 || c.ServiceCIDR6.Bits() > 126:
		return fmt.Errorf("IPv6 service CIDR %s: want a prefix of /108 to /126", c.ServiceCIDR6)
	}
	return nil
}

func orUnset(p netip.Prefix) string {
	if !p.IsValid() {
		return "unset"
	}
	return p.String()
}

// ClusterCIDRs is --cluster-cidr as the components take it: the IPv4 pod
// network, and the IPv6 one after a comma in a dual-stack lab.
func (c *Config) ClusterCIDRs() string { return joinFamilies(c.ClusterCIDR, c.ClusterCIDR6) }

// ServiceCIDRs is --service-cluster-ip-range as the components take it.
func (c *Config) ServiceCIDRs() string { return joinFamilies(c.ServiceCIDR, c.ServiceCIDR6) }

func joinFamilies(v4, v6 netip.Prefix) string {
	if v6.IsValid() {
		return v4.String() + "," + v6.String()
	}
	return v4.String()
}

// Addr6 is the IPv6 address, in a dual-stack lab, of the lab host whose
// IPv4 address is v4 (NodeAddr, ServerAddr, ClientAddr or BridgeAddr): the
// IPv4 address's offset in the lab subnet, in decimal digits read as hex,
// in Subnet6 (node 1 of the default lab is 10.250.0.11 and
// fd00:10:250:0::11). It is invalid in an IPv4-only lab.
func (c *Config) Addr6(v4 netip.Prefix) netip.Prefix {
	if !c.DualStack() {
		return netip.Prefix{}
	}
	a, b := c.Subnet.Masked().Addr().As4(), v4.Addr().As4()
	off := (int(b[2])-int(a[2]))<<8 | int(b[3]) - int(a[3])
	h, _ := strconv.ParseUint(strconv.Itoa(off), 16, 64)
	out := c.Subnet6.Masked().Addr().As16()
	for i := 15; i >= 8 && h > 0; i-- {
		out[i] |= byte(h)
		h >>= 8
	}
	return netip.PrefixFrom(netip.AddrFrom16(out), c.Subnet6.Bits())
}

// NodeIPs is node i's --node-ip: its lab address, and its IPv6 one after a
// comma in a dual-stack lab.
func (c *Config) NodeIPs(i int) string {
	s := c.NodeAddr(i).Addr().String()
	if a := c.Addr6(c.NodeAddr(i)); a.IsValid() {
		s += "," + a.Addr().String()
	}
	return s
}

// DefaultLoadBalancerPool is the lab's LoadBalancer address range: the last
// sixteen addresses of the lab subnet before its broadcast address (10.250.0.239-
// 10.250.0.254 by default), on the lab network so every node and the host
// reach them, above the node addresses (at most .210).
func (c *Config) DefaultLoadBalancerPool() string {
	p := c.Subnet.Masked()
	last := p.Addr()
	for i := 0; i < 1<<(32-p.Bits())-1; i++ {
		last = last.Next()
	}
	first := last
	for range 16 {
		first = first.Prev()
	}
	return first.String() + "-" + last.Prev().String()
}

// BridgeAddr is the host's address on the lab bridge, where the API server
// listens for the nodes.
func (c *Config) BridgeAddr() netip.Prefix {
	return netip.PrefixFrom(c.Subnet.Masked().Addr().Next(), c.Subnet.Bits())
}

func validPort(p int) bool { return p > 0 && p < 65536 }

// ServerName is the name of control plane server i (1-based) of an HA lab.
func (c *Config) ServerName(i int) string { return fmt.Sprintf("%s-server%d", c.Name, i) }

// ServerAddr is server i's address in an HA lab: the lab subnet's
// addresses 2 to 8 (nodes start at 11).
func (c *Config) ServerAddr(i int) netip.Prefix {
	a := c.Subnet.Masked().Addr().Next()
	for range i {
		a = a.Next()
	}
	return netip.PrefixFrom(a, c.Subnet.Bits())
}

// APIServer is the URL nodes (and the host) reach the lab's API server at
// (the first server's, in an HA lab: nodes learn the others from the
// kubernetes endpoints).
func (c *Config) APIServer() string {
	if c.Servers > 1 {
		return fmt.Sprintf("https://%s", netip.AddrPortFrom(c.ServerAddr(1).Addr(), uint16(c.APIPort)))
	}
	return fmt.Sprintf("https://%s", netip.AddrPortFrom(c.BridgeAddr().Addr(), uint16(c.APIPort)))
}

var labName = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

// NodeName is the name of node i (1-based).
func (c *Config) NodeName(i int) string { return fmt.Sprintf("%s-node%d", c.Name, i) }

// CgroupParent is the lab's cgroup directory relative to the cgroup2 mount;
// each node's subtree is below it.
func (c *Config) CgroupParent() string { return "waggle-" + c.Name }

// ClientName names the lab's external client: a network namespace
// waggle-<name>-client on the lab bridge that is no node, standing for a
// machine outside the cluster on the nodes' network.
func (c *Config) ClientName() string { return c.Name + "-client" }

// ClientAddr is the client's address: the lab subnet's address 9, above the
// HA servers' (2 to 8) and below the nodes' (11 up).
func (c *Config) ClientAddr() netip.Prefix {
	a := c.Subnet.Masked().Addr()
	for range 9 {
		a = a.Next()
	}
	return netip.PrefixFrom(a, c.Subnet.Bits())
}

// NodeAddr is node i's address on the lab network.
func (c *Config) NodeAddr(i int) netip.Prefix {
	a := c.Subnet.Masked().Addr()
	for range 10 + i {
		a = a.Next()
	}
	return netip.PrefixFrom(a, c.Subnet.Bits())
}
