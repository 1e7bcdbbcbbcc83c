package ebpf

import (
	"context"
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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
	wtestutil "github.com/waggle-io/waggle/internal/testutil"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// frontend builds a ClusterIP frontend with backends at the given addresses.
func frontend(vip string, proto dataplane.Protocol, backends ...string) dataplane.Frontend {
	a := ap(vip)
	f := dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: a.Addr(), Port: a.Port(), Protocol: proto},
		Kind: dataplane.ClusterIP, Service: dataplane.ServicePortName{Namespace: "default", Name: "svc-" + a.Addr().String()}}
	for _, b := range backends {
		x := ap(b)
		f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: x.Addr(), Port: x.Port()})
	}
	return f
}

func state(fs ...dataplane.Frontend) *dataplane.State {
	st := &dataplane.State{NodeName: "node", Frontends: fs}
	sortFrontends(st)
	return st
}

// backends starts n TCP and UDP servers on 10.1.0.1..n:port (or the IPv6
// fd00:1::1..n) and returns their addresses.
func (e *env) backends(n int, port uint16, v6 bool) []string {
	var out []string
	for i := 1; i <= n; i++ {
		a := netip.AddrFrom4([4]byte{10, 1, 0, byte(i)})
		if v6 {
			a = netip.MustParseAddr(fmt.Sprintf("fd00:1::%x", i))
		}
		e.addAddrs(a)
		x := netip.AddrPortFrom(a, port)
		e.serveTCP(x)
		e.serveUDP(x)
		out = append(out, x.String())
	}
	return out
}

// chiSquareFair fails t unless counts look like a uniform spread over
// backends: Pearson's chi-square below the critical value for p = 0.001.
func chiSquareFair(t *testing.T, what string, counts map[string]int, backends []string, n int) {
	t.Helper()
	// Critical values of chi-square at p = 0.001 by degrees of freedom.
	critical := map[int]float64{1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 7: 24.32, 19: 43.82}
	exp := float64(n) / float64(len(backends))
	chi := 0.0
	for _, b := range backends {
		d := float64(counts[b]) - exp
		chi += d * d / exp
	}
	for k := range counts {
		if !contains(backends, k) {
			t.Fatalf("%s: reached %q, which is not a backend (%v)", what, k, counts)
		}
	}
	if chi > critical[len(backends)-1] {
		t.Fatalf("%s: spread %v is not fair: chi-square %.2f > %.2f", what, counts, chi, critical[len(backends)-1])
	}
	t.Logf("%s: %v chi-square %.2f", what, counts, chi)
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// Four backends are held in the master entry itself, twenty in slot
// entries (more than inlineBackends).
func TestTCPAndUDPThroughVIPReachEveryBackendFairly(t *testing.T) {
	for _, nb := range []int{4, inlineBackends + 4} {
		t.Run(fmt.Sprintf("%d backends", nb), func(t *testing.T) { reachEveryBackendFairly(t, nb) })
	}
}

func reachEveryBackendFairly(t *testing.T, nb int) {
	e := newEnv(t)
	bes := e.backends(nb, 8080, false)
	e.sync(state(frontend("10.96.0.10:80", dataplane.TCP, bes...), frontend("10.96.0.10:53", dataplane.UDP, bes...)))
	n := 100 * nb
	cases := []struct {
		name string
		who  func() (string, error)
	}{
		{"TCP connect", func() (string, error) { return e.whoTCP(ap("10.96.0.10:80")) }},
		{"connected UDP", func() (string, error) { w, _, err := e.whoUDP(ap("10.96.0.10:53"), true); return w, err }},
		{"unconnected UDP", func() (string, error) { w, _, err := e.whoUDP(ap("10.96.0.10:53"), false); return w, err }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			counts := map[string]int{}
			for range n {
				who, err := c.who()
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				counts[who]++
			}
			chiSquareFair(t, c.name, counts, bes, n)
		})
	}
}

func TestUnconnectedUDPSocketKeepsItsBackend(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(4, 8080, false)
	e.sync(state(frontend("10.96.0.10:53", dataplane.UDP, bes...)))
	var c *net.UDPConn
	if err := e.in(func() (err error) { c, err = net.ListenUDP("udp", nil); return }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seen := map[string]bool{}
	buf := make([]byte, 100)
	for range 20 {
		if _, err := c.WriteToUDPAddrPort([]byte("x"), ap("10.96.0.10:53")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		seen[string(buf[:n])] = true
	}
	if len(seen) != 1 {
		t.Fatalf("one unconnected socket reached %d backends (%v), want 1", len(seen), seen)
	}
}

func TestUDPRepliesComeFromTheVIP(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(2, 8080, false)
	e.sync(state(frontend("10.96.0.10:53", dataplane.UDP, bes...)))
	for _, connected := range []bool{true, false} {
		who, from, err := e.whoUDP(ap("10.96.0.10:53"), connected)
		if err != nil {
			t.Fatal(err)
		}
		if from != ap("10.96.0.10:53") {
			t.Errorf("connected=%v: reply from %s (backend %s), want the VIP 10.96.0.10:53", connected, from, who)
		}
	}
}

func TestGetpeernameReturnsTheVIP(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(2, 8080, false)
	e.sync(state(frontend("10.96.0.10:80", dataplane.TCP, bes...), frontend("10.96.0.10:53", dataplane.UDP, bes...)))
	for _, network := range []string{"tcp", "udp"} {
		vip := ap("10.96.0.10:80")
		if network == "udp" {
			vip = ap("10.96.0.10:53")
		}
		var c net.Conn
		if err := e.in(func() (err error) { c, err = net.Dial(network, vip.String()); return }); err != nil {
			t.Fatal(err)
		}
		raw, _ := c.(syscall.Conn).SyscallConn()
		var sa syscall.Sockaddr
		var gerr error
		raw.Control(func(fd uintptr) { sa, gerr = syscall.Getpeername(int(fd)) })
		c.Close()
		if gerr != nil {
			t.Fatal(gerr)
		}
		sa4, ok := sa.(*syscall.SockaddrInet4)
		if !ok {
			t.Fatalf("%s: getpeername gave %T", network, sa)
		}
		if got := netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), uint16(sa4.Port)); got != vip {
			t.Errorf("%s: getpeername = %s, want the VIP %s", network, got, vip)
		}
	}
}

func TestAffinitySticksAndExpires(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(4, 8080, false)
	f := frontend("10.96.0.10:80", dataplane.TCP, bes...)
	f.AffinityTimeout = time.Second
	e.sync(state(f))
	first, err := e.whoTCP(ap("10.96.0.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		who, err := e.whoTCP(ap("10.96.0.10:80"))
		if err != nil {
			t.Fatal(err)
		}
		if who != first {
			t.Fatalf("connect %d under affinity reached %s, want %s", i, who, first)
		}
	}
	aff, err := e.b.View().Affinity()
	if err != nil || len(aff) != 1 {
		t.Fatalf("affinity entries %v, %v; want one", aff, err)
	}
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	ex, err := e.b.View().Explain(f.FrontendKey, aff[0].NetnsCookie, time.Duration(ts.Nano()))
	if err != nil || ex.Verdict != "affinity" || len(ex.Candidates) != 1 || ex.Candidates[0].Backend.String() != first {
		t.Errorf("explain under affinity: %+v, %v; want affinity to %s", ex, err, first)
	}
	// After the timeout a new choice is made: with 4 backends a different
	// one shows up within a few expiries (false failure chance 4^-10).
	for range 10 {
		time.Sleep(1100 * time.Millisecond) // the affinity timeout is 1 s of kernel time: waiting it out is the test
		who, err := e.whoTCP(ap("10.96.0.10:80"))
		if err != nil {
			t.Fatal(err)
		}
		if who != first {
			return
		}
	}
	t.Fatalf("affinity to %s never expired", first)
}

func TestRemovedBackendGetsNoNewConnectsAndItsUDPSocketsAreDestroyed(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "IPv4", true: "IPv6"}[v6], func(t *testing.T) {
			e := newEnv(t)
			bes := e.backends(4, 8080, v6)
			vip := "10.96.0.10"
			if v6 {
				vip = "[fd00:96::10]"
			}
			tcpVIP, udpVIP := vip+":80", vip+":53"
			e.sync(state(frontend(tcpVIP, dataplane.TCP, bes...), frontend(udpVIP, dataplane.UDP, bes...)))
			h := e.startHelper()
			lines := h.do(t, "dial "+udpVIP+" 40")
			onRemoved := map[string]bool{}
			for _, l := range lines {
				var i int
				var who string
				if _, err := fmt.Sscanf(l, "ok %d %s", &i, &who); err != nil {
					t.Fatalf("helper: %q", l)
				}
				if who == bes[0] {
					onRemoved[fmt.Sprint(i)] = true
				}
			}
			if len(onRemoved) == 0 {
				t.Fatalf("no UDP socket of 40 reached %s: %v", bes[0], lines)
			}
			e.sync(state(frontend(tcpVIP, dataplane.TCP, bes[1:]...), frontend(udpVIP, dataplane.UDP, bes[1:]...)))
			for i := range 200 {
				who, err := e.whoTCP(ap(tcpVIP))
				if err != nil {
					t.Fatal(err)
				}
				if who == bes[0] {
					t.Fatalf("connect %d after removal reached the removed backend %s", i, who)
				}
			}
			for _, l := range h.do(t, "poll") {
				f := strings.Fields(l)
				switch {
				case onRemoved[f[1]] && f[0] != "err":
					t.Errorf("socket %s of the removed backend still works: %q", f[1], l)
				case onRemoved[f[1]] && f[2] != fmt.Sprintf("errno=%d", int(syscall.ECONNABORTED)):
					t.Errorf("socket %s of the removed backend: %q, want ECONNABORTED", f[1], l)
				case !onRemoved[f[1]] && f[0] != "ok":
					t.Errorf("socket %s of a kept backend broke: %q", f[1], l)
				}
			}
		})
	}
}

func TestServiceWithoutBackendsRefuses(t *testing.T) {
	e := newEnv(t)
	e.sync(state(frontend("10.96.0.10:80", dataplane.TCP), frontend("10.96.0.10:53", dataplane.UDP)))
	_, err := e.whoTCP(ap("10.96.0.10:80"))
	if errno(err) != syscall.ECONNREFUSED {
		t.Errorf("TCP connect: %v, want ECONNREFUSED", err)
	}
	_, _, err = e.whoUDP(ap("10.96.0.10:53"), true)
	if errno(err) != syscall.ECONNREFUSED {
		t.Errorf("UDP connect: %v, want ECONNREFUSED", err)
	}
	_, _, err = e.whoUDP(ap("10.96.0.10:53"), false)
	if errno(err) != syscall.ECONNREFUSED {
		t.Errorf("UDP sendto: %v, want ECONNREFUSED", err)
	}
}

func TestBindOntoAFrontendIsRefused(t *testing.T) {
	e := newEnv(t)
	e.addAddrs(netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10"))
	bes := e.backends(1, 8080, false)
	e.sync(state(frontend("10.96.0.10:80", dataplane.TCP, bes...), frontend("[fd00:96::10]:80", dataplane.TCP),
		frontend("10.96.0.10:53", dataplane.UDP, bes...)))
	cases := []struct {
		network, addr string
		want          syscall.Errno
	}{
		{"tcp", "10.96.0.10:80", syscall.EADDRINUSE},
		{"tcp", "[fd00:96::10]:80", syscall.EADDRINUSE},
		{"udp", "10.96.0.10:53", syscall.EADDRINUSE},
		{"tcp", "10.96.0.10:81", 0}, // another port of the same address
		{"udp", "10.96.0.10:80", 0}, // the TCP frontend's port, over UDP
		{"tcp", "10.96.0.10:53", 0}, // the UDP frontend's port, over TCP
		{"tcp", "[fd00:96::10]:8443", 0},
	}
	for _, c := range cases {
		var err error
		e.in(func() error {
			var cl io.Closer
			if c.network == "tcp" {
				cl, err = net.Listen("tcp", c.addr)
			} else {
				cl, err = net.ListenPacket("udp", c.addr)
			}
			if err == nil {
				cl.Close()
			}
			return nil
		})
		if errno(err) != c.want {
			t.Errorf("bind %s %s: %v, want errno %d", c.network, c.addr, err, c.want)
		}
	}
}

func TestIPv6(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(3, 8080, true)
	e.sync(state(frontend("[fd00:96::10]:80", dataplane.TCP, bes...), frontend("[fd00:96::10]:53", dataplane.UDP, bes...)))
	counts := map[string]int{}
	for range 150 {
		who, err := e.whoTCP(ap("[fd00:96::10]:80"))
		if err != nil {
			t.Fatal(err)
		}
		counts[who]++
	}
	chiSquareFair(t, "IPv6 TCP", counts, bes, 150)
	for _, connected := range []bool{true, false} {
		who, from, err := e.whoUDP(ap("[fd00:96::10]:53"), connected)
		if err != nil {
			t.Fatal(err)
		}
		if !contains(bes, who) || from != ap("[fd00:96::10]:53") {
			t.Errorf("IPv6 UDP connected=%v: backend %q, reply from %s", connected, who, from)
		}
	}
}

// manyServices returns n TCP frontends 10.100.x.y:80 over the backends.
func manyServices(n int, bes []string, perService int) *dataplane.State {
	st := &dataplane.State{NodeName: "node"}
	for i := range n {
		vip := netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})
		f := frontend(netip.AddrPortFrom(vip, 80).String(), dataplane.TCP)
		for j := range perService {
			b := ap(bes[(i+j)%len(bes)])
			f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: b.Addr(), Port: b.Port()})
		}
		st.Frontends = append(st.Frontends, f)
	}
	sortFrontends(st)
	return st
}

func TestTenThousandServicesLoadAndResolve(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(4, 8080, false)
	st := manyServices(10000, bes, 2)
	e.sync(st)
	svcs, err := e.b.View().Services()
	if err != nil || len(svcs) != 10000 {
		t.Fatalf("view: %d services, %v", len(svcs), err)
	}
	for i := 0; i < 10000; i += 97 {
		f := st.Frontends[i]
		who, err := e.whoTCP(netip.AddrPortFrom(f.Addr, f.Port))
		if err != nil {
			t.Fatalf("frontend %s: %v", f.FrontendKey, err)
		}
		if who != f.Endpoints[0].AddrPort().String() && who != f.Endpoints[1].AddrPort().String() {
			t.Fatalf("frontend %s reached %s, not one of its backends", f.FrontendKey, who)
		}
	}
}

func TestRestartKeepsLongLivedStreamAndNewConnects(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(2, 8080, false)
	st := state(frontend("10.96.0.10:80", dataplane.TCP, bes...))
	e.sync(st)
	stream, _, err := e.dialTCP(ap("10.96.0.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var echoed, connects atomic.Int64
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { // the long-lived stream: echo round trips without a pause
		defer wg.Done()
		buf := make([]byte, 64)
		msg := []byte(strings.Repeat("w", 64))
		for ctx.Err() == nil {
			stream.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := stream.Write(msg); err != nil {
				errs <- fmt.Errorf("stream write: %w", err)
				return
			}
			if _, err := io.ReadFull(stream, buf); err != nil {
				errs <- fmt.Errorf("stream read: %w", err)
				return
			}
			echoed.Add(1)
		}
	}()
	go func() { // new connects, back to back
		defer wg.Done()
		for ctx.Err() == nil {
			who, err := e.whoTCP(ap("10.96.0.10:80"))
			if err != nil || !contains(bes, who) {
				errs <- fmt.Errorf("new connect during restart: %q, %v", who, err)
				return
			}
			connects.Add(1)
		}
	}()
	// Each step waits for the client to have made new connects, so every
	// restart happens under traffic (counted, not slept for).
	connected := func() {
		t.Helper()
		from := connects.Load()
		wtestutil.WaitFor(t, 30*time.Second, "20 more connects", func() bool { return connects.Load() >= from+20 })
	}
	connected()
	for i := range 3 { // restart the proxy three times
		if err := e.b.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := New(e.cfg)
		if err != nil {
			t.Fatalf("restart %d: %v", i, err)
		}
		e.b = b
		if len(b.rec.fronts) != 1 || len(b.rec.beIDs) != 2 {
			t.Errorf("restart %d restored %d frontends and %d backends, want 1 and 2", i, len(b.rec.fronts), len(b.rec.beIDs))
		}
		res, err := b.rec.sync(st)
		if err != nil || res.writes+res.deletes != 0 {
			t.Errorf("first sync after restart %d: %d writes, %d deletes, %v; want none", i, res.writes, res.deletes, err)
		}
		connected()
	}
	t.Cleanup(func() { e.b.Close() })
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if echoed.Load() == 0 || connects.Load() == 0 {
		t.Fatalf("nothing measured: %d echoes, %d connects", echoed.Load(), connects.Load())
	}
	t.Logf("%d stream round trips and %d new connects across 3 restarts", echoed.Load(), connects.Load())
}

func TestMapFullNamesTheFrontendsLeftOut(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) { c.MaxServices = 2; c.Metrics = reg })
	bes := e.backends(2, 8080, false)
	// Each frontend needs 1 entry (its backends inline): 2 fit, the third
	// does not.
	st := state(frontend("10.96.0.1:80", dataplane.TCP, bes...), frontend("10.96.0.2:80", dataplane.TCP, bes...),
		frontend("10.96.0.3:80", dataplane.TCP, bes...))
	err := e.b.Sync(context.Background(), st)
	if !errors.Is(err, dataplane.ErrMapFull) || !strings.Contains(err.Error(), "10.96.0.3:80/TCP") {
		t.Fatalf("Sync: %v, want ErrMapFull naming 10.96.0.3:80/TCP", err)
	}
	for _, vip := range []string{"10.96.0.1:80", "10.96.0.2:80"} {
		if _, err := e.whoTCP(ap(vip)); err != nil {
			t.Errorf("%s (fits) does not work: %v", vip, err)
		}
	}
	for name, want := range map[string]float64{"waggle_ebpf_map_full_total": 1, "waggle_ebpf_sync_errors_total": 1,
		"waggle_ebpf_frontends_programmed": 2, "waggle_ebpf_backends_programmed": 2} {
		if got := gatherValue(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// 2 frontends × 1 entry of the services map's 2.
	if got := testutil.ToFloat64(gaugeFor(t, reg, "waggle_ebpf_map_pressure", MapServices)); got != 1 {
		t.Errorf("waggle_ebpf_map_pressure{map=%q} = %v, want 1", MapServices, got)
	}
}

func TestMetricsCountMapEntriesExactly(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) { c.Metrics = reg })
	bes := e.backends(3, 8080, false)
	e.sync(state(frontend("10.96.0.10:80", dataplane.TCP, bes...), frontend("10.96.0.11:80", dataplane.TCP, bes[:1]...)))
	if _, err := e.whoTCP(ap("10.96.0.10:80")); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{MapServices: 1 + 1, MapBackends: 3, MapRevNat: 2, MapServiceNames: 2, MapReverseSockets: 1, MapAffinity: 0}
	for name, n := range want {
		got := testutil.ToFloat64(gaugeFor(t, reg, "waggle_ebpf_map_entries", name))
		if got != n {
			t.Errorf("waggle_ebpf_map_entries{map=%q} = %v, want %v", name, got, n)
		}
	}
	maps, err := e.b.View().Maps()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if n, ok := want[m.Name]; ok && float64(m.Entries) != n {
			t.Errorf("View.Maps %s: %d entries, metrics say %v", m.Name, m.Entries, n)
		}
	}
	if n, _ := testutil.GatherAndCount(reg, "waggle_ebpf_events_total"); n != int(statMax) {
		t.Errorf("%d event counters, want %d", n, statMax)
	}
}

// gatherValue returns the value of an unlabelled counter or gauge.
func gatherValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// gaugeFor returns a collector with only the labelled sample of name.
func gaugeFor(t *testing.T, reg *prometheus.Registry, name, mapName string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "map" && l.GetValue() == mapName {
					g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
					g.Set(m.GetGauge().GetValue())
					return g
				}
			}
		}
	}
	t.Fatalf("no %s{map=%q}", name, mapName)
	return nil
}

func TestPinnedStateFromAnotherLayoutIsRefused(t *testing.T) {
	e := newEnv(t)
	e.b.Close()
	m, err := ebpf.LoadPinnedMap(filepath.Join(e.cfg.PinDir, MapMeta), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Update(uint32(0), sockLBLbMeta{Magic: Magic, LayoutVersion: LayoutVersion + 1}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if _, err := New(e.cfg); !errors.Is(err, ErrLayoutMismatch) {
		t.Errorf("New over another layout: %v, want ErrLayoutMismatch", err)
	}
	if _, err := OpenPinned(e.cfg.PinDir); !errors.Is(err, ErrLayoutMismatch) {
		t.Errorf("OpenPinned over another layout: %v, want ErrLayoutMismatch", err)
	}
	if _, err := OpenPinned(filepath.Join(testPinRoot, "nonexistent")); !errors.Is(err, ErrNoPinnedState) {
		t.Errorf("OpenPinned of nothing: %v, want ErrNoPinnedState", err)
	}
}

func TestCleanupDetachesAndUnpinsEverything(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(1, 8080, false)
	e.sync(state(frontend("10.96.0.10:80", dataplane.TCP, bes...)))
	if err := e.b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.cfg.PinDir); !os.IsNotExist(err) {
		t.Errorf("pin dir after Cleanup: %v", err)
	}
	// Untranslated, the VIP is unreachable from the namespace.
	if who, err := e.whoTCP(ap("10.96.0.10:80")); err == nil {
		t.Errorf("connect after Cleanup still reached %s", who)
	}
	if err := e.b.Sync(context.Background(), state()); !errors.Is(err, ErrClosed) {
		t.Errorf("Sync after Cleanup: %v, want ErrClosed", err)
	}
}

func TestRealMapsMatchTheGoldenDump(t *testing.T) {
	e := newEnv(t)
	e.sync(goldenState())
	o := e.b.objs
	real := kernelTables(o)
	checkGolden(t, "maps.golden", dumpTables(real))
	// The read-only view decodes the same state.
	v, err := OpenPinned(e.cfg.PinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	svcs, err := v.Services()
	if err != nil || len(svcs) != 5 {
		t.Fatalf("view services: %d, %v", len(svcs), err)
	}
	web := svcs[1]
	if web.Address != "10.96.0.10:80/TCP" || web.Name != "default/web:http" || web.AffinityTimeout != 3*time.Hour ||
		len(web.Slots) != 3 || web.Slots[0].Backend != ap("10.244.1.5:8080") {
		t.Errorf("view of web: %+v", web)
	}
	for _, c := range []struct {
		k       dataplane.FrontendKey
		verdict string
		n       int
	}{
		{dataplane.FrontendKey{Addr: ap("10.96.0.10:80").Addr(), Port: 80, Protocol: dataplane.TCP}, "random", 3},
		{dataplane.FrontendKey{Addr: ap("10.96.0.10:80").Addr(), Port: 53, Protocol: dataplane.UDP}, "per-socket", 2},
		{dataplane.FrontendKey{Addr: ap("10.96.0.11:80").Addr(), Port: 80, Protocol: dataplane.TCP}, "refused", 0},
		{dataplane.FrontendKey{Addr: ap("10.96.0.12:80").Addr(), Port: 80, Protocol: dataplane.TCP}, "passthrough", 0},
	} {
		ex, err := v.Explain(c.k, 0, 0)
		if err != nil || ex.Verdict != c.verdict || len(ex.Candidates) != c.n {
			t.Errorf("explain %s: %+v, %v; want %s over %d", c.k, ex, err, c.verdict, c.n)
		}
	}
	progs, err := v.Programs()
	if err != nil || len(progs) != 10 {
		t.Fatalf("view programs: %d, %v", len(progs), err)
	}
	for _, p := range progs {
		if p.Type != "CGroupSockAddr" || p.AttachType == "" || p.CgroupID == 0 {
			t.Errorf("program %+v", p)
		}
	}
}

func TestRestartOnAnotherCgroupMovesThePrograms(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(1, 8080, false)
	e.sync(state(frontend("10.96.0.10:80", dataplane.TCP, bes...)))
	e.b.Close()
	other := wtestutil.NewCgroup(t)
	cfg := e.cfg
	cfg.CgroupPath = other
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	progs, err := b.View().Programs()
	if err != nil || len(progs) != 10 {
		t.Fatalf("programs: %v, %v", progs, err)
	}
	var st syscall.Stat_t
	syscall.Stat(other, &st)
	for _, p := range progs {
		if p.CgroupID != st.Ino {
			t.Errorf("%s attached to cgroup %d, want %d (%s)", p.Name, p.CgroupID, st.Ino, other)
		}
	}
	// This process is still in the first cgroup: no longer translated.
	if who, err := e.whoTCP(ap("10.96.0.10:80")); err == nil {
		t.Errorf("connect from the old cgroup still reached %s", who)
	}
}

// BenchmarkRealSyncFromScratch10kx10 programs 10,000 services × 10
// backends into fresh kernel maps (the programs attached to an empty
// cgroup).
func BenchmarkRealSyncFromScratch10kx10(b *testing.B) {
	wtestutil.RequiresKernelFeature(b, wtestutil.CgroupSockAddr)
	cg := wtestutil.NewCgroup(b)
	st := bigState(10000, 10)
	for range b.N {
		b.StopTimer()
		node := wtestutil.UniqueName("bench")
		cfg := Config{NodeName: node, CgroupPath: cg, PinDir: filepath.Join(testPinRoot, node), MaxServices: 1 << 17, MaxBackends: 1 << 17}
		be, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := be.Sync(context.Background(), st); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		be.Cleanup(context.Background())
		os.Remove(testPinRoot)
	}
}

func TestRestartWithOtherMapSizesResizesWithoutAGap(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(2, 8080, false)
	st := state(frontend("10.96.0.10:80", dataplane.TCP, bes...), frontend("10.96.0.10:53", dataplane.UDP, bes...))
	e.sync(st)
	stream, _, err := e.dialTCP(ap("10.96.0.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	e.b.Close()

	// Shrinking below what the maps hold is refused, and changes nothing.
	small := e.cfg
	small.MaxServices = 1
	if _, err := New(small); !errors.Is(err, dataplane.ErrMapFull) {
		t.Fatalf("New with a services map smaller than its entries: %v, want ErrMapFull", err)
	}
	// The backends array cannot shrink below its highest used ID (IDs 1..4
	// here: two backends, TCP and UDP).
	small = e.cfg
	small.MaxBackends = 3
	if _, err := New(small); !errors.Is(err, dataplane.ErrMapFull) {
		t.Fatalf("New with a backends array below its highest used ID: %v, want ErrMapFull", err)
	}
	// Growing copies the entries into new maps the new programs use.
	big := e.cfg
	big.MaxServices, big.MaxBackends = e.cfg.MaxServices*2, e.cfg.MaxBackends*2
	b, err := New(big)
	if err != nil {
		t.Fatalf("New with bigger maps: %v", err)
	}
	e.b = b
	res, err := b.rec.sync(st)
	if err != nil || res.writes+res.deletes != 0 {
		t.Errorf("sync after resize: %d writes, %d deletes, %v; want none", res.writes, res.deletes, err)
	}
	maps, err := b.View().Maps()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if m.Name == MapServices && (m.MaxEntries != big.MaxServices || m.Entries != 2) {
			t.Errorf("services map after resize: %+v", m)
		}
	}
	v, err := OpenPinned(big.PinDir) // the pins point at the new maps
	if err != nil {
		t.Fatal(err)
	}
	pinned, _ := v.Maps()
	v.Close()
	for _, m := range pinned {
		if m.Name == MapServices && m.MaxEntries != big.MaxServices {
			t.Errorf("pinned services map has %d entries max, want %d", m.MaxEntries, big.MaxServices)
		}
	}
	e.stillServes(t, "after resize", bes, stream, "10.96.0.10:80")
}

// stillServes checks, after a restart that replaced maps, that new TCP
// connects to each vip and connected UDP to 10.96.0.10:53 reach a backend
// of bes, and that stream, opened before, still echoes.
func (e *env) stillServes(t *testing.T, when string, bes []string, stream net.Conn, vips ...string) {
	t.Helper()
	for _, vip := range vips {
		if who, err := e.whoTCP(ap(vip)); err != nil || !contains(bes, who) {
			t.Errorf("connect to %s %s: %q, %v", vip, when, who, err)
		}
	}
	if _, from, err := e.whoUDP(ap("10.96.0.10:53"), true); err != nil || from != ap("10.96.0.10:53") {
		t.Errorf("UDP %s: from %s, %v", when, from, err)
	}
	stream.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := stream.Write([]byte("x")); err != nil {
		t.Fatalf("stream %s: %v", when, err)
	}
	if _, err := io.ReadFull(stream, make([]byte, 1)); err != nil {
		t.Fatalf("stream %s: %v", when, err)
	}
}

func TestTCPConnectionsToARemovedBackendAreDestroyedOnlyWhenAsked(t *testing.T) {
	for _, destroy := range []bool{false, true} {
		t.Run(fmt.Sprintf("DestroyTCPSockets=%v", destroy), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.DestroyTCPSockets = destroy })
			bes := e.backends(2, 8080, false)
			e.sync(state(frontend("10.96.0.10:80", dataplane.TCP, bes...)))
			type conn struct {
				c   net.Conn
				who string
			}
			var conns []conn
			for range 20 {
				c, who, err := e.dialTCP(ap("10.96.0.10:80"))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				conns = append(conns, conn{c, who})
			}
			e.sync(state(frontend("10.96.0.10:80", dataplane.TCP, bes[1:]...)))
			removed := 0
			for i, c := range conns {
				c.c.SetDeadline(time.Now().Add(2 * time.Second))
				_, err := c.c.Write([]byte("x"))
				if err == nil {
					_, err = io.ReadFull(c.c, make([]byte, 1))
				}
				switch {
				case c.who == bes[0] && destroy:
					removed++
					if errno(err) != syscall.ECONNABORTED {
						t.Errorf("conn %d to the removed backend: %v, want ECONNABORTED", i, err)
					}
				case err != nil:
					t.Errorf("conn %d to %s broke: %v", i, c.who, err)
				}
			}
			if destroy && removed == 0 {
				t.Fatalf("no connection of 20 reached %s", bes[0])
			}
		})
	}
}

func TestDualStackSocketReachesAnIPv4FrontendThroughItsMappedAddress(t *testing.T) {
	e := newEnv(t)
	bes := e.backends(2, 8080, false)
	e.sync(state(frontend("10.96.0.10:80", dataplane.TCP, bes...)))
	var who string
	err := e.in(func() error {
		fd, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "dual-stack")
		defer f.Close()
		sa := &syscall.SockaddrInet6{Port: 80, Addr: netip.MustParseAddr("::ffff:10.96.0.10").As16()}
		if err := syscall.Connect(fd, sa); err != nil {
			return fmt.Errorf("connect [::ffff:10.96.0.10]:80: %w", err)
		}
		peer, err := syscall.Getpeername(fd)
		if err != nil {
			return err
		}
		if p6, ok := peer.(*syscall.SockaddrInet6); !ok || netip.AddrFrom16(p6.Addr) != netip.MustParseAddr("::ffff:10.96.0.10") {
			return fmt.Errorf("getpeername = %+v, want [::ffff:10.96.0.10]:80", peer)
		}
		buf := make([]byte, 64)
		n, err := syscall.Read(fd, buf)
		if err != nil {
			return err
		}
		who = strings.TrimSpace(string(buf[:n]))
		return nil
	})
	if err != nil || !contains(bes, who) {
		t.Fatalf("dual-stack socket: reached %q, %v", who, err)
	}
}

// kernelTables are the socket LB's kernel maps as the writer's tables.
func kernelTables(o *sockLBObjects) tables {
	return tables{
		services: mapTable[sockLBLbServiceKey, sockLBLbService]{MapServices, o.WaggleServices},
		backends: arrayTable[sockLBLbBackend]{mapTable[uint32, sockLBLbBackend]{MapBackends, o.WaggleBackends}},
		revNat:   mapTable[uint32, sockLBLbRevNat]{MapRevNat, o.WaggleRevNat},
		names:    mapTable[uint32, sockLBLbSvcName]{MapServiceNames, o.WaggleSvcNames},
		affinity: mapTable[sockLBLbAffinityKey, sockLBLbAffinity]{MapAffinity, o.WaggleAffinity},
	}
}

// TestLargeSyncsMatchTheFake: a sync big enough to write the backends and
// the new frontends' slots on the writer goroutines (above parallelMin,
// more than one chunk each) leaves the kernel maps exactly as the recording fake (one
// entry at a time, checked after each), and so does a second sync that
// changes one backend of every frontend and adds new frontends. (The
// write order, entry by entry, is checked on the fake by the smaller tests.)
func TestLargeSyncsMatchTheFake(t *testing.T) {
	e := newEnv(t)
	o := e.b.objs
	real := kernelTables(o)
	f := newFakeMaps(1<<16, 1<<14)
	fake := newReconciler(f.tables(), 1<<16, 1<<14)
	st := bigState(1000, 10) // 10,000 backends, 10,000 slots of new frontends
	if 1000*10 < parallelMin {
		t.Fatalf("state too small for two threads (parallelMin %d)", parallelMin)
	}
	for round := range 2 {
		e.sync(st)
		if _, err := fake.sync(st); err != nil {
			t.Fatal(err)
		}
		if got, want := dumpTables(real), dumpTables(f.tables()); got != want {
			t.Fatalf("round %d: kernel maps differ from the fake's", round)
		}
		if err := consistent(real); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// Next: one backend replaced in every frontend, 500 frontends more.
		next := &dataplane.State{NodeName: st.NodeName}
		for i, fr := range st.Frontends {
			fr.Endpoints = append(slices.Clone(fr.Endpoints[1:]), dataplane.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 150, byte(i >> 8), byte(i)}), Port: 8080})
			next.Frontends = append(next.Frontends, fr)
		}
		for i := range 500 {
			next.Frontends = append(next.Frontends, dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)}), Port: 80, Protocol: dataplane.TCP},
				Kind: dataplane.ClusterIP, Service: dataplane.ServicePortName{Namespace: "ns", Name: "more"},
				Endpoints: []dataplane.Endpoint{{Addr: netip.AddrFrom4([4]byte{10, 151, byte(i >> 8), byte(i)}), Port: 8080}}})
		}
		sortFrontends(next)
		st = next
	}
}

// TestAFailedLargeSyncShowsNothingAndIsRepaired: when a chunk of a large
// first sync (written on the writer goroutines) fails, no master entry has
// been written, so no program sees any of it; the next sync completes it
// and the kernel maps then hold what the recording fake holds.
func TestAFailedLargeSyncShowsNothingAndIsRepaired(t *testing.T) {
	e := newEnv(t)
	real := kernelTables(e.b.objs)
	st := bigState(600, inlineBackends+4)  // slot entries, in 3 chunks
	for _, failAt := range []int32{1, 3} { // the first chunk of slots, a later one
		var left atomic.Int32
		tb := real
		tb.services = failingTable[sockLBLbServiceKey, sockLBLbService]{real.services, &left}
		tb.parallel = true
		r := newReconciler(tb, 1<<16, 1<<14)
		if err := r.restore(); err != nil {
			t.Fatal(err)
		}
		left.Store(failAt)
		if _, err := r.sync(st); !errors.Is(err, errInjected) {
			t.Fatalf("failAt %d: sync returned %v, want the injected fault", failAt, err)
		}
		masters := 0
		real.services.Iterate(func(k sockLBLbServiceKey, _ sockLBLbService) bool {
			if k.Slot == 0 {
				masters++
			}
			return true
		})
		if masters != 0 {
			t.Fatalf("failAt %d: %d master entries written although hidden entries failed", failAt, masters)
		}
		if _, err := r.sync(st); err != nil {
			t.Fatalf("failAt %d: sync after the fault: %v", failAt, err)
		}
		f := newFakeMaps(1<<16, 1<<14)
		if _, err := newReconciler(f.tables(), 1<<16, 1<<14).sync(st); err != nil {
			t.Fatal(err)
		}
		if got, want := stripIDs(dumpTables(real)), stripIDs(dumpTables(f.tables())); got != want {
			t.Fatalf("failAt %d: kernel maps differ from the fake's after the repair", failAt)
		}
		if err := consistent(real); err != nil {
			t.Fatal(err)
		}
		// Empty the maps for the next case.
		if _, err := r.sync(&dataplane.State{NodeName: st.NodeName}); err != nil {
			t.Fatal(err)
		}
	}
}
