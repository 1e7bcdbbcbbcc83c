package dataplane

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// HostPort is the frontend kind of a container's hostPort: the node address
// (or addresses) and host port that reach one pod's container port, as the
// CNI portmap plugin's DNAT does for other runtimes. Waggle serves hostPorts
// from the same maps and programs as Services: the socket hooks for
// connections made on the node (the kubelet, hostNetwork pods, pods reaching
// their node's address), the north-south program for traffic from outside.
const HostPort FrontendKind = "HostPort"

// hostPortRefPrefix marks the ServiceRef of a pod's hostPorts: the tracker
// keys every source of frontends by a ServiceRef, and "pod/" cannot begin a
// Service name (a DNS label), so a pod never collides with a Service.
const hostPortRefPrefix = "pod/"

// HostPortRef is the ServiceRef under which a pod's hostPort frontends are
// tracked (and named in Warnings and in `waggle bpf lb list`).
func HostPortRef(namespace, pod string) ServiceRef {
	return ServiceRef{Namespace: namespace, Name: hostPortRefPrefix + pod}
}

// IsHostPortRef reports whether ref names a pod's hostPorts, not a Service.
func IsHostPortRef(ref ServiceRef) bool { return strings.HasPrefix(ref.Name, hostPortRefPrefix) }

// HasHostPorts reports whether a pod asks for a hostPort in any container
// (hostNetwork pods bind their ports on the node themselves: none).
func HasHostPorts(pod *v1.Pod) bool {
	if pod == nil || pod.Spec.HostNetwork {
		return false
	}
	for _, c := range hostPortContainers(pod) {
		for _, p := range c.Ports {
			if p.HostPort > 0 {
				return true
			}
		}
	}
	return false
}

// hostPortContainers are the containers whose ports are exposed while the
// pod runs: app containers and restartable init containers (sidecars).
func hostPortContainers(pod *v1.Pod) []v1.Container {
	out := pod.Spec.Containers
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			out = append(out[:len(out):len(out)], c)
		}
	}
	return out
}

// hostPortFrontends returns the frontends of a pod's hostPorts on node
// nodeName, whose addresses are nodeIPs: for each container port with a
// hostPort, hostIP:hostPort/protocol → podIP:containerPort, where an empty
// (or unspecified) hostIP means every node address of the pod's family and,
// for IPv4, 127.0.0.1 (left out with noLoopback). A pod of another node, a
// finished pod or one without an address yet has none. Readiness does not
// matter: as the portmap plugin's DNAT, a hostPort reaches the container as
// soon as the pod has its address.
func hostPortFrontends(pod *v1.Pod, nodeName string, nodeIPs []netip.Addr, noLoopback bool, warn func(Warning)) []Frontend {
	if !HasHostPorts(pod) || pod.Spec.NodeName != nodeName ||
		pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return nil
	}
	ref := HostPortRef(pod.Namespace, pod.Name)
	var podIPs []netip.Addr
	for _, s := range pod.Status.PodIPs {
		if a, err := parseIP(s.IP); err == nil {
			podIPs = append(podIPs, a)
		}
	}
	if len(podIPs) == 0 && pod.Status.PodIP != "" {
		if a, err := parseIP(pod.Status.PodIP); err == nil {
			podIPs = append(podIPs, a)
		}
	}
	if len(podIPs) == 0 {
		return nil
	}
	podIP := func(is4 bool) (netip.Addr, bool) {
		for _, a := range podIPs {
			if a.Is4() == is4 {
				return a, true
			}
		}
		return netip.Addr{}, false
	}
	loopback := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	var out []Frontend
	for _, c := range hostPortContainers(pod) {
		for _, p := range c.Ports {
			if p.HostPort <= 0 || p.HostPort > 65535 || p.ContainerPort <= 0 || p.ContainerPort > 65535 {
				continue
			}
			proto := Protocol(p.Protocol)
			if p.Protocol == "" {
				proto = TCP
			}
			if proto != TCP && proto != UDP {
				warn(Warning{ref, ReasonUnsupportedProtocol, fmt.Sprintf("container %s hostPort %d: protocol %s is not supported by waggle proxy; only TCP and UDP hostPorts are served", c.Name, p.HostPort, p.Protocol)})
				continue
			}
			var addrs []netip.Addr
			if h := strings.TrimSpace(p.HostIP); h == "" || h == "0.0.0.0" || h == "::" {
				addrs = append(addrs, nodeIPs...)
				if !noLoopback {
					addrs = append(addrs, loopback)
				}
			} else {
				a, err := netip.ParseAddr(h)
				if err != nil || a.Zone() != "" {
					warn(Warning{ref, ReasonInvalidAddress, fmt.Sprintf("container %s hostIP %q does not parse", c.Name, p.HostIP)})
					continue
				}
				a = a.Unmap()
				if a.IsLoopback() && noLoopback {
					continue
				}
				addrs = append(addrs, a)
			}
			for _, a := range addrs {
				ep, ok := podIP(a.Is4())
				if !ok {
					continue
				}
				out = append(out, Frontend{
					FrontendKey: FrontendKey{Addr: a, Port: uint16(p.HostPort), Protocol: proto},
					Kind:        HostPort,
					Service:     ServicePortName{Namespace: pod.Namespace, Name: ref.Name, Port: c.Name},
					Endpoints:   []Endpoint{{Addr: ep, Port: uint16(p.ContainerPort), NodeName: nodeName}},
					// The endpoint is on this node: no masquerade is needed
					// from outside, and the client address is kept.
					LocalOnly: true,
				})
			}
		}
	}
	return out
}
