// Package lab runs a multi-node Waggle cluster on one machine: a control
// plane in the host's network namespace and N nodes, each in its own network
// namespace on a lab bridge, with its own kubelet, proxy, CNI bridge, pinned
// BPF state and cgroup v2 subtree. `waggle lab up|status|down` drive it.
//
// Everything the lab makes is recorded in a state file under the data dir as
// it is made, so `waggle lab down` removes exactly that — namespaces, links,
// cgroups, pinned BPF objects and processes — even after a half-finished up.
// It is not a VM lab: see the Vagrantfile and docs/lab.md for that.
package lab

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
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

// Validate checks a configuration before anything is made.
func (c *Config) Validate() error {
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
	}
	return nil
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
