package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
	kubeproxyconfig "k8s.io/kubernetes/pkg/proxy/apis/config"
	kpiptables "k8s.io/kubernetes/pkg/proxy/iptables"
	kpnftables "k8s.io/kubernetes/pkg/proxy/nftables"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
	utiliptables "k8s.io/kubernetes/pkg/util/iptables"
	"k8s.io/utils/ptr"
)

// Upstream kube-proxy as a peer: this test binary, re-executed inside a
// node namespace, runs k8s.io/kubernetes's own iptables or nftables proxier
// (the code kube-proxy v1.37.2 runs), fed the same Services and
// EndpointSlices the Waggle paths get, without an API server (the proxier's
// OnServiceAdd/OnEndpointSliceAdd are what its informers call).
const (
	envKPMode     = "DP_NS_KUBEPROXY_MODE"
	envKPServices = "DP_NS_KUBEPROXY_SERVICES"
	envKPNodeIP   = "DP_NS_KUBEPROXY_NODE_IP"
	envKPPort     = "DP_NS_KUBEPROXY_PORT"
	envKPBackends = "DP_NS_KUBEPROXY_BACKENDS"
)

type proxier interface {
	OnServiceAdd(*v1.Service)
	OnServiceSynced()
	OnEndpointSliceAdd(*discoveryv1.EndpointSlice)
	OnEndpointSlicesSynced()
	SyncLoop()
}

// runKubeProxyChild runs upstream's proxier until stdin closes; it prints
// "ready <seconds>" once its rules for the measured NodePort are in place.
func runKubeProxyChild(mode string) int {
	n, _ := strconv.Atoi(os.Getenv(envKPServices))
	port, _ := strconv.Atoi(os.Getenv(envKPPort))
	nodeIP := net.ParseIP(os.Getenv(envKPNodeIP))
	var backends []string
	for _, b := range strings.Split(os.Getenv(envKPBackends), ",") {
		if b != "" {
			backends = append(backends, b)
		}
	}
	cfg := &kubeproxyconfig.KubeProxyConfiguration{
		IPTables:          kubeproxyconfig.KubeProxyIPTablesConfiguration{MasqueradeBit: ptr.To[int32](14), LocalhostNodePorts: ptr.To(false)},
		NFTables:          kubeproxyconfig.KubeProxyNFTablesConfiguration{MasqueradeBit: ptr.To[int32](14)},
		NodePortAddresses: []string{nodeIP.String() + "/32"},
		SyncPeriod:        metav1.Duration{Duration: 30 * time.Minute}, MinSyncPeriod: metav1.Duration{Duration: time.Second},
	}
	ctx := context.Background()
	var p proxier
	var err error
	switch mode {
	case "iptables":
		p, err = kpiptables.NewProxier(ctx, cfg, v1.IPv4Protocol, utiliptables.New(utiliptables.ProtocolIPv4), utilsysctl.New(),
			proxyutil.NewNoOpLocalDetector(), "dp-bench-kube-proxy", nodeIP, nil, nil, false)
	case "nftables":
		p, err = kpnftables.NewProxier(ctx, cfg, v1.IPv4Protocol, proxyutil.NewNoOpLocalDetector(), "dp-bench-kube-proxy", nodeIP, nil, nil, false)
	default:
		err = fmt.Errorf("mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-proxy peer:", err)
		return 1
	}
	start := time.Now()
	for _, o := range kubeProxyObjects(n, int32(port), backends) {
		switch o := o.(type) {
		case *v1.Service:
			p.OnServiceAdd(o)
		case *discoveryv1.EndpointSlice:
			p.OnEndpointSliceAdd(o)
		}
	}
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	go p.SyncLoop()
	for {
		var out []byte
		if mode == "iptables" {
			out, _ = exec.Command("iptables-save", "-t", "nat").Output()
		} else {
			out, _ = exec.Command("nft", "list", "table", "ip", "kube-proxy").Output()
		}
		if strings.Contains(string(out), strconv.Itoa(port)) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling the kernel's rules for the first sync
	}
	fmt.Printf("ready %.2f\n", time.Since(start).Seconds())
	bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
	// Leave no rules behind (the namespace goes too).
	if mode == "iptables" {
		kpiptables.CleanupLeftovers(ctx)
	} else {
		kpnftables.CleanupLeftovers(ctx)
	}
	return 0
}

// kubeProxyObjects: the measured NodePort Service (TCP and UDP on port,
// Cluster policy) and n-1 ExternalIP Services, like nsTopo.state.
func kubeProxyObjects(n int, port int32, backends []string) []any {
	var out []any
	mk := func(i int, name string) (*v1.Service, *discoveryv1.EndpointSlice) {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: types.UID(fmt.Sprintf("uid-%d", i))},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, SessionAffinity: v1.ServiceAffinityNone,
				ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String(), IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
				ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyCluster}}
		svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP}
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4}
		for _, b := range backends {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{b}, NodeName: ptr.To("node2"),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
		}
		return svc, es
	}
	svc, es := mk(0, "nodeport")
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc.Spec.Ports = []v1.ServicePort{
		{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP, NodePort: port, TargetPort: intstr.FromInt32(bePort)},
		{Name: "udp", Port: 53, Protocol: v1.ProtocolUDP, NodePort: port, TargetPort: intstr.FromInt32(bePort)},
	}
	es.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Port: ptr.To[int32](bePort), Protocol: ptr.To(v1.ProtocolTCP)},
		{Name: ptr.To("udp"), Port: ptr.To[int32](bePort), Protocol: ptr.To(v1.ProtocolUDP)}}
	out = append(out, svc, es)
	for i := 1; i < n; i++ {
		svc, es := mk(i, fmt.Sprintf("ext-%d", i))
		svc.Spec.ExternalIPs = []string{netip.AddrFrom4([4]byte{10, 28, byte(i >> 8), byte(i)}).String()}
		svc.Spec.Ports = []v1.ServicePort{{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(bePort)}}
		es.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Port: ptr.To[int32](bePort), Protocol: ptr.To(v1.ProtocolTCP)}}
		out = append(out, svc, es)
	}
	return out
}

// kubeProxyPeer re-executes this test binary in netns as upstream's proxier.
func kubeProxyPeer(mode string) Peer {
	return Peer{Name: "kube-proxy-" + mode, Start: func(netns, nodeIP string, port, n int, backends []netip.Addr) (time.Duration, func(), error) {
		var bs []string
		for _, b := range backends {
			bs = append(bs, b.String())
		}
		cmd := exec.Command("nsenter", "--net="+netns, "--", os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envKPMode+"="+mode, envKPServices+"="+strconv.Itoa(n), envKPNodeIP+"="+nodeIP,
			envKPPort+"="+strconv.Itoa(port), envKPBackends+"="+strings.Join(bs, ","))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return 0, nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return 0, nil, err
		}
		if err := cmd.Start(); err != nil {
			return 0, nil, err
		}
		stop := func() { stdin.Close(); cmd.Wait() }
		line, err := bufio.NewReader(stdout).ReadString('\n')
		var secs float64
		if _, serr := fmt.Sscanf(line, "ready %f", &secs); err != nil || serr != nil {
			stop()
			return 0, nil, fmt.Errorf("kube-proxy peer did not get ready: %q %v", line, err)
		}
		return time.Duration(secs * float64(time.Second)), stop, nil
	}}
}
