package ebpf

import (
	"net/netip"
	"testing"

	"github.com/waggle-io/waggle/dataplane"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// frontend builds a frontend with backends at the given addresses.
func frontend(vip string, proto dataplane.Protocol, backends ...string) dataplane.Frontend {
	a := ap(vip)
	f := dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: a.Addr(), Port: a.Port(), Protocol: proto},
		Kind: dataplane.ClusterIP, Service: dataplane.ServicePortName{Namespace: "default", Name: "svc"}}
	for _, b := range backends {
		x := ap(b)
		f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: x.Addr(), Port: x.Port()})
	}
	return f
}

func TestSmokeTCPThroughVIP(t *testing.T) {
	e := newEnv(t)
	e.addAddrs(netip.MustParseAddr("10.1.0.1"))
	e.serveTCP(ap("10.1.0.1:8080"))
	e.sync(&dataplane.State{Frontends: []dataplane.Frontend{frontend("10.96.0.10:80", dataplane.TCP, "10.1.0.1:8080")}})
	who, err := e.whoTCP(ap("10.96.0.10:80"))
	if err != nil || who != "10.1.0.1:8080" {
		t.Fatalf("got %q, %v", who, err)
	}
}
