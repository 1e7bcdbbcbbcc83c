package inspect

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
)

// source is the pinned state as dataplane/ebpf's View reads it; an
// in-memory fake implements it in unit tests.
type source interface {
	Dir() string
	Meta() (ebpf.Meta, error)
	Services() ([]ebpf.Service, error)
	Backends() ([]ebpf.BackendEntry, error)
	Affinity() ([]ebpf.AffinityEntry, error)
	ReverseSockets() ([]ebpf.ReverseSocketEntry, error)
	Counters() (map[ebpf.Stat]uint64, error)
	Maps() ([]ebpf.MapInfo, error)
	RawEntries(name string) (keys, values [][]byte, err error)
	Programs() ([]ebpf.ProgramInfo, error)
}

// system is the rest of the machine the commands look at: clocks, cgroup
// paths, network namespaces and the kernel's BPF statistics switch.
type system interface {
	Now() time.Time
	// Monotonic is CLOCK_MONOTONIC now (bpf_ktime_get_ns's clock).
	Monotonic() time.Duration
	// Boottime is CLOCK_BOOTTIME now (the clock of program load times).
	Boottime() time.Duration
	// CgroupPath finds the cgroup v2 directory with this ID ("" if none).
	CgroupPath(id uint64) string
	// NetnsCookie resolves a client network namespace (see explain).
	NetnsCookie(src string) (uint64, error)
	// PinTime is when the file at path (on bpffs) was created.
	PinTime(path string) time.Time
	// StatsEnabled reports kernel.bpf_stats_enabled.
	StatsEnabled() bool
	// EnableStats turns BPF run statistics on until the closer is closed.
	EnableStats() (io.Closer, error)
	// Sleep waits d or until the context ends.
	Sleep(d time.Duration) error
}

// Program is one attached program (through its pinned link).
type Program struct {
	Name        string `json:"name"`
	ID          uint32 `json:"id"`
	LinkID      uint32 `json:"linkID"`
	Type        string `json:"type"`
	AttachType  string `json:"attachType"`
	AttachPoint string `json:"attachPoint"`
	CgroupID    uint64 `json:"cgroupID"`
	// Attached is when the link was pinned: the proxy pins it right after
	// attaching, and a restarted proxy swaps its program into the same
	// link, so this is when load balancing began on the cgroup (the
	// kernel keeps no attach time itself).
	Attached time.Time `json:"attached"`
	// Loaded is when the program now in the link was loaded (the last
	// proxy start).
	Loaded   time.Time `json:"loaded"`
	LinkPath string    `json:"linkPath"`
	// Runs and RunTime count only while BPF statistics are enabled.
	StatsEnabled bool          `json:"statsEnabled"`
	Runs         uint64        `json:"runs"`
	RunTime      time.Duration `json:"runTimeNanoseconds"`
	// Window is how long statistics were enabled by --enable-stats (Runs
	// and RunTime then count that window only).
	Window time.Duration `json:"windowNanoseconds,omitempty"`
}

// MapRow is one pinned map with its fill level.
type MapRow struct {
	Name       string  `json:"name"`
	Type       string  `json:"type"`
	KeySize    int     `json:"keySize"`
	ValueSize  int     `json:"valueSize"`
	Entries    int     `json:"entries"`
	MaxEntries int     `json:"maxEntries"`
	Pressure   float64 `json:"pressurePercent"`
	// FixedSize maps (arrays but the backends array, whose Entries are its
	// used IDs) always hold MaxEntries entries: no pressure.
	FixedSize bool   `json:"fixedSize,omitempty"`
	Path      string `json:"path"`
}

// pressureWarn is the fill level from which status warns.
const pressureWarn = 90

// sizeFlags names the proxy flag that sizes each map.
var sizeFlags = map[string]string{
	ebpf.MapServices: "--bpf-lb-map-max", ebpf.MapRevNat: "--bpf-lb-map-max", ebpf.MapServiceNames: "--bpf-lb-map-max",
	ebpf.MapBackends: "--bpf-lb-backends-max", ebpf.MapAffinity: "--bpf-lb-affinity-max", ebpf.MapReverseSockets: "--bpf-lb-sock-rev-max",
}

// warning says what a map's fill level means, or "" when it is fine.
func (m MapRow) warning() string {
	if m.FixedSize || m.Pressure < pressureWarn {
		return ""
	}
	flag := sizeFlags[m.Name]
	if flag == "" {
		flag = "its size"
	}
	if strings.HasPrefix(m.Type, "LRU") {
		return fmt.Sprintf("%s is %.2f%% full: the least recently used entries are evicted; raise the proxy's %s if that is too soon", m.Name, m.Pressure, flag)
	}
	return fmt.Sprintf("%s is %.2f%% full: frontends that do not fit are left out; raise the proxy's %s", m.Name, m.Pressure, flag)
}

// Event is one of the programs' counters.
type Event struct {
	Name  string `json:"name"`
	Count uint64 `json:"count"`
}

// Status is `waggle bpf status`.
type Status struct {
	Node          string    `json:"node,omitempty"`
	PinDir        string    `json:"pinDir"`
	Mode          string    `json:"mode"`
	LayoutVersion uint32    `json:"layoutVersion"`
	Created       time.Time `json:"created"`
	Frontends     int       `json:"frontends"`
	Backends      int       `json:"backends"`
	Programs      []Program `json:"programs"`
	Maps          []MapRow  `json:"maps"`
	Events        []Event   `json:"events"`
	// Warnings name maps at or above 90% of their size.
	Warnings []string `json:"warnings,omitempty"`
}

// Slot states.
const (
	StateActive         = "active"
	StateTerminating    = "terminating"     // serving but terminating (KEP-1669): used only while no backend is ready
	StateBackendMissing = "backend-missing" // the slot names a backend ID the backends map lacks
	StateSlotMissing    = "slot-missing"    // the master entry counts a slot that does not exist
)

// BackendSlot is one backend slot of a frontend.
type BackendSlot struct {
	Slot      int    `json:"slot"`
	BackendID uint32 `json:"backendID"`
	Backend   string `json:"backend"`
	State     string `json:"state"`
}

// Frontend is one frontend with its slots (`lb list`, `lb get`).
type Frontend struct {
	Frontend  string `json:"frontend"`
	Address   string `json:"address"`
	Port      uint16 `json:"port"`
	Protocol  string `json:"protocol"`
	ID        uint32 `json:"id"`
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	PortName  string `json:"portName,omitempty"`
	// Service is namespace/name[:port].
	Service         string        `json:"service,omitempty"`
	Flags           []string      `json:"flags"`
	AffinityTimeout time.Duration `json:"affinityTimeoutNanoseconds"`
	Count           int           `json:"count"`
	Backends        []BackendSlot `json:"backends"`

	key dataplane.FrontendKey
}

func flagNames(f uint16) []string {
	out := []string{}
	if f&ebpf.FlagAffinity != 0 {
		out = append(out, "affinity")
	}
	if f&ebpf.FlagLocal != 0 {
		out = append(out, "local")
	}
	if rest := f &^ (ebpf.FlagAffinity | ebpf.FlagLocal); rest != 0 {
		out = append(out, fmt.Sprintf("%#x", rest))
	}
	return out
}

// splitServiceName splits "namespace/name:port".
func splitServiceName(s string) (ns, name, port string) {
	ns, rest, ok := strings.Cut(s, "/")
	if !ok {
		return "", s, ""
	}
	name, port, _ = strings.Cut(rest, ":")
	return ns, name, port
}

// frontendsOf decodes the View's services into rows, with a state per slot.
func frontendsOf(svcs []ebpf.Service, backends []ebpf.BackendEntry) []Frontend {
	have := map[uint32]bool{}
	for _, b := range backends {
		have[b.ID] = true
	}
	out := make([]Frontend, 0, len(svcs))
	for _, s := range svcs {
		f := Frontend{Frontend: s.Frontend.String(), Address: s.Frontend.Addr.String(), Port: s.Frontend.Port,
			Protocol: string(s.Frontend.Protocol), ID: s.ID, Kind: string(s.Kind), Service: s.Name,
			Flags: flagNames(s.Flags), AffinityTimeout: s.AffinityTimeout, Count: s.Count,
			Backends: []BackendSlot{}, key: s.Frontend}
		f.Namespace, f.Name, f.PortName = splitServiceName(s.Name)
		bySlot := map[int]ebpf.Slot{}
		last := s.Count
		for _, sl := range s.Slots {
			bySlot[sl.Slot] = sl
			last = max(last, sl.Slot)
		}
		for i := 1; i <= last; i++ {
			sl, ok := bySlot[i]
			switch {
			case !ok && i <= s.Count:
				f.Backends = append(f.Backends, BackendSlot{Slot: i, Backend: "-", State: StateSlotMissing})
			case !ok:
			case !have[sl.BackendID] || !sl.Backend.IsValid():
				f.Backends = append(f.Backends, BackendSlot{Slot: i, BackendID: sl.BackendID, Backend: "-", State: StateBackendMissing})
			case i > s.Count:
				// A slot beyond count is never picked (left over by a
				// shrink in progress): show it, marked.
				f.Backends = append(f.Backends, BackendSlot{Slot: i, BackendID: sl.BackendID, Backend: sl.Backend.String(), State: "unused"})
			case sl.Terminating:
				f.Backends = append(f.Backends, BackendSlot{Slot: i, BackendID: sl.BackendID, Backend: sl.Backend.String(), State: StateTerminating})
			default:
				f.Backends = append(f.Backends, BackendSlot{Slot: i, BackendID: sl.BackendID, Backend: sl.Backend.String(), State: StateActive})
			}
		}
		out = append(out, f)
	}
	return out
}

// AffinityRow is one affinity entry.
type AffinityRow struct {
	ServiceID   uint32 `json:"serviceID"`
	Frontend    string `json:"frontend"`
	Service     string `json:"service,omitempty"`
	NetnsCookie uint64 `json:"netnsCookie"`
	BackendID   uint32 `json:"backendID"`
	Backend     string `json:"backend"`
	// Age is the time since the entry's last use.
	Age time.Duration `json:"ageNanoseconds"`
	// Expired entries are ignored (and deleted) by the next connect.
	Expired bool `json:"expired"`
	// State is live, expired, backend-missing (the next connect chooses
	// afresh) or service-gone.
	State string `json:"state"`
}

// SocketRow is one reverse-socket entry.
type SocketRow struct {
	Cookie    uint64 `json:"cookie"`
	Backend   string `json:"backend"`
	Frontend  string `json:"frontend"`
	ServiceID uint32 `json:"serviceID"`
	Service   string `json:"service,omitempty"`
	// State is "valid", or "stale" when the service ID now names another
	// frontend or none (recvmsg/getpeername then delete the entry).
	State string `json:"state"`
}

// revNat is one decoded rev_nat entry.
type revNat struct {
	ID       uint32
	Frontend netip.AddrPort
	Proto    uint8
}

// decodeRevNat decodes the rev_nat map's raw entries (key: __u32 ID;
// value: struct lb_rev_nat, 20 bytes: addr[16], be16 port, u8 proto, pad).
func decodeRevNat(keys, values [][]byte) ([]revNat, error) {
	out := make([]revNat, 0, len(keys))
	for i := range keys {
		if len(keys[i]) != 4 || len(values[i]) != 20 {
			return nil, fmt.Errorf("%s entry %d: %d/%d bytes, want 4/20: %w", ebpf.MapRevNat, i, len(keys[i]), len(values[i]), ebpf.ErrLayoutMismatch)
		}
		v := values[i]
		out = append(out, revNat{ID: binary.LittleEndian.Uint32(keys[i]),
			Frontend: netip.AddrPortFrom(netip.AddrFrom16([16]byte(v[:16])).Unmap(), binary.BigEndian.Uint16(v[16:18])),
			Proto:    v[18]})
	}
	slices.SortFunc(out, func(a, b revNat) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// svcName is one decoded names-map entry.
type svcName struct {
	ID   uint32
	Kind string
	Name string
}

var kindNames = map[byte]string{1: string(dataplane.ClusterIP), 2: string(dataplane.NodePort),
	3: string(dataplane.ExternalIP), 4: string(dataplane.LoadBalancer), 5: string(dataplane.HostPort)}

// decodeNames decodes the names map's raw entries (key: __u32 ID; value:
// struct lb_svc_name, 256 bytes: u8 kind, pad[3], NUL-padded name[252]).
func decodeNames(keys, values [][]byte) ([]svcName, error) {
	out := make([]svcName, 0, len(keys))
	for i := range keys {
		if len(keys[i]) != 4 || len(values[i]) != 256 {
			return nil, fmt.Errorf("%s entry %d: %d/%d bytes, want 4/256: %w", ebpf.MapServiceNames, i, len(keys[i]), len(values[i]), ebpf.ErrLayoutMismatch)
		}
		v := values[i]
		name := v[4:]
		if j := slices.Index(name, 0); j >= 0 {
			name = name[:j]
		}
		kind, ok := kindNames[v[0]]
		if !ok {
			kind = fmt.Sprintf("kind%d", v[0])
		}
		out = append(out, svcName{ID: binary.LittleEndian.Uint32(keys[i]), Kind: kind, Name: string(name)})
	}
	slices.SortFunc(out, func(a, b svcName) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

func protoString(p uint8) string {
	switch p {
	case 6:
		return string(dataplane.TCP)
	case 17:
		return string(dataplane.UDP)
	}
	return fmt.Sprintf("proto%d", p)
}

// parseFrontend parses VIP:PORT[/PROTO]; proto is "" when left out.
func parseFrontend(s string) (netip.AddrPort, dataplane.Protocol, error) {
	addr, proto, hasProto := strings.Cut(s, "/")
	var p dataplane.Protocol
	if hasProto {
		switch strings.ToUpper(proto) {
		case "TCP":
			p = dataplane.TCP
		case "UDP":
			p = dataplane.UDP
		default:
			return netip.AddrPort{}, "", usageErr("frontend %q: protocol %q: want TCP or UDP", s, proto)
		}
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.AddrPort{}, "", usageErr("frontend %q: want VIP:PORT[/PROTO], e.g. 10.96.0.10:53/UDP or [fd00::a]:80: %v", s, err)
	}
	if ap.Port() == 0 || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, "", usageErr("frontend %q: want a non-zero port and an address without zone", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), p, nil
}

// checkSource checks the syntax of explain's SRC: cookie:N, pid:N, a path
// or a netns name — never an address, since affinity is kept per network
// namespace.
func checkSource(src string) error {
	switch {
	case strings.HasPrefix(src, "cookie:"):
		if _, err := strconv.ParseUint(src[len("cookie:"):], 10, 64); err != nil {
			return usageErr("SRC %q: cookie:N wants a number", src)
		}
		return nil
	case strings.HasPrefix(src, "pid:"):
		if pid, err := strconv.Atoi(src[len("pid:"):]); err != nil || pid <= 0 {
			return usageErr("SRC %q: pid:N wants a process ID", src)
		}
		return nil
	case strings.Contains(src, "/"):
		return nil
	}
	if _, err := netip.ParseAddr(src); err == nil || src == "" || src == "." || src == ".." || strings.ContainsAny(src, ":[]") {
		return usageErr("SRC %q: want the client's network namespace: a name in /run/netns, a path, pid:N or cookie:N "+
			"(affinity is kept per network namespace, not per address)", src)
	}
	return nil
}
