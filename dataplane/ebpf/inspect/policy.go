package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/waggle-io/waggle/dataplane/policy"
)

func isPolicyCommand(cmd []string) bool {
	switch {
	case len(cmd) >= 1 && (cmd[0] == "policy" || cmd[0] == "monitor"):
		return true
	case len(cmd) >= 2 && cmd[0] == "explain" && cmd[1] == "policy":
		return true
	}
	return false
}

// parsePolicyDst parses DST:PORT[/PROTO] (PROTO defaults to TCP).
func parsePolicyDst(s string) (netip.AddrPort, uint8, error) {
	addr, proto, _ := strings.Cut(s, "/")
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.AddrPort{}, 0, usageErr("DST %q: want ADDRESS:PORT[/PROTO]", s)
	}
	p, err := policy.ParseProto(strings.ToUpper(proto))
	if err != nil {
		return netip.AddrPort{}, 0, usageErr("DST %q: %v", s, err)
	}
	return ap, p, nil
}

// policyView opens the NetworkPolicy maps under the node's pin directory;
// with none pinned there, the iptables fallback's rules in this network
// namespace (list and get; explain and monitor need the eBPF maps).
var policyView = func(dir string) (policyReader, error) {
	v, err := policy.OpenView(policy.DefaultPinDir(dir))
	if errors.Is(err, policy.ErrNoState) {
		if iv, ierr := policy.OpenIPTablesView(""); ierr == nil {
			return iv, nil
		}
	}
	if err != nil {
		if errors.Is(err, policy.ErrNoState) || errors.Is(err, policy.ErrLayoutMismatch) {
			return nil, fmt.Errorf("%w: %v", ErrNoState, err)
		}
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("%w: %v", ErrPermission, err)
		}
		return nil, err
	}
	return v, nil
}

type policyReader interface {
	Endpoints() ([]policy.EndpointInfo, error)
	FindEndpoint(ref string) (policy.EndpointInfo, error)
	Rules(ep uint32) ([]policy.RuleInfo, []policy.PolicyCounter, error)
	Explain(src, dst netip.Addr, port uint16, proto uint8) ([]policy.Verdict, error)
	Monitor(ctx context.Context, verdict string, fn func(policy.Event)) error
	Close() error
}

// PolicyList is `policy list`.
type PolicyList struct {
	Endpoints []policy.EndpointInfo `json:"endpoints"`
}

// PolicyGet is `policy get`.
type PolicyGet struct {
	Endpoint policy.EndpointInfo    `json:"endpoint"`
	Policies []policy.PolicyCounter `json:"policies"`
	Entries  []policy.RuleInfo      `json:"entries"`
}

// PolicyExplain is `explain policy`.
type PolicyExplain struct {
	Source      netip.Addr       `json:"source"`
	Destination netip.AddrPort   `json:"destination"`
	Protocol    string           `json:"protocol"`
	Allowed     bool             `json:"allowed"`
	Verdicts    []policy.Verdict `json:"verdicts"`
}

func runPolicy(ctx context.Context, cfg Config, dir string) error {
	v, err := policyView(dir)
	if err != nil {
		return err
	}
	defer v.Close()
	if err := runPolicyOn(ctx, cfg, v); err != nil {
		if errors.Is(err, policy.ErrIPTablesNoExplain) {
			return fmt.Errorf("%w: %v", ErrNoState, err)
		}
		return err
	}
	return nil
}

func runPolicyOn(ctx context.Context, cfg Config, v policyReader) error {
	cmd := cfg.Command
	switch {
	case cmd[0] == "monitor":
		verdict := cfg.Verdict
		if verdict == "all" {
			verdict = ""
		}
		if cfg.Output == FormatTable {
			fmt.Fprintf(cfg.Out, "%-26s %-7s %-5s %-28s %-8s %-7s %-24s %-24s %s\n", "TIME", "DIR", "VERD", "POD", "PROTO", "PORT", "PEER", "PEER IDENTITY", "POLICY / REASON")
		}
		enc := json.NewEncoder(cfg.Out)
		return v.Monitor(ctx, verdict, func(e policy.Event) {
			if cfg.Output != FormatTable {
				enc.Encode(e)
				return
			}
			port := e.LocalPort
			if e.Direction == "egress" {
				port = e.PeerPort
			}
			why := e.Reason
			if e.Policy != "" {
				why = e.Policy + " (" + e.Reason + ")"
			}
			fmt.Fprintf(cfg.Out, "%-26s %-7s %-5s %-28s %-8s %-7d %-24s %-24s %s\n", e.Time.Format("2006-01-02T15:04:05.000000"), e.Direction, e.Verdict,
				e.Endpoint, e.Protocol, port, e.Peer.String()+":"+strconv.Itoa(int(e.PeerPort)), e.PeerName, why)
		})
	case cmd[0] == "policy" && cmd[1] == "list":
		eps, err := v.Endpoints()
		if err != nil {
			return err
		}
		return render(cfg.Out, cfg.Output, &PolicyList{Endpoints: eps})
	case cmd[0] == "policy" && cmd[1] == "get":
		ep, err := v.FindEndpoint(cmd[2])
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%w: %v", ErrNotFound, err)
			}
			return usageErr("%v", err)
		}
		rules, counters, err := v.Rules(ep.Ifindex)
		if err != nil {
			return err
		}
		return render(cfg.Out, cfg.Output, &PolicyGet{Endpoint: ep, Policies: counters, Entries: rules})
	default: // explain policy SRC DST
		src, _ := netip.ParseAddr(cmd[2])
		dst, proto, err := parsePolicyDst(cmd[3])
		if err != nil {
			return err
		}
		vs, err := v.Explain(src, dst.Addr(), dst.Port(), proto)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%w: %v", ErrNotFound, err)
			}
			return err
		}
		res := &PolicyExplain{Source: src, Destination: dst, Protocol: policy.ProtoName(proto), Allowed: true, Verdicts: vs}
		for _, vd := range vs {
			res.Allowed = res.Allowed && vd.Allowed
		}
		return render(cfg.Out, cfg.Output, res)
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (l *PolicyList) writeTable(w io.Writer) {
	row(w, "POD", "IFINDEX", "IDENTITY", "INGRESS", "EGRESS", "ENTRIES", "IN ALLOWED", "IN DENIED", "OUT ALLOWED", "OUT DENIED", "REV")
	for _, e := range l.Endpoints {
		iso := func(b bool) string {
			if b {
				return "isolated"
			}
			return "open"
		}
		row(w, e.Pod, e.Ifindex, e.Identity, iso(e.IngressIsolated), iso(e.EgressIsolated), e.Entries, e.IngressAllowed, e.IngressDenied, e.EgressAllowed, e.EgressDenied, e.Revision)
	}
}

func (g *PolicyGet) writeTable(w io.Writer) {
	e := g.Endpoint
	row(w, "Pod:", e.Pod)
	row(w, "Veth ifindex:", e.Ifindex)
	row(w, "Identity:", fmt.Sprintf("%d (%s)", e.Identity, orDash(e.Labels)))
	row(w, "Ingress:", fmt.Sprintf("isolated=%s  flows allowed %d, packets denied %d", yesNo(e.IngressIsolated), e.IngressAllowed, e.IngressDenied))
	row(w, "Egress:", fmt.Sprintf("isolated=%s  flows allowed %d, packets denied %d", yesNo(e.EgressIsolated), e.EgressAllowed, e.EgressDenied))
	row(w, "Revision:", e.Revision)
	fmt.Fprintln(w)
	row(w, "POLICY", "DIRECTION", "FLOWS ALLOWED")
	for _, c := range g.Policies {
		row(w, c.Policy, c.Direction, c.Hits)
	}
	fmt.Fprintln(w)
	row(w, "DIRECTION", "PEER", "PEER IDENTITY", "PROTOCOL", "PORTS", "POLICY", "RULE", "HITS")
	for _, r := range g.Entries {
		row(w, r.Direction, r.Peer, r.PeerIdentity, r.Protocol, r.Ports, r.Policy, r.Rule, r.Hits)
	}
}

func (x *PolicyExplain) writeTable(w io.Writer) {
	verdict := "ALLOWED"
	if !x.Allowed {
		verdict = "DENIED"
	}
	row(w, "Connection:", fmt.Sprintf("%s -> %s/%s", x.Source, x.Destination, x.Protocol))
	row(w, "Verdict:", verdict)
	fmt.Fprintln(w)
	row(w, "AT POD", "DIRECTION", "VERDICT", "PEER", "POLICY", "RULE", "WHY")
	for _, v := range x.Verdicts {
		vd := "allow"
		if !v.Allowed {
			vd = "deny"
		}
		rule := "-"
		if v.Policy != "" {
			rule = strconv.Itoa(v.Rule)
		}
		row(w, v.Endpoint, v.Direction, vd, fmt.Sprintf("%s (%d)", v.Peer, v.PeerIdentity), orDash(v.Policy), rule, v.Reason)
	}
}
