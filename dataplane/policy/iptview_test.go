package policy

import (
	"errors"
	"net/netip"
	"os"
	"testing"
)

// TestIPTablesViewFromSave: `waggle bpf policy list|get` on the iptables
// datapath reads endpoints, rules and counters from iptables-save alone;
// a rule written in both families is one rule with the packets of both.
func TestIPTablesViewFromSave(t *testing.T) {
	v4 := []byte(`*filter
:WAGGLE-POLICY - [0:0]
:WAGGLE-POL-I-7 - [0:0]
:WAGGLE-POL-E-9 - [0:0]
[2:120] -A WAGGLE-POLICY -m connmark --mark 0x100000/0x100000 -m comment --comment "established flow a policy change denied" -j DROP
[90:9000] -A WAGGLE-POLICY -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
[0:0] -A WAGGLE-POLICY -s 10.1.0.9/32 -m comment --comment "y/c egress" -j WAGGLE-POL-E-9
[0:0] -A WAGGLE-POLICY -d 10.1.0.7/32 -m comment --comment "x/a ingress" -j WAGGLE-POL-I-7
[3:180] -A WAGGLE-POL-I-7 -p tcp -m tcp --dport 80 -m set --match-set waggle-pol-abc-4 src -m comment --comment "x/allow-b ingress rule 0" -j RETURN
[4:240] -A WAGGLE-POL-I-7 -p udp -m udp --dport 1000:1023 -m comment --comment "x/ports ingress rule 1" -j RETURN
[5:300] -A WAGGLE-POL-I-7 -m comment --comment "x/a ingress: no policy allows it" -j DROP
[6:360] -A WAGGLE-POL-E-9 -m comment --comment "y/c egress: no policy allows it" -j DROP
COMMIT
`)
	v6 := []byte(`*filter
:WAGGLE-POLICY - [0:0]
:WAGGLE-POL-I-7 - [0:0]
[0:0] -A WAGGLE-POLICY -d fd00::7/128 -m comment --comment "x/a ingress" -j WAGGLE-POL-I-7
[1:80] -A WAGGLE-POL-I-7 -p tcp -m tcp --dport 80 -m set --match-set waggle-pol-abc-6 src -m comment --comment "x/allow-b ingress rule 0" -j RETURN
[0:0] -A WAGGLE-POL-I-7 -p udp -m udp --dport 1000:1023 -m comment --comment "x/ports ingress rule 1" -j RETURN
[1:80] -A WAGGLE-POL-I-7 -m comment --comment "x/a ingress: no policy allows it" -j DROP
COMMIT
`)
	v, found, err := parseIPTablesView(v4, v6)
	if err != nil || !found {
		t.Fatalf("parse: found %v, err %v", found, err)
	}
	eps, _ := v.Endpoints()
	if len(eps) != 2 {
		t.Fatalf("endpoints %+v, want x/a and y/c", eps)
	}
	a, c := eps[0], eps[1]
	if a.Pod != "x/a" || a.Ifindex != 7 || !a.IngressIsolated || a.EgressIsolated || a.IngressAllowed != 8 || a.IngressDenied != 6 || a.Entries != 2 {
		t.Errorf("x/a = %+v", a)
	}
	if c.Pod != "y/c" || c.Ifindex != 9 || c.IngressIsolated || !c.EgressIsolated || c.EgressDenied != 6 || c.EgressAllowed != 0 || c.Entries != 0 {
		t.Errorf("y/c = %+v", c)
	}
	if v.Revoked != 2 {
		t.Errorf("revoked %d, want 2", v.Revoked)
	}
	for _, ref := range []string{"x/a", "a", "7", "10.1.0.7", "fd00::7"} {
		if e, err := v.FindEndpoint(ref); err != nil || e.Ifindex != 7 {
			t.Errorf("FindEndpoint(%q) = %+v, %v", ref, e, err)
		}
	}
	if _, err := v.FindEndpoint("x/zz"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("FindEndpoint(x/zz) err %v, want not exist", err)
	}
	rules, counters, err := v.Rules(7)
	if err != nil {
		t.Fatal(err)
	}
	want := []RuleInfo{
		{Direction: "ingress", Peer: "ipset waggle-pol-abc", Protocol: "TCP", Ports: "80", Policy: "x/allow-b", Rule: 0, Hits: 4},
		{Direction: "ingress", Peer: "any", Protocol: "UDP", Ports: "1000-1023", Policy: "x/ports", Rule: 1, Hits: 4},
	}
	if len(rules) != len(want) {
		t.Fatalf("rules %+v, want %+v", rules, want)
	}
	for i := range want {
		if rules[i] != want[i] {
			t.Errorf("rule %d = %+v, want %+v", i, rules[i], want[i])
		}
	}
	if len(counters) != 2 || counters[0] != (PolicyCounter{Policy: "x/allow-b", Direction: "ingress", Hits: 4}) ||
		counters[1] != (PolicyCounter{Policy: "x/ports", Direction: "ingress", Hits: 4}) {
		t.Errorf("counters %+v", counters)
	}
	if _, err := v.Explain(netip.MustParseAddr("10.1.0.9"), netip.MustParseAddr("10.1.0.7"), 80, 6); !errors.Is(err, ErrIPTablesNoExplain) {
		t.Errorf("explain err %v, want ErrIPTablesNoExplain", err)
	}
	if _, found, _ := parseIPTablesView([]byte("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n")); found {
		t.Error("a table without WAGGLE-POLICY: found")
	}
}
