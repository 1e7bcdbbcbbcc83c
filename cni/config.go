// Package cni is the logic of waggle-cni, Waggle's pod network plugin (CNI
// type "waggle", spec versions 0.4.0, 1.0.0 and 1.1.0): per node a Linux
// bridge holding the gateway address of the node's pod CIDR, per pod a veth
// pair with the pod's end in its network namespace, addresses from the IPAM
// store in cni/ipam, and one Waggle-owned nftables table masquerading pod
// traffic that leaves the cluster CIDR. It implements ADD, DEL, CHECK, GC and
// STATUS for the skel of github.com/containernetworking/cni, and renders the
// network configuration list the kubelet writes (ConfList).
//
// It is not the cross-node route controller (cni/routes, run by the node
// agent) and not a general-purpose IPAM or chaining plugin: it is a main
// plugin with its own built-in IPAM.
package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"
)

// Defaults of the network configuration.
const (
	PluginType     = "waggle"
	DefaultBridge  = "waggle0"
	DefaultMTU     = 1500
	DefaultDataDir = "/var/lib/cni/networks"
	// DefaultNetworkName is the network name ConfList uses.
	DefaultNetworkName = "waggle"
)

// SupportedVersions are the CNI spec versions the plugin speaks.
var SupportedVersions = version.PluginSupports("0.4.0", "1.0.0", "1.1.0")

// NetConf is the plugin's network configuration as JSON (see cni/README.md).
type NetConf struct {
	types.NetConf
	// Bridge is the node's bridge (default waggle0).
	Bridge string `json:"bridge,omitempty"`
	// MTU of the pod interfaces and the bridge (default 1500).
	MTU int `json:"mtu,omitempty"`
	// PodCIDR is the node's pod CIDR; PodCIDRs the dual-stack form (at most
	// one prefix per address family). At least one is required.
	PodCIDR  string   `json:"podCIDR,omitempty"`
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	// ClusterCIDR is the cluster's pod CIDR (all nodes' pod CIDRs); traffic to
	// it is not masqueraded. ClusterCIDRs is the dual-stack form.
	ClusterCIDR  string   `json:"clusterCIDR,omitempty"`
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`
	// Masquerade pod traffic leaving the cluster CIDR (default true).
	Masquerade *bool `json:"masquerade,omitempty"`
	// HairpinMode on the bridge ports, so a pod reaches itself through a
	// Service (default true).
	HairpinMode *bool `json:"hairpinMode,omitempty"`
	// DataDir is the IPAM store's root (default /var/lib/cni/networks); the
	// network's allocations live in DataDir/<name>.
	DataDir string `json:"dataDir,omitempty"`
}

// Config is a validated network configuration.
type Config struct {
	Name         string
	CNIVersion   string
	Bridge       string
	MTU          int
	PodCIDRs     []netip.Prefix // at most one per family, IPv4 first
	ClusterCIDRs []netip.Prefix // at most one per family
	Masquerade   bool
	Hairpin      bool
	DataDir      string
	// Net is the decoded configuration, prevResult included.
	Net NetConf
}

// ClusterCIDRFor returns the cluster CIDR of the address family of p.
func (c *Config) ClusterCIDRFor(p netip.Prefix) (netip.Prefix, bool) {
	for _, cc := range c.ClusterCIDRs {
		if cc.Addr().Is4() == p.Addr().Is4() {
			return cc, true
		}
	}
	return netip.Prefix{}, false
}

// Error codes used beyond the spec's generic ones: an exhausted pool is
// transient (pods come and go), so it is reported as "try again later".
const ErrCodePoolExhausted = types.ErrTryAgainLater

// ErrPluginNotAvailable is the CNI 1.1 STATUS code "plugin not available"
// (the library version in use has no constant for it).
const ErrPluginNotAvailable uint = 50

func invalidConfig(format string, args ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, args...), "")
}

// ParseConfig decodes and validates a network configuration. Every problem is
// reported as a *types.Error with the spec's code (6 for undecodable JSON, 7
// for an invalid configuration).
func ParseConfig(data []byte) (*Config, error) {
	var n NetConf
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&n); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network config: %v", err), "")
	}
	if n.Type != "" && n.Type != PluginType {
		return nil, invalidConfig("network config has type %q, this plugin is %q", n.Type, PluginType)
	}
	if n.Name == "" {
		return nil, invalidConfig("network config has no name")
	}
	if err := utils.ValidateNetworkName(n.Name); err != nil {
		return nil, err
	}
	c := &Config{Name: n.Name, CNIVersion: n.CNIVersion, Bridge: n.Bridge, MTU: n.MTU, DataDir: n.DataDir, Net: n,
		Masquerade: true, Hairpin: true}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if err := utils.ValidateInterfaceName(c.Bridge); err != nil {
		return nil, invalidConfig("bridge name %q: %s", c.Bridge, err.Msg)
	}
	if n.Masquerade != nil {
		c.Masquerade = *n.Masquerade
	}
	if n.HairpinMode != nil {
		c.Hairpin = *n.HairpinMode
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if !filepath.IsAbs(c.DataDir) {
		return nil, invalidConfig("dataDir %q must be an absolute path", c.DataDir)
	}
	c.DataDir = filepath.Clean(c.DataDir)

	pods, err := parsePrefixes("podCIDR", n.PodCIDR, n.PodCIDRs)
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		return nil, invalidConfig("network config has no podCIDR: set podCIDR (e.g. \"10.244.1.0/24\") to the node's pod CIDR")
	}
	for _, p := range pods {
		max := p.Addr().BitLen() - 2
		if p.Bits() > max {
			return nil, invalidConfig("podCIDR %s is too small: it needs room for a gateway and a pod (at most /%d)", p, max)
		}
	}
	c.PodCIDRs = pods
	clusters, err := parsePrefixes("clusterCIDR", n.ClusterCIDR, n.ClusterCIDRs)
	if err != nil {
		return nil, err
	}
	for _, cc := range clusters {
		for _, p := range pods {
			if p.Addr().Is4() == cc.Addr().Is4() && (!cc.Contains(p.Addr()) || cc.Bits() > p.Bits()) {
				return nil, invalidConfig("podCIDR %s is not inside clusterCIDR %s", p, cc)
			}
		}
	}
	c.ClusterCIDRs = clusters

	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	minMTU := 68
	for _, p := range pods {
		if p.Addr().Is6() {
			minMTU = 1280
		}
	}
	if c.MTU < minMTU || c.MTU > 65535 {
		return nil, invalidConfig("mtu %d is out of range [%d, 65535]", c.MTU, minMTU)
	}
	return c, nil
}

// parsePrefixes merges the single and list forms of a CIDR field: canonical
// network prefixes, at most one per family, IPv4 first.
func parsePrefixes(field, one string, many []string) ([]netip.Prefix, error) {
	all := many
	if one != "" {
		all = append([]string{one}, many...)
	}
	var v4, v6 []netip.Prefix
	for _, s := range all {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, invalidConfig("%s %q is not a CIDR (want e.g. \"10.244.1.0/24\" or \"fd00:10:244:1::/64\")", field, s)
		}
		if p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return nil, invalidConfig("%s %q: use plain IPv4 or IPv6 without a zone", field, s)
		}
		if p.Masked() != p {
			return nil, invalidConfig("%s %q is not a network address (did you mean %s?)", field, s, p.Masked())
		}
		if p.Addr().Is4() {
			if len(v4) > 0 && v4[0] != p {
				return nil, invalidConfig("%s: more than one IPv4 prefix (%s, %s)", field, v4[0], p)
			}
			v4 = []netip.Prefix{p}
		} else {
			if len(v6) > 0 && v6[0] != p {
				return nil, invalidConfig("%s: more than one IPv6 prefix (%s, %s)", field, v6[0], p)
			}
			v6 = []netip.Prefix{p}
		}
	}
	return append(v4, v6...), nil
}

// ValidateArgs checks the runtime's arguments the way skel does, so that
// in-process callers get the same errors (code 4 for bad environment).
func ValidateArgs(containerID, ifName string) error {
	if err := utils.ValidateContainerID(containerID); err != nil {
		return err
	}
	if err := utils.ValidateInterfaceName(ifName); err != nil {
		return err
	}
	return nil
}

// ErrNotSupported is returned on platforms without Linux networking.
var ErrNotSupported = errors.New("waggle-cni: not supported on this platform")
