package ebpf

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/waggle-io/waggle/dataplane"
)

// North-south load balancing (bpf/nodeport.c): traffic that arrives on the
// node's external devices for a NodePort, ExternalIP or LoadBalancer-IP
// frontend, translated per packet by tcx programs on those devices. The
// frontends and backends are the socket load balancer's maps; each frontend
// of those kinds also gets a Maglev table (waggle_np_maglev), written by the
// same reconciler in the same Apply (waggle_np_svc, waggle_np_maglev).

// Names of the north-south maps (pinned under the pin directory).
const (
	MapNPServices  = "waggle_np_svc"
	MapNPConntrack = "waggle_np_ct"
	MapNPAffinity  = "waggle_np_affinity"
	MapNPDevices   = "waggle_np_devices"
	MapNPConfig    = "waggle_np_config"
	MapNPStats     = "waggle_np_stats"
	MapNPMaglev    = "waggle_np_maglev"
	// NPSvcFlagSourceRanges (np_svc.flags): the frontend has
	// loadBalancerSourceRanges in MapNPSourceRanges.
	NPSvcFlagSourceRanges = 1 << 0
	// MapNPSourceRanges: loadBalancerSourceRanges (LPM trie by service ID and client address).
	MapNPSourceRanges = "waggle_np_src_ranges"
	// MapNPFragments: the first fragment's ports of each fragmented
	// datagram translated (LRU by addresses, IP ID and protocol).
	MapNPFragments = "waggle_np_frag"
	// MapNPLBMode: --bpf-lb-mode (ARRAY of one __u32, NP_LB_MODE_*).
	MapNPLBMode = "waggle_np_lb_mode"
)

// Values of NorthSouth.LBMode (--bpf-lb-mode, as Cilium's): how new flows
// from outside to a backend on another node are forwarded.
const (
	// LBModeSNAT: the source becomes the node's address; the backend's
	// replies come back through this node (the default).
	LBModeSNAT = "snat"
	// LBModeDSR: direct server return for TCP and UDP: the client's
	// address is kept, the frontend travels to the backend's node in an
	// IPv4 option or IPv6 destination option (Cilium's dsr-dispatch=opt) and that node's program
	// answers the client directly. Every node must run Waggle's programs.
	LBModeDSR = "dsr"
	// LBModeHybrid: DSR for TCP, SNAT for UDP.
	LBModeHybrid = "hybrid"
)

// LBModes lists the valid NorthSouth.LBMode values, each at its index
// NP_LB_MODE_* (the map value lbModeValue writes).
var LBModes = []string{LBModeSNAT, LBModeDSR, LBModeHybrid}

// lbModeValue is the waggle_np_lb_mode value of a mode (NP_LB_MODE_*:
// its index in LBModes; snat for an unknown one).
func lbModeValue(m string) uint32 {
	return uint32(max(0, slices.Index(LBModes, m)))
}

// lbModeName is lbModeValue's inverse.
func lbModeName(v uint32) string {
	if int(v) < len(LBModes) {
		return LBModes[v]
	}
	return fmt.Sprintf("unknown (%d)", v)
}

// NPLayoutVersion is WAGGLE_NP_LAYOUT_VERSION (bpf/lib/nodeport.h).
const NPLayoutVersion = 4

// NPMagic marks the north-south config map ("WGNP" little-endian).
const NPMagic = 0x504e4757

// Defaults of NorthSouth.
const (
	// DefaultMaglevTableSize is the entries of each Maglev table: a prime
	// well above 100 × the backends of a service (Maglev's rule of thumb
	// for an even spread). Cilium's default is 16381; 1021 keeps 10,000
	// distinct backend sets within 40 MB of kernel memory.
	DefaultMaglevTableSize = 1021
	DefaultNPConntrack     = 131072
	DefaultSNATPortMin     = 61000
	DefaultSNATPortMax     = 65535
)

// NPLinkPrefix starts the names of the north-south links under the link
// directory: np-<device>-ingress, np-<device>-egress.
const NPLinkPrefix = "np-"

// NorthSouth configures north-south load balancing; nil in Config turns it
// off (sockets on the node are still load-balanced).
type NorthSouth struct {
	// Devices are the external interfaces (by name) whose traffic is
	// served: at least one, each must exist (in NetNS) and have a global
	// IPv4 or IPv6 address (or both): the SNAT source of that family for
	// remote backends reached through it. A device without an address of
	// a family serves that family's frontends with DNAT only.
	Devices []string
	// NetNS is the path of the network namespace holding Devices (and the
	// routes to the backends); empty: the caller's.
	NetNS string
	// MaglevTableSize is the entries of every Maglev table, a prime
	// (default DefaultMaglevTableSize).
	MaglevTableSize int
	// MaxConntrack is the size of the north-south conntrack LRU (two
	// entries per flow; default DefaultNPConntrack).
	MaxConntrack int
	// Acceleration runs the ingress program in XDP on the devices too
	// (--bpf-lb-acceleration, as Cilium's): AccelDisabled (or empty: tc
	// only), AccelNative (driver XDP, or fail), AccelGeneric (generic XDP,
	// any device), AccelBestEffort (native where the driver supports it,
	// generic elsewhere). XDP forwards what it can (new flows to remote
	// backends, their packets, their replies) and leaves the rest to the
	// tc programs, which stay attached (bpf/README.md).
	Acceleration string
	// SNATPortMin and SNATPortMax bound the source ports SNAT uses,
	// inclusive (default 61000–65535: above the kernel's default
	// ip_local_port_range, so they never collide with the node's own
	// connections). Each (backend, node address) pair has this many
	// concurrent SNATed flows.
	SNATPortMin, SNATPortMax uint16
	// LBMode is --bpf-lb-mode: LBModeSNAT (or empty), LBModeDSR or
	// LBModeHybrid. It applies to new flows; established ones keep how
	// they were forwarded.
	LBMode string
	// DisableTCX attaches the tc programs as clsact filters (cls_bpf,
	// direct action) instead of tcx links (--enable-tcx=false, as
	// Cilium's). Kernels before 6.6 have no tcx; there the filters are
	// used without being asked.
	DisableTCX bool
}

// Values of NorthSouth.Acceleration (--bpf-lb-acceleration).
const (
	AccelDisabled   = "disabled"
	AccelNative     = "native"
	AccelGeneric    = "generic"
	AccelBestEffort = "best-effort"
)

// Accelerations lists the valid NorthSouth.Acceleration values.
var Accelerations = []string{AccelDisabled, AccelNative, AccelGeneric, AccelBestEffort}

// ErrNoDevice: a north-south device does not exist.
var ErrNoDevice = errors.New("no such north-south device")

func (n *NorthSouth) validate() error {
	if n == nil {
		return nil
	}
	if len(n.Devices) == 0 {
		return fmt.Errorf("north-south load balancing needs at least one external device (--nodeport-devices)")
	}
	seen := map[string]bool{}
	for _, d := range n.Devices {
		if d == "" || len(d) > 15 || seen[d] {
			return fmt.Errorf("north-south device %q: want distinct interface names of 1 to 15 characters", d)
		}
		seen[d] = true
	}
	if n.Acceleration != "" && !slices.Contains(Accelerations, n.Acceleration) {
		return fmt.Errorf("north-south acceleration %q: want one of %s", n.Acceleration, strings.Join(Accelerations, ", "))
	}
	if n.LBMode != "" && !slices.Contains(LBModes, n.LBMode) {
		return fmt.Errorf("north-south load-balancing mode %q: want one of %s", n.LBMode, strings.Join(LBModes, ", "))
	}
	if n.MaglevTableSize != 0 && (n.MaglevTableSize < 7 || n.MaglevTableSize > 1<<20 || !isPrime(n.MaglevTableSize)) {
		return fmt.Errorf("Maglev table size %d: want a prime from 7 to %d (e.g. 251, 509, 1021, 2039, 4093, 8191, 16381)", n.MaglevTableSize, 1<<20)
	}
	if n.MaxConntrack < 0 || n.MaxConntrack > 1<<24 {
		return fmt.Errorf("north-south conntrack size %d: want 0 (default) to %d", n.MaxConntrack, 1<<24)
	}
	if (n.SNATPortMin != 0 || n.SNATPortMax != 0) && (n.SNATPortMin < 1024 || n.SNATPortMax < n.SNATPortMin) {
		return fmt.Errorf("SNAT port range %d-%d: want 1024 <= min <= max", n.SNATPortMin, n.SNATPortMax)
	}
	return nil
}

func (n NorthSouth) withDefaults() NorthSouth {
	if n.MaglevTableSize == 0 {
		n.MaglevTableSize = DefaultMaglevTableSize
	}
	if n.MaxConntrack == 0 {
		n.MaxConntrack = DefaultNPConntrack
	}
	if n.LBMode == "" {
		n.LBMode = LBModeSNAT
	}
	if n.SNATPortMin == 0 && n.SNATPortMax == 0 {
		n.SNATPortMin, n.SNATPortMax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	return n
}

func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	for i := 2; i*i <= n; i++ {
		if n%i == 0 {
			return false
		}
	}
	return true
}

// northSouthKind reports whether frontends of kind k are served to traffic
// from outside the node.
func northSouthKind(k dataplane.FrontendKind) bool {
	return k == dataplane.NodePort || k == dataplane.ExternalIP || k == dataplane.LoadBalancer || k == dataplane.HostPort
}

// Maglev computes a Maglev lookup table (Eisenbud et al., NSDI 2016) of m
// entries for the named backends: entry i is an index into names. The
// permutation of each backend comes from its name alone (offset and skip
// from two FNV-1a hashes), so every node computes the same table for the
// same backends in the same order, and a backend added or removed moves
// about its own share of the entries. With no names the table is nil.
func Maglev(names []string, m int) []int {
	if len(names) == 0 || m <= 0 {
		return nil
	}
	n := len(names)
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	for i, name := range names {
		h := fnv.New64a()
		h.Write([]byte("waggle-maglev-offset\x00" + name))
		offset[i] = h.Sum64() % uint64(m)
		h = fnv.New64a()
		h.Write([]byte("waggle-maglev-skip\x00" + name))
		skip[i] = h.Sum64()%uint64(max(1, m-1)) + 1
	}
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	next := make([]uint64, n)
	filled := 0
	for filled < m {
		for i := 0; i < n && filled < m; i++ {
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for table[c] >= 0 {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			table[c] = i
			next[i]++
			filled++
		}
	}
	return table
}

// maglevTables is the reconciler's view of the Maglev maps.
type maglevTables interface {
	// Set points service ID id at the table of backends ids (names give
	// the permutation; both in slot order); no ids: an empty table. ranges
	// (loadBalancerSourceRanges, sorted) are the only sources new flows may
	// come from; none: any source.
	Set(id uint32, ids []uint32, names []string, ranges []netip.Prefix) error
	// Delete removes the services' entries.
	Delete(ids []uint32) error
	// Ranges returns the source ranges last written for id (restored from
	// the pinned map at start).
	Ranges(id uint32) []netip.Prefix
}

// Decoded north-south entries, as the View returns them.

// ConntrackEntry is one entry of the north-south conntrack.
type ConntrackEntry struct {
	Direction string             `json:"direction"` // "original", "reply" or "client" (see bpf/README.md)
	Protocol  dataplane.Protocol `json:"protocol"`
	Src       netip.AddrPort     `json:"src"`
	Dst       netip.AddrPort     `json:"dst"`
	// Original: the backend and the SNAT source (when SNAT). Reply: the
	// client (restored destination) and the frontend (restored source).
	Addr      netip.AddrPort `json:"addr"`
	NAT       netip.AddrPort `json:"nat,omitempty"`
	BackendID uint32         `json:"backendID,omitempty"`
	ServiceID uint32         `json:"serviceID"`
	SNAT      bool           `json:"snat"`
	// DSR: a direct-server-return flow (original: dispatched by this
	// node; reply and client: recorded from the option on the backend's
	// node).
	DSR     bool   `json:"dsr,omitempty"`
	Closing bool   `json:"closing,omitempty"`
	Replied bool   `json:"replied,omitempty"`
	Packets uint64 `json:"packets"`
	// ExpiresIn is the time left (negative: dead, awaiting reuse).
	ExpiresIn time.Duration `json:"expiresIn"`
}

// MaglevEntry summarizes one frontend's Maglev table.
type MaglevEntry struct {
	ServiceID uint32 `json:"serviceID"`
	Frontend  string `json:"frontend,omitempty"`
	Name      string `json:"service,omitempty"`
	// Table is the table's ID (shared by frontends with the same backends).
	Table uint32 `json:"table"`
	Size  int    `json:"size"`
	// Share is the table entries per backend.
	Share map[string]int `json:"share"`
	// SourceRanges: the frontend's loadBalancerSourceRanges (new flows
	// from elsewhere are dropped); empty: every source.
	SourceRanges []netip.Prefix `json:"sourceRanges,omitempty"`
}

// DeviceEntry is one north-south device.
type DeviceEntry struct {
	Ifindex uint32 `json:"ifindex"`
	Name    string `json:"name,omitempty"`
	// SNATAddr and SNATAddr6 are the device's IPv4 and IPv6 SNAT sources
	// (invalid: none of that family).
	SNATAddr  netip.Addr `json:"snatAddress"`
	SNATAddr6 netip.Addr `json:"snatAddress6,omitzero"`
	// MAC is the device's hardware address as the programs have it: XDP
	// serves only frames unicast to it (empty: any).
	MAC string `json:"mac,omitempty"`
	// XDP is the mode the ingress program also runs in on this device:
	// "native", "generic", or empty (tc only).
	XDP string `json:"xdp,omitempty"`
}

// np_device.flags (bpf/lib/nodeport.h).
const (
	npDevExternal   = 1 << 0
	npDevXDPNative  = 1 << 1
	npDevXDPGeneric = 1 << 2
)

var npStatNames = [...]string{"xlate_local", "xlate_snat", "ct_hit", "reply", "no_backend", "local_drop",
	"fragment", "snat_exhausted", "fib_miss", "maglev_miss", "affinity_hit", "backend_gone",
	"src_range_drop", "icmp_error", "xdp_fwd", "xdp_partial_csum", "ipv6_exthdr", "other_host", "frag_xlate",
	"xlate_dsr", "dsr_opt", "dsr_recv", "dsr_mtu"}

// NorthSouthStatNames lists the north-south counters (enum np_stat), in
// index order.
func NorthSouthStatNames() []string { return slices.Clone(npStatNames[:]) }

// ErrNoNorthSouth: the pinned state has no north-south maps (the proxy runs
// without --nodeport-devices).
var ErrNoNorthSouth = errors.New("north-south load balancing is not enabled on this node")
