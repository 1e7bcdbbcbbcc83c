package ebpf

import (
	"bytes"
	"fmt"
	"math/bits"
	"net/netip"
	"time"

	"github.com/waggle-io/waggle/dataplane"
)

// Names of the pinned maps (files under the pin directory).
const (
	MapServices       = "waggle_services"
	MapBackends       = "waggle_backends"
	MapRevNat         = "waggle_rev_nat"
	MapReverseSockets = "waggle_reverse_sk"
	MapAffinity       = "waggle_affinity"
	MapServiceNames   = "waggle_svc_names"
	MapMeta           = "waggle_meta"
	MapStats          = "waggle_stats"
)

// ServiceEntries is how many services-map entries a frontend with n
// backends takes (what --bpf-lb-map-max counts): its master entry, which
// holds up to 16 backend IDs itself, plus one slot entry per backend above
// that.
func ServiceEntries(n int) int { return 1 + slotEntries(n) }

// LinkDir is the pin directory's subdirectory holding one pinned link per
// program, named after the program.
const LinkDir = "links"

// Service flags (lb_service.flags).
const (
	FlagAffinity = 1 << 0
	FlagLocal    = 1 << 1
)

// BackendFlagTerminating marks a backend (lb_backend.flags bit 0) that is
// serving but terminating (KEP-1669): programmed because its frontend has no
// ready endpoint. The programs do not read it; `waggle bpf` shows it.
const BackendFlagTerminating = 1 << 0

// Stat indexes the per-CPU counters the programs keep (enum lb_stat).
type Stat int

// The programs' counters.
const (
	StatConnectXlate Stat = iota
	StatConnectRefused
	StatSendmsgXlate
	StatSendmsgRefused
	StatRecvmsgXlate
	StatPeernameXlate
	StatBindRefused
	StatAffinityHit
	StatBackendMissing
	statMax
)

var statNames = [...]string{"connect_xlate", "connect_refused", "sendmsg_xlate", "sendmsg_refused",
	"recvmsg_xlate", "getpeername_xlate", "bind_refused", "affinity_hit", "backend_missing"}

func (s Stat) String() string {
	if s >= 0 && int(s) < len(statNames) {
		return statNames[s]
	}
	return fmt.Sprintf("stat%d", int(s))
}

// Stats lists every counter, in index order.
func Stats() []Stat {
	out := make([]Stat, statMax)
	for i := range out {
		out[i] = Stat(i)
	}
	return out
}

const (
	protoTCP = 6
	protoUDP = 17
)

func protoNum(p dataplane.Protocol) uint8 {
	if p == dataplane.UDP {
		return protoUDP
	}
	return protoTCP
}

func protoName(n uint8) dataplane.Protocol {
	switch n {
	case protoTCP:
		return dataplane.TCP
	case protoUDP:
		return dataplane.UDP
	}
	return dataplane.Protocol(fmt.Sprintf("proto%d", n))
}

// Ports are stored in network byte order; Go reads the field natively
// (little-endian on every architecture bpf2go generated for).
func toNet16(p uint16) uint16   { return bits.ReverseBytes16(p) }
func fromNet16(p uint16) uint16 { return bits.ReverseBytes16(p) }

// addr16 is an address as the maps store it: IPv6, IPv4 mapped.
func addr16(a netip.Addr) [16]uint8 { return a.As16() }

func addrFrom16(b [16]uint8) netip.Addr { return netip.AddrFrom16(b).Unmap() }

var kindNums = map[dataplane.FrontendKind]uint8{
	dataplane.ClusterIP: 1, dataplane.NodePort: 2, dataplane.ExternalIP: 3, dataplane.LoadBalancer: 4, dataplane.HostPort: 5,
}

func kindName(n uint8) dataplane.FrontendKind {
	for k, v := range kindNums {
		if v == n {
			return k
		}
	}
	return ""
}

func serviceKey(k dataplane.FrontendKey, slot uint16) sockLBLbServiceKey {
	return sockLBLbServiceKey{Addr: addr16(k.Addr), Port: toNet16(k.Port), Slot: slot, Proto: protoNum(k.Protocol)}
}

func frontendOf(k sockLBLbServiceKey) dataplane.FrontendKey {
	return dataplane.FrontendKey{Addr: addrFrom16(k.Addr), Port: fromNet16(k.Port), Protocol: protoName(k.Proto)}
}

// backendKey identifies a backend: the backends map holds one ID per
// distinct address, port and protocol, shared by every frontend using it.
// It holds no pointer (the address as the maps store it, not a
// netip.Addr), so the mirror's maps keyed or valued by it hash it as 20
// plain bytes and are never scanned by the garbage collector.
type backendKey struct {
	addr  [16]byte // IPv6, IPv4 mapped
	port  uint16
	proto uint8 // IPPROTO_*
	// terminating: a serving-and-terminating endpoint (a distinct backend
	// entry, so its flag is true for every slot naming it).
	terminating bool
}

func newBackendKey(addr netip.Addr, port uint16, proto uint8, terminating bool) backendKey {
	return backendKey{addr: addr.As16(), port: port, proto: proto, terminating: terminating}
}

// ip is the backend's address (IPv4 unmapped).
func (b backendKey) ip() netip.Addr { return addrFrom16(b.addr) }

func (b backendKey) addrPort() netip.AddrPort { return netip.AddrPortFrom(b.ip(), b.port) }

func (b backendKey) String() string {
	return b.addrPort().String() + "/" + string(protoName(b.proto))
}

// backendValue is b's backends-map entry, for an ID of generation gen.
func backendValue(b backendKey, gen uint32) sockLBLbBackend {
	v := sockLBLbBackend{Addr: b.addr, Port: toNet16(b.port), Proto: b.proto, Gen: gen}
	if b.terminating {
		v.Flags |= BackendFlagTerminating
	}
	return v
}

func backendKeyOf(v sockLBLbBackend) backendKey {
	return backendKey{addr: v.Addr, port: fromNet16(v.Port), proto: v.Proto, terminating: v.Flags&BackendFlagTerminating != 0}
}

func revNatValue(k dataplane.FrontendKey) sockLBLbRevNat {
	return sockLBLbRevNat{Addr: addr16(k.Addr), Port: toNet16(k.Port), Proto: protoNum(k.Protocol)}
}

func nameValue(kind dataplane.FrontendKind, name string) sockLBLbSvcName {
	v := sockLBLbSvcName{Kind: kindNums[kind]}
	for i := 0; i < len(name) && i < len(v.Name)-1; i++ {
		v.Name[i] = int8(name[i])
	}
	return v
}

func nameOf(v sockLBLbSvcName) (dataplane.FrontendKind, string) {
	b := make([]byte, 0, len(v.Name))
	for _, c := range v.Name {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return kindName(v.Kind), string(bytes.Clone(b))
}

// Decoded entries, as the View returns them.

// Service is one frontend as programmed: its master entry and slots.
type Service struct {
	ID              uint32                 `json:"id"`
	Frontend        dataplane.FrontendKey  `json:"-"`
	Address         string                 `json:"frontend"`
	Kind            dataplane.FrontendKind `json:"kind,omitempty"`
	Name            string                 `json:"service,omitempty"`
	Count           int                    `json:"count"`
	Flags           uint16                 `json:"flags"`
	AffinityTimeout time.Duration          `json:"affinityTimeout"`
	Slots           []Slot                 `json:"slots"`
}

// Slot is one backend slot of a Service. Backend is invalid when the slot
// names a backend ID that the backends map lacks.
type Slot struct {
	Slot      int            `json:"slot"`
	BackendID uint32         `json:"backendID"`
	Backend   netip.AddrPort `json:"backend"`
	// Terminating: the backend is serving but terminating.
	Terminating bool `json:"terminating,omitempty"`
}

// BackendEntry is one entry of the backends map.
type BackendEntry struct {
	ID       uint32             `json:"id"`
	Backend  netip.AddrPort     `json:"backend"`
	Protocol dataplane.Protocol `json:"protocol"`
	// Terminating: serving but terminating (BackendFlagTerminating).
	Terminating bool `json:"terminating,omitempty"`
	// Gen is the ID's generation (how many backends it has held).
	Gen uint32 `json:"gen"`
}

// AffinityEntry is one entry of the affinity LRU.
type AffinityEntry struct {
	NetnsCookie uint64 `json:"netnsCookie"`
	ServiceID   uint32 `json:"serviceID"`
	BackendID   uint32 `json:"backendID"`
	// BackendGen is the backend ID's generation when the entry was
	// written: the programs follow the entry only while the ID has it.
	BackendGen uint32 `json:"backendGen"`
	// LastUsed is CLOCK_MONOTONIC time of the entry's last use.
	LastUsed time.Duration `json:"lastUsedMonotonic"`
}

// ReverseSocketEntry is one entry of the reverse-socket LRU.
type ReverseSocketEntry struct {
	Cookie    uint64         `json:"cookie"`
	Backend   netip.AddrPort `json:"backend"`
	Frontend  netip.AddrPort `json:"frontend"`
	ServiceID uint32         `json:"serviceID"`
}
