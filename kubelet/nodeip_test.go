package kubelet

import "testing"

func TestNodeIPsAreOneAddressOrOnePerFamily(t *testing.T) {
	for in, want := range map[string]int{"": 0, "10.0.0.1": 1, "fd00::1": 1, "10.0.0.1,fd00::1": 2, "fd00::1, 10.0.0.1": 2} {
		got, err := ParseNodeIPs(in)
		if err != nil || len(got) != want {
			t.Errorf("ParseNodeIPs(%q) = %v, %v; want %d addresses", in, got, err, want)
		}
	}
	for _, bad := range []string{"10.0.0.1,10.0.0.2", "fd00::1,fd00::2", "10.0.0.1,fd00::1,10.0.0.2", "0.0.0.0", "::", "10.0.0.1,", "node1"} {
		if got, err := ParseNodeIPs(bad); err == nil {
			t.Errorf("ParseNodeIPs(%q) = %v, want an error", bad, got)
		}
	}
	if got, err := ParseDualStackPrefixes("10.244.0.0/16,fd00:10:244::/56"); err != nil || len(got) != 2 {
		t.Errorf("dual-stack cluster CIDR: %v %v", got, err)
	}
	for _, bad := range []string{"10.244.0.0/16,10.245.0.0/16", "10.244.0.0/16,x", "a,b,c"} {
		if _, err := ParseDualStackPrefixes(bad); err == nil {
			t.Errorf("ParseDualStackPrefixes(%q) accepted", bad)
		}
	}
}
