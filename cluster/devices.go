package cluster

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/waggle-io/waggle/kubelet"
)

// NodePortDevices resolves --nodeport-devices of `waggle up` and `waggle
// join` into the proxy's external devices, on which eBPF serves NodePort,
// ExternalIP and LoadBalancer traffic from other machines (and answers ARP
// for LoadBalancer IPs). "auto" is the device that holds the node's address
// (nodeIP — its first address if it is a dual-stack pair — else the kubelet's default InternalIP: the default route's
// source address), as a kube-proxy user
// expects a NodePort to answer on the node's address from anywhere; a
// loopback address gives none. "none" or "" is off; anything else is a
// comma-separated list of device names, taken as given.
func NodePortDevices(spec, nodeIP string) ([]string, error) {
	switch spec {
	case "", "none":
		return nil, nil
	case "auto":
	default:
		var devs []string
		for _, d := range strings.Split(spec, ",") {
			if d = strings.TrimSpace(d); d == "" || len(d) > 15 || strings.ContainsAny(d, "/ ") {
				return nil, fmt.Errorf("--nodeport-devices %q: want auto, none or comma-separated device names", spec)
			}
			devs = append(devs, d)
		}
		return devs, nil
	}
	ip, _, _ := strings.Cut(nodeIP, ",") // a dual-stack node's primary address
	if ip == "" {
		ip = kubelet.DefaultNodeIP() // the InternalIP the node registers
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return nil, fmt.Errorf("node IP %q: %w", ip, err)
	}
	if addr.IsLoopback() {
		return nil, nil
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, ifc := range ifaces {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if got, ok := netip.AddrFromSlice(n.IP); ok && got.Unmap() == addr.Unmap() {
					if ifc.Flags&net.FlagLoopback != 0 {
						return nil, nil
					}
					return []string{ifc.Name}, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("--nodeport-devices auto: no device holds the node's address %s", addr)
}
