package policy

import (
	"net/netip"
	"slices"
	"testing"
)

// TestIPTablesSetMembers: a set holds what the eBPF lookups allow: the
// pods of its label identities, and for each ipBlock prefix identity the
// addresses whose longest known prefix it is (the except holes cut out,
// a pod address allowed by its label kept even inside a hole).
func TestIPTablesSetMembers(t *testing.T) {
	p := netip.MustParsePrefix
	d := &IPTables{cidrs: map[netip.Prefix]uint32{
		p("10.0.0.0/24"): firstCIDRID, p("10.0.0.13/32"): firstCIDRID + 1, p("0.0.0.0/0"): firstCIDRID + 2,
		p("10.0.0.128/25"): firstCIDRID + 3,
	}}
	byID := map[uint32][]netip.Addr{300: {netip.MustParseAddr("10.0.0.13"), netip.MustParseAddr("fd00::1")}}
	got := d.members([]uint32{firstCIDRID, 300}, ipv4, byID)
	var list []string
	for q := range got {
		list = append(list, q.String())
	}
	slices.Sort(list)
	want := []string{"10.0.0.0/29", "10.0.0.12/32", "10.0.0.13/32", "10.0.0.14/31", "10.0.0.16/28", "10.0.0.32/27", "10.0.0.64/26", "10.0.0.8/30"}
	if !slices.Equal(list, want) {
		t.Errorf("members = %v, want %v", list, want)
	}
	// 0.0.0.0/0 minus its known inner prefixes, as hash:net entries (no /0).
	got = d.members([]uint32{firstCIDRID + 2}, ipv4, nil)
	for q := range got {
		if q.Bits() == 0 || q.Overlaps(p("10.0.0.0/24")) {
			t.Errorf("world member %s: /0 or overlapping a known inner prefix", q)
		}
	}
	if !contains4(got, "1.2.3.4") || !contains4(got, "200.1.1.1") || contains4(got, "10.0.0.5") {
		t.Errorf("world members %v", got)
	}
}

func contains4(m map[netip.Prefix]bool, a string) bool {
	for q := range m {
		if q.Contains(netip.MustParseAddr(a)) {
			return true
		}
	}
	return false
}

func TestParseCounters(t *testing.T) {
	save := []byte(`*filter
:WAGGLE-POL-I-7 - [0:0]
[3:180] -A WAGGLE-POL-I-7 -p tcp -m tcp --dport 80 -m set --match-set waggle-pol-x-4 src -m comment --comment "x/allow ingress rule 0" -j RETURN
[5:300] -A WAGGLE-POL-I-7 -m comment --comment "x/b ingress: no policy allows it" -j DROP
[9:9] -A FORWARD -j ACCEPT
COMMIT
`)
	rs, err := parseCounters(save)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].packets != 3 || rs[0].target != "RETURN" || rs[0].comment != "x/allow ingress rule 0" ||
		rs[1].packets != 5 || rs[1].target != "DROP" || rs[1].chain != "WAGGLE-POL-I-7" {
		t.Errorf("parsed %+v", rs)
	}
}
