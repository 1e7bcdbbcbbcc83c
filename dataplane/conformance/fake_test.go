package conformance

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/dataplane/iptables/iptablestest"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/iptables"
	"github.com/waggle-io/waggle/dataplane/ipvs"
	"github.com/waggle-io/waggle/dataplane/ipvs/ipvstest"
)

var (
	testEPs6 = []netip.AddrPort{netip.MustParseAddrPort("[fd00:99::1]:8080"), netip.MustParseAddrPort("[fd00:99::2]:8080")}
	nodeIP6  = netip.MustParseAddr("fd00:99::fe")
	nodeIP   = netip.MustParseAddr("10.99.0.254")
	testEPs  = []netip.AddrPort{
		netip.MustParseAddrPort("10.99.0.1:8080"), netip.MustParseAddrPort("10.99.0.2:8080"),
		netip.MustParseAddrPort("10.99.0.3:8080"), netip.MustParseAddrPort("10.99.0.4:8080"),
	}
)

// waggleLines keeps the Waggle rules of an iptables-save dump, without
// counters.
func waggleLines(dump string) string {
	var b strings.Builder
	for _, l := range strings.Split(dump, "\n") {
		if strings.Contains(l, "WAGGLE") {
			if i := strings.LastIndex(l, " ["); strings.HasPrefix(l, ":") && i > 0 {
				l = l[:i]
			}
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestFakeIPTables(t *testing.T) { fakeIPTables(t, 0) }

// TestFakeIPTablesCompact: the compact layout whenever a state has more
// than one endpoint.
func TestFakeIPTablesCompact(t *testing.T) { fakeIPTables(t, 1) }

func fakeIPTables(t *testing.T, compactAbove int) {
	Run(t, func(t *testing.T) *Target {
		fr := iptablestest.NewFakeRunner(nodeIP, nodeIP6)
		b, err := iptables.New(iptables.Config{Runner: fr, CompactAbove: compactAbove})
		if err != nil {
			t.Fatal(err)
		}
		return &Target{
			Backend: b, Endpoints: testEPs, Endpoints6: testEPs6, NodeIP: nodeIP,
			Connect: func(proto dataplane.Protocol, addr netip.AddrPort) (netip.AddrPort, error) {
				fam, src := iptables.IPv4, nodeIP
				if addr.Addr().Is6() {
					fam, src = iptables.IPv6, nodeIP6
				}
				v, err := fr.Connect(fam, string(proto), src, addr)
				switch {
				case err != nil:
					return netip.AddrPort{}, err
				case v.Rejected:
					return netip.AddrPort{}, ErrRefused
				case slices.Contains(testEPs, v.Dst), slices.Contains(testEPs6, v.Dst):
					return v.Dst, nil
				}
				return netip.AddrPort{}, ErrNotServed
			},
			Dump: func() string { return waggleLines(fr.Dump(iptables.IPv4) + fr.Dump(iptables.IPv6)) },
		}
	})
}

func TestFakeIPVS(t *testing.T) {
	Run(t, func(t *testing.T) *Target {
		fr := iptablestest.NewFakeRunner(nodeIP, nodeIP6)
		fh, fl := ipvstest.NewFakeHandle(), ipvstest.NewFakeLink()
		b, err := ipvs.New(ipvs.Config{Handle: fh, Link: fl, Runner: fr})
		if err != nil {
			t.Fatal(err)
		}
		return &Target{
			Backend: b, Endpoints: testEPs, Endpoints6: testEPs6, NodeIP: nodeIP,
			Connect: func(proto dataplane.Protocol, addr netip.AddrPort) (netip.AddrPort, error) {
				fam, src := iptables.IPv4, nodeIP
				if addr.Addr().Is6() {
					fam, src = iptables.IPv6, nodeIP6
				}
				v, err := fr.Connect(fam, string(proto), src, addr)
				if err != nil {
					return netip.AddrPort{}, err
				}
				if v.Rejected {
					return netip.AddrPort{}, ErrRefused
				}
				// IPVS sees only packets to local addresses: the node's
				// and those bound to the dummy interface.
				bound, _ := fl.Addrs(ipvs.DummyInterface)
				if addr.Addr() != src && !slices.Contains(bound, addr.Addr()) {
					return netip.AddrPort{}, ErrNotServed
				}
				ep, err := fh.Connect(dataplane.FrontendKey{Addr: addr.Addr(), Port: addr.Port(), Protocol: proto}, src)
				fh.CloseAll() // each connection is short
				switch {
				case errors.Is(err, ipvstest.ErrNoRealServer):
					return netip.AddrPort{}, ErrRefused
				case err != nil:
					return netip.AddrPort{}, ErrNotServed
				}
				return ep, nil
			},
			Dump: func() string {
				out := waggleLines(fr.Dump(iptables.IPv4) + fr.Dump(iptables.IPv6))
				if fl.Exists(ipvs.DummyInterface) {
					d, _ := ipvs.Dump(fh, fl)
					out += d
				} else if vss, _ := fh.Services(); len(vss) > 0 {
					out += "virtual servers left without the interface\n"
				}
				return out
			},
		}
	})
}
