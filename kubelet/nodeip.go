package kubelet

import (
	"fmt"
	"net/netip"
	"strings"
)

// ParseNodeIPs parses --node-ip as upstream's kubelet does: empty, one
// address, or two comma-separated addresses of different families (a
// dual-stack node; the first is the primary). Unspecified addresses
// (0.0.0.0, ::) are refused: Waggle does not pick an address per family.
func ParseNodeIPs(s string) ([]netip.Addr, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%q: want one address, or two of different families (IPv4,IPv6)", s)
	}
	out := make([]netip.Addr, 0, len(parts))
	for _, p := range parts {
		a, err := netip.ParseAddr(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		a = a.Unmap()
		if a.IsUnspecified() {
			return nil, fmt.Errorf("%q: an unspecified address is not a node IP", s)
		}
		out = append(out, a)
	}
	if len(out) == 2 && out[0].Is4() == out[1].Is4() {
		return nil, fmt.Errorf("%q: two addresses of the same family (a dual-stack node has one IPv4 and one IPv6)", s)
	}
	return out, nil
}

// ParseDualStackPrefixes parses a CIDR list of the --cluster-cidr and
// --service-cluster-ip-range kind: empty, one prefix, or two
// comma-separated prefixes of different families (masked).
func ParseDualStackPrefixes(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%q: want one CIDR, or two of different families (IPv4,IPv6)", s)
	}
	out := make([]netip.Prefix, 0, len(parts))
	for _, p := range parts {
		c, err := netip.ParsePrefix(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		out = append(out, c.Masked())
	}
	if len(out) == 2 && out[0].Addr().Is4() == out[1].Addr().Is4() {
		return nil, fmt.Errorf("%q: two CIDRs of the same family (dual-stack wants one IPv4 and one IPv6)", s)
	}
	return out, nil
}
