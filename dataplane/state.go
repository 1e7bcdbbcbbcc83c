// Package dataplane is Waggle's service proxy: it turns Services,
// EndpointSlices and Nodes into one desired State — every frontend (ClusterIP,
// NodePort, ExternalIP, LoadBalancer IP × port × protocol) with its ordered
// endpoints — and hands that State to a Backend that programs the kernel.
//
// What to program is decided here, once; how is each backend's business
// (dataplane/ebpf, dataplane/iptables, dataplane/ipvs). This package does not
// touch the kernel.
package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Protocol is a frontend's L4 protocol.
type Protocol string

// Protocols a frontend can have. SCTP is refused during computation.
const (
	TCP Protocol = "TCP"
	UDP Protocol = "UDP"
)

// FrontendKind says how a frontend address is exposed.
type FrontendKind string

// Frontend kinds, as Kubernetes names them.
const (
	ClusterIP    FrontendKind = "ClusterIP"
	NodePort     FrontendKind = "NodePort"
	ExternalIP   FrontendKind = "ExternalIP"
	LoadBalancer FrontendKind = "LoadBalancer"
)

// ServicePortName names the Service port a frontend comes from.
type ServicePortName struct {
	Namespace string
	Name      string
	// Port is the Service port's name ("" for an unnamed single port).
	Port string
}

func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// FrontendKey identifies a frontend: address, port and protocol.
type FrontendKey struct {
	Addr     netip.Addr
	Port     uint16
	Protocol Protocol
}

func (k FrontendKey) String() string {
	return netip.AddrPortFrom(k.Addr, k.Port).String() + "/" + string(k.Protocol)
}

// Frontend is one address, port and protocol that load-balances to
// Endpoints.
type Frontend struct {
	FrontendKey
	Kind    FrontendKind
	Service ServicePortName
	// Endpoints in the order they are to be programmed: ready ones when there
	// are any, else serving-and-terminating ones (KEP-1669), after traffic
	// policy was applied. Empty means the frontend refuses connections.
	// Compute shares one list among a Service port's frontends of the same
	// family and policy: read-only to every backend.
	Endpoints []Endpoint
	// AffinityTimeout is sessionAffinity ClientIP's timeout; 0 means no
	// affinity.
	AffinityTimeout time.Duration
	// LocalOnly is set when a traffic policy of Local restricted Endpoints to
	// this node's (the iptables backend then need not masquerade).
	LocalOnly bool
	// TerminateTCP: TCP connections to an endpoint this frontend loses are
	// terminated (the Service's AnnotationTerminateTCP is "true"). Connected
	// UDP sockets always are, where the backend can.
	TerminateTCP bool
	// SourceRanges (LoadBalancer frontends only): spec.loadBalancerSourceRanges
	// of the frontend's family, sorted; new flows from any other source are
	// dropped, as kube-proxy does. Empty: every source.
	SourceRanges []netip.Prefix
}

// AnnotationTerminateTCP on a Service, set to "true", makes the proxy
// terminate TCP connections to an endpoint the Service loses (by default
// they live on until they close; UDP sockets are always re-balanced).
const AnnotationTerminateTCP = "waggle.io/terminate-tcp-on-backend-removal"

// Endpoint is one backend address of a frontend.
type Endpoint struct {
	Addr netip.Addr
	Port uint16
	// NodeName is the node the endpoint lives on, when known.
	NodeName string
	// Terminating is set for serving-and-terminating endpoints.
	Terminating bool
}

// AddrPort returns the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// State is the whole desired dataplane of one node.
type State struct {
	// Frontends sorted by FrontendKey (address, port, protocol).
	Frontends []Frontend
	// NodeName is the node this state is for.
	NodeName string
	// ClusterCIDRs are the pod networks (used by backends that masquerade).
	ClusterCIDRs []netip.Prefix
}

// Backend programs a State into the kernel. Sync may be called any number of
// times with the same State and then changes nothing; it must never leave a
// frontend that existed before and after the call without endpoints in
// between (make-before-break).
type Backend interface {
	// Name is the proxy mode: "ebpf", "iptables" or "ipvs".
	Name() string
	// Sync makes the kernel match state.
	Sync(ctx context.Context, state *State) error
	// Cleanup removes everything the backend ever programmed on this node.
	Cleanup(ctx context.Context) error
}

// Errors shared by the backends.
var (
	// ErrNotSupported: the kernel lacks what the backend needs.
	ErrNotSupported = errors.New("not supported by this kernel")
	// ErrMapFull: a kernel map or table has no room for the state.
	ErrMapFull = errors.New("map full")
)

// Compare orders frontend keys by address, port, then protocol.
func (k FrontendKey) Compare(o FrontendKey) int {
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if k.Port != o.Port {
		if k.Port < o.Port {
			return -1
		}
		return 1
	}
	switch {
	case k.Protocol < o.Protocol:
		return -1
	case k.Protocol > o.Protocol:
		return 1
	}
	return 0
}

// Validate checks the invariants backends rely on: sorted unique frontends,
// valid addresses and ports, endpoints of the frontend's address family.
func (s *State) Validate() error {
	for i, f := range s.Frontends {
		if !f.Addr.IsValid() || f.Port == 0 {
			return fmt.Errorf("frontend %d (%s): invalid address or port", i, f.FrontendKey)
		}
		if f.Protocol != TCP && f.Protocol != UDP {
			return fmt.Errorf("frontend %s: unsupported protocol %q", f.FrontendKey, f.Protocol)
		}
		if i > 0 && s.Frontends[i-1].FrontendKey.Compare(f.FrontendKey) >= 0 {
			return fmt.Errorf("frontend %s: not sorted or duplicate", f.FrontendKey)
		}
		for _, e := range f.Endpoints {
			if !e.Addr.IsValid() || e.Port == 0 || e.Addr.Is4() != f.Addr.Is4() {
				return fmt.Errorf("frontend %s: invalid endpoint %s", f.FrontendKey, e.AddrPort())
			}
		}
	}
	return nil
}

// FrontendError is a failure to program one frontend. Backends wrap
// per-frontend failures in it (for example a full map: Err wraps ErrMapFull)
// so that the proxy can record an Event on the Service concerned.
type FrontendError struct {
	Frontend FrontendKey
	Service  ServicePortName
	Err      error
}

func (e *FrontendError) Error() string {
	return fmt.Sprintf("frontend %s of Service %s: %v", e.Frontend, e.Service, e.Err)
}

func (e *FrontendError) Unwrap() error { return e.Err }

// RejectedFrontends is a sync's structured partial failure: every frontend
// that was not programmed, each with its reason; everything else was. Its
// message summarizes (the first few keys and a count), FrontendErrors lists
// them all.
type RejectedFrontends struct {
	Errs []*FrontendError
	// Hint says what to do (for example which flag to raise).
	Hint string
}

func (e *RejectedFrontends) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d frontends not programmed (", len(e.Errs))
	for i, fe := range e.Errs[:min(len(e.Errs), 5)] {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s of %s", fe.Frontend, fe.Service)
	}
	if len(e.Errs) > 5 {
		fmt.Fprintf(&b, " and %d more", len(e.Errs)-5)
	}
	b.WriteString(")")
	if len(e.Errs) > 0 {
		fmt.Fprintf(&b, ": %v", e.Errs[0].Err)
	}
	if e.Hint != "" {
		b.WriteString(": " + e.Hint)
	}
	return b.String()
}

// Unwrap returns every FrontendError, so errors.Is(err, ErrMapFull) and
// FrontendErrors see them.
func (e *RejectedFrontends) Unwrap() []error {
	out := make([]error, len(e.Errs))
	for i, fe := range e.Errs {
		out[i] = fe
	}
	return out
}

// FrontendErrors returns every FrontendError in err's tree (through
// errors.Join and %w wrapping).
func FrontendErrors(err error) []*FrontendError {
	var out []*FrontendError
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if fe, ok := err.(*FrontendError); ok {
			out = append(out, fe)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// FullResyncer is implemented by backends that sync partially and can be
// told that the next Sync must rewrite everything (the proxy's periodic
// resync does, to repair drift).
type FullResyncer interface {
	RequestFullSync()
}
