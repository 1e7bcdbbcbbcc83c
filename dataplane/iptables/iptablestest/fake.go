// Package iptablestest is an in-memory iptables for the dataplane's unit
// tests: FakeRunner implements iptables.Runner and traces connections through
// the rules it holds.
package iptablestest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/waggle-io/waggle/dataplane/iptables"
)

// FakeRunner is an in-memory iptables for unit tests: it keeps the filter and
// nat tables of both families, applies iptables-restore input with the
// kernel's checks (a rule must name existing chains, a chain in use cannot be
// deleted, a failed restore changes nothing) and can trace a new connection
// through the rules (Connect), interpreting the matches and targets this
// backend writes. It serves tests only.
type FakeRunner struct {
	// LocalAddrs are the addresses `-m addrtype --dst-type LOCAL` matches.
	LocalAddrs []netip.Addr
	// FailRestore, when set, makes Restore fail with it (fault injection).
	FailRestore error
	// Now is the clock of the recent module (default time.Now).
	Now func() time.Time
	// Float64 is the statistic module's random source (default math/rand).
	Float64 func() float64

	mu       sync.Mutex
	flushes  []string
	tables   map[iptables.Family]map[string]*fakeTable
	restores []string
	recent   map[string]map[netip.Addr]time.Time
}

type fakeTable struct {
	order []string            // user chains in creation order
	rules map[string][]string // chain → rule specs (after "-A CHAIN ")
}

var builtins = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
}

// NewFakeRunner returns an empty fake with the built-in chains.
func NewFakeRunner(localAddrs ...netip.Addr) *FakeRunner {
	return &FakeRunner{LocalAddrs: localAddrs}
}

func (f *FakeRunner) table(fam iptables.Family, name string) (*fakeTable, error) {
	if _, ok := builtins[name]; !ok {
		return nil, fmt.Errorf("table %q does not exist", name)
	}
	if f.tables == nil {
		f.tables = map[iptables.Family]map[string]*fakeTable{}
	}
	if f.tables[fam] == nil {
		f.tables[fam] = map[string]*fakeTable{}
	}
	t := f.tables[fam][name]
	if t == nil {
		t = &fakeTable{rules: map[string][]string{}}
		for _, c := range builtins[name] {
			t.rules[c] = nil
		}
		f.tables[fam][name] = t
	}
	return t, nil
}

func (t *fakeTable) clone() *fakeTable {
	c := &fakeTable{order: slices.Clone(t.order), rules: map[string][]string{}}
	for k, v := range t.rules {
		c.rules[k] = slices.Clone(v)
	}
	return c
}

func isBuiltin(table, chain string) bool { return slices.Contains(builtins[table], chain) }

// jumpTarget returns the chain a rule spec jumps to, if it is a user chain.
func jumpTarget(spec string) string {
	toks := tokenize(spec)
	for i, t := range toks {
		if (t == "-j" || t == "-g") && i+1 < len(toks) {
			return toks[i+1]
		}
	}
	return ""
}

var standardTargets = map[string]bool{"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "DNAT": true, "SNAT": true, "MASQUERADE": true, "MARK": true}

// Restore implements iptables.Runner (always as --noflush).
func (f *FakeRunner) Restore(_ context.Context, fam iptables.Family, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restores = append(f.restores, string(data))
	if f.FailRestore != nil {
		return f.FailRestore
	}
	staged := map[string]*fakeTable{}
	var cur *fakeTable
	var curName string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	line := 0
	fail := func(format string, args ...any) error {
		return fmt.Errorf("iptables-restore: line %d failed: %s", line, fmt.Sprintf(format, args...))
	}
	for sc.Scan() {
		line++
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "*"):
			t, err := f.table(fam, l[1:])
			if err != nil {
				return fail("%v", err)
			}
			curName, cur = l[1:], t.clone()
		case cur == nil:
			return fail("%q outside a table", l)
		case l == "COMMIT":
			for _, specs := range cur.rules {
				for _, s := range specs {
					if tgt := jumpTarget(s); tgt != "" && !standardTargets[tgt] {
						if _, ok := cur.rules[tgt]; !ok {
							return fail("chain %s does not exist", tgt)
						}
					}
				}
			}
			staged[curName], cur = cur, nil
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l[1:], " ")
			if _, ok := cur.rules[name]; !ok {
				cur.order = append(cur.order, name)
			}
			if !isBuiltin(curName, name) {
				cur.rules[name] = nil // --noflush: a declared chain is flushed
			}
		case strings.HasPrefix(l, "-A "):
			chain, spec, _ := strings.Cut(l[3:], " ")
			if _, ok := cur.rules[chain]; !ok {
				return fail("chain %s does not exist", chain)
			}
			cur.rules[chain] = append(cur.rules[chain], spec)
		case strings.HasPrefix(l, "-X "):
			name := strings.TrimSpace(l[3:])
			if _, ok := cur.rules[name]; !ok || isBuiltin(curName, name) {
				return fail("cannot delete chain %s: no such chain", name)
			}
			for c, specs := range cur.rules {
				for _, s := range specs {
					if jumpTarget(s) == name && c != name {
						return fail("cannot delete chain %s: in use by %s", name, c)
					}
				}
			}
			delete(cur.rules, name)
			cur.order = slices.DeleteFunc(cur.order, func(s string) bool { return s == name })
		default:
			return fail("unsupported line %q", l)
		}
	}
	if cur != nil {
		return fail("no COMMIT")
	}
	for name, t := range staged {
		f.tables[fam][name] = t
	}
	return nil
}

// Save implements iptables.Runner, in iptables-save's layout (without counters).
func (f *FakeRunner) Save(_ context.Context, fam iptables.Family, table string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.table(fam, table)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%s\n", table)
	for _, c := range builtins[table] {
		fmt.Fprintf(&b, ":%s ACCEPT [0:0]\n", c)
	}
	users := slices.Clone(t.order)
	users = slices.DeleteFunc(users, func(s string) bool { return isBuiltin(table, s) })
	slices.Sort(users)
	for _, c := range users {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, c := range append(slices.Clone(builtins[table]), users...) {
		for _, s := range t.rules[c] {
			fmt.Fprintf(&b, "-A %s %s\n", c, s)
		}
	}
	b.WriteString("COMMIT\n")
	return b.Bytes(), nil
}

func quoteArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \"") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// EnsureRule implements iptables.Runner.
func (f *FakeRunner) EnsureRule(_ context.Context, fam iptables.Family, table, chain string, rule ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.table(fam, table)
	if err != nil {
		return err
	}
	specs, ok := t.rules[chain]
	if !ok {
		return fmt.Errorf("iptables: chain %s does not exist", chain)
	}
	spec := quoteArgs(rule)
	if slices.Contains(specs, spec) {
		return nil
	}
	if tgt := jumpTarget(spec); tgt != "" && !standardTargets[tgt] {
		if _, ok := t.rules[tgt]; !ok {
			return fmt.Errorf("iptables: chain %s does not exist", tgt)
		}
	}
	t.rules[chain] = append([]string{spec}, specs...)
	return nil
}

// DeleteRule implements iptables.Runner.
func (f *FakeRunner) DeleteRule(_ context.Context, fam iptables.Family, table, chain string, rule ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.table(fam, table)
	if err != nil {
		return err
	}
	spec := quoteArgs(rule)
	if tgt := jumpTarget(spec); tgt != "" && !standardTargets[tgt] {
		if _, ok := t.rules[tgt]; !ok {
			return fmt.Errorf("iptables: chain %s does not exist", tgt) // as iptables -D (exit 2)
		}
	}
	t.rules[chain] = slices.DeleteFunc(t.rules[chain], func(s string) bool { return s == spec })
	return nil
}

// Restores returns every iptables-restore input received, in order.
func (f *FakeRunner) Restores() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.restores)
}

// Dump returns iptables-save of filter and nat for fam.
func (f *FakeRunner) Dump(fam iptables.Family) string {
	a, _ := f.Save(context.Background(), fam, "filter")
	b, _ := f.Save(context.Background(), fam, "nat")
	return string(a) + string(b)
}

// Verdict is what the rules did to a new connection.
type Verdict struct {
	// Dst is the destination after NAT (unchanged when no rule matched).
	Dst netip.AddrPort
	// Rejected: a REJECT rule matched.
	Rejected bool
	// Dropped: a DROP rule matched (loadBalancerSourceRanges).
	Dropped bool
	// Masqueraded: the connection's source is rewritten on the way out.
	Masqueraded bool
}

// ErrNoVerdict: a trace ran off a chain's end in a way real iptables would
// not (a malformed ruleset).
var ErrNoVerdict = errors.New("fake iptables: malformed trace")

// Connect traces a new connection made by a local process from src to dst
// through nat OUTPUT, filter OUTPUT and nat POSTROUTING, as the kernel does
// for locally generated packets.
func (f *FakeRunner) Connect(fam iptables.Family, proto string, src netip.Addr, dst netip.AddrPort) (Verdict, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := &packet{proto: strings.ToLower(proto), src: src, dst: dst}
	v := Verdict{Dst: dst}
	for _, hop := range []struct{ table, chain string }{{"nat", "OUTPUT"}, {"filter", "OUTPUT"}, {"nat", "POSTROUTING"}} {
		t, err := f.table(fam, hop.table)
		if err != nil {
			return v, err
		}
		res, err := f.walk(t, hop.chain, p, 0)
		if err != nil {
			return v, err
		}
		switch res {
		case "REJECT":
			v.Rejected = true
			return v, nil
		case "DROP":
			v.Dropped = true
			return v, nil
		case "MASQUERADE":
			v.Masqueraded = true
		}
	}
	v.Dst = p.dst
	return v, nil
}

type packet struct {
	proto   string
	src     netip.Addr
	dst     netip.AddrPort
	mark    uint32
	natDone bool
}

// walk runs chain on p and returns the terminal target ("" when the chain
// ran to its end or RETURNed).
func (f *FakeRunner) walk(t *fakeTable, chain string, p *packet, depth int) (string, error) {
	if depth > 32 {
		return "", fmt.Errorf("%w: jump depth", ErrNoVerdict)
	}
	specs, ok := t.rules[chain]
	if !ok {
		return "", fmt.Errorf("%w: no chain %s", ErrNoVerdict, chain)
	}
	for _, spec := range specs {
		toks := tokenize(spec)
		matched, target, targs, err := f.match(toks, p)
		if err != nil {
			return "", fmt.Errorf("rule %q: %w", spec, err)
		}
		if !matched {
			continue
		}
		switch target {
		case "":
		case "RETURN":
			return "", nil
		case "ACCEPT", "REJECT", "DROP", "MASQUERADE":
			return target, nil
		case "DNAT":
			to, err := netip.ParseAddrPort(arg(targs, "--to-destination"))
			if err != nil {
				return "", fmt.Errorf("DNAT: %w", err)
			}
			p.dst, p.natDone = to, true
			return "DNAT", nil
		case "MARK":
			if v := arg(targs, "--or-mark"); v != "" {
				n, _ := strconv.ParseUint(v, 0, 32)
				p.mark |= uint32(n)
			}
			if v := arg(targs, "--xor-mark"); v != "" {
				n, _ := strconv.ParseUint(v, 0, 32)
				p.mark ^= uint32(n)
			}
		default:
			res, err := f.walk(t, target, p, depth+1)
			if err != nil || res != "" {
				return res, err
			}
		}
	}
	return "", nil
}

func arg(toks []string, name string) string {
	for i, t := range toks {
		if t == name && i+1 < len(toks) {
			return toks[i+1]
		}
	}
	return ""
}

// match evaluates a rule's matches and returns its target and the target's
// arguments.
func (f *FakeRunner) match(toks []string, p *packet) (bool, string, []string, error) {
	now := time.Now
	if f.Now != nil {
		now = f.Now
	}
	random := rand.Float64
	if f.Float64 != nil {
		random = f.Float64
	}
	ok := true
	neg := false
	var recentName, recentOp string
	var seconds int
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		next := func() string {
			i++
			if i < len(toks) {
				return toks[i]
			}
			return ""
		}
		res := true
		isMatch := true
		switch t {
		case "!":
			neg = true
			continue
		case "-s", "-d":
			pfx, err := netip.ParsePrefix(next())
			if err != nil {
				return false, "", nil, err
			}
			a := p.src
			if t == "-d" {
				a = p.dst.Addr()
			}
			res = pfx.Contains(a)
		case "-p":
			res = next() == p.proto
		case "--dport":
			n, _ := strconv.Atoi(next())
			res = uint16(n) == p.dst.Port()
		case "--probability":
			pr, err := strconv.ParseFloat(next(), 64)
			if err != nil {
				return false, "", nil, err
			}
			res = random() < pr
		case "--dst-type":
			res = next() == "LOCAL" && slices.Contains(f.LocalAddrs, p.dst.Addr())
		case "--ctstate":
			res = strings.Contains(next(), "NEW")
		case "--mark":
			v, m, _ := strings.Cut(next(), "/")
			val, _ := strconv.ParseUint(v, 0, 32)
			mask := uint64(0xffffffff)
			if m != "" {
				mask, _ = strconv.ParseUint(m, 0, 32)
			}
			res = uint64(p.mark)&mask == val
		case "--rcheck", "--set", "--update":
			recentOp = t
			isMatch = false
		case "--seconds":
			seconds, _ = strconv.Atoi(next())
			isMatch = false
		case "--name":
			recentName = next()
			isMatch = false
		case "-m", "--comment", "--mode", "--mask":
			next()
			isMatch = false
		case "--reap", "--rsource":
			isMatch = false
		case "-j":
			target := next()
			if !ok {
				return false, "", nil, nil
			}
			if recentOp != "" {
				if f.recent == nil {
					f.recent = map[string]map[netip.Addr]time.Time{}
				}
				switch recentOp {
				case "--rcheck", "--update":
					seen, found := f.recent[recentName][p.src]
					if !found || (seconds > 0 && now().Sub(seen) > time.Duration(seconds)*time.Second) {
						return false, "", nil, nil
					}
					if recentOp == "--update" {
						f.recent[recentName][p.src] = now()
					}
				case "--set":
					if f.recent[recentName] == nil {
						f.recent[recentName] = map[netip.Addr]time.Time{}
					}
					f.recent[recentName][p.src] = now()
				}
			}
			return true, target, toks[i+1:], nil
		default:
			return false, "", nil, fmt.Errorf("fake iptables does not know %q", t)
		}
		if isMatch {
			if neg {
				res = !res
			}
			ok = ok && res
		}
		neg = false
	}
	return false, "", nil, fmt.Errorf("%w: rule without -j", ErrNoVerdict)
}

// tokenize splits a rule spec like a shell would, honouring double quotes
// with backslash escapes (as iptables-save writes comments).
func tokenize(s string) []string {
	var out []string
	var cur strings.Builder
	in, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			quoted = !quoted
			in = true
		case c == ' ' && !quoted:
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// DeleteUDPFlows implements ConntrackCleaner by recording the call.
func (f *FakeRunner) DeleteUDPFlows(_ context.Context, fam iptables.Family, orig netip.AddrPort, endpoint netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flushes = append(f.flushes, fmt.Sprintf("%s %s via %s", fam, orig, endpoint))
	return nil
}

// ConntrackDeletes returns the DeleteUDPFlows calls received, in order.
func (f *FakeRunner) ConntrackDeletes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flushes)
}
