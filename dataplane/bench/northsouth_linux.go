package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/iptables"
	"github.com/waggle-io/waggle/internal/ethtool"
)

// North-south addresses (the northsouth engineer's 10.27/16).
const (
	nsClientAddr = "10.27.10.100"
	nsNode1Addr  = "10.27.10.1"
	nsNode2Addr  = "10.27.10.2"
	nsNode3Addr  = "10.27.10.3"
	nsPodNet     = "10.27.12.0/24"
	nsPortEBPF   = 30080
	nsPortIPT    = 30081
	nsNodeXAddr  = "10.27.10.9" // the eBPF node with generic XDP
	nsPortXDP    = 30090
	nsNodeNAddr  = "10.27.10.8" // the eBPF node with native XDP
	nsPortXDPN   = 30091
	nsNodeDAddr  = "10.27.10.7" // the eBPF node in DSR mode
	nsPortDSR    = 30088
	// IPv6 beside (NorthSouthConfig.IPv6): the same hosts in fd06:10::/64,
	// the backends in fd06:12::/64.
	nsClientAddr6 = "fd06:10::100"
	nsNode1Addr6  = "fd06:10::1"
	nsNode2Addr6  = "fd06:10::2"
	nsPodNet6     = "fd06:12::/64"
	nsNodeXAddr6  = "fd06:10::9"
	nsNodeNAddr6  = "fd06:10::8"
)

// nsTopo: a client outside every node, three nodes on a bridge, the
// backends in a pod namespace behind node2. The client reaches pod IPs
// through node1 (its route to the pod network), so the direct path crosses
// node1 as a NodePort on node1 whose backends are on node2 does; node3 is
// the iptables node (its rules alone there).
type nsTopo struct {
	suffix                     string
	wire, client, node1, node2 string
	node3                      string // the iptables node
	pod                        string
	backends                   []netip.Addr
	backends6                  []netip.Addr // with IPv6: the same backends' IPv6 addresses
	cgroup                     string
	closers                    []func()
	listeners                  []io.Closer
}

func (t *nsTopo) path(n string) string { return "/run/netns/" + n }

func sh2(args ...string) error {
	return (&topo{}).run(args[0], args[1:]...)
}

func (t *nsTopo) in(n string, args ...string) error {
	return sh2(append([]string{"ip", "netns", "exec", n}, args...)...)
}

func (t *nsTopo) close() {
	for _, l := range t.listeners {
		l.Close()
	}
	for i := len(t.closers) - 1; i >= 0; i-- {
		t.closers[i]()
	}
}

func newNSTopo(backends int, ipv6 bool) (t *nsTopo, err error) {
	t = &nsTopo{suffix: randSuffix()[:6]}
	t.wire, t.client, t.node1, t.node2, t.pod = "ns-bw"+t.suffix, "ns-bc"+t.suffix, "ns-b1"+t.suffix, "ns-b2"+t.suffix, "ns-bp"+t.suffix
	t.node3 = "ns-b3" + t.suffix
	for _, n := range []string{t.wire, t.client, t.node1, t.node2, t.node3, t.pod} {
		if err := sh2("ip", "netns", "add", n); err != nil {
			return t, err
		}
		n := n
		t.closers = append(t.closers, func() { sh2("ip", "netns", "del", n) })
		if err := t.in(n, "ip", "link", "set", "lo", "up"); err != nil {
			return t, err
		}
	}
	plug := func(from, fromName, to, toName string) error {
		tmp := "nsbtmp" + toName
		if len(tmp) > 15 {
			tmp = tmp[:15]
		}
		for _, c := range [][]string{
			{from, "ip", "link", "add", fromName, "type", "veth", "peer", "name", tmp},
			{from, "ip", "link", "set", tmp, "netns", to},
			{to, "ip", "link", "set", tmp, "name", toName},
			{from, "ip", "link", "set", fromName, "up"},
			{to, "ip", "link", "set", toName, "up"},
		} {
			if err := t.in(c[0], c[1:]...); err != nil {
				return err
			}
		}
		return nil
	}
	steps := [][]string{{t.wire, "ip", "link", "add", "br0", "type", "bridge"}, {t.wire, "ip", "link", "set", "br0", "up"}}
	for _, s := range steps {
		if err := t.in(s[0], s[1:]...); err != nil {
			return t, err
		}
	}
	for _, x := range []struct{ n, port, addr string }{{t.client, "c0", nsClientAddr}, {t.node1, "n1", nsNode1Addr}, {t.node2, "n2", nsNode2Addr}, {t.node3, "n3", nsNode3Addr}} {
		if err := plug(t.wire, x.port, x.n, "eth0"); err != nil {
			return t, err
		}
		for _, c := range [][]string{{t.wire, "ip", "link", "set", x.port, "master", "br0"}, {x.n, "ip", "addr", "add", x.addr + "/24", "dev", "eth0"}} {
			if err := t.in(c[0], c[1:]...); err != nil {
				return t, err
			}
		}
	}
	if err := plug(t.node2, "p0", t.pod, "eth0"); err != nil {
		return t, err
	}
	steps = [][]string{
		{t.node1, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{t.node2, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{t.node1, "ip", "route", "add", nsPodNet, "via", nsNode2Addr},
		{t.node3, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{t.node3, "ip", "route", "add", nsPodNet, "via", nsNode2Addr},
		{t.node2, "ip", "route", "add", nsPodNet, "dev", "p0", "scope", "link"},
		{t.client, "ip", "route", "add", nsPodNet, "via", nsNode1Addr},
		{t.pod, "ip", "route", "add", nsNode2Addr, "dev", "eth0", "scope", "link"},
		{t.pod, "ip", "route", "add", "default", "via", nsNode2Addr, "dev", "eth0"},
	}
	for i := range backends {
		a := netip.AddrFrom4([4]byte{10, 27, 12, byte(10 + i)})
		t.backends = append(t.backends, a)
		steps = append(steps, []string{t.pod, "ip", "addr", "add", a.String() + "/32", "dev", "eth0"})
	}
	if ipv6 {
		// The same paths in IPv6: the pod's gateway is fe80::1 on node2's
		// side of its veth.
		steps = append(steps,
			[]string{t.client, "ip", "addr", "add", nsClientAddr6 + "/64", "dev", "eth0", "nodad"},
			[]string{t.node1, "ip", "addr", "add", nsNode1Addr6 + "/64", "dev", "eth0", "nodad"},
			[]string{t.node2, "ip", "addr", "add", nsNode2Addr6 + "/64", "dev", "eth0", "nodad"},
			[]string{t.node1, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
			[]string{t.node2, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
			[]string{t.node1, "ip", "-6", "route", "add", nsPodNet6, "via", nsNode2Addr6},
			[]string{t.node2, "ip", "addr", "add", "fe80::1/64", "dev", "p0", "nodad"},
			[]string{t.node2, "ip", "-6", "route", "add", nsPodNet6, "dev", "p0"},
			[]string{t.client, "ip", "-6", "route", "add", nsPodNet6, "via", nsNode1Addr6},
			[]string{t.pod, "ip", "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"})
		for i := range backends {
			a := netip.MustParseAddr(fmt.Sprintf("fd06:12::%d", 10+i))
			t.backends6 = append(t.backends6, a)
			steps = append(steps, []string{t.pod, "ip", "addr", "add", a.String() + "/128", "dev", "eth0", "nodad"})
		}
	}
	for _, s := range steps {
		if err := t.in(s[0], s[1:]...); err != nil {
			return t, err
		}
	}
	// Echo servers in the pod namespace.
	err = inNS(t.pod, func() error {
		for _, a := range append(slices.Clone(t.backends), t.backends6...) {
			ln, err := net.Listen("tcp", netip.AddrPortFrom(a, bePort).String())
			if err != nil {
				return err
			}
			pc, err := net.ListenPacket("udp", netip.AddrPortFrom(a, bePort).String())
			if err != nil {
				return err
			}
			t.listeners = append(t.listeners, ln, pc)
			go serveEcho(ln)
			go serveUDPEcho(pc)
		}
		return nil
	})
	return t, err
}

// addNode adds a node namespace on the bridge (eth0 = addr/24) routing the
// pod network through node2.
func (t *nsTopo) addNode(n, addr, port string) error {
	if err := sh2("ip", "netns", "add", n); err != nil {
		return err
	}
	t.closers = append(t.closers, func() { sh2("ip", "netns", "del", n) })
	for _, c := range [][]string{
		{n, "ip", "link", "set", "lo", "up"},
		{t.wire, "ip", "link", "add", port, "type", "veth", "peer", "name", "nsbt" + port},
		{t.wire, "ip", "link", "set", "nsbt" + port, "netns", n},
		{n, "ip", "link", "set", "nsbt" + port, "name", "eth0"},
		{t.wire, "ip", "link", "set", port, "master", "br0", "up"},
		{n, "ip", "addr", "add", addr + "/24", "dev", "eth0"},
		{n, "ip", "link", "set", "eth0", "up"},
		{n, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{n, "ip", "route", "add", nsPodNet, "via", nsNode2Addr},
	} {
		if err := t.in(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
}

func serveUDPEcho(pc net.PacketConn) {
	buf := make([]byte, 2048)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		pc.WriteTo(buf[:n], from)
	}
}

// NorthSouthConfig configures RunNorthSouth.
type NorthSouthConfig struct {
	Duration, Warmup time.Duration
	Rounds, Clients  int
	Backends         int
	// ServiceCounts: frontends programmed besides the measured NodePort
	// (ExternalIP frontends, which the iptables path matches linearly).
	ServiceCounts []int
	// Tests: TCP_CRR, TCP_RR, UDP_RR (default all three).
	Tests []string
	// IPTables adds the iptables path (a NodePort on the same node).
	IPTables bool
	// XDP adds the eBPF path with generic XDP (--bpf-lb-acceleration=generic)
	// on a node namespace of its own, and makes the client send full
	// checksums (tx checksum offload off on its veth, as packets from
	// another machine arrive; every path sees the same client).
	XDP bool
	// XDPNative adds the same with native (driver) XDP on the node's veth
	// (--bpf-lb-acceleration=native), and an XDP program that passes
	// everything on the veth's peer on the bridge: a veth's native XDP
	// transmits (XDP_TX) only to a peer with NAPI, and on this kernel only
	// the peer's own XDP program makes it deliver what it is sent (GRO on
	// the peer gives it NAPI, yet the frames it is sent stay queued).
	XDPNative bool
	// IPv6 adds the IPv6 paths beside: direct6 (the client to the
	// backends' IPv6 addresses through node1) and ebpf-tc6 (node1's IPv6
	// NodePort, the same tc programs), their ratios against direct6.
	IPv6 bool
	// DSR adds the eBPF tc path in direct-server-return mode
	// (--bpf-lb-mode=dsr) on a node namespace of its own, with node2 (the
	// backends' node) running the north-south programs too, as DSR needs:
	// the replies go from node2 straight to the client.
	DSR bool
	// Peers are other proxies measured beside (upstream kube-proxy: the
	// benchmark test supplies them), each on its own node namespace.
	Peers  []Peer
	Output string
	Out    io.Writer
	Log    interface {
		Info(msg string, args ...any)
	}
}

// Peer is another proxy serving the measured NodePort on its own node
// namespace: Start programs n Services (the NodePort on port of nodeIP,
// with backends, and n-1 ExternalIP Services) in netns and returns how long
// that took and how to stop it.
type Peer struct {
	Name  string
	Start func(netns, nodeIP string, port, n int, backends []netip.Addr) (took time.Duration, stop func(), err error)
}

// Latency is a test's per-operation latency over every round.
type Latency struct {
	P50us float64 `json:"p50us"`
	P99us float64 `json:"p99us"`
}

// NSRow is one test at one service count: per path, the rate over rounds
// and the latency percentiles of every operation.
type NSRow struct {
	Services int                 `json:"services"`
	Test     string              `json:"test"`
	Rate     map[string]*Stat    `json:"ratePerSecond"`
	Latency  map[string]*Latency `json:"latency"`
}

// NorthSouthReport is the result of RunNorthSouth.
type NorthSouthReport struct {
	Started  time.Time `json:"started"`
	Kernel   string    `json:"kernel"`
	Clients  int       `json:"clients"`
	Backends int       `json:"backends"`
	Duration string    `json:"durationPerMeasurement"`
	Rounds   int       `json:"rounds"`
	Notes    []string  `json:"notes"`
	Rows     []NSRow   `json:"rows"`
}

// RunNorthSouth measures an external client reaching backends on another
// node: directly by pod IP (through node1, the same hops), through the
// NodePort of node1 served by the eBPF tc programs (Maglev, SNAT to node1),
// and through the iptables backend's NodePort on the same node — side by
// side, interleaved, TCP_CRR, TCP_RR and UDP_RR, rates and p50/p99.
func RunNorthSouth(ctx context.Context, cfg NorthSouthConfig) (*NorthSouthReport, error) {
	if cfg.Duration <= 0 {
		cfg.Duration = time.Second
	}
	if cfg.Warmup <= 0 {
		cfg.Warmup = 200 * time.Millisecond
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
	}
	if cfg.Clients <= 0 {
		cfg.Clients = 4
	}
	if cfg.Backends <= 0 {
		cfg.Backends = 4
	}
	if len(cfg.ServiceCounts) == 0 {
		cfg.ServiceCounts = []int{1}
	}
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the north-south benchmark needs root (network namespaces, BPF)")
	}
	rep := &NorthSouthReport{Started: time.Now().UTC(), Clients: cfg.Clients, Backends: cfg.Backends,
		Duration: cfg.Duration.String(), Rounds: cfg.Rounds}
	var un unix.Utsname
	if unix.Uname(&un) == nil {
		rep.Kernel = unix.ByteSliceToString(un.Release[:])
	}
	rep.Notes = []string{
		"client, node1, node2 in their own network namespaces on one bridge; all backends in one pod namespace behind node2",
		"direct: the client connects to pod IP i mod N, routed through node1 (forwarded by node1's stack, no NAT rules there); replies return from node2 straight to the client",
		"ebpf-tc: node1's NodePort served by the tc programs on node1's eth0 (Maglev, DNAT + SNAT to node1, FIB + redirect); replies return through node1",
		"iptables: node3's NodePort through Waggle's iptables backend (kube-proxy's layout, masquerade: replies return through node3); node3 holds the iptables rules alone, node1 none",
		"TCP_CRR closes with SO_LINGER 0 (RST); 1-byte payloads; latency is per operation (connect+request+response for CRR)",
	}
	if !cfg.XDP && !cfg.XDPNative {
		rep.Notes = append(rep.Notes, "XDP not measured (NorthSouthConfig.XDP, XDPNative)")
	}
	t, err := newNSTopo(cfg.Backends, cfg.IPv6)
	defer t.close()
	if err != nil {
		return nil, fmt.Errorf("set up namespaces: %w", err)
	}
	if t.cgroup, err = newBenchCgroup("ns-bench-" + t.suffix); err != nil {
		return nil, err
	}
	t.closers = append(t.closers, func() { os.Remove(t.cgroup) })
	node := "ns-bench-" + t.suffix
	pin := filepath.Join(ebpf.DefaultPinRoot, node)
	eb, err := ebpf.New(ebpf.Config{NodeName: node, CgroupPath: t.cgroup, PinDir: pin, MaxServices: 1 << 17, MaxBackends: 1 << 17,
		NorthSouth: &ebpf.NorthSouth{Devices: []string{"eth0"}, NetNS: t.path(t.node1)}})
	if err != nil {
		return nil, fmt.Errorf("eBPF backend: %w", err)
	}
	t.closers = append(t.closers, func() { eb.Cleanup(context.Background()) })
	paths := []string{"direct", "ebpf-tc"}
	if cfg.IPv6 {
		paths = append(paths, "direct6", "ebpf-tc6")
		rep.Notes = append(rep.Notes, "direct6, ebpf-tc6: the same two paths over IPv6 (client "+nsClientAddr6+", NodePort ["+nsNode1Addr6+"]:30080 on the same node1 programs, SNAT to "+nsNode1Addr6+", backends fd06:12::10+i in the same pod namespace); their ratios are against direct6")
	}
	var xdps []*xdpNode
	for _, x := range []*xdpNode{
		{path: "ebpf-xdp", mode: ebpf.AccelGeneric, netns: "ns-bx" + t.suffix, port: "nx", addr: nsNodeXAddr, addr6: nsNodeXAddr6, nodePort: nsPortXDP},
		{path: "ebpf-xdp-native", mode: ebpf.AccelNative, netns: "ns-bn" + t.suffix, port: "nn", addr: nsNodeNAddr, addr6: nsNodeNAddr6, nodePort: nsPortXDPN},
	} {
		if x.mode == ebpf.AccelGeneric && !cfg.XDP || x.mode == ebpf.AccelNative && !cfg.XDPNative {
			continue
		}
		if err := t.startXDP(x); err != nil {
			return rep, err
		}
		xdps = append(xdps, x)
		paths = append(paths, x.path)
		if cfg.IPv6 {
			paths = append(paths, x.path+"6")
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s6: that XDP node's IPv6 NodePort [%s]:%d, ratio against direct6 (its XDP counters below cover both families)", x.path, x.addr6, x.nodePort))
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: the same programs on a node of its own (%s), the ingress in %s XDP on its eth0 (a veth): new flows, their packets and their replies forwarded with XDP_TX; the client and the backends send full checksums (tx offload off) for every path, as from other machines", x.path, x.addr, x.mode))
		if x.mode == ebpf.AccelNative {
			rep.Notes = append(rep.Notes, x.path+": an XDP_PASS program on the node's veth peer on the bridge (a veth's native XDP_TX needs the peer to run XDP)")
		}
	}
	var db *ebpf.Backend
	var dpin string
	if cfg.DSR {
		if db, dpin, err = t.startDSR(); err != nil {
			return rep, err
		}
		paths = append(paths, "ebpf-dsr")
		rep.Notes = append(rep.Notes, "ebpf-dsr: the tc programs in DSR mode (--bpf-lb-mode=dsr) on a node of its own ("+nsNodeDAddr+"): DNAT only, the NodePort in an IPv4 option on SYNs and UDP datagrams; node2 runs the north-south tc programs (DSR mode) on its eth0 to read the option and reverse-translate the replies, which go from node2 straight to the client (node2's programs also see every other path's packets)")
	}
	var ib *iptables.Backend
	if cfg.IPTables {
		if err := iptables.Supported(); err != nil {
			rep.Notes = append(rep.Notes, "iptables not measured: "+err.Error())
		} else {
			p := t.path(t.node3)
			ib, err = iptables.New(iptables.Config{Runner: &iptables.ExecRunner{NetNSPath: p, Timeout: 10 * time.Minute}, NetNSPath: p})
			if err != nil {
				return nil, fmt.Errorf("iptables backend: %w", err)
			}
			t.closers = append(t.closers, func() { ib.Cleanup(context.Background()) })
			paths = append(paths, "iptables")
		}
	}
	type peerNode struct {
		Peer
		netns, addr string
		port        int
		stop        func()
	}
	var peers []*peerNode
	for i, pr := range cfg.Peers {
		pn := &peerNode{Peer: pr, netns: fmt.Sprintf("ns-b%d%s", 4+i, t.suffix), addr: fmt.Sprintf("10.27.10.%d", 4+i), port: 30082 + i}
		if err := t.addNode(pn.netns, pn.addr, fmt.Sprintf("n%d", 4+i)); err != nil {
			return rep, err
		}
		peers = append(peers, pn)
		paths = append(paths, pr.Name)
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: its own node namespace (%s), NodePort %d", pr.Name, pn.addr, pn.port))
	}
	defer func() {
		for _, pn := range peers {
			if pn.stop != nil {
				pn.stop()
			}
		}
	}()
	targets := map[string]string{}
	for _, pn := range peers {
		targets[pn.Name] = fmt.Sprintf("%s:%d", pn.addr, pn.port)
	}
	for _, n := range cfg.ServiceCounts {
		for _, pn := range peers {
			if pn.stop != nil {
				pn.stop()
			}
			took, stop, err := pn.Start(t.path(pn.netns), pn.addr, pn.port, n, t.backends)
			if err != nil {
				return rep, fmt.Errorf("%s at %d services: %w", pn.Name, n, err)
			}
			pn.stop = stop
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: %d services programmed in %.2f s (from scratch)", pn.Name, n, took.Seconds()))
		}
		type prog struct {
			be   dataplane.Backend
			port uint16
			node string
		}
		progs := []prog{{eb, nsPortEBPF, nsNode1Addr}}
		for _, x := range xdps {
			progs = append(progs, prog{x.b, x.nodePort, x.addr})
		}
		if db != nil {
			progs = append(progs, prog{db, nsPortDSR, nsNodeDAddr})
		}
		if ib != nil {
			progs = append(progs, prog{ib, nsPortIPT, nsNode3Addr})
		}
		for _, b := range progs {
			start := time.Now()
			if err := b.be.Sync(ctx, t.state(n, b.port, b.node)); err != nil {
				return rep, fmt.Errorf("%s sync of %d services: %w", b.be.Name(), n, err)
			}
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: %d services programmed in %.2f s", b.be.Name(), n, time.Since(start).Seconds()))
		}
		rows := map[string]*NSRow{}
		lats := map[string]map[string][]time.Duration{}
		tests := cfg.Tests
		if len(tests) == 0 {
			tests = allTests
		}
		for _, test := range tests {
			rows[test] = &NSRow{Services: n, Test: test, Rate: map[string]*Stat{}, Latency: map[string]*Latency{}}
			lats[test] = map[string][]time.Duration{}
		}
		warm := cfg
		warm.Duration = cfg.Warmup
		for _, test := range tests {
			for _, p := range paths {
				measureLat(ctx, t.path(t.client), test, t.nsTarget(p, test, targets), warm)
			}
		}
		for round := range cfg.Rounds {
			for _, test := range tests {
				for _, p := range paths {
					s := rows[test].Rate[p]
					if s == nil {
						s = &Stat{ErrorKinds: map[string]int{}, KernelCounters: map[string]int64{}}
						rows[test].Rate[p] = s
					}
					// Counters of the client and of the namespaces that
					// terminate the connections (the backends' pod).
					takeErrKinds()
					c0, _ := netCounters(t.path(t.client))
					s0, _ := netCounters(t.path(t.pod))
					rate, errs, l := measureLat(ctx, t.path(t.client), test, t.nsTarget(p, test, targets), cfg)
					c1, _ := netCounters(t.path(t.client))
					s1, _ := netCounters(t.path(t.pod))
					counterDelta(s.KernelCounters, "client", c0, c1)
					counterDelta(s.KernelCounters, "server", s0, s1)
					for k, v := range takeErrKinds() {
						s.ErrorKinds[k] += v
					}
					s.Rounds = append(s.Rounds, rate)
					s.Errors += errs
					s.Ops += int64(rate * cfg.Duration.Seconds())
					lats[test][p] = append(lats[test][p], l...)
					if cfg.Log != nil {
						cfg.Log.Info("measured", "services", n, "test", test, "path", p, "round", round, "rate", int(rate), "errors", errs)
					}
				}
			}
		}
		for _, test := range tests {
			r := rows[test]
			for p, s := range r.Rate {
				s.summarize()
				l := lats[test][p]
				slices.Sort(l)
				if len(l) > 0 {
					r.Latency[p] = &Latency{P50us: float64(l[len(l)/2].Nanoseconds()) / 1000,
						P99us: float64(l[min(len(l)-1, len(l)*99/100)].Nanoseconds()) / 1000}
				}
			}
			for p, s := range r.Rate {
				base := "direct"
				if strings.HasSuffix(p, "6") {
					base = "direct6"
				}
				if d := r.Rate[base]; d != nil && d.Median > 0 {
					s.Ratio = s.Median / d.Median
				}
			}
			rep.Rows = append(rep.Rows, *r)
		}
	}
	for _, x := range xdps {
		// Proof that XDP, not tc behind it, did the work.
		if v, err := ebpf.OpenPinned(x.pin); err == nil {
			if st, err := v.NorthSouthStats(); err == nil {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s counters over the run: xdp_fwd %d packets (of ct_hit %d + reply %d + new flows %d), xdp_partial_csum %d",
					x.path, st["xdp_fwd"], st["ct_hit"], st["reply"], st["xlate_snat"]+st["xlate_local"], st["xdp_partial_csum"]))
			}
			v.Close()
		}
	}
	if db != nil {
		if v, err := ebpf.OpenPinned(dpin); err == nil {
			if st, err := v.NorthSouthStats(); err == nil {
				rep.Notes = append(rep.Notes, fmt.Sprintf("ebpf-dsr counters over the run: xlate_dsr %d flows, dsr_opt %d packets, dsr_mtu %d, xlate_snat %d",
					st["xlate_dsr"], st["dsr_opt"], st["dsr_mtu"], st["xlate_snat"]))
			}
			v.Close()
		}
	}
	rep.print(cfg.Out, paths)
	if cfg.Output != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(cfg.Output, append(b, '\n'), 0o644); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// xdpNode is a node namespace of its own whose eBPF backend runs the
// north-south ingress in XDP of one mode: the path's name, its namespace,
// its port on the bridge, its addresses and NodePort; startXDP sets b and
// pin.
type xdpNode struct {
	path, mode, netns, port string
	addr, addr6             string
	nodePort                uint16
	b                       *ebpf.Backend
	pin                     string
}

// startXDP adds an XDP node and its eBPF backend (XDP in x.mode on its
// eth0; native: an XDP program passing everything on the eth0's peer on the
// bridge), and turns tx checksum offload of the client and the backends
// off.
func (t *nsTopo) startXDP(x *xdpNode) error {
	nx := x.netns
	if err := t.addNode(nx, x.addr, x.port); err != nil {
		return fmt.Errorf("XDP node: %w", err)
	}
	if x.mode == ebpf.AccelNative {
		// The peer must run XDP to take what native XDP transmits.
		if err := inNS(t.wire, func() error {
			ifi, err := net.InterfaceByName(x.port)
			if err != nil {
				return err
			}
			l, err := ebpf.AttachPeerXDP(ifi.Index)
			if err == nil {
				t.closers = append(t.closers, func() { l.Close() })
			}
			return err
		}); err != nil {
			return fmt.Errorf("%s: %w", x.port, err)
		}
	}
	if len(t.backends6) > 0 {
		for _, c := range [][]string{
			{"ip", "addr", "add", x.addr6 + "/64", "dev", "eth0", "nodad"},
			{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
			{"ip", "-6", "route", "add", nsPodNet6, "via", nsNode2Addr6},
		} {
			if err := t.in(nx, c...); err != nil {
				return fmt.Errorf("XDP node: %w", err)
			}
		}
	}
	// The client and the backends send full checksums, as from other
	// machines: XDP leaves offloaded ones (CHECKSUM_PARTIAL) to tc.
	for _, n := range []string{t.client, t.pod} {
		if err := inNS(n, func() error { return ethtool.SetTxChecksum("eth0", false) }); err != nil {
			return fmt.Errorf("%s eth0: tx checksum off: %w", n, err)
		}
	}
	node := "ns-bench-xdp-" + x.mode + "-" + t.suffix
	cg, err := newBenchCgroup(node)
	if err != nil {
		return err
	}
	t.closers = append(t.closers, func() { os.Remove(cg) })
	x.pin = filepath.Join(ebpf.DefaultPinRoot, node)
	x.b, err = ebpf.New(ebpf.Config{NodeName: node, CgroupPath: cg, PinDir: x.pin,
		MaxServices: 1 << 17, MaxBackends: 1 << 17,
		NorthSouth: &ebpf.NorthSouth{Devices: []string{"eth0"}, NetNS: t.path(nx), Acceleration: x.mode}})
	if err != nil {
		return fmt.Errorf("eBPF backend with %s XDP: %w", x.mode, err)
	}
	t.closers = append(t.closers, func() { x.b.Cleanup(context.Background()) })
	return nil
}

// startDSR adds the DSR node and its eBPF backend (tc, --bpf-lb-mode=dsr),
// and node2's north-south programs (DSR mode, no frontends), which read
// the option and give the replies the NodePort's address.
func (t *nsTopo) startDSR() (*ebpf.Backend, string, error) {
	nd := "ns-bd" + t.suffix
	if err := t.addNode(nd, nsNodeDAddr, "nd"); err != nil {
		return nil, "", fmt.Errorf("DSR node: %w", err)
	}
	var pin string
	var db *ebpf.Backend
	for _, n := range []struct{ netns, name string }{{t.node2, "ns-bench-dsr2-"}, {nd, "ns-bench-dsr-"}} {
		cg, err := newBenchCgroup(n.name + t.suffix)
		if err != nil {
			return nil, "", err
		}
		t.closers = append(t.closers, func() { os.Remove(cg) })
		pin = filepath.Join(ebpf.DefaultPinRoot, n.name+t.suffix)
		b, err := ebpf.New(ebpf.Config{NodeName: n.name + t.suffix, CgroupPath: cg, PinDir: pin,
			MaxServices: 1 << 17, MaxBackends: 1 << 17,
			NorthSouth: &ebpf.NorthSouth{Devices: []string{"eth0"}, NetNS: t.path(n.netns), LBMode: ebpf.LBModeDSR}})
		if err != nil {
			return nil, "", fmt.Errorf("eBPF backend in DSR mode (%s): %w", n.netns, err)
		}
		t.closers = append(t.closers, func() { b.Cleanup(context.Background()) })
		db = b
	}
	return db, pin, nil
}

func newBenchCgroup(name string) (string, error) {
	root, err := cgroup2Root()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, name)
	return p, os.Mkdir(p, 0o755)
}

// state is the measured NodePort on node1 (all backends on node2) plus
// n-1 ExternalIP frontends of 10.28/16 with the same backends.
func (t *nsTopo) state(n int, port uint16, node string) *dataplane.State {
	var eps []dataplane.Endpoint
	for _, a := range t.backends {
		eps = append(eps, dataplane.Endpoint{Addr: a, Port: bePort})
	}
	var fs []dataplane.Frontend
	for _, proto := range []dataplane.Protocol{dataplane.TCP, dataplane.UDP} {
		fs = append(fs, dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: netip.MustParseAddr(node), Port: port, Protocol: proto},
			Kind: dataplane.NodePort, Service: dataplane.ServicePortName{Namespace: "bench", Name: "nodeport"}, Endpoints: eps})
	}
	node6 := map[string]string{nsNode1Addr: nsNode1Addr6, nsNodeXAddr: nsNodeXAddr6, nsNodeNAddr: nsNodeNAddr6}[node]
	if node6 != "" && len(t.backends6) > 0 {
		var eps6 []dataplane.Endpoint
		for _, a := range t.backends6 {
			eps6 = append(eps6, dataplane.Endpoint{Addr: a, Port: bePort})
		}
		for _, proto := range []dataplane.Protocol{dataplane.TCP, dataplane.UDP} {
			fs = append(fs, dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: netip.MustParseAddr(node6), Port: port, Protocol: proto},
				Kind: dataplane.NodePort, Service: dataplane.ServicePortName{Namespace: "bench", Name: "nodeport"}, Endpoints: eps6})
		}
	}
	for i := 1; i < n; i++ {
		a := netip.AddrFrom4([4]byte{10, 28, byte(i >> 8), byte(i)})
		fs = append(fs, dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: a, Port: 80, Protocol: dataplane.TCP},
			Kind: dataplane.ExternalIP, Service: dataplane.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("ext-%d", i)}, Endpoints: eps})
	}
	slices.SortFunc(fs, func(a, b dataplane.Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
	return &dataplane.State{Frontends: fs}
}

func (t *nsTopo) nsTarget(path, test string, peers map[string]string) func(i int) string {
	if a, ok := peers[path]; ok {
		return func(int) string { return a }
	}
	switch path {
	case "ebpf-tc":
		return func(int) string { return fmt.Sprintf("%s:%d", nsNode1Addr, nsPortEBPF) }
	case "iptables":
		return func(int) string { return fmt.Sprintf("%s:%d", nsNode3Addr, nsPortIPT) }
	case "ebpf-xdp":
		return func(int) string { return fmt.Sprintf("%s:%d", nsNodeXAddr, nsPortXDP) }
	case "ebpf-dsr":
		return func(int) string { return fmt.Sprintf("%s:%d", nsNodeDAddr, nsPortDSR) }
	case "ebpf-xdp6":
		return func(int) string { return fmt.Sprintf("[%s]:%d", nsNodeXAddr6, nsPortXDP) }
	case "ebpf-xdp-native":
		return func(int) string { return fmt.Sprintf("%s:%d", nsNodeNAddr, nsPortXDPN) }
	case "ebpf-xdp-native6":
		return func(int) string { return fmt.Sprintf("[%s]:%d", nsNodeNAddr6, nsPortXDPN) }
	case "ebpf-tc6":
		return func(int) string { return fmt.Sprintf("[%s]:%d", nsNode1Addr6, nsPortEBPF) }
	case "direct6":
		return func(i int) string { return netip.AddrPortFrom(t.backends6[i%len(t.backends6)], bePort).String() }
	}
	return func(i int) string { return netip.AddrPortFrom(t.backends[i%len(t.backends)], bePort).String() }
}

// measureLat is measure with per-operation latencies.
func measureLat(ctx context.Context, nsPath, test string, target func(int) string, cfg NorthSouthConfig) (float64, int, []time.Duration) {
	var mu sync.Mutex
	var all []time.Duration
	ops, errs := 0, 0
	start := time.Now()
	warmEnd := start.Add(cfg.Warmup)
	end := warmEnd.Add(cfg.Duration)
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			myOps, myErrs := 0, 0
			defer func() {
				mu.Lock()
				all = append(all, mine...)
				ops += myOps
				errs += myErrs
				mu.Unlock()
			}()
			if err := enterNS(nsPath); err != nil {
				myErrs++
				return
			}
			last := time.Now()
			count := func(err error) bool {
				now := time.Now()
				if now.After(warmEnd) {
					if err != nil {
						myErrs++
						noteErr(err)
					} else {
						myOps++
						mine = append(mine, now.Sub(last))
					}
				}
				last = now
				return now.Before(end) && ctx.Err() == nil
			}
			switch test {
			case "TCP_CRR":
				for count(crr(target(i))) {
				}
			case "TCP_RR":
				rrLoop(target(i), "tcp", count)
			case "UDP_RR":
				rrLoop(target(i), "udp", count)
			}
		}()
	}
	wg.Wait()
	return float64(ops) / cfg.Duration.Seconds(), errs, all
}

func (r *NorthSouthReport) print(w io.Writer, paths []string) {
	fmt.Fprintf(w, "North-south: external client -> NodePort on a node -> backends on node2 (%d clients, %d backends, %s x %d rounds, kernel %s)\n",
		r.Clients, r.Backends, r.Duration, r.Rounds, r.Kernel)
	fmt.Fprintf(w, "%9s %-8s", "services", "test")
	for _, p := range paths {
		fmt.Fprintf(w, " | %-34s", p+" /s (ratio) p50/p99 µs")
	}
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		fmt.Fprintf(w, "%9d %-8s", row.Services, row.Test)
		for _, p := range paths {
			s, l := row.Rate[p], row.Latency[p]
			if s == nil || l == nil {
				fmt.Fprintf(w, " | %-34s", "-")
				continue
			}
			cell := fmt.Sprintf("%s (%.2fx) %.0f/%.0f", human(s.Median), s.Ratio, l.P50us, l.P99us)
			if s.Errors > 0 {
				cell += fmt.Sprintf(" err %d", s.Errors)
			}
			fmt.Fprintf(w, " | %-34s", cell)
		}
		fmt.Fprintln(w)
	}
	for _, row := range r.Rows {
		for _, p := range paths {
			if s := row.Rate[p]; s != nil {
				printStatErrors(w, fmt.Sprintf("%s services %s %s", human(float64(row.Services)), row.Test, p), s)
			}
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "  - "+strings.TrimSpace(n))
	}
}
