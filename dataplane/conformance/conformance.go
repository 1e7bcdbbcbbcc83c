// Package conformance is the one test suite every proxy backend must pass:
// the same table of cases (ClusterIP over TCP and UDP, NodePort, ExternalIP,
// session affinity, terminating endpoints, a frontend without endpoints,
// scaling up and down, service deletion, repeated Sync, Cleanup) runs against
// a Target — a dataplane.Backend plus a way to open connections through it.
//
// The fakes (iptablestest.FakeRunner, ipvstest.FakeHandle) run it unprivileged; the
// real iptables and eBPF backends run it as root in fresh network namespaces
// with real sockets (see conformance_test.go). It is test code shipped as a
// package so that every backend's tests can call Run; it is not used by the
// proxy itself.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/waggle-io/waggle/dataplane"
)

// Connection outcomes other than reaching an endpoint.
var (
	// ErrRefused: the connection was actively refused (a frontend without
	// endpoints).
	ErrRefused = errors.New("connection refused")
	// ErrNotServed: nothing load-balanced the connection (it timed out or
	// reached no endpoint).
	ErrNotServed = errors.New("connection not served")
)

// Target is one backend under test.
type Target struct {
	Backend dataplane.Backend
	// Endpoints are at least four addresses with a TCP and a UDP echo
	// server on the same port that answer with their own address.
	Endpoints []netip.AddrPort
	// NodeIP is the node's own address (NodePort frontends live on it).
	NodeIP netip.Addr
	// Endpoints6, when set, are two IPv6 endpoints like Endpoints, for the
	// IPv6 case.
	Endpoints6 []netip.AddrPort
	// Connect opens a new connection (TCP) or a new socket (UDP) to addr,
	// makes one request and returns the endpoint that answered, or an error
	// wrapping ErrRefused or ErrNotServed.
	Connect func(proto dataplane.Protocol, addr netip.AddrPort) (netip.AddrPort, error)
	// UDPFlow, when set, opens one long-lived UDP socket to addr; ask sends
	// a request on it and returns the endpoint that answered.
	UDPFlow func(addr netip.AddrPort) (ask func() (netip.AddrPort, error), closeFn func(), err error)
	// Dump, when set, renders the kernel state the backend programmed, to
	// check that a repeated Sync changes nothing and Cleanup leaves nothing
	// (an empty Dump).
	Dump func() string
}

// Setup makes a fresh Target for one case; it registers its cleanup on t.
type Setup func(t *testing.T) *Target

var (
	clusterIP6 = netip.MustParseAddr("fd00:96::10")
	clusterIP  = netip.MustParseAddr("10.96.0.10")
	externalIP = netip.MustParseAddr("203.0.113.10")
)

const (
	svcPort  = 80
	nodePort = 30080
)

// frontend builds a frontend of kind on addr:port with the given endpoints.
func frontend(kind dataplane.FrontendKind, addr netip.Addr, port uint16, proto dataplane.Protocol, eps []netip.AddrPort) dataplane.Frontend {
	f := dataplane.Frontend{
		FrontendKey: dataplane.FrontendKey{Addr: addr, Port: port, Protocol: proto},
		Kind:        kind,
		Service:     dataplane.ServicePortName{Namespace: "conformance", Name: "svc", Port: "p"},
	}
	for _, e := range eps {
		f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: e.Addr(), Port: e.Port()})
	}
	return f
}

func state(fs ...dataplane.Frontend) *dataplane.State {
	st := &dataplane.State{NodeName: "conformance", Frontends: fs}
	sortFrontends(st)
	return st
}

func sortFrontends(st *dataplane.State) {
	slices.SortFunc(st.Frontends, func(a, b dataplane.Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
}

// Run runs every case against fresh targets from setup.
func Run(t *testing.T, setup Setup) {
	cases := []struct {
		name string
		run  func(t *testing.T, tg *Target)
	}{
		{"ClusterIP TCP reaches every endpoint", func(t *testing.T, tg *Target) {
			eps := tg.Endpoints[:3]
			sync(t, tg, state(frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, eps)))
			reachesAll(t, tg, dataplane.TCP, netip.AddrPortFrom(clusterIP, svcPort), eps)
		}},
		{"ClusterIP UDP reaches every endpoint", func(t *testing.T, tg *Target) {
			eps := tg.Endpoints[:3]
			sync(t, tg, state(frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.UDP, eps)))
			reachesAll(t, tg, dataplane.UDP, netip.AddrPortFrom(clusterIP, svcPort), eps)
		}},
		{"IPv6 ClusterIP reaches every endpoint over TCP and UDP", func(t *testing.T, tg *Target) {
			if len(tg.Endpoints6) < 2 {
				t.Skip("target has no IPv6 endpoints")
			}
			eps := tg.Endpoints6[:2]
			sync(t, tg, state(
				frontend(dataplane.ClusterIP, clusterIP6, svcPort, dataplane.TCP, eps),
				frontend(dataplane.ClusterIP, clusterIP6, svcPort, dataplane.UDP, eps)))
			reachesAll(t, tg, dataplane.TCP, netip.AddrPortFrom(clusterIP6, svcPort), eps)
			reachesAll(t, tg, dataplane.UDP, netip.AddrPortFrom(clusterIP6, svcPort), eps)
		}},
		{"NodePort on the node IP reaches the endpoints", func(t *testing.T, tg *Target) {
			eps := tg.Endpoints[:2]
			sync(t, tg, state(
				frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, eps),
				frontend(dataplane.NodePort, tg.NodeIP, nodePort, dataplane.TCP, eps)))
			reachesAll(t, tg, dataplane.TCP, netip.AddrPortFrom(tg.NodeIP, nodePort), eps)
		}},
		{"ExternalIP reaches the endpoints", func(t *testing.T, tg *Target) {
			eps := tg.Endpoints[:2]
			sync(t, tg, state(
				frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, eps),
				frontend(dataplane.ExternalIP, externalIP, svcPort, dataplane.TCP, eps)))
			reachesAll(t, tg, dataplane.TCP, netip.AddrPortFrom(externalIP, svcPort), eps)
		}},
		{"ClientIP affinity sticks to one endpoint", func(t *testing.T, tg *Target) {
			f := frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, tg.Endpoints[:3])
			f.AffinityTimeout = time.Hour
			sync(t, tg, state(f))
			vip := netip.AddrPortFrom(clusterIP, svcPort)
			first := mustReach(t, tg, dataplane.TCP, vip, tg.Endpoints[:3])
			for range 15 {
				if got := mustReach(t, tg, dataplane.TCP, vip, tg.Endpoints[:3]); got != first {
					t.Fatalf("affinity broken: %s then %s", first, got)
				}
			}
		}},
		{"serving terminating endpoints are used", func(t *testing.T, tg *Target) {
			f := frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, tg.Endpoints[:2])
			for i := range f.Endpoints {
				f.Endpoints[i].Terminating = true
			}
			sync(t, tg, state(f))
			reachesAll(t, tg, dataplane.TCP, netip.AddrPortFrom(clusterIP, svcPort), tg.Endpoints[:2])
		}},
		{"a frontend without endpoints refuses", func(t *testing.T, tg *Target) {
			sync(t, tg, state(
				frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, nil),
				frontend(dataplane.ClusterIP, clusterIP, svcPort+1, dataplane.TCP, tg.Endpoints[:1])))
			if ep, err := tg.Connect(dataplane.TCP, netip.AddrPortFrom(clusterIP, svcPort)); !errors.Is(err, ErrRefused) {
				t.Fatalf("connect to a frontend without endpoints: %s, %v; want refused", ep, err)
			}
			mustReach(t, tg, dataplane.TCP, netip.AddrPortFrom(clusterIP, svcPort+1), tg.Endpoints[:1])
		}},
		{"scaling up and down changes the endpoints reached", func(t *testing.T, tg *Target) {
			vip := netip.AddrPortFrom(clusterIP, svcPort)
			for _, eps := range [][]netip.AddrPort{tg.Endpoints[:1], tg.Endpoints[:4], tg.Endpoints[3:4], tg.Endpoints[1:3]} {
				sync(t, tg, state(frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, eps)))
				reachesAll(t, tg, dataplane.TCP, vip, eps)
			}
		}},
		{"a long-lived UDP socket stops reaching a removed endpoint", func(t *testing.T, tg *Target) {
			if tg.UDPFlow == nil {
				t.Skip("target has no long-lived UDP sockets (a fake without conntrack)")
			}
			vip := netip.AddrPortFrom(clusterIP, svcPort)
			eps := tg.Endpoints[:2]
			sync(t, tg, state(frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.UDP, eps)))
			ask, closeFn, err := tg.UDPFlow(vip)
			if err != nil {
				t.Fatal(err)
			}
			defer closeFn()
			first, err := ask()
			if err != nil {
				t.Fatal(err)
			}
			var rest []netip.AddrPort
			for _, e := range eps {
				if e != first {
					rest = append(rest, e)
				}
			}
			sync(t, tg, state(frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.UDP, rest)))
			// The socket may be destroyed (eBPF) or move to a live endpoint
			// (iptables, after its conntrack entry is deleted); it must not
			// keep talking to the removed one.
			if got, err := ask(); err == nil && got == first {
				t.Fatalf("the socket still reaches the removed endpoint %s", first)
			}
		}},
		{"a deleted service is no longer served", func(t *testing.T, tg *Target) {
			vip := netip.AddrPortFrom(clusterIP, svcPort)
			sync(t, tg, state(frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, tg.Endpoints[:2])))
			mustReach(t, tg, dataplane.TCP, vip, tg.Endpoints[:2])
			sync(t, tg, state())
			if ep, err := tg.Connect(dataplane.TCP, vip); err == nil {
				t.Fatalf("deleted service still answered by %s", ep)
			}
		}},
		{"a repeated Sync changes nothing", func(t *testing.T, tg *Target) {
			st := state(
				frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, tg.Endpoints[:3]),
				frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.UDP, tg.Endpoints[:3]))
			sync(t, tg, st)
			var before string
			if tg.Dump != nil {
				before = tg.Dump()
			}
			sync(t, tg, st)
			if tg.Dump != nil {
				if after := tg.Dump(); after != before {
					t.Errorf("repeated Sync changed the kernel state:\n--- before\n%s--- after\n%s", before, after)
				}
			}
			reachesAll(t, tg, dataplane.TCP, netip.AddrPortFrom(clusterIP, svcPort), tg.Endpoints[:3])
		}},
		{"Cleanup removes everything", func(t *testing.T, tg *Target) {
			vip := netip.AddrPortFrom(clusterIP, svcPort)
			sync(t, tg, state(frontend(dataplane.ClusterIP, clusterIP, svcPort, dataplane.TCP, tg.Endpoints[:2])))
			if err := tg.Backend.Cleanup(context.Background()); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if ep, err := tg.Connect(dataplane.TCP, vip); err == nil {
				t.Errorf("after Cleanup the service is still answered by %s", ep)
			}
			if tg.Dump != nil {
				if d := tg.Dump(); d != "" {
					t.Errorf("after Cleanup the kernel still holds:\n%s", d)
				}
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tg := setup(t)
			if len(tg.Endpoints) < 4 {
				t.Fatalf("target has %d endpoints, the suite needs 4", len(tg.Endpoints))
			}
			c.run(t, tg)
		})
	}
}

func sync(t *testing.T, tg *Target, st *dataplane.State) {
	t.Helper()
	if err := tg.Backend.Sync(context.Background(), st); err != nil {
		t.Fatalf("Sync: %v\n%s", err, st.Dump())
	}
	// A backend that terminates stale sockets off the sync path (eBPF):
	// the cases check the state after that job too.
	if w, ok := tg.Backend.(interface{ WaitSocketsTerminated(context.Context) error }); ok {
		if err := w.WaitSocketsTerminated(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func mustReach(t *testing.T, tg *Target, proto dataplane.Protocol, addr netip.AddrPort, eps []netip.AddrPort) netip.AddrPort {
	t.Helper()
	got, err := tg.Connect(proto, addr)
	if err != nil {
		t.Fatalf("%s %s: %v", proto, addr, err)
	}
	for _, e := range eps {
		if got == e {
			return got
		}
	}
	t.Fatalf("%s %s answered by %s, want one of %v", proto, addr, got, eps)
	return got
}

// reachesAll connects until every endpoint answered (at most 20 tries per
// endpoint; a uniform spread misses one with probability < 1e-3) and fails
// on any answer from elsewhere.
func reachesAll(t *testing.T, tg *Target, proto dataplane.Protocol, addr netip.AddrPort, eps []netip.AddrPort) {
	t.Helper()
	seen := map[netip.AddrPort]bool{}
	for i := 0; i < 20*len(eps) && len(seen) < len(eps); i++ {
		seen[mustReach(t, tg, proto, addr, eps)] = true
	}
	if len(seen) != len(eps) {
		t.Fatalf("%s %s reached %v, want all of %v", proto, addr, keys(seen), eps)
	}
}

func keys(m map[netip.AddrPort]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k.String())
	}
	return out
}

// Classify maps a dial or read error to ErrRefused or ErrNotServed.
func Classify(err error, refused bool) error {
	if refused {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	return fmt.Errorf("%w: %v", ErrNotServed, err)
}
