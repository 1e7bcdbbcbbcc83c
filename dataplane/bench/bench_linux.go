package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/iptables"
	"github.com/waggle-io/waggle/internal/cgroupfs"
)

// pathDirectIPT is the direct path measured from the iptables client
// namespace: the cost of the iptables rules alone.
const pathDirectIPT = "direct-iptables-node"

const (
	clientAddr  = "10.250.0.1"
	serverAddr  = "10.250.0.2"
	client2Addr = "10.250.1.1"
	server2Addr = "10.250.1.2"
	svcPort     = 80
	udpPort     = 53
	bePort      = 8080
)

// topo is the benchmark's namespaces, cgroup and servers.
type topo struct {
	cfg        Config
	suffix     string
	client     string // netns names
	client2    string // the iptables node's client namespace
	server     string
	clientPath string
	cgroup     string
	origCgroup string
	backends   []netip.Addr
	closers    []func()
}

func (t *topo) run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (t *topo) in(netns string, args ...string) error {
	return t.run("ip", append([]string{"netns", "exec", netns}, args...)...)
}

func randSuffix() string {
	var b [4]byte
	f, _ := os.Open("/dev/urandom")
	f.Read(b[:])
	f.Close()
	return fmt.Sprintf("%x", b)
}

func newTopo(cfg Config) (*topo, error) {
	t := &topo{cfg: cfg, suffix: randSuffix()}
	t.client, t.client2, t.server = "wgbc"+t.suffix, "wgbi"+t.suffix, "wgbs"+t.suffix
	t.clientPath = "/run/netns/" + t.client
	steps := [][]string{
		{"ip", "netns", "add", t.client},
		{"ip", "netns", "add", t.client2},
		{"ip", "netns", "add", t.server},
		{"ip", "link", "add", "wgbc" + t.suffix, "type", "veth", "peer", "name", "wgbs" + t.suffix},
		{"ip", "link", "set", "wgbc" + t.suffix, "netns", t.client},
		{"ip", "link", "set", "wgbs" + t.suffix, "netns", t.server},
		{"ip", "link", "add", "wgbi" + t.suffix, "type", "veth", "peer", "name", "wgbt" + t.suffix},
		{"ip", "link", "set", "wgbi" + t.suffix, "netns", t.client2},
		{"ip", "link", "set", "wgbt" + t.suffix, "netns", t.server},
	}
	t.closers = append(t.closers, func() {
		t.run("ip", "netns", "del", t.client)
		t.run("ip", "netns", "del", t.client2)
		t.run("ip", "netns", "del", t.server)
	})
	for _, s := range steps {
		if err := t.run(s[0], s[1:]...); err != nil {
			return t, err
		}
	}
	inC := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "set", "wgbc" + t.suffix, "name", "eth0"},
		{"ip", "addr", "add", clientAddr + "/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", serverAddr},
	}
	inC2 := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "set", "wgbi" + t.suffix, "name", "eth0"},
		{"ip", "addr", "add", client2Addr + "/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", server2Addr},
	}
	inS := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "set", "wgbs" + t.suffix, "name", "eth0"},
		{"ip", "addr", "add", serverAddr + "/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "link", "set", "wgbt" + t.suffix, "name", "eth1"},
		{"ip", "addr", "add", server2Addr + "/24", "dev", "eth1"},
		{"ip", "link", "set", "eth1", "up"},
	}
	for i := range cfg.Backends {
		a := netip.AddrFrom4([4]byte{10, 251, 0, byte(i + 1)})
		t.backends = append(t.backends, a)
		inS = append(inS, []string{"ip", "addr", "add", a.String() + "/32", "dev", "lo"})
	}
	for _, s := range inC {
		if err := t.in(t.client, s...); err != nil {
			return t, err
		}
	}
	for _, s := range inC2 {
		if err := t.in(t.client2, s...); err != nil {
			return t, err
		}
	}
	for _, s := range inS {
		if err := t.in(t.server, s...); err != nil {
			return t, err
		}
	}
	return t, t.enterCgroup()
}

// enterCgroup makes a fresh cgroup and moves this process into it: the
// client sockets of every path are created there.
func (t *topo) enterCgroup() error {
	root, err := cgroup2Root()
	if err != nil {
		return err
	}
	t.cgroup = filepath.Join(root, "waggle-bench-"+t.suffix)
	if err := os.Mkdir(t.cgroup, 0o755); err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	t.origCgroup = root
	if self, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, l := range strings.Split(string(self), "\n") {
			if rest, ok := strings.CutPrefix(l, "0::"); ok {
				t.origCgroup = filepath.Join(root, rest)
			}
		}
	}
	pid := []byte(fmt.Sprint(os.Getpid()))
	if err := os.WriteFile(filepath.Join(t.cgroup, "cgroup.procs"), pid, 0o644); err != nil {
		os.Remove(t.cgroup)
		return fmt.Errorf("enter cgroup: %w", err)
	}
	t.closers = append(t.closers, func() {
		os.WriteFile(filepath.Join(t.origCgroup, "cgroup.procs"), pid, 0o644)
		os.Remove(t.cgroup)
	})
	return nil
}

func (t *topo) close() {
	for i := len(t.closers) - 1; i >= 0; i-- {
		t.closers[i]()
	}
}

func cgroup2Root() (string, error) { return cgroupfs.V2Root() }

// inNS runs fn on a thread in the named namespace.
func inNS(name string, fn func() error) error {
	return ns.WithNetNSPath("/run/netns/"+name, func(ns.NetNS) error { return fn() })
}

// enterNS moves the calling goroutine's thread into the namespace for
// good: the goroutine must exit afterwards (the runtime then drops the
// thread).
func enterNS(path string) error {
	runtime.LockOSThread()
	h, err := ns.GetNS(path)
	if err != nil {
		return err
	}
	defer h.Close()
	return h.Set()
}

// serve starts the echo servers: TCP and UDP on every backend address.
func (t *topo) serve() error {
	for _, a := range t.backends {
		addr := netip.AddrPortFrom(a, bePort).String()
		var ln net.Listener
		var pc net.PacketConn
		err := inNS(t.server, func() (err error) {
			if ln, err = net.Listen("tcp", addr); err != nil {
				return err
			}
			pc, err = net.ListenPacket("udp", addr)
			return err
		})
		if err != nil {
			return fmt.Errorf("echo server on %s: %w", addr, err)
		}
		t.closers = append(t.closers, func() { ln.Close(); pc.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					buf := make([]byte, 64)
					for {
						n, err := c.Read(buf)
						if err != nil {
							return
						}
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
				}()
			}
		}()
		for range 2 {
			go func() {
				buf := make([]byte, 64)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					pc.WriteTo(buf[:n], from)
				}
			}()
		}
	}
	return nil
}

// services builds n services in the /16 of base: TCP port 80 on every one,
// and UDP 53 on the last. The last (measured) one has every backend; the
// others one each (backend i mod N), as the reference figures in
// BENCHMARKING.md, which keeps iptables-restore of 10,000 services within
// minutes.
func (t *topo) services(base [2]byte, n int) (*dataplane.State, netip.Addr) {
	st := &dataplane.State{NodeName: "bench"}
	var last netip.Addr
	for i := range n {
		vip := netip.AddrFrom4([4]byte{base[0], base[1], byte(i >> 8), byte(i)})
		last = vip
		for _, proto := range []dataplane.Protocol{dataplane.TCP, dataplane.UDP} {
			port := uint16(svcPort)
			if proto == dataplane.UDP {
				if i != n-1 {
					continue
				}
				port = udpPort
			}
			f := dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: vip, Port: port, Protocol: proto},
				Kind: dataplane.ClusterIP, Service: dataplane.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}}
			for j, b := range t.backends {
				if i == n-1 || j == i%len(t.backends) {
					f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: b, Port: bePort})
				}
			}
			st.Frontends = append(st.Frontends, f)
		}
	}
	slices.SortFunc(st.Frontends, func(a, b dataplane.Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
	return st, last
}

// Run runs the benchmark and returns (and prints, and writes) its report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	if os.Geteuid() != 0 {
		return nil, errors.New("waggle bench dataplane needs root (network namespaces, cgroups, BPF)")
	}
	rep := &Report{Started: time.Now().UTC(), CPUs: runtime.NumCPU(), Clients: cfg.Clients, Backends: cfg.Backends,
		Payload: 1, Duration: cfg.Duration.String(), Rounds: cfg.Rounds, Skipped: map[string]string{}}
	var un unix.Utsname
	if unix.Uname(&un) == nil {
		rep.Kernel = unix.ByteSliceToString(un.Release[:])
	}
	rep.Notes = []string{
		"TCP_CRR: the client closes with SO_LINGER 0 (RST), so no TIME_WAIT piles up",
		"every client (all paths) runs in the same fresh cgroup, where the eBPF programs are attached (a direct connect also runs the connect hook, a map miss)",
		"direct and ebpf run from one client namespace without NAT rules (a node in eBPF mode); iptables runs from a second client namespace holding the iptables rules (a node in iptables mode), whose own direct figure is " + pathDirectIPT + "; both reach the same server namespace over their own veth",
		"the measured service is the last one of the table; TCP services on port 80, one UDP frontend (the measured service, port 53)",
		"direct: client i connects to backend i mod N; ClusterIP paths: every client connects to the VIP",
	}
	t, err := newTopo(cfg)
	defer t.close()
	if err != nil {
		return nil, fmt.Errorf("set up namespaces: %w", err)
	}
	if err := t.serve(); err != nil {
		return nil, err
	}
	paths := []string{"direct"}
	var eb *ebpf.Backend
	var ib *iptables.Backend
	for _, p := range cfg.Paths {
		switch p {
		case "ebpf":
			if err := ebpf.Supported(); err != nil {
				rep.Skipped[p] = err.Error()
				continue
			}
			pin := filepath.Join(ebpf.DefaultPinRoot, "bench-"+t.suffix)
			eb, err = ebpf.New(ebpf.Config{NodeName: "bench-" + t.suffix, CgroupPath: t.cgroup, PinDir: pin,
				MaxServices: 1 << 17, MaxBackends: 1 << 17, Log: cfg.Log})
			if err != nil {
				return nil, fmt.Errorf("eBPF backend: %w", err)
			}
			t.closers = append(t.closers, func() { eb.Cleanup(context.Background()) })
			paths = append(paths, p)
		case "iptables":
			if err := iptables.Supported(); err != nil {
				rep.Skipped[p] = err.Error()
				continue
			}
			c2 := "/run/netns/" + t.client2
			ib, err = iptables.New(iptables.Config{Runner: &iptables.ExecRunner{NetNSPath: c2, Timeout: 10 * time.Minute},
				NetNSPath: c2, Log: cfg.Log})
			if err != nil {
				rep.Skipped[p] = err.Error()
				continue
			}
			t.closers = append(t.closers, func() { ib.Cleanup(context.Background()) })
			paths = append(paths, p, pathDirectIPT)
		default:
			return nil, fmt.Errorf("unknown path %q (ebpf, iptables)", p)
		}
	}
	for _, n := range cfg.ServiceCounts {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		vips := map[string]netip.Addr{}
		active := slices.Clone(paths)
		if eb != nil {
			st, vip := t.services([2]byte{10, 96}, n)
			start := time.Now()
			if err := eb.Sync(ctx, st); err != nil {
				return rep, fmt.Errorf("eBPF sync of %d services: %w", n, err)
			}
			cfg.Log.Info("programmed eBPF", "services", n, "took", time.Since(start))
			vips["ebpf"] = vip
		}
		if ib != nil {
			st, vip := t.services([2]byte{10, 97}, n)
			start := time.Now()
			if err := ib.Sync(ctx, st); err != nil {
				// Not fatal: the other paths are still measured.
				cfg.Log.Error("iptables sync failed", "services", n, "err", err)
				rep.Notes = append(rep.Notes, fmt.Sprintf("iptables at %d services: not measured, programming failed: %v", n, err))
				active = slices.DeleteFunc(active, func(p string) bool { return p == "iptables" || p == pathDirectIPT })
			} else {
				d := time.Since(start)
				cfg.Log.Info("programmed iptables", "services", n, "took", d)
				rep.Notes = append(rep.Notes, fmt.Sprintf("iptables-restore of %d services (incremental on the previous count) took %.2f s", n, d.Seconds()))
				vips["iptables"] = vip
			}
		}
		rows := map[string]*Row{}
		for _, test := range cfg.Tests {
			rows[test] = &Row{Services: n, Test: test, Paths: map[string]*Stat{}}
		}
		// One unrecorded pass over every test and path first: the first
		// measurements of a run (threads, caches, neighbours) run slow.
		warm := cfg
		warm.Duration = cfg.Warmup
		for _, test := range cfg.Tests {
			for _, p := range active {
				measure(ctx, t.nsFor(p), test, t.target(p, vips[p], test), warm)
			}
		}
		for round := range cfg.Rounds {
			for _, test := range cfg.Tests {
				for _, p := range active {
					target := t.target(p, vips[p], test)
					s := rows[test].Paths[p]
					if s == nil {
						s = &Stat{ErrorKinds: map[string]int{}, KernelCounters: map[string]int64{}}
						rows[test].Paths[p] = s
					}
					takeErrKinds()
					c0, _ := netCounters(t.nsFor(p))
					s0, _ := netCounters("/run/netns/" + t.server)
					rate, errs := measure(ctx, t.nsFor(p), test, target, cfg)
					c1, _ := netCounters(t.nsFor(p))
					s1, _ := netCounters("/run/netns/" + t.server)
					counterDelta(s.KernelCounters, "client", c0, c1)
					counterDelta(s.KernelCounters, "server", s0, s1)
					kinds := takeErrKinds()
					for k, v := range kinds {
						s.ErrorKinds[k] += v
					}
					s.Rounds = append(s.Rounds, rate)
					s.Errors += errs
					s.Ops += int64(rate * cfg.Duration.Seconds())
					cfg.Log.Info("measured", "services", n, "test", test, "path", p, "round", round, "rate", int(rate), "errors", errs, "kinds", kinds)
				}
			}
		}
		for _, test := range cfg.Tests {
			r := rows[test]
			for _, s := range r.Paths {
				s.summarize()
			}
			for _, s := range r.Paths {
				if d := r.Paths["direct"]; d != nil && d.Median > 0 {
					s.Ratio = s.Median / d.Median
				}
			}
			rep.Rows = append(rep.Rows, *r)
		}
	}
	if eb != nil && cfg.ProgramServices > 0 {
		if err := programBench(ctx, cfg, t, rep); err != nil {
			return rep, err
		}
	}
	rep.print(cfg, paths)
	if cfg.Output != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(cfg.Output, append(b, '\n'), 0o644); err != nil {
			return rep, fmt.Errorf("write %s: %w", cfg.Output, err)
		}
	}
	return rep, nil
}

// nsFor returns the client namespace of a path.
func (t *topo) nsFor(path string) string {
	if path == "iptables" || path == pathDirectIPT {
		return "/run/netns/" + t.client2
	}
	return t.clientPath
}

// target returns, for client i, the address to reach.
func (t *topo) target(path string, vip netip.Addr, test string) func(i int) string {
	port := uint16(svcPort)
	if test == "UDP_RR" {
		port = udpPort
	}
	if path == "direct" || path == pathDirectIPT {
		return func(i int) string { return netip.AddrPortFrom(t.backends[i%len(t.backends)], bePort).String() }
	}
	return func(int) string { return netip.AddrPortFrom(vip, port).String() }
}

// measure runs one test from cfg.Clients clients in the client namespace
// and returns operations per second after the warm-up, and errors.
func measure(ctx context.Context, nsPath, test string, target func(int) string, cfg Config) (float64, int) {
	var ops, errs atomic.Int64
	start := time.Now()
	warmEnd := start.Add(cfg.Warmup)
	end := warmEnd.Add(cfg.Duration)
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := enterNS(nsPath); err != nil {
				errs.Add(1)
				return
			}
			count := func(err error) bool {
				now := time.Now()
				if now.After(warmEnd) {
					if err != nil {
						errs.Add(1)
						noteErr(err)
					} else {
						ops.Add(1)
					}
				}
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
	return float64(ops.Load()) / cfg.Duration.Seconds(), int(errs.Load())
}

var dialer = net.Dialer{Timeout: time.Second}

func crr(addr string) error {
	c, err := dialer.Dial("tcp", addr)
	if err != nil {
		return &opError{"connect", err}
	}
	defer c.Close()
	c.(*net.TCPConn).SetLinger(0)
	c.SetDeadline(time.Now().Add(time.Second))
	b := []byte{'x'}
	if _, err := c.Write(b); err != nil {
		return &opError{"write", err}
	}
	if _, err = c.Read(b); err != nil {
		return &opError{"read", err}
	}
	return nil
}

func rrLoop(addr, network string, count func(error) bool) {
	for {
		c, err := dialer.Dial(network, addr)
		if err != nil {
			if !count(err) {
				return
			}
			continue
		}
		b := []byte{'x'}
		for {
			c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			_, err := c.Write(b)
			if err == nil {
				_, err = c.Read(b)
			}
			if !count(err) {
				c.Close()
				return
			}
			if err != nil && network == "tcp" {
				break // reconnect
			}
		}
		c.Close()
	}
}

func (s *Stat) summarize() {
	r := slices.Clone(s.Rounds)
	slices.Sort(r)
	if len(r) == 0 {
		return
	}
	s.Min, s.Max = r[0], r[len(r)-1]
	if len(r)%2 == 1 {
		s.Median = r[len(r)/2]
	} else {
		s.Median = (r[len(r)/2-1] + r[len(r)/2]) / 2
	}
}

// processCPU is the CPU time (user + system) this process used so far:
// robust to other load on the machine, unlike wall time. The echo
// servers are idle while it is read around programming.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// programBench times programming cfg.ProgramServices × ProgramBackends
// from scratch into a fresh set of maps, then endpoint changes at that
// scale.
func programBench(ctx context.Context, cfg Config, t *topo, rep *Report) error {
	n, m := cfg.ProgramServices, cfg.ProgramBackends
	rep.ProgramSize = fmt.Sprintf("%d services × %d backends (all distinct), one TCP port each", n, m)
	st := &dataplane.State{NodeName: "bench"}
	for i := range n {
		vip := netip.AddrFrom4([4]byte{10, 98 + byte(i>>16), byte(i >> 8), byte(i)})
		f := dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: vip, Port: 80, Protocol: dataplane.TCP},
			Kind: dataplane.ClusterIP, Service: dataplane.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("p-%d", i)}}
		for j := range m {
			k := i*m + j
			f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 200 + byte(k>>16), byte(k >> 8), byte(k)}), Port: 8080})
		}
		st.Frontends = append(st.Frontends, f)
	}
	slices.SortFunc(st.Frontends, func(a, b dataplane.Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
	cg := filepath.Join(filepath.Dir(t.cgroup), "waggle-bench-prog-"+t.suffix)
	if err := os.Mkdir(cg, 0o755); err != nil {
		return err
	}
	defer os.Remove(cg)
	size := 1 << 17
	for size < n*(m+1) || size < n*m {
		size <<= 1
	}
	bcfg := ebpf.Config{NodeName: "bench-prog-" + t.suffix, CgroupPath: cg,
		PinDir: filepath.Join(ebpf.DefaultPinRoot, "bench-prog-"+t.suffix), MaxServices: size, MaxBackends: size, Log: cfg.Log}
	prog, progCPU := &Stat{}, &Stat{}
	var b *ebpf.Backend
	for round := range cfg.ProgramRounds {
		var err error
		if b, err = ebpf.New(bcfg); err != nil {
			return err
		}
		start, cpu0 := time.Now(), processCPU()
		err = b.Sync(ctx, st)
		d, cpu := time.Since(start), processCPU()-cpu0
		if err != nil {
			b.Cleanup(ctx)
			return fmt.Errorf("program %s: %w", rep.ProgramSize, err)
		}
		prog.Rounds = append(prog.Rounds, d.Seconds())
		progCPU.Rounds = append(progCPU.Rounds, cpu.Seconds())
		cfg.Log.Info("programmed from scratch", "size", rep.ProgramSize, "round", round, "took", d)
		if round < cfg.ProgramRounds-1 {
			if err := b.Cleanup(ctx); err != nil {
				return err
			}
		}
	}
	defer b.Cleanup(ctx)
	prog.summarize()
	progCPU.summarize()
	rep.Program, rep.ProgramCPU = prog, progCPU
	// Endpoint changes at scale: one service loses a backend and gains a
	// new one; the time is the Sync of the whole state (what the proxy
	// runs per change), until the kernel maps hold the change.
	var lat []float64
	cpu0 := processCPU()
	for i := range cfg.LatencySamples {
		f := &st.Frontends[(i*7919)%len(st.Frontends)]
		k := n*m + i
		f.Endpoints = append(f.Endpoints[1:], dataplane.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 199 - byte(k>>16), byte(k >> 8), byte(k)}), Port: 8080})
		start := time.Now()
		if err := b.Sync(ctx, st); err != nil {
			return fmt.Errorf("endpoint change: %w", err)
		}
		lat = append(lat, float64(time.Since(start).Microseconds())/1000)
	}
	rep.ChangeCPUms = float64((processCPU() - cpu0).Microseconds()) / 1000 / float64(len(lat))
	slices.Sort(lat)
	rep.ChangeP50 = lat[len(lat)/2]
	rep.ChangeP99 = lat[min(len(lat)-1, len(lat)*99/100)]
	rep.ChangeMax = lat[len(lat)-1]
	return nil
}
