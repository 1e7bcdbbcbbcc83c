package dataplane

import (
	"fmt"
	"strings"
)

// Dump renders the State as canonical text, one frontend per line followed by
// its endpoints: what golden files and `waggle proxy` debug logs show.
func (s *State) Dump() string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s\n", s.NodeName)
	for _, c := range s.ClusterCIDRs {
		fmt.Fprintf(&b, "cluster-cidr %s\n", c)
	}
	for _, f := range s.Frontends {
		fmt.Fprintf(&b, "%s %s %s", f.FrontendKey, f.Kind, f.Service)
		if f.AffinityTimeout > 0 {
			fmt.Fprintf(&b, " affinity=%s", f.AffinityTimeout)
		}
		if f.LocalOnly {
			b.WriteString(" local-only")
		}
		if f.TerminateTCP {
			b.WriteString(" terminate-tcp")
		}
		for i, r := range f.SourceRanges {
			b.WriteString(map[bool]string{true: " sources=", false: ","}[i == 0] + r.String())
		}
		if len(f.Endpoints) == 0 {
			b.WriteString(" (no endpoints: refuse)")
		}
		b.WriteByte('\n')
		for _, e := range f.Endpoints {
			fmt.Fprintf(&b, "  -> %s", e.AddrPort())
			if e.NodeName != "" {
				fmt.Fprintf(&b, " node=%s", e.NodeName)
			}
			if e.Terminating {
				b.WriteString(" terminating")
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}
