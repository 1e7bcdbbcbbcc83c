// Package routes is Waggle's cross-node pod route controller, run by the node
// agent: from the cluster's Node objects (spec.podCIDRs and the InternalIP
// addresses) it keeps, through netlink, a route to every other node's pod
// CIDRs. In host-gw mode the route goes via the other node's IP, which must
// be on the same L2 segment; in VXLAN mode a vxlan device carries pod traffic
// to nodes anywhere the underlay routes, with one static neighbour and FDB
// entry per remote node (no flooding, no learning).
//
// Sync is the desired-state core: given the nodes it makes the kernel match
// and changes nothing when called again with the same nodes. It talks to the
// kernel through the small Dataplane interface (NewNetlink is the real one;
// the tests also use an in-memory fake). Run wraps Sync in a client-go node
// informer.
//
// Waggle owns exactly: routes with protocol RouteProtocol, and the vxlan
// device named in Config (with its addresses, neighbours and FDB entries).
// It touches nothing else. It is not the CNI plugin (package cni) and does
// not allocate pod CIDRs (the controller-manager does).
package routes

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sort"
	"time"
)

// Mode is how pod traffic reaches other nodes.
type Mode string

// Modes.
const (
	// ModeHostGW routes each remote pod CIDR via the remote node's IP.
	ModeHostGW Mode = "host-gw"
	// ModeVXLAN encapsulates pod traffic in VXLAN between node IPs.
	ModeVXLAN Mode = "vxlan"
)

// Defaults.
const (
	DefaultVXLANDevice = "waggle.vxlan"
	DefaultVNI         = 1
	DefaultVXLANPort   = 8472 // the Linux kernel's (and flannel's) VXLAN port
	// DefaultVXLANMTU leaves room for 50 bytes of VXLAN over IPv4 on a
	// 1500-byte underlay.
	DefaultVXLANMTU = 1450
	// RouteProtocol marks the routes Waggle owns (rtnetlink protocol 87,
	// unassigned in /etc/iproute2/rt_protos).
	RouteProtocol = 87
	// DefaultResync is how often Run re-applies the desired state, repairing
	// drift (a route deleted by hand) even when no Node changes.
	DefaultResync = time.Minute
)

// Sentinel errors.
var (
	// ErrNotSupported: no netlink on this platform.
	ErrNotSupported = errors.New("routes: not supported on this platform")
	// ErrInvalidConfig: the controller's configuration is unusable.
	ErrInvalidConfig = errors.New("routes: invalid configuration")
	// ErrUnreachable: a host-gw next hop is not on a directly connected
	// network (use VXLAN for such nodes).
	ErrUnreachable = errors.New("next hop is not directly reachable")
)

// Config configures the controller.
type Config struct {
	// NodeName is this node; routes go to every other node.
	NodeName string
	// Mode is host-gw (default) or vxlan.
	Mode Mode
	// VXLANDevice, VNI, VXLANPort and VXLANMTU configure the vxlan device.
	VXLANDevice string
	VNI         int
	VXLANPort   int
	VXLANMTU    int
	// Resync is Run's periodic re-sync (default one minute).
	Resync time.Duration
	// Dataplane is the kernel interface; nil means NewNetlink().
	Dataplane Dataplane
	// Log receives the controller's logs (nil: slog.Default()).
	Log *slog.Logger
}

func (c *Config) defaults() error {
	if c.NodeName == "" {
		return fmt.Errorf("%w: NodeName is required", ErrInvalidConfig)
	}
	if c.Mode == "" {
		c.Mode = ModeHostGW
	}
	if c.Mode != ModeHostGW && c.Mode != ModeVXLAN {
		return fmt.Errorf("%w: mode %q (want %q or %q)", ErrInvalidConfig, c.Mode, ModeHostGW, ModeVXLAN)
	}
	if c.VXLANDevice == "" {
		c.VXLANDevice = DefaultVXLANDevice
	}
	if len(c.VXLANDevice) > 15 {
		return fmt.Errorf("%w: vxlan device name %q is longer than 15 bytes", ErrInvalidConfig, c.VXLANDevice)
	}
	if c.VNI == 0 {
		c.VNI = DefaultVNI
	}
	if c.VNI < 0 || c.VNI >= 1<<24 {
		return fmt.Errorf("%w: VNI %d out of range", ErrInvalidConfig, c.VNI)
	}
	if c.VXLANPort == 0 {
		c.VXLANPort = DefaultVXLANPort
	}
	if c.VXLANMTU == 0 {
		c.VXLANMTU = DefaultVXLANMTU
	}
	if c.Resync == 0 {
		c.Resync = DefaultResync
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// Node is what the controller needs of a Node object.
type Node struct {
	Name string
	// PodCIDRs, at most one per address family.
	PodCIDRs []netip.Prefix
	// InternalIPs, the node's addresses on the cluster network.
	InternalIPs []netip.Addr
}

func (n Node) ipFor(is4 bool) (netip.Addr, bool) {
	for _, a := range n.InternalIPs {
		if a.Is4() == is4 {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// underlay is the node's address VXLAN packets go to (its first InternalIP).
func (n Node) underlay() (netip.Addr, bool) {
	if len(n.InternalIPs) == 0 {
		return netip.Addr{}, false
	}
	return n.InternalIPs[0], true
}

// Route is one route Waggle owns. Dev empty means "the kernel picks the
// device from the gateway".
type Route struct {
	Dst    netip.Prefix
	Gw     netip.Addr
	Dev    string
	OnLink bool
}

func (r Route) String() string {
	s := fmt.Sprintf("%s via %s", r.Dst, r.Gw)
	if r.Dev != "" {
		s += " dev " + r.Dev
	}
	if r.OnLink {
		s += " onlink"
	}
	return s
}

// VXLANDevice is the desired vxlan device.
type VXLANDevice struct {
	Name  string
	VNI   int
	Port  int
	MTU   int
	Local netip.Addr
	MAC   net.HardwareAddr
	// Addrs are the local VTEP addresses (host prefixes).
	Addrs []netip.Prefix
}

// Neighbor is a static neighbour entry: a remote VTEP address and its MAC.
type Neighbor struct {
	IP  netip.Addr
	MAC string
}

// FDBEntry sends frames for MAC to the remote node Dst.
type FDBEntry struct {
	MAC string
	Dst netip.Addr
}

// Dataplane is the kernel edge of the controller.
type Dataplane interface {
	// Routes lists the routes with protocol RouteProtocol.
	Routes() ([]Route, error)
	// ReplaceRoute adds or replaces a route (protocol RouteProtocol).
	ReplaceRoute(Route) error
	// DeleteRoute deletes a route; a missing route is success.
	DeleteRoute(Route) error
	// EnsureVXLAN creates the device or makes it match.
	EnsureVXLAN(VXLANDevice) error
	// DeleteLink deletes a device; a missing device is success.
	DeleteLink(name string) error
	// Neighbors lists the permanent neighbour entries on dev.
	Neighbors(dev string) ([]Neighbor, error)
	SetNeighbor(dev string, n Neighbor) error
	DeleteNeighbor(dev string, n Neighbor) error
	// FDB lists the FDB entries of dev that have a remote destination.
	FDB(dev string) ([]FDBEntry, error)
	SetFDB(dev string, e FDBEntry) error
	DeleteFDB(dev string, e FDBEntry) error
}

// VTEPMAC is the MAC of a node's vxlan device, derived from its underlay
// address so that other nodes know it without an annotation: locally
// administered 0e:57 followed by the address's last four bytes.
func VTEPMAC(underlay netip.Addr) net.HardwareAddr {
	b := underlay.AsSlice()
	b = b[len(b)-4:]
	return net.HardwareAddr{0x0e, 0x57, b[0], b[1], b[2], b[3]}
}

// VTEPAddr is a node's VTEP address for one of its pod CIDRs: the CIDR's
// network address (as flannel does), kept off the pod range by the CNI IPAM.
func VTEPAddr(podCIDR netip.Prefix) netip.Addr { return podCIDR.Masked().Addr() }

// Controller keeps the routes. Sync may be called from one goroutine at a time.
type Controller struct {
	cfg Config
	dp  Dataplane
}

// New validates cfg and returns a controller (Dataplane nil: netlink).
func New(cfg Config) (*Controller, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	dp := cfg.Dataplane
	if dp == nil {
		dp = NewNetlink()
	}
	return &Controller{cfg: cfg, dp: dp}, nil
}

// Desired is the state Sync programs for a set of nodes.
type Desired struct {
	Routes    []Route
	VXLAN     *VXLANDevice // nil in host-gw mode
	Neighbors []Neighbor
	FDB       []FDBEntry
}

// Compute returns the desired state for nodes, and the nodes it had to skip
// (no pod CIDR, no address of the right family) with the reason.
func (c *Controller) Compute(nodes []Node) (Desired, map[string]string) {
	var d Desired
	skipped := map[string]string{}
	var self *Node
	for i := range nodes {
		if nodes[i].Name == c.cfg.NodeName {
			self = &nodes[i]
		}
	}
	if c.cfg.Mode == ModeVXLAN {
		if self == nil {
			skipped[c.cfg.NodeName] = "this node is not among the nodes (yet): no vxlan device"
		} else if local, ok := self.underlay(); !ok {
			skipped[c.cfg.NodeName] = "this node has no InternalIP: no vxlan device"
		} else {
			dev := &VXLANDevice{Name: c.cfg.VXLANDevice, VNI: c.cfg.VNI, Port: c.cfg.VXLANPort, MTU: c.cfg.VXLANMTU,
				Local: local, MAC: VTEPMAC(local)}
			for _, p := range self.PodCIDRs {
				a := VTEPAddr(p)
				dev.Addrs = append(dev.Addrs, netip.PrefixFrom(a, a.BitLen()))
			}
			d.VXLAN = dev
		}
	}
	for _, n := range nodes {
		if n.Name == c.cfg.NodeName {
			continue
		}
		if len(n.PodCIDRs) == 0 {
			skipped[n.Name] = "no podCIDR"
			continue
		}
		switch c.cfg.Mode {
		case ModeHostGW:
			for _, p := range n.PodCIDRs {
				gw, ok := n.ipFor(p.Addr().Is4())
				if !ok {
					skipped[n.Name] = fmt.Sprintf("no InternalIP of the family of %s", p)
					continue
				}
				d.Routes = append(d.Routes, Route{Dst: p, Gw: gw})
			}
		case ModeVXLAN:
			if d.VXLAN == nil {
				continue
			}
			remote, ok := n.underlay()
			if !ok {
				skipped[n.Name] = "no InternalIP"
				continue
			}
			if remote.Is4() != d.VXLAN.Local.Is4() {
				skipped[n.Name] = fmt.Sprintf("InternalIP %s is not of this node's underlay family", remote)
				continue
			}
			mac := VTEPMAC(remote).String()
			d.FDB = append(d.FDB, FDBEntry{MAC: mac, Dst: remote})
			for _, p := range n.PodCIDRs {
				vtep := VTEPAddr(p)
				d.Neighbors = append(d.Neighbors, Neighbor{IP: vtep, MAC: mac})
				d.Routes = append(d.Routes, Route{Dst: p, Gw: vtep, Dev: c.cfg.VXLANDevice, OnLink: true})
			}
		}
	}
	sort.Slice(d.Routes, func(i, j int) bool { return d.Routes[i].Dst.String() < d.Routes[j].Dst.String() })
	return d, skipped
}

// Sync makes the kernel match the desired state for nodes: missing routes,
// neighbours and FDB entries are added, wrong ones replaced, stale ones
// deleted. It goes on past a failing item and returns all failures joined.
func (c *Controller) Sync(nodes []Node) error {
	d, skipped := c.Compute(nodes)
	for name, why := range skipped {
		c.cfg.Log.Debug("node skipped", "node", name, "reason", why)
	}
	var errs []error
	dev := c.cfg.VXLANDevice
	if d.VXLAN != nil {
		if err := c.dp.EnsureVXLAN(*d.VXLAN); err != nil {
			return fmt.Errorf("vxlan device %s: %w", dev, err)
		}
		haveN, err := c.dp.Neighbors(dev)
		if err != nil {
			return fmt.Errorf("list neighbours of %s: %w", dev, err)
		}
		for _, n := range haveN {
			if !slices.Contains(d.Neighbors, n) {
				if err := c.dp.DeleteNeighbor(dev, n); err != nil {
					errs = append(errs, fmt.Errorf("delete neighbour %s: %w", n.IP, err))
				}
			}
		}
		for _, n := range d.Neighbors {
			if !slices.Contains(haveN, n) {
				if err := c.dp.SetNeighbor(dev, n); err != nil {
					errs = append(errs, fmt.Errorf("set neighbour %s %s: %w", n.IP, n.MAC, err))
				}
			}
		}
		haveF, err := c.dp.FDB(dev)
		if err != nil {
			return fmt.Errorf("list FDB of %s: %w", dev, err)
		}
		for _, e := range haveF {
			if !slices.Contains(d.FDB, e) {
				if err := c.dp.DeleteFDB(dev, e); err != nil {
					errs = append(errs, fmt.Errorf("delete FDB %s: %w", e.MAC, err))
				}
			}
		}
		for _, e := range d.FDB {
			if !slices.Contains(haveF, e) {
				if err := c.dp.SetFDB(dev, e); err != nil {
					errs = append(errs, fmt.Errorf("set FDB %s dst %s: %w", e.MAC, e.Dst, err))
				}
			}
		}
	}
	have, err := c.dp.Routes()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list routes: %w", err))...)
	}
	for _, r := range have {
		if !slices.Contains(d.Routes, r) {
			if err := c.dp.DeleteRoute(r); err != nil {
				errs = append(errs, fmt.Errorf("delete route %s: %w", r, err))
			}
		}
	}
	for _, r := range d.Routes {
		if !slices.Contains(have, r) {
			if err := c.dp.ReplaceRoute(r); err != nil {
				errs = append(errs, fmt.Errorf("route %s: %w", r, err))
			}
		}
	}
	if c.cfg.Mode == ModeHostGW {
		// A node switched from VXLAN leaves no device behind.
		if err := c.dp.DeleteLink(dev); err != nil {
			errs = append(errs, fmt.Errorf("delete unused %s: %w", dev, err))
		}
	}
	return errors.Join(errs...)
}

// Cleanup removes everything the controller owns: its routes and the vxlan
// device (with its neighbours and FDB entries).
func (c *Controller) Cleanup() error {
	var errs []error
	have, err := c.dp.Routes()
	if err != nil {
		errs = append(errs, err)
	}
	for _, r := range have {
		if err := c.dp.DeleteRoute(r); err != nil {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r, err))
		}
	}
	if err := c.dp.DeleteLink(c.cfg.VXLANDevice); err != nil {
		errs = append(errs, fmt.Errorf("delete %s: %w", c.cfg.VXLANDevice, err))
	}
	return errors.Join(errs...)
}
