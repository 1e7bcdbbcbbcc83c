package ipvs

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/iptables"
)

// The IPVS backend's iptables chains (kube-proxy's IPVS mode marks for
// masquerade with ipsets; a rule per frontend does the same without them).
const (
	chainServices    = "WAGGLE-IPVS-SERVICES"
	chainMarkMasq    = "WAGGLE-IPVS-MARK-MASQ"
	chainPostrouting = "WAGGLE-IPVS-POSTROUTING"
	chainFilter      = "WAGGLE-IPVS-FILTER"
	chainPrefix      = "WAGGLE-IPVS-"
	masqMark         = iptables.MasqueradeMark
)

type jump = iptables.Jump

func jumps() []jump {
	c := func(s string) []string { return []string{"-m", "comment", "--comment", s} }
	newConn := []string{"-m", "conntrack", "--ctstate", "NEW"}
	return []jump{
		{Table: "nat", Chain: "PREROUTING", Rule: append(c("waggle ipvs service portals"), "-j", chainServices)},
		{Table: "nat", Chain: "OUTPUT", Rule: append(c("waggle ipvs service portals"), "-j", chainServices)},
		{Table: "nat", Chain: "POSTROUTING", Rule: append(c("waggle ipvs postrouting rules"), "-j", chainPostrouting)},
		{Table: "filter", Chain: "INPUT", Rule: append(append(newConn, c("waggle ipvs services without endpoints")...), "-j", chainFilter)},
		{Table: "filter", Chain: "OUTPUT", Rule: append(append(newConn, c("waggle ipvs services without endpoints")...), "-j", chainFilter)},
		{Table: "filter", Chain: "FORWARD", Rule: append(append(newConn, c("waggle ipvs services without endpoints")...), "-j", chainFilter)},
	}
}

// RenderRules returns the iptables-restore input for st's frontends of one
// family.
func RenderRules(st *dataplane.State, fam iptables.Family) []byte {
	bits, reject := 32, "icmp-port-unreachable"
	if fam == iptables.IPv6 {
		bits, reject = 128, "icmp6-port-unreachable"
	}
	var cidr netip.Prefix
	for _, c := range st.ClusterCIDRs {
		if c.Addr().Is4() == (fam == iptables.IPv4) {
			cidr = c.Masked()
			break
		}
	}
	var filter, nat bytes.Buffer
	for _, f := range st.Frontends {
		if f.Addr.Is4() != (fam == iptables.IPv4) {
			continue
		}
		p := strings.ToLower(string(f.Protocol))
		match := fmt.Sprintf("-d %s/%d -p %s -m comment --comment %q -m %s --dport %d", f.Addr, bits, p, f.Service.String()+" "+string(f.Kind), p, f.Port)
		switch {
		case len(f.Endpoints) == 0:
			fmt.Fprintf(&filter, "-A %s %s -j REJECT --reject-with %s\n", chainFilter, match, reject)
		case f.LocalOnly:
		case f.Kind == dataplane.ClusterIP:
			if cidr.IsValid() {
				fmt.Fprintf(&nat, "-A %s ! -s %s %s -j %s\n", chainServices, cidr, match, chainMarkMasq)
			}
		default:
			fmt.Fprintf(&nat, "-A %s %s -j %s\n", chainServices, match, chainMarkMasq)
		}
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "*filter\n:%s - [0:0]\n%sCOMMIT\n", chainFilter, filter.String())
	fmt.Fprintf(&out, "*nat\n:%s - [0:0]\n:%s - [0:0]\n:%s - [0:0]\n", chainServices, chainMarkMasq, chainPostrouting)
	out.WriteString(nat.String())
	fmt.Fprintf(&out, "-A %s -j MARK --or-mark %s\n", chainMarkMasq, masqMark)
	fmt.Fprintf(&out, "-A %s -m mark ! --mark %s/%s -j RETURN\n", chainPostrouting, masqMark, masqMark)
	fmt.Fprintf(&out, "-A %s -j MARK --xor-mark %s\n", chainPostrouting, masqMark)
	fmt.Fprintf(&out, "-A %s -m comment --comment %q -j MASQUERADE\n", chainPostrouting, "waggle ipvs service traffic requiring SNAT")
	out.WriteString("COMMIT\n")
	return out.Bytes()
}

func (b *Backend) syncRules(ctx context.Context, st *dataplane.State) error {
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		if err := b.runner.Restore(ctx, fam, RenderRules(st, fam)); err != nil {
			return fmt.Errorf("ipvs masquerade rules (%s): %w", fam, err)
		}
		if b.jumped {
			continue
		}
		for _, j := range jumps() {
			if err := b.runner.EnsureRule(ctx, fam, j.Table, j.Chain, j.Rule...); err != nil {
				return fmt.Errorf("ensure jump %s/%s (%s): %w", j.Table, j.Chain, fam, err)
			}
		}
	}
	b.jumped = true
	return nil
}

// CleanupRules removes the IPVS backend's jumps and chains.
func CleanupRules(ctx context.Context, r iptables.Runner) error {
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		if err := iptables.RemoveChains(ctx, r, fam, func(c string) bool { return strings.HasPrefix(c, chainPrefix) }, jumps()); err != nil {
			return err
		}
	}
	return nil
}
