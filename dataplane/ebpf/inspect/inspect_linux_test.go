package inspect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cebpf "github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/internal/testutil"
)

// testPinRoot is a directory of the test's own on bpffs (never the
// proxy's /sys/fs/bpf/waggle).
const testPinRoot = "/sys/fs/bpf/waggle-inspect-test"

// fixture is pinned state written by the real eBPF backend into a fresh
// cgroup, with real connections from a fresh netns filling the affinity
// and reverse-socket maps.
type fixture struct {
	t      *testing.T
	node   string
	pinDir string
	cgroup string
	ns     *testutil.NetNS
	reg    *prometheus.Registry
	b      *ebpf.Backend
	cfg    ebpf.Config
}

func ep(s string) dataplane.Endpoint {
	ap := netip.MustParseAddrPort(s)
	return dataplane.Endpoint{Addr: ap.Addr(), Port: ap.Port()}
}

func fe(addr string, proto dataplane.Protocol, kind dataplane.FrontendKind, svc string, eps ...string) dataplane.Frontend {
	ap := netip.MustParseAddrPort(addr)
	nsName, rest, _ := strings.Cut(svc, "/")
	name, port, _ := strings.Cut(rest, ":")
	f := dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto},
		Kind: kind, Service: dataplane.ServicePortName{Namespace: nsName, Name: name, Port: port}}
	for _, e := range eps {
		f.Endpoints = append(f.Endpoints, ep(e))
	}
	return f
}

// testState is the hand-built desired state every golden file shows.
func testState() *dataplane.State {
	dns := fe("10.96.0.10:53", dataplane.UDP, dataplane.ClusterIP, "kube-system/kube-dns:dns", "10.1.0.1:53", "10.1.0.2:53")
	web := fe("10.96.0.10:80", dataplane.TCP, dataplane.ClusterIP, "default/web:http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")
	web.AffinityTimeout = 3 * time.Hour
	empty := fe("10.96.0.11:80", dataplane.TCP, dataplane.ClusterIP, "default/empty")
	spread := fe("10.96.0.12:80", dataplane.TCP, dataplane.ClusterIP, "default/spread", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")
	sticky := fe("10.96.0.13:80", dataplane.TCP, dataplane.ClusterIP, "default/sticky", "10.1.0.3:8080")
	sticky.AffinityTimeout = 10 * time.Minute
	np := fe("192.168.1.10:30080", dataplane.TCP, dataplane.NodePort, "default/web:http", "10.1.0.1:8080")
	np.LocalOnly = true
	v6 := fe("[fd00:96::10]:443", dataplane.TCP, dataplane.ClusterIP, "default/web6", "[fd00:1::1]:8443", "[fd00:1::2]:8443")
	st := &dataplane.State{NodeName: "node", Frontends: []dataplane.Frontend{dns, web, empty, spread, sticky, np, v6}}
	if err := st.Validate(); err != nil {
		panic(err)
	}
	return st
}

func newFixture(t *testing.T, tweak ...func(*ebpf.Config)) *fixture {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresKernelFeature(t, testutil.CgroupSockAddr)
	testutil.RequiresKernelFeature(t, testutil.BTF)
	cg := testutil.NewCgroup(t)
	n := testutil.NewNetNS(t)
	node := testutil.UniqueName("node")
	f := &fixture{t: t, node: node, pinDir: filepath.Join(testPinRoot, node), cgroup: cg, ns: n, reg: prometheus.NewRegistry()}
	t.Cleanup(func() {
		if err := ebpf.CleanupPinned(f.pinDir); err != nil {
			t.Errorf("cleanup pinned state: %v", err)
		}
		os.Remove(testPinRoot) // only when no other test's node is left
	})
	cfg := ebpf.Config{NodeName: node, CgroupPath: cg, PinDir: f.pinDir, MaxServices: 1024,
		MaxBackends: 256, MaxAffinity: 128, MaxReverseSockets: 512, Metrics: f.reg}
	for _, fn := range tweak {
		fn(&cfg)
	}
	f.cfg = cfg
	b, err := ebpf.New(cfg)
	if err != nil {
		t.Fatalf("ebpf.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	f.b = b
	if err := b.Sync(context.Background(), testState()); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return f
}

// traffic makes real connections from the netns, inside the cgroup: two
// to the sticky Service (an affinity miss, then a hit; one reverse-socket
// entry each) and one refused by the Service without endpoints.
func (f *fixture) traffic() {
	t := f.t
	t.Helper()
	f.ns.Run(t, "ip", "addr", "add", "10.1.0.3/32", "dev", "lo")
	var ln net.Listener
	if err := f.ns.Do(func(ns.NetNS) (err error) { ln, err = net.Listen("tcp", "10.1.0.3:8080"); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	testutil.EnterCgroup(t, f.cgroup)
	err := f.ns.Do(func(ns.NetNS) error {
		for range 2 {
			c, err := net.Dial("tcp", "10.96.0.13:80")
			if err != nil {
				return err
			}
			if got := c.RemoteAddr().String(); got != "10.96.0.13:80" {
				return fmt.Errorf("getpeername shows %s, want the frontend", got)
			}
			c.Close()
		}
		if _, err := net.Dial("tcp", "10.96.0.11:80"); !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("connect to a Service without endpoints: %v, want ECONNREFUSED", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("traffic: %v", err)
	}
}

// pinnedSystem is the real system with a monotonic clock fixed 5s after the
// newest affinity use, so ages in the goldens are stable.
type pinnedSystem struct {
	system
	mono time.Duration
}

func (s pinnedSystem) Monotonic() time.Duration { return s.mono }

func (f *fixture) inspector() *inspector {
	f.t.Helper()
	src, err := openSource(f.pinDir, f.node)
	if err != nil {
		f.t.Fatalf("openSource: %v", err)
	}
	f.t.Cleanup(func() { src.Close() })
	aff, err := src.Affinity()
	if err != nil {
		f.t.Fatal(err)
	}
	var last time.Duration
	for _, a := range aff {
		last = max(last, a.LastUsed)
	}
	return &inspector{src: src, sys: pinnedSystem{newSystem(context.Background()), last + 5*time.Second}, node: f.node}
}

// mask replaces what differs from run to run (IDs the kernel hands out,
// cookies, times, the test's unique names) with stable placeholders.
func (f *fixture) mask(v any) any {
	path := func(p string) string {
		p = strings.ReplaceAll(p, f.pinDir, "$PINDIR")
		return strings.ReplaceAll(p, f.cgroup, "$CGROUP")
	}
	progs := func(ps []Program) {
		for i := range ps {
			p := &ps[i]
			p.ID, p.LinkID, p.CgroupID, p.Attached, p.Loaded = 0, 0, 0, time.Time{}, time.Time{}
			p.LinkPath = path(p.LinkPath)
			p.StatsEnabled, p.Runs, p.RunTime, p.Window = false, 0, 0, 0
			p.AttachPoint = path(p.AttachPoint)
		}
	}
	switch r := v.(type) {
	case *Status:
		r.Node, r.PinDir, r.Created = "$NODE", path(r.PinDir), time.Time{}
		progs(r.Programs)
		for i := range r.Maps {
			r.Maps[i].Path = path(r.Maps[i].Path)
		}
	case ProgramList:
		progs(r)
	case MapList:
		for i := range r {
			r[i].Path = path(r[i].Path)
		}
	case AffinityList:
		for i := range r {
			r[i].NetnsCookie = 0
		}
	case SocketList:
		for i := range r {
			r[i].Cookie = 0
		}
	case *Explanation:
		if r.NetnsCookie != 0 {
			r.Client, r.NetnsCookie = "$CLIENT", 0
		}
	case *Dump:
		for c, col := range r.Columns {
			switch col {
			case "netnsCookie", "cookie", "lastUsedMonotonicNanoseconds", "created":
				for i := range r.rows {
					r.rows[i][c] = "*"
					r.Entries[i][col] = "*"
				}
			}
		}
	}
	return v
}

// TestCommandsOnRealProxyStateMatchGoldens fills the maps with the real
// backend and real sockets, then checks every command's output in every
// format against testdata/.
func TestCommandsOnRealProxyStateMatchGoldens(t *testing.T) {
	f := newFixture(t)
	f.traffic()
	in := f.inspector()
	netnsPath := filepath.Join("/run/netns", f.ns.Name)
	cases := []struct {
		golden string
		cmd    []string
		raw    bool
	}{
		{"status", []string{"status"}, false},
		{"lb-list", []string{"lb", "list"}, false},
		{"lb-get-web", []string{"lb", "get", "10.96.0.10:80/TCP"}, false},
		{"lb-get-all-protocols", []string{"lb", "get", "10.96.0.10:53"}, false},
		{"lb-get-ipv6", []string{"lb", "get", "[fd00:96::10]:443"}, false},
		{"map-list", []string{"map", "list"}, false},
		{"affinity-list", []string{"affinity", "list"}, false},
		{"sockets", []string{"sockets"}, false},
		{"prog-list", []string{"prog", "list"}, false},
		{"explain-balanced", []string{"explain", "10.96.0.10:80"}, false},
		{"explain-udp", []string{"explain", "10.96.0.10:53/UDP"}, false},
		{"explain-refused", []string{"explain", "10.96.0.11:80/TCP"}, false},
		{"explain-affinity-hit", []string{"explain", netnsPath, "10.96.0.13:80"}, false},
		{"explain-affinity-by-name", []string{"explain", f.ns.Name, "10.96.0.13:80"}, false},
		{"explain-affinity-other-client", []string{"explain", "cookie:1", "10.96.0.13:80"}, false},
		{"explain-no-entry", []string{"explain", netnsPath, "10.96.0.10:80"}, false},
		{"explain-ipv6", []string{"explain", "[fd00:96::10]:443/TCP"}, false},
	}
	for _, m := range []string{ebpf.MapServices, ebpf.MapBackends, ebpf.MapRevNat, ebpf.MapServiceNames,
		ebpf.MapAffinity, ebpf.MapReverseSockets, ebpf.MapMeta, ebpf.MapStats} {
		cases = append(cases, struct {
			golden string
			cmd    []string
			raw    bool
		}{"map-dump-" + m, []string{"map", "dump", m}, false})
	}
	for _, m := range []string{ebpf.MapServices, ebpf.MapBackends, ebpf.MapRevNat, ebpf.MapServiceNames} {
		cases = append(cases, struct {
			golden string
			cmd    []string
			raw    bool
		}{"map-dump-raw-" + m, []string{"map", "dump", m}, true})
	}
	for _, c := range cases {
		t.Run(c.golden, func(t *testing.T) {
			res, err := in.run(context.Background(), Config{Command: c.cmd, Raw: c.raw})
			if err != nil {
				t.Fatalf("%v: %v", c.cmd, err)
			}
			renderAll(t, c.golden, f.mask(res))
		})
	}
}

// gather returns the registry's samples as "name{label}" -> value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetValue() + "}"
			}
			out[key] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	}
	return -1
}

// TestStatusAgreesWithProxyMetrics: every count the backend exports on
// /metrics equals what `waggle bpf status` reads from the pinned maps.
func TestStatusAgreesWithProxyMetrics(t *testing.T) {
	f := newFixture(t)
	f.traffic()
	f.udpTraffic(3)
	metrics := gather(t, f.reg)
	var out bytes.Buffer
	if err := Run(context.Background(), Config{Command: []string{"status"}, PinDir: f.pinDir, Output: FormatJSON, Out: &out}); err != nil {
		t.Fatalf("status: %v", err)
	}
	var st Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out.Bytes())
	}
	checked := 0
	check := func(what string, metric string, got float64) {
		t.Helper()
		want, ok := metrics[metric]
		if !ok {
			t.Errorf("%s: metric %s not exported", what, metric)
			return
		}
		checked++
		if got != want {
			t.Errorf("%s: waggle bpf status says %v, /metrics %s says %v", what, got, metric, want)
		}
	}
	check("frontends", "waggle_ebpf_frontends_programmed", float64(st.Frontends))
	check("backends", "waggle_ebpf_backends_programmed", float64(st.Backends))
	seen := map[string]bool{}
	for _, m := range st.Maps {
		if _, ok := metrics["waggle_ebpf_map_entries{"+m.Name+"}"]; !ok {
			continue // meta and stats are fixed-size arrays the backend does not export
		}
		seen[m.Name] = true
		check(m.Name+" entries", "waggle_ebpf_map_entries{"+m.Name+"}", float64(m.Entries))
		check(m.Name+" max", "waggle_ebpf_map_max_entries{"+m.Name+"}", float64(m.MaxEntries))
	}
	for k := range metrics {
		if name, ok := strings.CutPrefix(k, "waggle_ebpf_map_entries{"); ok && !seen[strings.TrimSuffix(name, "}")] {
			t.Errorf("metric %s has no row in waggle bpf status", k)
		}
	}
	for _, e := range st.Events {
		check("event "+e.Name, "waggle_ebpf_events_total{"+e.Name+"}", float64(e.Count))
	}
	for k := range metrics {
		if strings.HasPrefix(k, "waggle_ebpf_events_total{") && !strings.Contains(out.String(), strings.TrimSuffix(strings.TrimPrefix(k, "waggle_ebpf_events_total{"), "}")) {
			t.Errorf("metric %s has no event in waggle bpf status", k)
		}
	}
	// The traffic must have made the counts non-trivial.
	if metrics["waggle_ebpf_events_total{connect_xlate}"] != 2 || metrics["waggle_ebpf_events_total{affinity_hit}"] != 1 ||
		metrics["waggle_ebpf_map_entries{waggle_affinity}"] != 1 || metrics["waggle_ebpf_events_total{sendmsg_xlate}"] < 3 ||
		metrics["waggle_ebpf_events_total{recvmsg_xlate}"] < 3 {
		t.Errorf("traffic left unexpected counts: %v", metrics)
	}
	if checked < 20 {
		t.Errorf("only %d counts compared", checked)
	}
}

func runCLI(t *testing.T, args ...string) (stdout string, code int, err error) {
	t.Helper()
	var out bytes.Buffer
	cfg, err := ParseArgs(args, &out)
	if err == nil {
		cfg.Out = &out
		err = Run(context.Background(), cfg)
	}
	return out.String(), exitCodeOf(err), err
}

// TestExitCodesAndErrorsOnRealState drives the whole CLI path (arguments
// to exit code) against real pinned state and its absence.
func TestExitCodesAndErrorsOnRealState(t *testing.T) {
	f := newFixture(t)
	tmp := t.TempDir()
	cases := []struct {
		name    string
		args    []string
		code    int
		wantErr string
		wantOut string
	}{
		{"status ok", []string{"status", "--pin-dir", f.pinDir}, ExitOK, "", "Mode:"},
		{"node selects the pinned state", []string{"lb", "list", "--pin-dir", f.pinDir, "-o", "json"}, ExitOK, "", `"frontend": "10.96.0.13:80/TCP"`},
		{"yaml", []string{"-o", "yaml", "map", "list", "--pin-dir", f.pinDir}, ExitOK, "", "name: waggle_services"},
		{"unknown frontend", []string{"lb", "get", "10.9.9.9:80", "--pin-dir", f.pinDir}, ExitNotFound, "frontend 10.9.9.9:80 is not in waggle_services", ""},
		{"unknown protocol of a known address", []string{"lb", "get", "10.96.0.11:80/UDP", "--pin-dir", f.pinDir}, ExitNotFound, "not in waggle_services", ""},
		{"explain unknown frontend", []string{"explain", "10.9.9.9:80", "--pin-dir", f.pinDir}, ExitNotFound, "is no frontend", ""},
		{"explain unknown netns", []string{"explain", "no-such-netns", "10.96.0.13:80", "--pin-dir", f.pinDir}, ExitNotFound, "client netns", ""},
		{"explain source given as an IP", []string{"explain", "10.0.0.1", "10.96.0.13:80", "--pin-dir", f.pinDir}, ExitUsage, "per network namespace", ""},
		{"unknown map", []string{"map", "dump", "nope", "--pin-dir", f.pinDir}, ExitNotFound, `no map "nope" (maps: waggle_affinity`, ""},
		{"unknown map raw", []string{"map", "dump", "nope", "--raw", "--pin-dir", f.pinDir}, ExitNotFound, `no map "nope"`, ""},
		{"raw per-CPU map", []string{"map", "dump", "waggle_stats", "--raw", "--pin-dir", f.pinDir}, ExitUsage, "per-CPU", ""},
		{"bad frontend", []string{"lb", "get", "web", "--pin-dir", f.pinDir}, ExitUsage, "want VIP:PORT[/PROTO]", ""},
		{"bad protocol", []string{"lb", "get", "10.96.0.10:80/SCTP", "--pin-dir", f.pinDir}, ExitUsage, `protocol "SCTP"`, ""},
		{"no state for the node", []string{"status", "--pin-dir", filepath.Join(testPinRoot, "no-such-node")}, ExitNoState, "no pinned state in", ""},
		{"no state: other nodes named", []string{"status", "--node", "no-such-node"}, ExitNoState, "no eBPF dataplane state on this node", ""},
		{"not on bpffs", []string{"status", "--pin-dir", tmp}, ExitNoState, "not on a BPF filesystem", ""},
		{"bad usage", []string{"lb", "frob"}, ExitUsage, `"lb" needs one of`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code, err := runCLI(t, c.args...)
			if code != c.code {
				t.Fatalf("exit code %d, want %d (err %v)", code, c.code, err)
			}
			if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Errorf("error %v, want it to mention %q", err, c.wantErr)
			}
			if c.wantOut != "" && !strings.Contains(out, c.wantOut) {
				t.Errorf("output lacks %q:\n%s", c.wantOut, out)
			}
			var ec interface{ ExitCode() int }
			if err != nil && (!errors.As(err, &ec) || ec.ExitCode() != c.code) {
				t.Errorf("error %T does not carry exit code %d", err, c.code)
			}
		})
	}
}

// TestNodeFlagListsNodesWithState: asking for a node without state names
// the nodes that have some, under the same root.
func TestNodeFlagListsNodesWithState(t *testing.T) {
	f := newFixture(t)
	src, err := openSource(filepath.Join(testPinRoot, "absent"), "absent")
	if err == nil {
		src.Close()
		t.Fatal("opened state of an absent node")
	}
	if exitCodeOf(err) != ExitNoState || !strings.Contains(err.Error(), f.node) {
		t.Errorf("error %v: want exit 3 and the node %s with state named", err, f.node)
	}
}

// TestLayoutFromAnotherVersionIsRefused: a meta record of another layout
// version makes every command fail with exit 3 and say so.
func TestLayoutFromAnotherVersionIsRefused(t *testing.T) {
	f := newFixture(t)
	m, err := cebpf.LoadPinnedMap(filepath.Join(f.pinDir, ebpf.MapMeta), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var raw [16]byte
	if err := m.Lookup(uint32(0), &raw); err != nil {
		t.Fatal(err)
	}
	orig := raw
	raw[4] = byte(ebpf.LayoutVersion + 1)
	if err := m.Update(uint32(0), raw, cebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Update(uint32(0), orig, cebpf.UpdateExist) })
	for _, args := range [][]string{{"status"}, {"lb", "list"}, {"map", "dump", "waggle_meta", "--raw"}} {
		_, code, err := runCLI(t, append(args, "--pin-dir", f.pinDir)...)
		if code != ExitNoState || err == nil || !strings.Contains(err.Error(), "layout") ||
			!errors.Is(err, ebpf.ErrLayoutMismatch) {
			t.Errorf("%v: exit %d, error %v; want exit 3 naming the layout mismatch", args, code, err)
		}
	}
}

// TestProgListEnableStatsCountsRunsInTheWindow: --enable-stats turns the
// kernel's statistics on for the window and reports the runs made in it.
func TestProgListEnableStatsCountsRunsInTheWindow(t *testing.T) {
	f := newFixture(t)
	f.traffic() // sets up the listener and enters the cgroup
	in := f.inspector()
	done := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the connects must fall inside the stats window the inspector opens after this goroutine starts; the window has no start event
		done <- f.ns.Do(func(ns.NetNS) error {
			for range 5 {
				c, err := net.Dial("tcp", "10.96.0.13:80")
				if err != nil {
					return err
				}
				c.Close()
			}
			return nil
		})
	}()
	res, err := in.run(context.Background(), Config{Command: []string{"prog", "list"}, EnableStats: time.Second})
	if err != nil {
		t.Fatalf("prog list --enable-stats: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	progs := res.(ProgramList)
	if len(progs) != 10 {
		t.Fatalf("%d programs, want 10", len(progs))
	}
	for _, p := range progs {
		if !p.StatsEnabled || p.Window != time.Second {
			t.Errorf("%s: stats not marked as measured over the window: %+v", p.Name, p)
		}
		if p.Name == "waggle_connect4" && (p.Runs < 5 || p.RunTime <= 0) {
			t.Errorf("connect4 ran %d times in %s during the window, want at least the 5 connects", p.Runs, p.RunTime)
		}
		if p.ID == 0 || p.Loaded.IsZero() || p.Attached.IsZero() || p.Attached.After(p.Loaded.Add(time.Second)) ||
			time.Since(p.Attached) > time.Minute || !strings.HasPrefix(p.AttachPoint, "/") {
			t.Errorf("%s: want an ID, a load time and the cgroup path: %+v", p.Name, p)
		}
		if p.AttachPoint != f.cgroup {
			t.Errorf("%s attached at %s, want %s", p.Name, p.AttachPoint, f.cgroup)
		}
	}
	var b bytes.Buffer
	if err := render(&b, FormatTable, progs); err != nil || !strings.Contains(b.String(), "window of --enable-stats") {
		t.Errorf("table: %v\n%s", err, b.String())
	}
}

// serveAddrs starts TCP servers in the netns that write their own address
// to each connection.
func (f *fixture) serveAddrs(addrs ...string) {
	t := f.t
	t.Helper()
	for _, a := range addrs {
		ap := netip.MustParseAddrPort(a)
		f.ns.Run(t, "ip", "addr", "add", ap.Addr().String()+"/32", "dev", "lo")
		var ln net.Listener
		if err := f.ns.Do(func(ns.NetNS) (err error) { ln, err = net.Listen("tcp", a); return }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "%s\n", a)
				c.Close()
			}
		}()
	}
}

// reach connects to vip from the netns and returns the backend that
// answered, or the connect error.
func (f *fixture) reach(vip string) (string, error) {
	var who string
	err := f.ns.Do(func(ns.NetNS) error {
		c, err := net.Dial("tcp", vip)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		who = strings.TrimSpace(string(buf[:n]))
		return err
	})
	return who, err
}

// TestExplainPredictsRealConnects: what explain says a connection would do
// is what real connections from the netns then do — an affinity entry pins
// the backend it names, and a slot whose backend is gone refuses its share.
func TestExplainPredictsRealConnects(t *testing.T) {
	f := newFixture(t)
	f.serveAddrs("10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")
	testutil.EnterCgroup(t, f.cgroup)
	client := filepath.Join("/run/netns", f.ns.Name)

	first, err := f.reach("10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	in := f.inspector()
	res, err := in.run(context.Background(), Config{Command: []string{"explain", client, "10.96.0.10:80"}})
	if err != nil {
		t.Fatal(err)
	}
	e := res.(*Explanation)
	if e.Verdict != VerdictAffinity || len(e.Candidates) != 1 || e.Candidates[0].Backend != first {
		t.Fatalf("after a connect reached %s, explain says %s %+v", first, e.Verdict, e.Candidates)
	}
	for range 5 {
		if who, err := f.reach("10.96.0.10:80"); err != nil || who != first {
			t.Fatalf("explain predicted %s, a connect reached %s (%v)", first, who, err)
		}
	}

	// Take 10.1.0.2:8080 out of the backends map behind the proxy's back
	// (an array: its entry marked free).
	bes, err := in.src.Backends()
	if err != nil {
		t.Fatal(err)
	}
	m, err := cebpf.LoadPinnedMap(filepath.Join(f.pinDir, ebpf.MapBackends), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, b := range bes {
		if b.Backend.String() == "10.1.0.2:8080" {
			if err := m.Put(b.ID, make([]byte, m.ValueSize())); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err = in.run(context.Background(), Config{Command: []string{"lb", "get", "10.96.0.12:80"}})
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, s := range res.(FrontendDetail)[0].Backends {
		states = append(states, s.Backend+"="+s.State)
	}
	if got := strings.Join(states, " "); got != "10.1.0.1:8080=active -=backend-missing 10.1.0.3:8080=active" {
		t.Errorf("lb get after the backend went: %s", got)
	}
	res, err = in.run(context.Background(), Config{Command: []string{"explain", "10.96.0.12:80"}})
	if err != nil {
		t.Fatal(err)
	}
	e = res.(*Explanation)
	ok := map[string]bool{}
	refused := 0
	for _, c := range e.Candidates {
		if c.Outcome == "connects" {
			ok[c.Backend] = true
		} else {
			refused++
		}
	}
	if refused != 1 || len(ok) != 2 || ok["10.1.0.2:8080"] {
		t.Fatalf("explain after the backend went: %s, candidates %+v", e.Summary, e.Candidates)
	}
	sawRefused, sawOK := 0, 0
	for range 60 {
		who, err := f.reach("10.96.0.12:80")
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			sawRefused++
		case err != nil:
			t.Fatal(err)
		case !ok[who]:
			t.Fatalf("a connect reached %s, which explain did not list as reachable", who)
		default:
			sawOK++
		}
	}
	// Each outcome has a chance of at least 1/3 per connect: missing one
	// in 60 tries happens with probability below 1e-10.
	if sawRefused == 0 || sawOK == 0 {
		t.Errorf("60 connects: %d refused, %d connected; explain said %s", sawRefused, sawOK, e.Summary)
	}
}

// TestExplainAgreesWithTheViewsReplay cross-checks explain with
// dataplane/ebpf's own replay of the connect decision (View.Explain) on
// every frontend, for any client and for the netns that has an affinity
// entry: same verdict, same backends.
func TestExplainAgreesWithTheViewsReplay(t *testing.T) {
	f := newFixture(t)
	f.traffic()
	in := f.inspector()
	view, ok := in.src.(*ebpf.View)
	if !ok {
		t.Fatalf("source is %T, want *ebpf.View", in.src)
	}
	client := filepath.Join("/run/netns", f.ns.Name)
	cookie, err := in.sys.NetnsCookie(client)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{"refused": VerdictRefused, "affinity": VerdictAffinity, "random": VerdictBalanced, "per-socket": VerdictBalanced}
	for _, fr := range testState().Frontends {
		for _, src := range []string{"", client} {
			var c uint64
			if src != "" {
				c = cookie
			}
			theirs, err := view.Explain(fr.FrontendKey, c, in.sys.Monotonic())
			if err != nil {
				t.Fatal(err)
			}
			args := []string{"explain", fr.FrontendKey.String()}
			if src != "" {
				args = []string{"explain", src, fr.FrontendKey.String()}
			}
			res, err := in.run(context.Background(), Config{Command: args})
			if err != nil {
				t.Fatal(err)
			}
			ours := res.(*Explanation)
			var a, b []string
			for _, s := range theirs.Candidates {
				a = append(a, s.Backend.String())
			}
			for _, c := range ours.Candidates {
				b = append(b, c.Backend)
			}
			if kinds[theirs.Verdict] != ours.Verdict || strings.Join(a, " ") != strings.Join(b, " ") {
				t.Errorf("%s from %q: View.Explain says %s %v (%s), explain says %s %v (%s)", fr.FrontendKey, src,
					theirs.Verdict, a, theirs.Reason, ours.Verdict, b, ours.Summary)
			}
		}
	}
}

// udpTraffic sends n datagrams to the DNS frontend from one unconnected
// socket in the netns (sendmsg and recvmsg hooks) and checks that every
// reply appears to come from the frontend.
func (f *fixture) udpTraffic(n int) {
	t := f.t
	t.Helper()
	for _, a := range []string{"10.1.0.1:53", "10.1.0.2:53"} {
		ap := netip.MustParseAddrPort(a)
		if !strings.Contains(f.ns.Run(t, "ip", "addr", "show", "dev", "lo"), ap.Addr().String()+"/") {
			f.ns.Run(t, "ip", "addr", "add", ap.Addr().String()+"/32", "dev", "lo")
		}
		var pc net.PacketConn
		if err := f.ns.Do(func(ns.NetNS) (err error) { pc, err = net.ListenPacket("udp", a); return }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 64)
			for {
				m, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(buf[:m], from)
			}
		}()
	}
	err := f.ns.Do(func(ns.NetNS) error {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer pc.Close()
		vip := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("10.96.0.10:53"))
		buf := make([]byte, 64)
		for range n {
			if _, err := pc.WriteTo([]byte("q"), vip); err != nil {
				return err
			}
			pc.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return err
			}
			if from.String() != "10.96.0.10:53" {
				return fmt.Errorf("reply from %s, want the frontend", from)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("udp traffic: %v", err)
	}
}

// TestStatusWarnsWhenAMapIsNearlyFull: a backends map sized exactly for
// the state is 100% full, and status says which proxy flag to raise.
func TestStatusWarnsWhenAMapIsNearlyFull(t *testing.T) {
	f := newFixture(t, func(c *ebpf.Config) { c.MaxBackends = 7 })
	out, code, err := runCLI(t, "status", "--pin-dir", f.pinDir)
	if code != ExitOK {
		t.Fatalf("status: exit %d, %v", code, err)
	}
	for _, want := range []string{"100.00% !", "WARNING: waggle_backends is 100.00% full", "--bpf-lb-backends-max"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "WARNING") != 1 {
		t.Errorf("want exactly one warning:\n%s", out)
	}
}

// TestRestartKeepsAttachTimeAndMovesLoadTime: a restarted proxy swaps new
// programs into the pinned links, so ATTACHED stays (load balancing never
// stopped) while LOADED moves to the restart.
func TestRestartKeepsAttachTimeAndMovesLoadTime(t *testing.T) {
	f := newFixture(t)
	before, err := f.inspector().programs()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // times are shown to the second
	f.b.Close()
	cfg := f.cfg
	cfg.Metrics = nil
	b, err := ebpf.New(cfg)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	after, err := f.inspector().programs()
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 10 || len(after) != len(before) {
		t.Fatalf("%d programs before, %d after", len(before), len(after))
	}
	for i := range after {
		a, p := after[i], before[i]
		if !a.Attached.Equal(p.Attached) || !a.Loaded.After(p.Loaded) || a.ID == p.ID || a.LinkID != p.LinkID {
			t.Errorf("%s: before attached %s loaded %s (prog %d, link %d); after attached %s loaded %s (prog %d, link %d)",
				a.Name, p.Attached, p.Loaded, p.ID, p.LinkID, a.Attached, a.Loaded, a.ID, a.LinkID)
		}
	}
}
