package policy

import (
	"fmt"
	"net/netip"
	"time"
)

// EndpointInfo is one endpoint as the pinned maps hold it.
type EndpointInfo struct {
	Pod             string `json:"pod"`
	Ifindex         uint32 `json:"ifindex"`
	Identity        uint32 `json:"identity"`
	Labels          string `json:"labels,omitempty"`
	IngressIsolated bool   `json:"ingressIsolated"`
	EgressIsolated  bool   `json:"egressIsolated"`
	Revision        uint32 `json:"revision"`
	Entries         int    `json:"entries"`
	IngressAllowed  uint64 `json:"ingressFlowsAllowed"`
	IngressDenied   uint64 `json:"ingressPacketsDenied"`
	EgressAllowed   uint64 `json:"egressFlowsAllowed"`
	EgressDenied    uint64 `json:"egressPacketsDenied"`
}

// RuleInfo is one policy entry of an endpoint.
type RuleInfo struct {
	Direction    string `json:"direction"`
	PeerIdentity uint32 `json:"peerIdentity"`
	Peer         string `json:"peer"`
	Protocol     string `json:"protocol"`
	Ports        string `json:"ports"`
	Policy       string `json:"policy"`
	Rule         int    `json:"rule"`
	Hits         uint64 `json:"hits"`
}

// PolicyCounter sums the hits of a policy's entries on one endpoint.
type PolicyCounter struct {
	Policy    string `json:"policy"`
	Direction string `json:"direction"`
	Hits      uint64 `json:"flowsAllowed"`
}

// Verdict is what one endpoint's program decides for a new flow.
type Verdict struct {
	Endpoint     string `json:"endpoint"`
	Direction    string `json:"direction"`
	Allowed      bool   `json:"allowed"`
	Reason       string `json:"reason"`
	PeerIdentity uint32 `json:"peerIdentity"`
	Peer         string `json:"peer"`
	Policy       string `json:"policy,omitempty"`
	Rule         int    `json:"rule,omitempty"`
	// IsolatedBy lists the policies that isolate the endpoint in this
	// direction (from the compiler's names; empty when not isolated).
	Entry string `json:"entry,omitempty"`
}

// Event is one verdict from the ring buffer.
type Event struct {
	Time      time.Time  `json:"time"`
	Endpoint  string     `json:"endpoint"`
	Direction string     `json:"direction"`
	Verdict   string     `json:"verdict"`
	Reason    string     `json:"reason"`
	Protocol  string     `json:"protocol"`
	Local     netip.Addr `json:"local"`
	LocalPort uint16     `json:"localPort"`
	Peer      netip.Addr `json:"peer"`
	PeerPort  uint16     `json:"peerPort"`
	PeerID    uint32     `json:"peerIdentity"`
	PeerName  string     `json:"peerName"`
	Policy    string     `json:"policy,omitempty"`
}

// DirName names a direction.
func DirName(d uint8) string {
	if d == DirEgress {
		return "egress"
	}
	return "ingress"
}

// ProtoName names an IP protocol.
func ProtoName(p uint8) string {
	switch p {
	case 0:
		return "any"
	case protoTCP:
		return "TCP"
	case protoUDP:
		return "UDP"
	case protoSCTP:
		return "SCTP"
	case 1:
		return "ICMP"
	case 58:
		return "ICMPv6"
	}
	return fmt.Sprint(p)
}

// ParseProto parses TCP, UDP (any case).
func ParseProto(s string) (uint8, error) {
	switch s {
	case "TCP", "tcp", "":
		return protoTCP, nil
	case "UDP", "udp":
		return protoUDP, nil
	case "SCTP", "sctp":
		return protoSCTP, nil
	}
	return 0, fmt.Errorf("protocol %q: want TCP or UDP", s)
}

var reasons = []string{"policy", "not isolated", "this node (always allowed)", "established", "default deny", "established, denied by the new policy"}

// ReasonName names a verdict reason.
func ReasonName(r uint8) string {
	if int(r) < len(reasons) {
		return reasons[r]
	}
	return fmt.Sprint(r)
}

// IdentityName names reserved identities.
func IdentityName(id uint32) string {
	switch id {
	case IdentityAny:
		return "any"
	case IdentityHost:
		return "host (this node)"
	case IdentityWorld:
		return "world"
	}
	return ""
}

func portsString(k Key) string {
	if k.Proto == protoAny || k.PortBits == 0 {
		return "any"
	}
	size := uint32(1) << (16 - k.PortBits)
	lo := uint32(k.Port) &^ (size - 1)
	if size == 1 {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d-%d", lo, lo+size-1)
}
