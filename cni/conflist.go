package cni

import (
	"encoding/json"
	"fmt"
	"net/netip"
)

// ConfListFileName is the file name the kubelet writes ConfList's output to
// in its CNI configuration directory (/etc/cni/net.d by default).
const ConfListFileName = "10-waggle.conflist"

// ConfListOption changes one field of the rendered configuration.
type ConfListOption func(*confListOptions)

type confListOptions struct {
	name, cniVersion, bridge, dataDir string
	mtu                               int
	masquerade, hairpin               bool
	extraPod, extraCluster            []netip.Prefix
}

// WithName sets the network name (default "waggle").
func WithName(name string) ConfListOption { return func(o *confListOptions) { o.name = name } }

// WithCNIVersion sets the spec version of the list (default "1.0.0").
func WithCNIVersion(v string) ConfListOption { return func(o *confListOptions) { o.cniVersion = v } }

// WithBridge sets the bridge name (default waggle0).
func WithBridge(name string) ConfListOption { return func(o *confListOptions) { o.bridge = name } }

// WithMTU sets the pods' MTU (default 1500).
func WithMTU(mtu int) ConfListOption { return func(o *confListOptions) { o.mtu = mtu } }

// WithDataDir sets the IPAM store's root (default /var/lib/cni/networks).
func WithDataDir(dir string) ConfListOption { return func(o *confListOptions) { o.dataDir = dir } }

// WithMasquerade turns masquerading on or off (default on).
func WithMasquerade(on bool) ConfListOption { return func(o *confListOptions) { o.masquerade = on } }

// WithHairpin turns hairpin mode on or off (default on).
func WithHairpin(on bool) ConfListOption { return func(o *confListOptions) { o.hairpin = on } }

// WithDualStack adds the pod and cluster CIDRs of the other address family.
func WithDualStack(podCIDR, clusterCIDR netip.Prefix) ConfListOption {
	return func(o *confListOptions) {
		o.extraPod = append(o.extraPod, podCIDR)
		if clusterCIDR.IsValid() {
			o.extraCluster = append(o.extraCluster, clusterCIDR)
		}
	}
}

type confList struct {
	CNIVersion string           `json:"cniVersion"`
	Name       string           `json:"name"`
	Plugins    []map[string]any `json:"plugins"`
}

// ConfList renders the network configuration list the kubelet writes to
// /etc/cni/net.d (e.g. 10-waggle.conflist) from the node's spec.podCIDR and
// the cluster CIDR (the zero Prefix leaves it out). The result is validated
// with ParseConfig, so a bad CIDR is an error here and not at the first ADD.
func ConfList(podCIDR, clusterCIDR netip.Prefix, opts ...ConfListOption) ([]byte, error) {
	o := confListOptions{name: DefaultNetworkName, cniVersion: "1.0.0", bridge: DefaultBridge, mtu: DefaultMTU,
		masquerade: true, hairpin: true}
	for _, f := range opts {
		f(&o)
	}
	p := map[string]any{
		"type":        PluginType,
		"bridge":      o.bridge,
		"mtu":         o.mtu,
		"podCIDR":     podCIDR.String(),
		"masquerade":  o.masquerade,
		"hairpinMode": o.hairpin,
	}
	if clusterCIDR.IsValid() {
		p["clusterCIDR"] = clusterCIDR.String()
	}
	if len(o.extraPod) > 0 {
		p["podCIDRs"] = prefixStrings(o.extraPod)
	}
	if len(o.extraCluster) > 0 {
		p["clusterCIDRs"] = prefixStrings(o.extraCluster)
	}
	if o.dataDir != "" {
		p["dataDir"] = o.dataDir
	}
	l := confList{CNIVersion: o.cniVersion, Name: o.name, Plugins: []map[string]any{p}}
	// Validate the plugin's own configuration as the plugin will see it.
	p["cniVersion"], p["name"] = o.cniVersion, o.name
	one, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("render waggle-cni config: %w", err)
	}
	if _, err := ParseConfig(one); err != nil {
		return nil, fmt.Errorf("render waggle-cni config: %w", err)
	}
	if !SupportedVersion(o.cniVersion) {
		return nil, fmt.Errorf("render waggle-cni config: cniVersion %q is not one of %v", o.cniVersion, SupportedVersions.SupportedVersions())
	}
	delete(p, "cniVersion")
	delete(p, "name")
	out, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("render waggle-cni config list: %w", err)
	}
	return append(out, '\n'), nil
}

// SupportedVersion reports whether the plugin speaks spec version v.
func SupportedVersion(v string) bool {
	for _, s := range SupportedVersions.SupportedVersions() {
		if s == v {
			return true
		}
	}
	return false
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}
