package cni

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/internal/netlinkdump"
)

// nf_tables over nfnetlink: only what reading a chain's rules and the
// table's chains takes (linux/netfilter/nf_tables.h, libnftnl's udata).
const (
	nfnlSubsysNFTables = 10
	nftMsgNewTable     = 0
	nftMsgGetTable     = 1
	nftMsgNewChain     = 3
	nftMsgGetChain     = 4
	nftMsgNewRule      = 6
	nftMsgGetRule      = 7
	nftaTableName      = 1
	nftaChainTable     = 1
	nftaChainName      = 3
	nftaRuleTable      = 1
	nftaRuleChain      = 2
	nftaRuleUserdata   = 7
	nfprotoInet        = 1
	udataRuleComment   = 0 // NFTNL_UDATA_RULE_COMMENT
)

func masqChain(network string) string { return "masq-" + network }

// masqueradeRules are the rules of the network's chain.
func masqueradeRules(cfg *Config) []string {
	var out []string
	for _, p := range cfg.PodCIDRs {
		fam, mcast := "ip", "224.0.0.0/4"
		if p.Addr().Is6() {
			fam, mcast = "ip6", "ff00::/8"
		}
		inside := p
		if cc, ok := cfg.ClusterCIDRFor(p); ok {
			inside = cc
		}
		out = append(out, fmt.Sprintf("%s saddr %s %s daddr != %s %s daddr != %s masquerade", fam, p, fam, inside, fam, mcast))
	}
	return out
}

// masqueradeTag is the comment every rule of the network's chain carries: a
// digest of the chain's name and all its rules, so that reading the
// comments back tells whether the chain holds exactly these rules.
func masqueradeTag(network string, rules []string) string {
	h := sha256.Sum256([]byte(masqChain(network) + "\n" + strings.Join(rules, "\n")))
	return "waggle-cni " + hex.EncodeToString(h[:8])
}

// ensureMasquerade makes sure the network's chain in Waggle's table holds
// exactly its rules. Reading the chain back over netlink costs one round
// trip; only when it differs (the node's first ADD, a changed
// configuration, a flushed ruleset, a rule removed or added by hand) is it
// rewritten, with one `nft -f -` transaction: idempotent and atomic (the
// chain is flushed and refilled in the same transaction). An exec of nft
// costs more CPU than all the rest of an ADD.
func ensureMasquerade(cfg *Config) error {
	rules := masqueradeRules(cfg)
	tag := masqueradeTag(cfg.Name, rules)
	if masqueradeInPlace(cfg.Name, tag, len(rules)) {
		return nil
	}
	chain := masqChain(cfg.Name)
	var b strings.Builder
	fmt.Fprintf(&b, "add table inet %s { comment \"pod masquerading of waggle-cni\" ; }\n", MasqueradeTable)
	fmt.Fprintf(&b, "add chain inet %s %s { type nat hook postrouting priority srcnat ; comment \"masquerade pods of network %s leaving the cluster CIDR\" ; }\n",
		MasqueradeTable, chain, cfg.Name)
	fmt.Fprintf(&b, "flush chain inet %s %s\n", MasqueradeTable, chain)
	for _, r := range rules {
		fmt.Fprintf(&b, "add rule inet %s %s %s comment %q\n", MasqueradeTable, chain, r, tag)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return types.NewError(ErrPluginNotAvailable, "nft is not installed: masquerading needs nftables 1.0.1 or later",
			"install nftables or set \"masquerade\": false")
	}
	if err := nftApply(b.String()); err != nil {
		return ioError("write masquerade rules (nft table inet %s): %v", MasqueradeTable, err)
	}
	return nil
}

// nftApply runs script as one `nft -f -` transaction; the error carries
// nft's output.
func nftApply(script string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// masqueradeInPlace reports whether the network's chain holds n rules, each
// tagged tag, reading it with one netlink dump. Any error (no table, no
// chain, an interrupted dump) is "no": the caller then writes the chain.
func masqueradeInPlace(network, tag string, n int) bool {
	comments, err := nftRuleComments(MasqueradeTable, masqChain(network))
	if err != nil || len(comments) != n {
		return false
	}
	for _, c := range comments {
		if c != tag {
			return false
		}
	}
	return true
}

// nfgenmsg is nfnetlink's header (struct nfgenmsg).
type nfgenmsg struct{ family uint8 }

func (m nfgenmsg) Len() int          { return 4 }
func (m nfgenmsg) Serialize() []byte { return []byte{m.family, 0 /* NFNETLINK_V0 */, 0, 0} }

// nfDump runs an nf_tables dump of the inet family (request get, replies
// of type reply, filter attributes attrs) and returns each reply's
// attributes. An interrupted dump (the ruleset changed meanwhile) is run
// again, as every other dump of this package.
func nfDump(get, reply int, attrs ...*nl.RtAttr) ([]map[uint16][]byte, error) {
	msgs, err := netlinkdump.Retry(func() ([][]byte, error) {
		req := nl.NewNetlinkRequest(nfnlSubsysNFTables<<8|get, unix.NLM_F_DUMP)
		req.AddData(nfgenmsg{family: nfprotoInet})
		for _, a := range attrs {
			req.AddData(a)
		}
		return req.Execute(unix.NETLINK_NETFILTER, uint16(nfnlSubsysNFTables<<8|reply))
	})
	if err != nil {
		return nil, err
	}
	out := make([]map[uint16][]byte, 0, len(msgs))
	for _, m := range msgs {
		a, err := nfAttrs(m)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

func nfString(b []byte) string { return string(bytes.TrimRight(b, "\x00")) }

// nftRuleComments returns the comment of every rule of an inet chain.
func nftRuleComments(table, chain string) ([]string, error) {
	rules, err := nfDump(nftMsgGetRule, nftMsgNewRule,
		nl.NewRtAttr(nftaRuleTable, nl.ZeroTerminated(table)), nl.NewRtAttr(nftaRuleChain, nl.ZeroTerminated(chain)))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range rules {
		if nfString(r[nftaRuleTable]) == table && nfString(r[nftaRuleChain]) == chain {
			out = append(out, udataComment(r[nftaRuleUserdata]))
		}
	}
	return out, nil
}

func nfAttrs(m []byte) (map[uint16][]byte, error) {
	if len(m) < 4 {
		return nil, errors.New("short nfnetlink message")
	}
	as, err := nl.ParseRouteAttr(m[4:])
	if err != nil {
		return nil, err
	}
	out := make(map[uint16][]byte, len(as))
	for _, a := range as {
		out[a.Attr.Type&nlaTypeMask] = a.Value
	}
	return out, nil
}

// udataComment finds the comment in a rule's user data: type-length-value
// items of one byte each for type and length.
func udataComment(b []byte) string {
	for len(b) >= 2 {
		typ, n := b[0], int(b[1])
		if len(b) < 2+n {
			break
		}
		if typ == udataRuleComment {
			return nfString(b[2 : 2+n])
		}
		b = b[2+n:]
	}
	return ""
}

// nftTableExists reports whether the inet table exists.
func nftTableExists(table string) (bool, error) {
	tables, err := nfDump(nftMsgGetTable, nftMsgNewTable)
	if err != nil {
		return false, err
	}
	for _, t := range tables {
		if nfString(t[nftaTableName]) == table {
			return true, nil
		}
	}
	return false, nil
}

// nftChains lists the chains of an inet table.
func nftChains(table string) ([]string, error) {
	chains, err := nfDump(nftMsgGetChain, nftMsgNewChain)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range chains {
		if nfString(c[nftaChainTable]) == table {
			out = append(out, nfString(c[nftaChainName]))
		}
	}
	return out, nil
}

// RemoveMasquerade deletes the network's chain from Waggle's table (and the
// table once it is empty). A missing chain is success.
func RemoveMasquerade(network string) error {
	exists, err := nftTableExists(MasqueradeTable)
	if err != nil {
		return fmt.Errorf("nftables: list tables: %w", err)
	}
	if !exists {
		return nil
	}
	chains, err := nftChains(MasqueradeTable)
	if err != nil {
		return fmt.Errorf("nftables: list chains of %s: %w", MasqueradeTable, err)
	}
	var script string
	switch {
	case !slices.ContainsFunc(chains, func(c string) bool { return c != masqChain(network) }):
		script = fmt.Sprintf("delete table inet %s\n", MasqueradeTable) // nothing else in it
	case slices.Contains(chains, masqChain(network)):
		script = fmt.Sprintf("delete chain inet %s %s\n", MasqueradeTable, masqChain(network))
	default:
		return nil
	}
	if err := nftApply(script); err != nil {
		return fmt.Errorf("remove masquerade chain of %s: %w", network, err)
	}
	return nil
}
