package cni

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

func TestParseConfigAppliesDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"waggle","type":"waggle","podCIDR":"10.244.1.0/24"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Bridge != DefaultBridge || c.MTU != DefaultMTU || c.DataDir != DefaultDataDir || !c.Masquerade || !c.Hairpin {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if len(c.PodCIDRs) != 1 || c.PodCIDRs[0] != netip.MustParsePrefix("10.244.1.0/24") {
		t.Fatalf("PodCIDRs = %v", c.PodCIDRs)
	}
}

func TestParseConfigDualStackOrdersIPv4First(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"w","type":"waggle","podCIDRs":["fd00:10:244:1::/64","10.244.1.0/24"],
		"clusterCIDRs":["10.244.0.0/16","fd00:10:244::/56"],"mtu":1400}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.PodCIDRs) != 2 || !c.PodCIDRs[0].Addr().Is4() || !c.PodCIDRs[1].Addr().Is6() {
		t.Fatalf("PodCIDRs = %v", c.PodCIDRs)
	}
	if cc, ok := c.ClusterCIDRFor(c.PodCIDRs[1]); !ok || cc.String() != "fd00:10:244::/56" {
		t.Fatalf("ClusterCIDRFor(v6) = %v %v", cc, ok)
	}
}

func TestParseConfigRejectsBadInputWithTheSpecCode(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		code       uint
		msg        string
	}{
		{"malformed JSON", `{"name":`, types.ErrDecodingFailure, "decode"},
		{"wrong JSON type", `{"name":"w","podCIDR":5}`, types.ErrDecodingFailure, "decode"},
		{"missing name", `{"type":"waggle","podCIDR":"10.0.0.0/24"}`, types.ErrInvalidNetworkConfig, "no name"},
		{"name with a path separator", `{"name":"../w","type":"waggle","podCIDR":"10.0.0.0/24"}`, types.ErrInvalidNetworkConfig, "invalid characters"},
		{"plugin type with a path separator", `{"name":"w","type":"../waggle","podCIDR":"10.0.0.0/24"}`, types.ErrInvalidNetworkConfig, "type"},
		{"other plugin type", `{"name":"w","type":"bridge","podCIDR":"10.0.0.0/24"}`, types.ErrInvalidNetworkConfig, "type"},
		{"missing podCIDR", `{"name":"w","type":"waggle"}`, types.ErrInvalidNetworkConfig, "no podCIDR"},
		{"podCIDR not a CIDR", `{"name":"w","type":"waggle","podCIDR":"10.0.0.0"}`, types.ErrInvalidNetworkConfig, "not a CIDR"},
		{"podCIDR garbage", `{"name":"w","type":"waggle","podCIDR":"ten/8"}`, types.ErrInvalidNetworkConfig, "not a CIDR"},
		{"podCIDR host bits", `{"name":"w","type":"waggle","podCIDR":"10.0.0.5/24"}`, types.ErrInvalidNetworkConfig, "did you mean 10.0.0.0/24"},
		{"podCIDR too small", `{"name":"w","type":"waggle","podCIDR":"10.0.0.0/31"}`, types.ErrInvalidNetworkConfig, "too small"},
		{"two IPv4 podCIDRs", `{"name":"w","type":"waggle","podCIDRs":["10.0.0.0/24","10.1.0.0/24"]}`, types.ErrInvalidNetworkConfig, "more than one IPv4"},
		{"podCIDR outside clusterCIDR", `{"name":"w","type":"waggle","podCIDR":"10.9.0.0/24","clusterCIDR":"10.244.0.0/16"}`, types.ErrInvalidNetworkConfig, "not inside"},
		{"invalid clusterCIDR", `{"name":"w","type":"waggle","podCIDR":"10.0.0.0/24","clusterCIDR":"x"}`, types.ErrInvalidNetworkConfig, "clusterCIDR"},
		{"bridge with a path separator", `{"name":"w","type":"waggle","podCIDR":"10.0.0.0/24","bridge":"br/0"}`, types.ErrInvalidNetworkConfig, "bridge name"},
		{"bridge name too long", `{"name":"w","type":"waggle","podCIDR":"10.0.0.0/24","bridge":"averyverylongbridge"}`, types.ErrInvalidNetworkConfig, "bridge name"},
		{"relative dataDir", `{"name":"w","type":"waggle","podCIDR":"10.0.0.0/24","dataDir":"rel/dir"}`, types.ErrInvalidNetworkConfig, "absolute"},
		{"MTU too small", `{"name":"w","type":"waggle","podCIDR":"10.0.0.0/24","mtu":10}`, types.ErrInvalidNetworkConfig, "mtu"},
		{"IPv6 MTU below 1280", `{"name":"w","type":"waggle","podCIDR":"fd00::/64","mtu":1000}`, types.ErrInvalidNetworkConfig, "mtu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.conf))
			var e *types.Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v (%T), want a *types.Error", err, err)
			}
			if e.Code != tc.code || !strings.Contains(e.Msg+e.Details, tc.msg) {
				t.Fatalf("err = code %d %q, want code %d containing %q", e.Code, e.Msg+" "+e.Details, tc.code, tc.msg)
			}
		})
	}
}

func TestValidateArgsRejectsPathSeparators(t *testing.T) {
	for _, tc := range []struct{ id, ifname string }{
		{"abc", "eth/0"}, {"abc", "../x"}, {"abc", "eth0:1"}, {"abc", ""}, {"abc", "averyveryverylongname"}, {"a/b", "eth0"}, {"", "eth0"},
	} {
		var e *types.Error
		if err := ValidateArgs(tc.id, tc.ifname); !errors.As(err, &e) || (e.Code != types.ErrInvalidEnvironmentVariables && e.Code != types.ErrUnknownContainer) {
			t.Errorf("ValidateArgs(%q, %q) = %v, want a code 3/4 CNI error", tc.id, tc.ifname, err)
		}
	}
	if err := ValidateArgs("abc-123_x.y", "eth0"); err != nil {
		t.Errorf("valid args rejected: %v", err)
	}
}

func TestHostVethNameIsStableAndFitsIFNAMSIZ(t *testing.T) {
	a := HostVethName("waggle", "c1", "eth0")
	if a != HostVethName("waggle", "c1", "eth0") || len(a) != 15 || !strings.HasPrefix(a, "wv") {
		t.Fatalf("HostVethName = %q", a)
	}
	if a == HostVethName("waggle", "c1", "eth1") || a == HostVethName("other", "c1", "eth0") {
		t.Fatal("different attachments share a veth name")
	}
}

func TestConfListMatchesGoldenAndParses(t *testing.T) {
	for _, tc := range []struct {
		golden string
		pod    string
		clus   string
		opts   []ConfListOption
	}{
		{"conflist-default.json", "10.244.1.0/24", "10.244.0.0/16", nil},
		{"conflist-dualstack.json", "10.244.1.0/24", "10.244.0.0/16", []ConfListOption{
			WithDualStack(netip.MustParsePrefix("fd00:10:244:1::/64"), netip.MustParsePrefix("fd00:10:244::/56")),
			WithMTU(1450), WithBridge("cbr0"), WithDataDir("/var/lib/waggle/cni"), WithName("pods"), WithCNIVersion("0.4.0")}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			var clus netip.Prefix
			if tc.clus != "" {
				clus = netip.MustParsePrefix(tc.clus)
			}
			got, err := ConfList(netip.MustParsePrefix(tc.pod), clus, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.golden)
			if *update {
				os.WriteFile(path, got, 0o644)
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("ConfList =\n%s\nwant\n%s", got, want)
			}
		})
	}
}

func TestConfListRejectsBadInput(t *testing.T) {
	for name, f := range map[string]func() ([]byte, error){
		"zero podCIDR": func() ([]byte, error) { return ConfList(netip.Prefix{}, netip.Prefix{}) },
		"host bits":    func() ([]byte, error) { return ConfList(netip.MustParsePrefix("10.0.0.1/24"), netip.Prefix{}) },
		"outside cluster": func() ([]byte, error) {
			return ConfList(netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("10.244.0.0/16"))
		},
		"bad version": func() ([]byte, error) {
			return ConfList(netip.MustParsePrefix("10.0.0.0/24"), netip.Prefix{}, WithCNIVersion("0.1.0"))
		},
	} {
		if _, err := f(); err == nil {
			t.Errorf("%s: ConfList accepted it", name)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.0.0","name":"waggle","type":"waggle","podCIDR":"10.244.1.0/24","clusterCIDR":"10.244.0.0/16"}`))
	f.Add([]byte(`{"name":"w","podCIDRs":["fd00::/64","10.0.0.0/24"],"mtu":1280}`))
	f.Add([]byte(`{"name":"w","podCIDR":"10.0.0.5/24"}`))
	f.Add([]byte(`{"name":"../x","bridge":"a/b"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			var e *types.Error
			if !errors.As(err, &e) || e.Code == 0 {
				t.Fatalf("error without a CNI code: %v", err)
			}
			return
		}
		if len(c.PodCIDRs) == 0 || c.MTU <= 0 || c.Bridge == "" || !filepath.IsAbs(c.DataDir) {
			t.Fatalf("accepted an incomplete config: %+v", c)
		}
		for _, p := range c.PodCIDRs {
			if p.Masked() != p {
				t.Fatalf("accepted a non-canonical podCIDR %s", p)
			}
		}
	})
}

func TestHostVethAliasRoundTrips(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("fd00::5")}
	got := ParseHostVethAlias(HostVethAlias(addrs))
	if len(got) != 2 || got[0] != addrs[0] || got[1] != addrs[1] {
		t.Errorf("ParseHostVethAlias(HostVethAlias(%v)) = %v", addrs, got)
	}
	if ParseHostVethAlias("something else") != nil {
		t.Error("a foreign alias parsed as a pod's")
	}
}
