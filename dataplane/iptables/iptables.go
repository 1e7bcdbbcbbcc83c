// Package iptables is Waggle's iptables proxy backend: it programs a
// dataplane.State as kube-proxy-style NAT chains (WAGGLE-SERVICES,
// WAGGLE-SVC-<hash>, WAGGLE-SEP-<hash>, WAGGLE-NODEPORTS, WAGGLE-MARK-MASQ,
// WAGGLE-POSTROUTING) and filter chains that REJECT frontends without
// endpoints, written atomically with iptables-restore --noflush.
//
// It touches only chains named WAGGLE-* and its own jump rules in the
// built-in chains, so it coexists with other rules on the host. It never sets
// route_localnet (CVE-2020-8558), so 127.0.0.1 NodePorts are not served by
// this backend (compute the State with ComputeOptions.NoLoopbackNodePorts).
// It is not the place where what to program is decided: that is
// dataplane.Compute.
package iptables

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/waggle-io/waggle/dataplane"
)

// Chain names. Every chain the backend creates starts with ChainPrefix.
const (
	ChainPrefix      = "WAGGLE-"
	chainServices    = "WAGGLE-SERVICES"
	chainNodePorts   = "WAGGLE-NODEPORTS"
	chainMarkMasq    = "WAGGLE-MARK-MASQ"
	chainPostrouting = "WAGGLE-POSTROUTING"
	chainForward     = "WAGGLE-FORWARD"
	svcPrefix        = "WAGGLE-SVC-"
	sepPrefix        = "WAGGLE-SEP-"
	// fwPrefix: a LoadBalancer frontend's loadBalancerSourceRanges
	// (kube-proxy's KUBE-FW-): allowed sources jump on to its WAGGLE-SVC-.
	fwPrefix = "WAGGLE-FW-"
	// MasqueradeMark is the packet mark bit that asks WAGGLE-POSTROUTING to
	// masquerade (kube-proxy's 0x4000).
	MasqueradeMark = "0x4000"
	// ipvsPrefix names the IPVS backend's own chains, which this backend
	// leaves alone.
	ipvsPrefix = "WAGGLE-IPVS-"
)

// ownsChain reports whether chain is this backend's.
func ownsChain(name string) bool {
	return strings.HasPrefix(name, ChainPrefix) && !strings.HasPrefix(name, ipvsPrefix)
}

// Config configures the backend.
type Config struct {
	// Runner runs iptables; nil means an ExecRunner in NetNSPath.
	Runner Runner
	// NetNSPath, when set, programs the network namespace at this path
	// (e.g. /run/netns/x) instead of the caller's.
	NetNSPath string
	// FullSyncPeriod is the longest time between two full syncs (which
	// rewrite every chain and remove stray WAGGLE- chains); other syncs only
	// rewrite what changed. Default 1 hour.
	FullSyncPeriod time.Duration
	// Log receives the backend's logs (default slog.Default()).
	Log *slog.Logger
	// Metrics, when set, receives the backend's metrics.
	Metrics prometheus.Registerer
	// ChunkChains bounds the chains of one iptables-restore when a sync
	// writes many (default 2000; negative: one restore, one transaction).
	// See restorePlan.
	ChunkChains int
	// CompactAbove switches to the compact layout (RenderOptions.Compact)
	// when the State has more endpoints than this, over all frontends
	// (default: never, the kube-proxy layout).
	CompactAbove int
	// Now is the clock (default time.Now), for tests.
	Now func() time.Time
}

// Backend is the iptables dataplane.Backend.
type Backend struct {
	cfg    Config
	runner Runner
	log    *slog.Logger

	mu sync.Mutex
	// last holds, per family, the chains written by the last successful
	// sync (name → rendered rules) for partial syncs.
	last     map[Family]map[chainKey]string
	lastFull time.Time
	// udp holds the endpoints of the UDP frontends last programmed.
	udp          map[dataplane.FrontendKey][]dataplane.Endpoint
	forceFull    bool
	syncs        *prometheus.CounterVec
	restoreBytes prometheus.Histogram
}

type chainKey struct{ table, name string }

// New returns an iptables backend. It checks nothing in the kernel: Supported
// does.
func New(cfg Config) (*Backend, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.FullSyncPeriod == 0 {
		cfg.FullSyncPeriod = time.Hour
	}
	if cfg.CompactAbove == 0 {
		cfg.CompactAbove = -1
	}
	if cfg.ChunkChains == 0 {
		cfg.ChunkChains = 2000
	}
	r := cfg.Runner
	if r == nil {
		r = &ExecRunner{NetNSPath: cfg.NetNSPath}
	}
	b := &Backend{
		cfg: cfg, runner: r, log: cfg.Log.With("backend", "iptables"),
		last:      map[Family]map[chainKey]string{},
		forceFull: true,
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "waggle_proxy_iptables_syncs_total",
			Help: "iptables-restore runs by kind (full, partial) and result (ok, error).",
		}, []string{"kind", "result"}),
		restoreBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "waggle_proxy_iptables_restore_bytes",
			Help:    "Size of the iptables-restore input per sync and family.",
			Buckets: prometheus.ExponentialBuckets(256, 4, 10),
		}),
	}
	if cfg.Metrics != nil {
		for _, c := range []prometheus.Collector{b.syncs, b.restoreBytes} {
			if err := cfg.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("register iptables metrics: %w", err)
			}
		}
	}
	return b, nil
}

// Name implements dataplane.Backend.
func (b *Backend) Name() string { return "iptables" }

// RequestFullSync makes the next Sync a full one (the proxy's periodic
// resync does this to repair drift).
func (b *Backend) RequestFullSync() {
	b.mu.Lock()
	b.forceFull = true
	b.mu.Unlock()
}

// Jump is a rule in a built-in chain that leads to a Waggle chain (its
// rule ends with "-j <chain>").
type Jump struct {
	Table, Chain string
	Rule         []string
}

type jump = Jump

func jumps() []jump {
	c := func(s string) []string { return []string{"-m", "comment", "--comment", s} }
	return []jump{
		{"nat", "PREROUTING", append(c("waggle service portals"), "-j", chainServices)},
		{"nat", "OUTPUT", append(c("waggle service portals"), "-j", chainServices)},
		{"nat", "POSTROUTING", append(c("waggle postrouting rules"), "-j", chainPostrouting)},
		{"filter", "INPUT", append(append([]string{"-m", "conntrack", "--ctstate", "NEW"}, c("waggle service portals")...), "-j", chainServices)},
		{"filter", "FORWARD", append(append([]string{"-m", "conntrack", "--ctstate", "NEW"}, c("waggle service portals")...), "-j", chainServices)},
		{"filter", "OUTPUT", append(append([]string{"-m", "conntrack", "--ctstate", "NEW"}, c("waggle service portals")...), "-j", chainServices)},
		{"filter", "FORWARD", append(c("waggle forwarding rules"), "-j", chainForward)},
	}
}

// Sync implements dataplane.Backend: one iptables-restore per family that
// rewrites the dispatch chains and every per-service chain that changed (all
// of them on a full sync) and deletes the chains no longer wanted.
func (b *Backend) Sync(ctx context.Context, st *dataplane.State) error {
	if err := st.Validate(); err != nil {
		return fmt.Errorf("iptables sync: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	full := b.forceFull || b.cfg.Now().Sub(b.lastFull) >= b.cfg.FullSyncPeriod
	eps := 0
	for _, f := range st.Frontends {
		eps += len(f.Endpoints)
	}
	opts := RenderOptions{Compact: b.cfg.CompactAbove >= 0 && eps > b.cfg.CompactAbove}
	for _, fam := range []Family{IPv4, IPv6} {
		want := Render(st, fam, opts)
		if len(want.order) == 0 && b.last[fam] == nil && !full {
			continue
		}
		if err := b.syncFamily(ctx, fam, want, full); err != nil {
			b.forceFull = true
			return err
		}
	}
	if full {
		b.lastFull = b.cfg.Now()
		b.forceFull = false
	}
	b.clearStaleUDP(ctx, st)
	return nil
}

// clearStaleUDP deletes the conntrack entries of UDP flows whose endpoint
// was removed since the last sync, so that their next packet is load
// balanced again instead of following the old DNAT.
func (b *Backend) clearStaleUDP(ctx context.Context, st *dataplane.State) {
	now := map[dataplane.FrontendKey][]dataplane.Endpoint{}
	for _, f := range st.Frontends {
		if f.Protocol == dataplane.UDP {
			now[f.FrontendKey] = f.Endpoints
		}
	}
	cc, ok := b.runner.(ConntrackCleaner)
	for key, old := range b.udp {
		for _, e := range old {
			if slices.ContainsFunc(now[key], func(n dataplane.Endpoint) bool { return n.AddrPort() == e.AddrPort() }) || !ok {
				continue
			}
			fam := IPv4
			if key.Addr.Is6() {
				fam = IPv6
			}
			if err := cc.DeleteUDPFlows(ctx, fam, netip.AddrPortFrom(key.Addr, key.Port), e.Addr); err != nil {
				b.log.Warn("clear conntrack entries of a removed UDP endpoint", "frontend", key.String(), "endpoint", e.AddrPort().String(), "err", err)
			}
		}
	}
	b.udp = now
}

func (b *Backend) syncFamily(ctx context.Context, fam Family, want *Ruleset, full bool) error {
	kind := "partial"
	var existing map[chainKey]bool
	if full {
		kind = "full"
		var err error
		existing, err = b.existingChains(ctx, fam)
		if err != nil {
			b.syncs.WithLabelValues(kind, "error").Inc()
			return err
		}
	} else {
		existing = map[chainKey]bool{}
		for k := range b.last[fam] {
			existing[k] = true
		}
	}
	chunks, data := want.restorePlan(b.last[fam], existing, full, b.cfg.ChunkChains)
	for i, c := range chunks {
		b.restoreBytes.Observe(float64(len(c)))
		if err := b.runner.Restore(ctx, fam, c); err != nil {
			b.syncs.WithLabelValues(kind, "error").Inc()
			return fmt.Errorf("iptables-restore (%s, %s sync, chunk %d of %d): %w", fam, kind, i+1, len(chunks), err)
		}
	}
	b.restoreBytes.Observe(float64(len(data)))
	if err := b.runner.Restore(ctx, fam, data); err != nil {
		b.syncs.WithLabelValues(kind, "error").Inc()
		return fmt.Errorf("iptables-restore (%s, %s sync): %w", fam, kind, err)
	}
	if full || b.last[fam] == nil {
		for _, j := range jumps() {
			if err := b.runner.EnsureRule(ctx, fam, j.Table, j.Chain, j.Rule...); err != nil {
				b.syncs.WithLabelValues(kind, "error").Inc()
				return fmt.Errorf("ensure jump %s/%s -> %s (%s): %w", j.Table, j.Chain, j.Rule[len(j.Rule)-1], fam, err)
			}
		}
	}
	b.last[fam] = want.chains
	b.syncs.WithLabelValues(kind, "ok").Inc()
	b.log.Debug("iptables synced", "family", fam.String(), "kind", kind, "chains", len(want.order), "bytes", len(data))
	return nil
}

// existingChains lists the WAGGLE- chains the kernel has in both tables.
func (b *Backend) existingChains(ctx context.Context, fam Family) (map[chainKey]bool, error) {
	out := map[chainKey]bool{}
	for _, table := range []string{"filter", "nat"} {
		data, err := b.runner.Save(ctx, fam, table)
		if err != nil {
			return nil, fmt.Errorf("iptables-save -t %s (%s): %w", table, fam, err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, ":") {
				if name, _, _ := strings.Cut(line[1:], " "); ownsChain(name) {
					out[chainKey{table, name}] = true
				}
			}
		}
	}
	return out, nil
}

// Cleanup implements dataplane.Backend: it removes the jump rules and every
// WAGGLE- chain of both tables and families. Running it twice is harmless.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, fam := range []Family{IPv4, IPv6} {
		if err := cleanupFamily(ctx, b.runner, fam); err != nil {
			errs = append(errs, err)
		}
		delete(b.last, fam)
	}
	b.forceFull = true
	if len(errs) > 0 {
		return fmt.Errorf("iptables cleanup: %w", joinErrs(errs))
	}
	return nil
}

func cleanupFamily(ctx context.Context, r Runner, fam Family) error {
	return RemoveChains(ctx, r, fam, ownsChain, jumps())
}

// RemoveChains deletes the jumps whose target chain exists, then flushes and
// deletes every chain of the filter and nat tables for which owns is true.
// Nothing there is success.
func RemoveChains(ctx context.Context, r Runner, fam Family, owns func(chain string) bool, jumps []Jump) error {
	exists := map[chainKey]bool{}
	owned := map[string][]string{}
	for _, table := range []string{"filter", "nat"} {
		data, err := r.Save(ctx, fam, table)
		if err != nil {
			return fmt.Errorf("iptables-save -t %s (%s): %w", table, fam, err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, ":") {
				name, _, _ := strings.Cut(line[1:], " ")
				exists[chainKey{table, name}] = true
				if owns(name) {
					owned[table] = append(owned[table], name)
				}
			}
		}
	}
	for _, j := range jumps {
		if !exists[chainKey{j.Table, j.Rule[len(j.Rule)-1]}] {
			continue // its target is gone, so is the jump
		}
		if err := r.DeleteRule(ctx, fam, j.Table, j.Chain, j.Rule...); err != nil {
			return fmt.Errorf("delete jump %s/%s (%s): %w", j.Table, j.Chain, fam, err)
		}
	}
	// Flush every owned chain, then delete them, in restores of at most
	// removeChunk chains: once all are flushed no chain references
	// another, so the deletions can be split in any order (one restore of
	// 100,000 chains takes iptables-nft minutes; see restorePlan).
	const removeChunk = 2000
	for _, op := range []string{"flush", "delete"} {
		for _, table := range []string{"filter", "nat"} {
			names := owned[table]
			for len(names) > 0 {
				n := min(len(names), removeChunk)
				var buf bytes.Buffer
				fmt.Fprintf(&buf, "*%s\n", table)
				for _, c := range names[:n] {
					if op == "flush" {
						fmt.Fprintf(&buf, ":%s - [0:0]\n", c)
					} else {
						fmt.Fprintf(&buf, "-X %s\n", c)
					}
				}
				buf.WriteString("COMMIT\n")
				if err := r.Restore(ctx, fam, buf.Bytes()); err != nil {
					return fmt.Errorf("%s chains (%s): %w", op, fam, err)
				}
				names = names[n:]
			}
		}
	}
	return nil
}

func joinErrs(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return fmt.Errorf("%w (and %d more: %s)", errs[0], len(errs)-1, strings.Join(msgs[1:], "; "))
}

// Ruleset is the rendered rules of one family: every Waggle chain and its
// rules, in restore order.
type Ruleset struct {
	order  []chainKey
	chains map[chainKey]string
}

// RenderOptions choose the layout.
type RenderOptions struct {
	// Compact leaves out the per-endpoint WAGGLE-SEP- chains: each
	// endpoint's rules go into its service chain. iptables-nft resolves
	// every jump target by a linear search of the table's chains, so with
	// tens of thousands of endpoints the kube-proxy layout takes minutes to
	// restore; the compact one takes seconds. Hairpin traffic is then
	// masqueraded when its source is any endpoint of the service, not only
	// the one chosen.
	Compact bool
}

// firewall is a LoadBalancer frontend's loadBalancerSourceRanges chain.
type firewall struct {
	chain, svc, service string
	ranges              []netip.Prefix
}

// Render renders the chains of st's frontends of one family.
func Render(st *dataplane.State, fam Family, opts RenderOptions) *Ruleset {
	rs := &Ruleset{chains: map[chainKey]string{}}
	var (
		filterSvc, filterFwd        strings.Builder
		natSvc, natNodePorts        strings.Builder
		natMarkMasq, natPostrouting strings.Builder
		perService                  []chainKey
		perServiceRules             = map[chainKey]*strings.Builder{}
		firewalls                   []firewall
		bits                        = 32
		proto                       = func(p dataplane.Protocol) string { return strings.ToLower(string(p)) }
		rejectWith                  = "icmp-port-unreachable"
		clusterCIDR                 netip.Prefix
		newChain                    = func(name string) *strings.Builder {
			k := chainKey{"nat", name}
			if b, ok := perServiceRules[k]; ok {
				return b
			}
			b := &strings.Builder{}
			perServiceRules[k] = b
			perService = append(perService, k)
			return b
		}
	)
	if fam == IPv6 {
		bits, rejectWith = 128, "icmp6-port-unreachable"
	}
	for _, c := range st.ClusterCIDRs {
		if c.Addr().Is4() == (fam == IPv4) {
			clusterCIDR = c.Masked()
			break
		}
	}
	for _, f := range st.Frontends {
		if f.Addr.Is4() != (fam == IPv4) {
			continue
		}
		comment := fmt.Sprintf("%q", f.Service.String()+" "+kindComment(f.Kind))
		match := fmt.Sprintf("-d %s/%d -p %s -m comment --comment %s -m %s --dport %d", f.Addr, bits, proto(f.Protocol), comment, proto(f.Protocol), f.Port)
		if len(f.Endpoints) == 0 {
			fmt.Fprintf(&filterSvc, "-A %s %s -j REJECT --reject-with %s\n", chainServices, strings.Replace(match, comment, fmt.Sprintf("%q", f.Service.String()+" has no endpoints"), 1), rejectWith)
			continue
		}
		svcChain := svcPrefix + hash(f.Kind, f.FrontendKey.String())
		target := svcChain
		if len(f.SourceRanges) > 0 {
			// As kube-proxy: the dispatch jumps to a firewall chain that
			// passes only the allowed sources on; what it does not
			// DNAT still has the LB IP as destination, and filter drops it.
			target = fwPrefix + hash(f.Kind, f.FrontendKey.String())
			fmt.Fprintf(&filterSvc, "-A %s %s -j DROP\n", chainServices, strings.Replace(match, comment, fmt.Sprintf("%q", f.Service.String()+" traffic not accepted by loadBalancerSourceRanges"), 1))
		}
		if f.Kind == dataplane.NodePort {
			fmt.Fprintf(&natNodePorts, "-A %s %s -j %s\n", chainNodePorts, match, target)
		} else {
			fmt.Fprintf(&natSvc, "-A %s %s -j %s\n", chainServices, match, target)
		}
		sb := newChain(svcChain)
		if target != svcChain {
			firewalls = append(firewalls, firewall{target, svcChain, f.Service.String(), f.SourceRanges})
		}
		switch {
		case f.LocalOnly:
		case f.Kind == dataplane.ClusterIP:
			if clusterCIDR.IsValid() {
				fmt.Fprintf(sb, "-A %s ! -s %s %s -j %s\n", svcChain, clusterCIDR, match, chainMarkMasq)
			}
		default:
			fmt.Fprintf(sb, "-A %s -m comment --comment %q -j %s\n", svcChain, "masquerade traffic for "+f.Service.String()+" external destinations", chainMarkMasq)
		}
		seps := make([]string, len(f.Endpoints))
		for i, e := range f.Endpoints {
			seps[i] = sepPrefix + hash(f.Kind, f.FrontendKey.String(), e.AddrPort().String())
		}
		epComment := fmt.Sprintf("%q", f.Service.String())
		secs := 0
		if f.AffinityTimeout > 0 {
			secs = max(int(f.AffinityTimeout/time.Second), 1)
		}
		n := len(f.Endpoints)
		if opts.Compact {
			// No per-endpoint chains: hairpin, affinity and DNAT rules
			// live in the service chain (the recent lists keep the
			// endpoint chain's name).
			for _, e := range f.Endpoints {
				fmt.Fprintf(sb, "-A %s -s %s/%d -m comment --comment %q -j %s\n", svcChain, e.Addr, bits, f.Service.String()+" hairpin "+e.AddrPort().String(), chainMarkMasq)
			}
			if secs > 0 {
				for i, e := range f.Endpoints {
					fmt.Fprintf(sb, "-A %s -p %s -m comment --comment %q -m recent --update --seconds %d --reap --name %s --mask %s --rsource -m %s -j DNAT --to-destination %s\n",
						svcChain, proto(f.Protocol), f.Service.String()+" -> "+e.AddrPort().String(), secs, seps[i], fullMask(fam), proto(f.Protocol), e.AddrPort())
				}
			}
			for i, e := range f.Endpoints {
				stat := ""
				if i < n-1 {
					stat = " -m statistic --mode random --probability " + probability(n-i)
				}
				recent := ""
				if secs > 0 {
					recent = fmt.Sprintf(" -m recent --set --name %s --mask %s --rsource", seps[i], fullMask(fam))
				}
				fmt.Fprintf(sb, "-A %s -p %s -m comment --comment %q%s%s -m %s -j DNAT --to-destination %s\n",
					svcChain, proto(f.Protocol), f.Service.String()+" -> "+e.AddrPort().String(), stat, recent, proto(f.Protocol), e.AddrPort())
			}
			continue
		}
		if secs > 0 {
			for i, e := range f.Endpoints {
				fmt.Fprintf(sb, "-A %s -m comment --comment %q -m recent --rcheck --seconds %d --reap --name %s --mask %s --rsource -j %s\n",
					svcChain, f.Service.String()+" -> "+e.AddrPort().String(), secs, seps[i], fullMask(fam), seps[i])
			}
		}
		for i, e := range f.Endpoints {
			c := fmt.Sprintf("%q", f.Service.String()+" -> "+e.AddrPort().String())
			if i < n-1 {
				fmt.Fprintf(sb, "-A %s -m comment --comment %s -m statistic --mode random --probability %s -j %s\n", svcChain, c, probability(n-i), seps[i])
			} else {
				fmt.Fprintf(sb, "-A %s -m comment --comment %s -j %s\n", svcChain, c, seps[i])
			}
			ep := newChain(seps[i])
			fmt.Fprintf(ep, "-A %s -s %s/%d -m comment --comment %s -j %s\n", seps[i], e.Addr, bits, epComment, chainMarkMasq)
			recent := ""
			if secs > 0 {
				recent = fmt.Sprintf(" -m recent --set --name %s --mask %s --rsource", seps[i], fullMask(fam))
			}
			fmt.Fprintf(ep, "-A %s -p %s -m comment --comment %s%s -m %s -j DNAT --to-destination %s\n", seps[i], proto(f.Protocol), epComment, recent, proto(f.Protocol), e.AddrPort())
		}
	}
	// Firewall chains after every service and endpoint chain they jump to
	// (a chunked restore may write them in a later chunk, never an earlier).
	for _, fw := range firewalls {
		fb := newChain(fw.chain)
		for _, r := range fw.ranges {
			fmt.Fprintf(fb, "-A %s -s %s -m comment --comment %q -j %s\n", fw.chain, r, fw.service+" loadBalancerSourceRanges", fw.svc)
		}
	}
	fmt.Fprintf(&natSvc, "-A %s -m comment --comment %q -m addrtype --dst-type LOCAL -j %s\n", chainServices, "waggle service nodeports; NOTE: this must be the last rule in this chain", chainNodePorts)
	fmt.Fprintf(&filterFwd, "-A %s -m comment --comment %q -m mark --mark %s/%s -j ACCEPT\n", chainForward, "waggle forwarding rules", MasqueradeMark, MasqueradeMark)
	fmt.Fprintf(&filterFwd, "-A %s -m comment --comment %q -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n", chainForward, "waggle forwarding conntrack rule")
	fmt.Fprintf(&natMarkMasq, "-A %s -j MARK --or-mark %s\n", chainMarkMasq, MasqueradeMark)
	fmt.Fprintf(&natPostrouting, "-A %s -m mark ! --mark %s/%s -j RETURN\n", chainPostrouting, MasqueradeMark, MasqueradeMark)
	fmt.Fprintf(&natPostrouting, "-A %s -j MARK --xor-mark %s\n", chainPostrouting, MasqueradeMark)
	fmt.Fprintf(&natPostrouting, "-A %s -m comment --comment %q -j MASQUERADE\n", chainPostrouting, "waggle service traffic requiring SNAT")

	put := func(k chainKey, rules string) {
		rs.order = append(rs.order, k)
		rs.chains[k] = rules
	}
	put(chainKey{"filter", chainServices}, filterSvc.String())
	put(chainKey{"filter", chainForward}, filterFwd.String())
	put(chainKey{"nat", chainServices}, natSvc.String())
	put(chainKey{"nat", chainNodePorts}, natNodePorts.String())
	put(chainKey{"nat", chainMarkMasq}, natMarkMasq.String())
	put(chainKey{"nat", chainPostrouting}, natPostrouting.String())
	for _, k := range perService {
		put(k, perServiceRules[k].String())
	}
	return rs
}

// RestoreInput is the iptables-restore input of a full sync from nothing
// (what the golden files show).
func (rs *Ruleset) RestoreInput() []byte {
	return rs.restoreInput(nil, map[chainKey]bool{}, true)
}

// restoreInput writes the chains that differ from last (all when full), and
// deletes the existing Waggle chains that are no longer wanted.
func (rs *Ruleset) restoreInput(last map[chainKey]string, existing map[chainKey]bool, full bool) []byte {
	_, final := rs.restorePlan(last, existing, full, 0)
	return final
}

// restorePlan returns the iptables-restore inputs of a sync: chunks, to be
// restored first, each rewriting whole services (a WAGGLE-SVC- chain with
// its WAGGLE-SEP- chains) that nothing references yet or that switch
// atomically; then final, which rewrites the dispatch chains and the other
// changed chains and deletes the stale ones.
//
// Chunks exist because iptables-nft (1.8.9) finds the chain of every rule
// and jump by a linear search of the chains its batch touches: one restore
// of 10,000 services with 10 endpoints each costs minutes of CPU, while
// restores of at most chunkChains chains each cost seconds in all. With
// chunkChains 0, or few chains to write, everything is in final.
func (rs *Ruleset) restorePlan(last map[chainKey]string, existing map[chainKey]bool, full bool, chunkChains int) (chunks [][]byte, final []byte) {
	var write []chainKey
	for _, k := range rs.order {
		if k.table != "nat" || isDispatch(k.name) {
			continue
		}
		if prev, had := last[k]; full || !had || prev != rs.chains[k] {
			write = append(write, k)
		}
	}
	chunked := map[chainKey]bool{}
	if chunkChains > 0 && len(write) > chunkChains {
		masq := chainKey{"nat", chainMarkMasq}
		var cur []chainKey
		flush := func() {
			if len(cur) == 0 {
				return
			}
			var b bytes.Buffer
			b.WriteString("*nat\n")
			fmt.Fprintf(&b, ":%s - [0:0]\n", chainMarkMasq) // endpoint chains jump to it
			for _, k := range cur {
				fmt.Fprintf(&b, ":%s - [0:0]\n", k.name)
			}
			b.WriteString(rs.chains[masq])
			for _, k := range cur {
				b.WriteString(rs.chains[k])
				chunked[k] = true
			}
			b.WriteString("COMMIT\n")
			chunks = append(chunks, b.Bytes())
			cur = nil
		}
		for _, k := range write {
			// Start a new chunk only at a service chain, so that a
			// service and its endpoint chains switch together.
			if strings.HasPrefix(k.name, svcPrefix) && len(cur) >= chunkChains {
				flush()
			}
			cur = append(cur, k)
		}
		flush()
	}
	size := 0
	for _, k := range rs.order {
		size += len(rs.chains[k]) + len(k.name) + 16
	}
	var buf bytes.Buffer
	buf.Grow(size + 64)
	var body strings.Builder
	body.Grow(size)
	for _, table := range []string{"filter", "nat"} {
		fmt.Fprintf(&buf, "*%s\n", table)
		body.Reset()
		for _, k := range rs.order {
			if k.table != table {
				continue
			}
			rules := rs.chains[k]
			prev, had := last[k]
			if !full && had && prev == rules {
				continue // unchanged chain: left as it is
			}
			if chunked[k] {
				continue // written by a chunk
			}
			fmt.Fprintf(&buf, ":%s - [0:0]\n", k.name)
			body.WriteString(rules)
		}
		var stale []string
		for k := range existing {
			if k.table == table {
				if _, ok := rs.chains[k]; !ok {
					stale = append(stale, k.name)
				}
			}
		}
		slices.Sort(stale)
		for _, n := range stale {
			fmt.Fprintf(&buf, ":%s - [0:0]\n", n)
		}
		buf.WriteString(body.String())
		for _, n := range stale {
			fmt.Fprintf(&buf, "-X %s\n", n)
		}
		buf.WriteString("COMMIT\n")
	}
	return chunks, buf.Bytes()
}

func isDispatch(name string) bool {
	return !strings.HasPrefix(name, svcPrefix) && !strings.HasPrefix(name, sepPrefix) && !strings.HasPrefix(name, fwPrefix)
}

func kindComment(k dataplane.FrontendKind) string {
	switch k {
	case dataplane.ClusterIP:
		return "cluster IP"
	case dataplane.NodePort:
		return "node port"
	case dataplane.ExternalIP:
		return "external IP"
	case dataplane.LoadBalancer:
		return "loadbalancer IP"
	}
	return string(k)
}

func fullMask(fam Family) string {
	if fam == IPv6 {
		return "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
	}
	return "255.255.255.255"
}

// probability is kube-proxy's: the chance of picking the first of n
// remaining endpoints, with ten decimals.
func probability(n int) string { return fmt.Sprintf("%0.10f", 1.0/float64(n)) }

// hash returns 16 base32 characters of the SHA-256 of parts, as kube-proxy
// names its chains (WAGGLE-SVC- + 16 = 27 characters, under the limit of 28).
func hash(kind dataplane.FrontendKind, parts ...string) string {
	h := sha256.Sum256([]byte(string(kind) + "|" + strings.Join(parts, "|")))
	return base32.StdEncoding.EncodeToString(h[:])[:16]
}
