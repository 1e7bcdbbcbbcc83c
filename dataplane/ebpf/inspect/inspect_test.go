package inspect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/waggle-io/waggle/dataplane/ebpf"
)

func TestParseArgsAcceptsCommandsWithFlagsAnywhere(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want Config
	}{
		{"status", []string{"status"}, Config{Command: []string{"status"}, Output: FormatTable}},
		{"flags before", []string{"--node", "n1", "-o", "json", "lb", "list"}, Config{Command: []string{"lb", "list"}, Node: "n1", Output: FormatJSON}},
		{"flags after", []string{"lb", "get", "10.96.0.10:80/TCP", "-o", "yaml"}, Config{Command: []string{"lb", "get", "10.96.0.10:80/TCP"}, Output: FormatYAML}},
		{"flags between", []string{"map", "--pin-dir", "/sys/fs/bpf/x", "dump", "waggle_backends", "--raw"}, Config{Command: []string{"map", "dump", "waggle_backends"}, PinDir: "/sys/fs/bpf/x", Raw: true, Output: FormatTable}},
		{"explain with source", []string{"explain", "pod1", "10.96.0.10:80"}, Config{Command: []string{"explain", "pod1", "10.96.0.10:80"}, Output: FormatTable}},
		{"enable stats", []string{"prog", "list", "--enable-stats", "2s"}, Config{Command: []string{"prog", "list"}, EnableStats: 2 * time.Second, Output: FormatTable}},
		{"wide is the table", []string{"sockets", "-o", "wide"}, Config{Command: []string{"sockets"}, Output: FormatTable}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseArgs(c.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got.Command, " ") != strings.Join(c.want.Command, " ") || got.Node != c.want.Node ||
				got.PinDir != c.want.PinDir || got.Output != c.want.Output || got.Raw != c.want.Raw || got.EnableStats != c.want.EnableStats {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestParseArgsReadsFlagsFromEnvironment(t *testing.T) {
	t.Setenv("WAGGLE_NODE", "lab-2")
	t.Setenv("WAGGLE_O", "json")
	got, err := ParseArgs([]string{"status"}, io.Discard)
	if err != nil || got.Node != "lab-2" || got.Output != FormatJSON {
		t.Fatalf("got %+v, %v", got, err)
	}
	got, err = ParseArgs([]string{"status", "--node", "lab-3"}, io.Discard)
	if err != nil || got.Node != "lab-3" {
		t.Fatalf("the flag must win over the environment: %+v, %v", got, err)
	}
}

func TestParseArgsRejectsBadUsageWithExitTwo(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "no command"},
		{"unknown command", []string{"frob"}, `unknown command "frob"`},
		{"group without verb", []string{"lb"}, `"lb" needs one of: lb list, lb get`},
		{"unknown verb", []string{"map", "show"}, `"map" needs one of`},
		{"missing argument", []string{"lb", "get"}, "lb get takes 1 argument"},
		{"extra argument", []string{"status", "now"}, "status takes no arguments"},
		{"explain too many", []string{"explain", "a", "b", "c"}, "explain takes 1 to 2 arguments"},
		{"bad format", []string{"status", "-o", "xml"}, `-o "xml"`},
		{"raw elsewhere", []string{"lb", "list", "--raw"}, "--raw applies to map dump only"},
		{"stats elsewhere", []string{"status", "--enable-stats", "1s"}, "--enable-stats applies to prog list only"},
		{"negative window", []string{"prog", "list", "--enable-stats", "-1s"}, "positive duration"},
		{"unknown flag", []string{"status", "--frob"}, "flag provided but not defined"},
		{"node with slash", []string{"status", "--node", "../etc"}, "not a node name"},
		{"bad frontend before any state is read", []string{"lb", "get", "web", "--pin-dir", "/nonexistent"}, "want VIP:PORT[/PROTO]"},
		{"explain bad frontend", []string{"explain", "10.96.0.1:80/ICMP"}, `protocol "ICMP"`},
		{"explain source as an address", []string{"explain", "10.0.0.1", "10.96.0.1:80"}, "not per address"},
		{"explain bad cookie", []string{"explain", "cookie:x", "10.96.0.1:80"}, "cookie:N wants a number"},
		{"explain bad pid", []string{"explain", "pid:0", "10.96.0.1:80"}, "pid:N wants a process ID"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseArgs(c.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to mention %q", err, c.want)
			}
			var ec interface{ ExitCode() int }
			if !errors.As(err, &ec) || ec.ExitCode() != ExitUsage || !errors.Is(err, ErrUsage) {
				t.Errorf("error %v: want exit code 2 and ErrUsage", err)
			}
		})
	}
}

func TestParseArgsHelpPrintsUsage(t *testing.T) {
	var b bytes.Buffer
	_, err := ParseArgs([]string{"--help"}, &b)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(b.String(), "explain [SRC] VIP:PORT[/PROTO]") || !strings.Contains(b.String(), "-enable-stats") {
		t.Fatalf("err %v, usage:\n%s", err, b.String())
	}
}

func TestExitCodeOfEachErrorCategory(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{ErrNotFound, ExitNotFound},
		{usageErr("x"), ExitUsage},
		{ErrNoState, ExitNoState},
		{ebpf.ErrNoPinnedState, ExitNoState},
		{ebpf.ErrLayoutMismatch, ExitNoState},
		{ErrPermission, ExitFailure},
		{errBoom, ExitFailure},
	}
	for _, c := range cases {
		if got := exitCodeOf(c.err); got != c.want {
			t.Errorf("exitCodeOf(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestParseFrontend(t *testing.T) {
	cases := []struct {
		in, want, proto string
		bad             bool
	}{
		{in: "10.96.0.10:80", want: "10.96.0.10:80"},
		{in: "10.96.0.10:53/udp", want: "10.96.0.10:53", proto: "UDP"},
		{in: "[fd00::a]:443/TCP", want: "[fd00::a]:443", proto: "TCP"},
		{in: "[::ffff:10.0.0.1]:80", want: "10.0.0.1:80"},
		{in: "10.96.0.10", bad: true},
		{in: "10.96.0.10:0", bad: true},
		{in: "10.96.0.10:80/SCTP", bad: true},
		{in: "[fe80::1%eth0]:80", bad: true},
		{in: "web:80", bad: true},
	}
	for _, c := range cases {
		ap, p, err := parseFrontend(c.in)
		if c.bad {
			if exitCodeOf(err) != ExitUsage {
				t.Errorf("%q: err %v, want a usage error", c.in, err)
			}
			continue
		}
		if err != nil || ap.String() != c.want || string(p) != c.proto {
			t.Errorf("%q: %v %q %v, want %s %q", c.in, ap, p, err, c.want, c.proto)
		}
	}
}

func TestLbListMarksMissingSlotsAndBackends(t *testing.T) {
	src, sys := newFake()
	in := &inspector{src: src, sys: sys}
	res, err := in.run(context.Background(), Config{Command: []string{"lb", "list"}})
	if err != nil {
		t.Fatal(err)
	}
	fs := res.(FrontendList)
	var states []string
	for _, s := range fs[1].Backends {
		states = append(states, s.State)
	}
	if got := strings.Join(states, ","); got != "active,slot-missing,backend-missing,unused" {
		t.Errorf("states of 10.96.0.2:53/UDP: %s", got)
	}
	renderAll(t, "fake-lb-list", res)
}

func TestLbGetUnknownFrontendIsNotFound(t *testing.T) {
	src, sys := newFake()
	in := &inspector{src: src, sys: sys}
	for _, arg := range []string{"10.96.0.9:80", "10.96.0.1:80/UDP"} {
		_, err := in.run(context.Background(), Config{Command: []string{"lb", "get", arg}})
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("lb get %s: %v, want ErrNotFound", arg, err)
		}
	}
	res, err := in.run(context.Background(), Config{Command: []string{"lb", "get", "10.96.0.1:80"}})
	if err != nil || len(res.(FrontendDetail)) != 1 || res.(FrontendDetail)[0].Namespace != "default" || res.(FrontendDetail)[0].PortName != "http" {
		t.Fatalf("lb get: %+v %v", res, err)
	}
}

func TestExplainMirrorsTheProgramsChoice(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		verdict  string
		summary  string
		why      string
		backends []string
	}{
		{"affinity entry pins the client", []string{"live", "10.96.0.1:80"}, VerdictAffinity, "10.1.0.2:80 (affinity entry", "last used 10s ago", []string{"10.1.0.2:80"}},
		{"expired entry gives a fresh choice", []string{"expired", "10.96.0.1:80"}, VerdictBalanced, "one of 2 backends, each 1/2", "expired (timeout 1m0s)", []string{"10.1.0.1:80", "10.1.0.2:80"}},
		{"entry naming a gone backend", []string{"gone", "10.96.0.1:80"}, VerdictBalanced, "one of 2", "which waggle_backends lacks", []string{"10.1.0.1:80", "10.1.0.2:80"}},
		{"client without entry", []string{"fresh", "10.96.0.1:80/TCP"}, VerdictBalanced, "one of 2", "has no entry for this client", []string{"10.1.0.1:80", "10.1.0.2:80"}},
		{"any client counts entries", []string{"10.96.0.1:80"}, VerdictBalanced, "one of 2", "3 client netns have an entry", []string{"10.1.0.1:80", "10.1.0.2:80"}},
		{"broken slots refuse their share", []string{"10.96.0.2:53/UDP"}, VerdictBalanced, "one of 3 slots, each 1/3: 1 connect, 2 refused", "socket cookie's hash", []string{"10.1.0.1:80", "-", "-"}},
		{"no endpoints", []string{"10.96.0.3:80"}, VerdictRefused, "ECONNREFUSED: the Service has no ready", "count 0", nil},
		{"IPv6 backend for IPv4 sockets", []string{"10.96.0.4:80"}, VerdictRefused, "none of the 1 slots", "", []string{"[fd00::1]:80"}},
		{"affinity to an IPv6 backend", []string{"live", "10.96.0.4:80"}, VerdictRefused, "affinity entry names an IPv6 backend", "IPv4 sockets are refused", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, sys := newFake()
			in := &inspector{src: src, sys: sys}
			res, err := in.run(context.Background(), Config{Command: append([]string{"explain"}, c.args...)})
			if err != nil {
				t.Fatal(err)
			}
			e := res.(*Explanation)
			var bes []string
			for _, cand := range e.Candidates {
				bes = append(bes, cand.Backend)
			}
			if e.Verdict != c.verdict || !strings.Contains(e.Summary, c.summary) ||
				!strings.Contains(strings.Join(e.Steps, "\n"), c.why) || strings.Join(bes, " ") != strings.Join(c.backends, " ") {
				t.Errorf("got verdict %s, summary %q, candidates %v, steps:\n%s", e.Verdict, e.Summary, bes, strings.Join(e.Steps, "\n"))
			}
		})
	}
}

func TestExplainErrors(t *testing.T) {
	src, sys := newFake()
	in := &inspector{src: src, sys: sys}
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"10.96.0.99:80"}, ExitNotFound},
		{[]string{"nobody", "10.96.0.1:80"}, ExitNotFound},
		{[]string{"10.96.0.1"}, ExitUsage},
	} {
		_, err := in.run(context.Background(), Config{Command: append([]string{"explain"}, c.args...)})
		if exitCodeOf(err) != c.code {
			t.Errorf("explain %v: %v, want exit %d", c.args, err, c.code)
		}
	}
}

func TestFakeStateOutputsMatchGoldens(t *testing.T) {
	for _, c := range []struct {
		golden string
		cmd    []string
		raw    bool
	}{
		{"fake-status", []string{"status"}, false},
		{"fake-affinity-list", []string{"affinity", "list"}, false},
		{"fake-sockets", []string{"sockets"}, false},
		{"fake-prog-list", []string{"prog", "list"}, false},
		{"fake-explain-partial", []string{"explain", "10.96.0.2:53/UDP"}, false},
		{"fake-map-dump-rev-nat", []string{"map", "dump", ebpf.MapRevNat}, false},
		{"fake-map-dump-names", []string{"map", "dump", ebpf.MapServiceNames}, false},
		{"fake-map-dump-raw-short", []string{"map", "dump", ebpf.MapMeta}, true},
		{"fake-map-dump-raw-long", []string{"map", "dump", ebpf.MapBackends}, true},
	} {
		t.Run(c.golden, func(t *testing.T) {
			src, sys := newFake()
			in := &inspector{src: src, sys: sys, node: "fake"}
			res, err := in.run(context.Background(), Config{Command: c.cmd, Raw: c.raw})
			if err != nil {
				t.Fatal(err)
			}
			renderAll(t, c.golden, res)
		})
	}
}

func TestStatusModeWithoutPrograms(t *testing.T) {
	src, sys := newFake()
	src.programs = nil
	in := &inspector{src: src, sys: sys}
	st, err := in.status()
	if err != nil || !strings.HasPrefix(st.Mode, "none") {
		t.Fatalf("mode %q, %v", st.Mode, err)
	}
}

func TestProgListEnableStatsReportsTheWindowOnly(t *testing.T) {
	src, sys := newFake()
	sys.onSleep = func() {
		src.programs[0].Runs += 7
		src.programs[0].RunTime += 7 * time.Microsecond
	}
	in := &inspector{src: src, sys: sys}
	res, err := in.run(context.Background(), Config{Command: []string{"prog", "list"}, EnableStats: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if sys.slept != 3*time.Second || sys.stats {
		t.Errorf("slept %s, stats left enabled: %v", sys.slept, sys.stats)
	}
	for _, p := range res.(ProgramList) {
		if p.Name == "waggle_connect4" && (p.Runs != 7 || p.RunTime != 7*time.Microsecond || p.Window != 3*time.Second) {
			t.Errorf("connect4: %+v, want the 7 runs of the window", p)
		}
	}
}

func TestMapDumpUnknownMapIsNotFound(t *testing.T) {
	src, sys := newFake()
	in := &inspector{src: src, sys: sys}
	for _, raw := range []bool{false, true} {
		_, err := in.run(context.Background(), Config{Command: []string{"map", "dump", "nope"}, Raw: raw})
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "waggle_services") {
			t.Errorf("raw=%v: %v", raw, err)
		}
	}
}

func TestDecodersRejectForeignSizes(t *testing.T) {
	if _, err := decodeRevNat([][]byte{{1, 0, 0, 0}}, [][]byte{make([]byte, 19)}); !errors.Is(err, ebpf.ErrLayoutMismatch) {
		t.Errorf("rev_nat: %v", err)
	}
	if _, err := decodeNames([][]byte{{1, 0, 0}}, [][]byte{make([]byte, 256)}); !errors.Is(err, ebpf.ErrLayoutMismatch) {
		t.Errorf("names: %v", err)
	}
}

func TestJSONAndYAMLAreMachineReadable(t *testing.T) {
	src, sys := newFake()
	in := &inspector{src: src, sys: sys}
	res, err := in.run(context.Background(), Config{Command: []string{"lb", "list"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{FormatJSON, FormatYAML} {
		var b bytes.Buffer
		if err := render(&b, format, res); err != nil {
			t.Fatal(err)
		}
		var back []Frontend
		var err error
		if format == FormatJSON {
			err = json.Unmarshal(b.Bytes(), &back)
		} else {
			err = yaml.Unmarshal(b.Bytes(), &back)
		}
		if err != nil || len(back) != 4 || back[1].Backends[2].State != StateBackendMissing {
			t.Errorf("%s round trip: %v %+v", format, err, back)
		}
	}
}

func TestRunRefusesAMissingCommandOrFormat(t *testing.T) {
	if err := Run(context.Background(), Config{}); exitCodeOf(err) != ExitUsage {
		t.Errorf("Run without command: %v", err)
	}
	if err := Run(context.Background(), Config{Command: []string{"status"}, Output: "xml"}); exitCodeOf(err) != ExitUsage {
		t.Errorf("Run with output xml: %v", err)
	}
}

func FuzzParseFrontend(f *testing.F) {
	for _, s := range []string{"10.96.0.10:80", "[fd00::1]:53/UDP", "1.2.3.4:0", "x", "[::ffff:1.2.3.4]:1/tcp", ":80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ap, p, err := parseFrontend(s)
		if err != nil {
			if exitCodeOf(err) != ExitUsage {
				t.Fatalf("%q: error %v is not a usage error", s, err)
			}
			return
		}
		if ap.Port() == 0 || ap.Addr().Is4In6() || (p != "" && p != "TCP" && p != "UDP") {
			t.Fatalf("%q accepted as %v %q", s, ap, p)
		}
	})
}

func FuzzDecodeRaw(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0}, make([]byte, 20))
	f.Add([]byte{1, 0, 0, 0}, make([]byte, 256))
	f.Add([]byte{1}, []byte{})
	f.Fuzz(func(t *testing.T, k, v []byte) {
		if r, err := decodeRevNat([][]byte{k}, [][]byte{v}); err == nil && (len(r) != 1 || len(v) != 20) {
			t.Fatalf("rev_nat accepted %d/%d bytes", len(k), len(v))
		}
		if n, err := decodeNames([][]byte{k}, [][]byte{v}); err == nil && (len(n) != 1 || len(n[0].Name) > 252) {
			t.Fatalf("names accepted %d/%d bytes", len(k), len(v))
		}
		var b bytes.Buffer
		(&RawDump{Map: "m", Entries: []RawEntry{{Key: k, Value: v}}}).writeTable(&b)
		if !strings.HasSuffix(b.String(), "Found 1 element\n") {
			t.Fatalf("raw dump:\n%s", b.String())
		}
	})
}
