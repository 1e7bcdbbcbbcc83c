package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// Funcs returns the plugin's command handlers for skel.PluginMainFuncs:
// ADD, DEL, CHECK, and the CNI 1.1 GC and STATUS.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: Add, Del: Del, Check: Check, GC: GC, Status: Status}
}

// Add attaches the container to the network and prints the result in the
// configuration's CNI version on stdout (the skel contract).
func Add(args *skel.CmdArgs) error {
	res, cfg, err := Attach(args)
	if err != nil {
		return err
	}
	return types.PrintResult(res, cfg.CNIVersion)
}

// HostVethName is the deterministic name of the host end of the veth pair of
// containerID's interface ifName on network: "wv" and 13 hex digits of a
// hash. Being deterministic, a repeated ADD, a DEL or a GC finds the veth a
// crashed ADD left.
func HostVethName(network, containerID, ifName string) string {
	h := sha256.Sum256([]byte(network + "\x00" + containerID + "\x00" + ifName))
	return "wv" + hex.EncodeToString(h[:])[:13]
}

// MasqueradeTable is the one nftables table (family inet) Waggle's plugin
// owns: a base chain per network named masq-<network>.
const MasqueradeTable = "waggle-cni"

// HostVethAliasPrefix starts the alias (IFLA_IFALIAS) of every host veth
// the plugin makes: "waggle-pod " and the pod's addresses, comma-separated.
// The node agent's NetworkPolicy enforcement finds a pod's veth by it
// (dataplane/policy), as a Pod object names addresses, not containers.
const HostVethAliasPrefix = "waggle-pod "

// HostVethAlias is the alias of the host veth of a pod with addrs.
func HostVethAlias(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return HostVethAliasPrefix + strings.Join(s, ",")
}

// ParseHostVethAlias returns the pod addresses of a host veth alias (nil
// when the alias is not one of the plugin's).
func ParseHostVethAlias(alias string) []netip.Addr {
	rest, ok := strings.CutPrefix(alias, HostVethAliasPrefix)
	if !ok {
		return nil
	}
	var out []netip.Addr
	for _, f := range strings.Split(rest, ",") {
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, a)
		}
	}
	return out
}
