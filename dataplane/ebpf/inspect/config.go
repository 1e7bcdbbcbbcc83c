package inspect

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/internal/cliflag"
)

// Exit codes of `waggle bpf`.
const (
	ExitOK       = 0
	ExitNotFound = 1
	ExitUsage    = 2
	// ExitNoState: this node has no dataplane state this Waggle can read
	// (nothing pinned, no bpffs mounted, or a map layout from another
	// Waggle version).
	ExitNoState = 3
	// ExitFailure: anything else (no permission, a kernel error).
	ExitFailure = 4
)

// Sentinel errors; Run's errors wrap one of them and carry the matching
// exit code (ExitCode).
var (
	ErrUsage      = errors.New("usage")
	ErrNotFound   = errors.New("not found")
	ErrNoState    = errors.New("no eBPF dataplane state on this node")
	ErrPermission = errors.New("permission denied")
)

// Output formats.
const (
	FormatTable = "table"
	FormatJSON  = "json"
	FormatYAML  = "yaml"
)

// Config is one invocation of `waggle bpf`.
type Config struct {
	// Command is the command words and arguments, e.g. ["lb", "get",
	// "10.96.0.10:80/TCP"].
	Command []string
	// Node selects the node's pin directory under ebpf.DefaultPinRoot.
	// Default: this machine's hostname (as the proxy's default), or
	// its lower-cased form when only that has pinned state.
	Node string
	// PinDir overrides the pin directory (then Node is informational).
	PinDir string
	// Output is table, json or yaml.
	Output string
	// Raw makes `map dump` print hex bytes as bpftool does.
	Raw bool
	// EnableStats, for `prog list`, turns the kernel's BPF run statistics
	// on for this long and reports the runs counted meanwhile.
	EnableStats time.Duration
	// Verdict filters `monitor`: drop (default), allow or all.
	Verdict string
	// Out receives the output (default os.Stdout).
	Out io.Writer
}

// ExitError is an error with the process exit code `waggle bpf` should
// end with (cmd/waggle honours ExitCode).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode is the process exit code.
func (e *ExitError) ExitCode() int { return e.Code }

// exitCodeOf maps an error to its exit code.
func exitCodeOf(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrUsage):
		return ExitUsage
	case errors.Is(err, ErrNotFound):
		return ExitNotFound
	case errors.Is(err, ErrNoState), errors.Is(err, ebpf.ErrNoPinnedState), errors.Is(err, ebpf.ErrLayoutMismatch):
		return ExitNoState
	}
	return ExitFailure
}

func withExitCode(err error) error {
	if err == nil {
		return nil
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return err
	}
	return &ExitError{Code: exitCodeOf(err), Err: err}
}

func usageErr(format string, args ...any) error {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%w: "+format, append([]any{ErrUsage}, args...)...)}
}

// Usage is the command summary printed by --help and after usage errors.
const Usage = `Usage: waggle bpf COMMAND [ARGS] [flags]

Inspect the eBPF dataplane's pinned maps and programs (read-only; works while
the proxy is down). Needs root.

Commands:
  status                            programs attached, map pressure, proxy mode, event counters
  lb list                           every frontend with its backend slots
  lb get VIP:PORT[/PROTO]           one frontend (every protocol when /PROTO is left out)
  map list                          pinned maps: type, key/value sizes, entries/max, path
  map dump NAME [--raw]             a map's entries, decoded (or hex bytes as bpftool prints them)
  affinity list                     session-affinity entries (client netns -> backend)
  sockets                           reverse-socket entries (socket -> backend, shown as frontend)
  explain [SRC] VIP:PORT[/PROTO]    which backend a connection would reach, and why; SRC is the
                                    client's network namespace: a name in /run/netns, a path,
                                    pid:N or cookie:N (affinity is kept per netns);
                                    PROTO defaults to TCP
  prog list [--enable-stats DUR]    attached programs: id, type, attach point, runs, run time
  nodeport status                   north-south devices (SNAT addresses) and counters
  nodeport ct                       north-south conntrack: both directions of each flow, NAT, expiry
  nodeport maglev                   each NodePort/ExternalIP/LoadBalancer frontend's Maglev table share per backend
  policy list                       NetworkPolicy endpoints: pod, identity, isolation, verdict counters
                                    (eBPF maps, or the iptables fallback's counters)
  policy get POD                    one endpoint (namespace/name, name, address or ifindex): its entries
                                    (peer identity, port, protocol, direction), policy, rule, hits
  explain policy SRC DST:PORT[/PROTO]
                                    whether a connection from SRC (an address) to DST is allowed,
                                    and by which policy and rule (eBPF only)
  monitor [--verdict drop|allow|all]
                                    NetworkPolicy verdicts as they happen (pod, peer, port, policy)

Exit codes: 0 ok, 1 not found, 2 usage, 3 no dataplane state on this node
(none pinned, bpffs not mounted, or a map layout from another Waggle), 4 other failure.

Flags (anywhere on the line; each also read from WAGGLE_<FLAG>):
`

// commands lists the valid command words with their argument counts.
var commands = map[string]struct{ min, max int }{
	"status":          {0, 0},
	"lb list":         {0, 0},
	"lb get":          {1, 1},
	"map list":        {0, 0},
	"map dump":        {1, 1},
	"affinity list":   {0, 0},
	"sockets":         {0, 0},
	"explain":         {1, 2},
	"prog list":       {0, 0},
	"policy list":     {0, 0},
	"policy get":      {1, 1},
	"explain policy":  {2, 2},
	"monitor":         {0, 0},
	"nodeport status": {0, 0},
	"nodeport ct":     {0, 0},
	"nodeport maglev": {0, 0},
}

// groups are the command words that take a second word.
var groups = map[string][]string{"policy": {"list", "get"}, "lb": {"list", "get"}, "map": {"list", "dump"}, "affinity": {"list"}, "prog": {"list"}, "nodeport": {"status", "ct", "maglev"}}

// ParseArgs parses `waggle bpf`'s arguments (flags may come anywhere;
// flags not given fall back to WAGGLE_<FLAG>). Errors carry ExitUsage;
// --help returns flag.ErrHelp after printing the usage to stderr.
func ParseArgs(args []string, stderr io.Writer) (Config, error) {
	var cfg Config
	fs := cliflag.NewFlagSet("bpf", "")
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.Node, "node", "", "node whose pinned state to read ("+ebpf.DefaultPinRoot+"/<node>; default: this host's name)")
	fs.StringVar(&cfg.PinDir, "pin-dir", "", "pin directory to read (overrides --node)")
	fs.StringVar(&cfg.Output, "o", FormatTable, "output format: table, json or yaml")
	fs.BoolVar(&cfg.Raw, "raw", false, "map dump: hex bytes as bpftool prints them")
	fs.StringVar(&cfg.Verdict, "verdict", "drop", "monitor: which NetworkPolicy verdicts to show: drop, allow or all")
	fs.DurationVar(&cfg.EnableStats, "enable-stats", 0, "prog list: enable BPF run statistics for this long and report the runs meanwhile")
	printUsage := func() {
		fmt.Fprint(stderr, Usage)
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage()
				return cfg, err
			}
			return cfg, usageErr("%v (see waggle bpf --help)", err)
		}
		rest = fs.Args()
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		rest = rest[1:]
	}
	// Environment fallback for the flags not given.
	if err := cliflag.Parse(fs, nil); err != nil {
		return cfg, usageErr("%v", err)
	}
	if len(pos) == 0 {
		printUsage()
		return cfg, usageErr("no command given")
	}
	cmd, args := pos[0], pos[1:]
	if subs, ok := groups[cmd]; ok {
		if len(args) == 0 || !contains(subs, args[0]) {
			return cfg, usageErr("%q needs one of: %s", cmd, strings.Join(prefixed(cmd, subs), ", "))
		}
		cmd, args = cmd+" "+args[0], args[1:]
	}
	if cmd == "explain" && len(args) > 0 && args[0] == "policy" {
		cmd, args = "explain policy", args[1:]
	}
	n, ok := commands[cmd]
	if !ok {
		return cfg, usageErr("unknown command %q (see waggle bpf --help)", cmd)
	}
	if len(args) < n.min || len(args) > n.max {
		return cfg, usageErr("%s takes %s, got %d: %q", cmd, argCount(n.min, n.max), len(args), args)
	}
	switch cfg.Output {
	case FormatTable, FormatJSON, FormatYAML:
	case "wide", "":
		cfg.Output = FormatTable
	default:
		return cfg, usageErr("-o %q: want table, json or yaml", cfg.Output)
	}
	if cfg.Raw && cmd != "map dump" {
		return cfg, usageErr("--raw applies to map dump only")
	}
	if cfg.EnableStats != 0 && cmd != "prog list" {
		return cfg, usageErr("--enable-stats applies to prog list only")
	}
	if cfg.EnableStats < 0 {
		return cfg, usageErr("--enable-stats %s: want a positive duration", cfg.EnableStats)
	}
	if cfg.Node != "" && strings.ContainsAny(cfg.Node, "/\x00") || cfg.Node == "." || cfg.Node == ".." {
		return cfg, usageErr("--node %q: not a node name", cfg.Node)
	}
	switch cfg.Verdict {
	case "drop", "allow", "all":
	default:
		return cfg, usageErr("--verdict %q: want drop, allow or all", cfg.Verdict)
	}
	if cmd == "explain policy" {
		if _, err := netip.ParseAddr(args[0]); err != nil {
			return cfg, usageErr("explain policy: SRC %q is not an address", args[0])
		}
		if _, _, err := parsePolicyDst(args[1]); err != nil {
			return cfg, err
		}
	}
	// Check the frontend (and SRC) now: a usage error wins over a node
	// without state.
	switch cmd {
	case "lb get", "explain":
		if _, _, err := parseFrontend(args[len(args)-1]); err != nil {
			return cfg, err
		}
	}
	if cmd == "explain" && len(args) == 2 {
		if err := checkSource(args[0]); err != nil {
			return cfg, err
		}
	}
	cfg.Command = append(strings.Fields(cmd), args...)
	return cfg, nil
}

func argCount(lo, hi int) string {
	switch {
	case lo == 0 && hi == 0:
		return "no arguments"
	case lo == hi:
		return fmt.Sprintf("%d argument(s)", lo)
	}
	return fmt.Sprintf("%d to %d arguments", lo, hi)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func prefixed(p string, xs []string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = p + " " + x
	}
	return out
}

// pinDir resolves the pin directory of cfg.
func (c Config) pinDir() (dir, node string, err error) {
	if c.PinDir != "" {
		return c.PinDir, c.Node, nil
	}
	node = c.Node
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", "", fmt.Errorf("no --node given and the hostname is unknown: %w", err)
		}
		node = h
		// Kubernetes node names are the lower-cased hostname; the proxy
		// defaults to the hostname as is. Take whichever has state.
		if l := strings.ToLower(h); l != h && !exists(ebpf.DefaultPinRoot+"/"+h) && exists(ebpf.DefaultPinRoot+"/"+l) {
			node = l
		}
	}
	return ebpf.DefaultPinRoot + "/" + node, node, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
