package dataplane_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/l2announce"
	"github.com/waggle-io/waggle/dataplane/modes"
	"github.com/waggle-io/waggle/internal/ops"
	"github.com/waggle-io/waggle/internal/testutil"
)

func nsNetns(t *testing.T, role string) string {
	t.Helper()
	var b [3]byte
	rand.Read(b[:])
	name := "ns-px" + role + hex.EncodeToString(b[:])
	nsRun(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	nsRun(t, "ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
	return name
}

func nsRun(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func nsIn(t *testing.T, n string, args ...string) {
	t.Helper()
	nsRun(t, append([]string{"ip", "netns", "exec", n}, args...)...)
}

// TestProxyServesNodePortAndLoadBalancerIPFromOutside runs the whole proxy
// (ebpf mode, --nodeport-devices eth0) against a real API server: a client
// namespace outside the node reaches a LoadBalancer Service with
// externalTrafficPolicy Local through its NodePort and through its
// LoadBalancer IP — which the node announces by ARP after taking its Lease —
// and the pod sees the client's own address.
func TestProxyServesNodePortAndLoadBalancerIPFromOutside(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresKernelFeature(t, testutil.CgroupSockAddr)
	testutil.RequiresKernelFeature(t, testutil.BTF)
	wire, client, node, pod := nsNetns(t, "w"), nsNetns(t, "c"), nsNetns(t, "n"), nsNetns(t, "p")
	nsIn(t, wire, "ip", "link", "add", "br0", "type", "bridge")
	nsIn(t, wire, "ip", "link", "set", "br0", "up")
	for i, x := range []struct{ n, addr string }{{client, "10.27.40.100/24"}, {node, "10.27.40.1/24"}} {
		port := fmt.Sprintf("p%d", i)
		nsIn(t, wire, "ip", "link", "add", port, "type", "veth", "peer", "name", "t"+port)
		nsIn(t, wire, "ip", "link", "set", "t"+port, "netns", x.n)
		nsIn(t, x.n, "ip", "link", "set", "t"+port, "name", "eth0")
		nsIn(t, wire, "ip", "link", "set", port, "master", "br0", "up")
		nsIn(t, x.n, "ip", "addr", "add", x.addr, "dev", "eth0")
		nsIn(t, x.n, "ip", "link", "set", "eth0", "up")
	}
	nsIn(t, node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	nsIn(t, node, "ip", "link", "add", "pod0", "type", "veth", "peer", "name", "tpod")
	nsIn(t, node, "ip", "link", "set", "tpod", "netns", pod)
	nsIn(t, pod, "ip", "link", "set", "tpod", "name", "eth0")
	nsIn(t, node, "ip", "link", "set", "pod0", "up")
	nsIn(t, pod, "ip", "link", "set", "eth0", "up")
	nsIn(t, pod, "ip", "addr", "add", "10.27.41.10/32", "dev", "eth0")
	nsIn(t, pod, "ip", "route", "add", "10.27.40.1", "dev", "eth0", "scope", "link")
	nsIn(t, pod, "ip", "route", "add", "default", "via", "10.27.40.1", "dev", "eth0")
	nsIn(t, node, "ip", "route", "add", "10.27.41.10/32", "dev", "pod0")
	// The pod answers with the address it sees the connection from.
	var ln net.Listener
	if err := ns.WithNetNSPath("/run/netns/"+pod, func(ns.NetNS) (err error) {
		ln, err = net.Listen("tcp", "10.27.41.10:8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			c.Close()
		}
	}()

	rc, _, _ := apiservertest.StartTestServer(t)
	cs := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()
	const nodeName = "ns-node-a"
	if _, err := cs.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.27.40.1"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services("default").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The LB IPAM allocator's job, done by hand.
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.27.40.50"}}
	if _, err := cs.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.27.41.10"}, NodeName: ptr.To(nodeName),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	pin := filepath.Join("/sys/fs/bpf/waggle-test", testutil.UniqueName("ns-px"))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	cfg := dataplane.Config{Client: cs, NodeName: nodeName, Mode: dataplane.ModeEBPF, Modes: modes.All(),
		CgroupRoot: testutil.NewCgroup(t), BPFPinDir: pin, NodePortDevices: []string{"eth0"},
		NodePortNetNS: "/run/netns/" + node, NetworkPolicy: "off", NoHealthCheckNodePorts: true,
		// XDP in front of tc (generic on a veth); the backend is local,
		// so XDP passes these flows on to tc.
		LBAcceleration: ebpf.AccelBestEffort,
		// hybrid reaches the programs (the backend is local: no DSR here).
		LBMode:     ebpf.LBModeHybrid,
		SyncPeriod: time.Minute, Health: ops.NewHealth(),
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	go func() { done <- dataplane.Run(runCtx, cfg) }()
	t.Cleanup(func() {
		stop()
		<-done
		ebpf.CleanupPinned(pin)
	})

	dial := func(addr string) (string, error) {
		var seen string
		err := ns.WithNetNSPath("/run/netns/"+client, func(ns.NetNS) error {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil && err != io.EOF {
				return err
			}
			seen, _, _ = net.SplitHostPort(strings.TrimSpace(line))
			return nil
		})
		return seen, err
	}
	nodePort := fmt.Sprintf("10.27.40.1:%d", svc.Spec.Ports[0].NodePort)
	for _, addr := range []string{nodePort, "10.27.40.50:80"} {
		testutil.Eventually(t, 45*time.Second, func() error {
			seen, err := dial(addr)
			if err != nil {
				return fmt.Errorf("%s: %w", addr, err)
			}
			if seen != "10.27.40.100" {
				return fmt.Errorf("%s: the pod saw %s, want the client 10.27.40.100 (externalTrafficPolicy Local)", addr, seen)
			}
			return nil
		})
	}
	// --bpf-lb-acceleration reached the devices: generic XDP on the veth.
	if err := ns.WithNetNSPath("/run/netns/"+node, func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if x := l.Attrs().Xdp; x == nil || !x.Attached || x.AttachMode != 2 { // XDP_ATTACHED_SKB
			return fmt.Errorf("eth0 XDP %+v, want generic", x)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	// --bpf-lb-mode reached the programs' map.
	if v, err := ebpf.OpenPinned(pin); err != nil {
		t.Error(err)
	} else {
		if mode, err := v.LBMode(); err != nil || mode != ebpf.LBModeHybrid {
			t.Errorf("north-south mode %q, %v; want %s", mode, err, ebpf.LBModeHybrid)
		}
		v.Close()
	}
	l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, l2announce.LeaseName(netip.MustParseAddr("10.27.40.50")), metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != nodeName {
		t.Fatalf("L2 lease: %+v %v", l, err)
	}
}
