// Package ebpf is Waggle's socket-level service load balancer: it loads the
// cgroup sock_addr programs of bpf/sock_lb.c, attaches them to a cgroup v2
// path, pins maps and links under /sys/fs/bpf/waggle/<node>/, and programs a
// dataplane.State into those maps (the dataplane.Backend named "ebpf").
//
// It also offers a read-only View of the pinned state (services, backends,
// affinity and reverse-socket entries, attached programs, map pressure) for
// inspection tools such as `waggle bpf`, which work while the proxy is down.
//
// It does not compute what to program (package dataplane does that). The
// socket programs translate nothing per packet: the destination is rewritten
// once, when a socket connects or sends, so established connections carry no
// NAT state. With Config.NorthSouth it also attaches bpf/nodeport.c to the
// node's external devices (tcx), which serves NodePort, ExternalIP and
// LoadBalancer traffic arriving from outside per packet: Maglev backend
// choice, SNAT for remote backends, a BPF conntrack (northsouth*.go).
// bpf/README.md documents every hook, map and byte.
package ebpf

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LayoutVersion is the version of the pinned map layout this package
// reads and writes (WAGGLE_LB_LAYOUT_VERSION in bpf/lib/lb.h).
const LayoutVersion = 3

// Magic marks Waggle's meta map ("WGGL" little-endian).
const Magic = 0x4c474757

// Default map sizes.
const (
	DefaultMaxServices       = 65536
	DefaultMaxBackends       = 65536
	DefaultMaxAffinity       = 65536
	DefaultMaxReverseSockets = 65536
)

// DefaultPinRoot is where node directories of pinned state live.
const DefaultPinRoot = "/sys/fs/bpf/waggle"

// Errors of this package; the dataplane's ErrNotSupported and ErrMapFull
// are wrapped where they apply.
var (
	// ErrLayoutMismatch: pinned maps were written by a Waggle with another
	// map layout (or are not Waggle's).
	ErrLayoutMismatch = errors.New("pinned map layout from another Waggle version")
	// ErrNoPinnedState: the pin directory holds no Waggle state.
	ErrNoPinnedState = errors.New("no pinned eBPF dataplane state")
	// ErrClosed: the Backend was closed or cleaned up.
	ErrClosed = errors.New("ebpf backend closed")
)

// Config configures a Backend.
type Config struct {
	// NodeName names this node; the pinned state lives in PinDir.
	NodeName string
	// CgroupPath is the cgroup v2 directory the programs attach to; every
	// socket of a process in it or below is load-balanced. Default: the
	// cgroup2 mount's root.
	CgroupPath string
	// PinDir is where maps and links are pinned. Default:
	// /sys/fs/bpf/waggle/<NodeName>.
	PinDir string
	// MaxServices is the size of the services map: one entry per frontend
	// plus one per backend slot (as Cilium's bpf-lb-map-max). It also bounds
	// the number of frontends (rev_nat and names maps).
	MaxServices int
	// MaxBackends is the number of distinct backends (address, port,
	// protocol) the backends map holds: IDs 1..MaxBackends of an array of
	// MaxBackends+1 entries (ID 0 is never used). Freed IDs are reused.
	MaxBackends int
	// MaxAffinity is the size of the session-affinity LRU.
	MaxAffinity int
	// MaxReverseSockets is the size of the reverse-socket LRU (one entry per
	// translated socket, for recvmsg and getpeername).
	MaxReverseSockets int
	// DestroyTCPSockets also destroys TCP sockets connected through a
	// frontend to a backend it lost (connected UDP sockets always are).
	DestroyTCPSockets bool
	// SocketTerminationInterval is the least time between two runs of the
	// job that destroys sockets of removed backends (default 100 ms).
	SocketTerminationInterval time.Duration
	// Log receives the backend's logs; nil discards them.
	Log *slog.Logger
	// Metrics, when set, gets the backend's metrics registered.
	Metrics prometheus.Registerer
	// NorthSouth, when set, also serves NodePort, ExternalIP and
	// LoadBalancer traffic arriving from outside on the node's external
	// devices (bpf/nodeport.c).
	NorthSouth *NorthSouth
}

// validate refuses configurations that would write outside the pin root or
// make maps the kernel cannot.
func (c Config) validate() error {
	if strings.ContainsAny(c.NodeName, "/\x00") || c.NodeName == "." || c.NodeName == ".." {
		return fmt.Errorf("node name %q cannot name a pin directory", c.NodeName)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"MaxServices", c.MaxServices}, {"MaxBackends", c.MaxBackends}, {"MaxAffinity", c.MaxAffinity},
		{"MaxReverseSockets", c.MaxReverseSockets}} {
		if n.v < 0 || n.v > 1<<24 {
			return fmt.Errorf("%s = %d: want 0 (default) to %d", n.name, n.v, 1<<24)
		}
	}
	return c.NorthSouth.validate()
}

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	if c.NodeName == "" {
		c.NodeName = "local"
	}
	if c.PinDir == "" {
		c.PinDir = DefaultPinRoot + "/" + c.NodeName
	}
	if c.MaxServices <= 0 {
		c.MaxServices = DefaultMaxServices
	}
	if c.MaxBackends <= 0 {
		c.MaxBackends = DefaultMaxBackends
	}
	if c.MaxAffinity <= 0 {
		c.MaxAffinity = DefaultMaxAffinity
	}
	if c.MaxReverseSockets <= 0 {
		c.MaxReverseSockets = DefaultMaxReverseSockets
	}
	if c.SocketTerminationInterval <= 0 {
		c.SocketTerminationInterval = 100 * time.Millisecond
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.NorthSouth != nil {
		ns := c.NorthSouth.withDefaults()
		c.NorthSouth = &ns
	}
	return c
}
