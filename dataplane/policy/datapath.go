package policy

import (
	"errors"
	"net/netip"
)

// DefaultPinSubdir is where, under a node's pin directory
// (/sys/fs/bpf/waggle/<node>), the policy maps and links are pinned.
const DefaultPinSubdir = "policy"

// LinkDir is the subdirectory of the policy pin directory holding the tcx
// links, one pair per endpoint: <ifindex>-from (tcx ingress of the veth:
// the pod's egress) and <ifindex>-to (tcx egress: the pod's ingress).
const LinkDir = "links"

// Map names (bpf/policy.c).
const (
	MapEndpoints = "waggle_pol_endpoints"
	MapPolicy    = "waggle_pol_policy"
	MapIPCache   = "waggle_pol_ipcache"
	MapCIDR      = "waggle_pol_cidr"
	MapCT        = "waggle_pol_ct"
	MapEvents    = "waggle_pol_events"
	MapConfig    = "waggle_pol_config"
	MapNames     = "waggle_pol_names"
)

// Name kinds of waggle_pol_names.
const (
	NamePolicy   uint32 = 1
	NameEndpoint uint32 = 2
	NameIdentity uint32 = 3
)

// ErrNotSupported: this kernel or platform cannot run the eBPF policy
// dataplane.
var ErrNotSupported = errors.New("eBPF NetworkPolicy enforcement not supported")

// ErrLayoutMismatch: pinned policy maps from another Waggle version.
var ErrLayoutMismatch = errors.New("pinned policy maps have another layout")

// Datapath programs compiled policy into the kernel. Apply* calls may be
// repeated with the same input and then change nothing.
type Datapath interface {
	// ApplyIPCache makes the address -> identity table equal to m.
	ApplyIPCache(m map[netip.Addr]uint32) error
	// ApplyCIDRs makes the ipBlock prefix -> identity table equal to m.
	ApplyCIDRs(m map[netip.Prefix]uint32) error
	// ApplyEndpoint programs one endpoint in two phases, make-before-break:
	// without prune it writes new entries and the isolation flags and
	// attaches the programs; with prune it removes the entries st lacks and
	// bumps the endpoint's revision, so established flows are checked once
	// more. Program runs phase one for every endpoint, then the ipcache and
	// CIDR tables, then phase two.
	ApplyEndpoint(st *EndpointState, prune bool) error
	// RemoveEndpoint detaches and forgets an endpoint (idempotent).
	RemoveEndpoint(ifindex uint32) error
	// SetNames records what IDs stand for (policies, identities).
	SetNames(kind uint32, names map[uint32]string) error
	Close() error
}
