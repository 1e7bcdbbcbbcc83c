package dataplane

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
)

var update = flag.Bool("update", false, "rewrite golden files")

func svc(name string, mut ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, m := range mut {
		m(s)
	}
	return s
}

type epSpec struct {
	addr        string
	node        string
	ready       *bool
	serving     *bool
	terminating *bool
}

func slice(svcName, name string, port int32, eps ...epSpec) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, e := range eps {
		if strings.Contains(e.addr, ":") {
			es.AddressType = discoveryv1.AddressTypeIPv6
		}
		ep := discoveryv1.Endpoint{Addresses: []string{e.addr},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating}}
		if e.node != "" {
			ep.NodeName = ptr.To(e.node)
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

func node(name string, addrs ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	return n
}

func ready(addr, nodeName string) epSpec { return epSpec{addr: addr, node: nodeName} }
func terminating(addr, nodeName string, serving bool) epSpec {
	return epSpec{addr: addr, node: nodeName, ready: ptr.To(false), serving: ptr.To(serving), terminating: ptr.To(true)}
}
func notReady(addr, nodeName string) epSpec {
	return epSpec{addr: addr, node: nodeName, ready: ptr.To(false), serving: ptr.To(false)}
}

// summary is the part of a frontend a case checks: key → endpoints.
func summary(st *State) map[string][]string {
	out := map[string][]string{}
	for _, f := range st.Frontends {
		var eps []string
		for _, e := range f.Endpoints {
			s := e.AddrPort().String()
			if e.Terminating {
				s += "(t)"
			}
			eps = append(eps, s)
		}
		out[string(f.Kind)+" "+f.FrontendKey.String()] = eps
	}
	return out
}

func TestCompute(t *testing.T) {
	nodes := []*v1.Node{node("a", "192.168.1.1", "fd00::1"), node("b", "192.168.1.2")}
	tests := []struct {
		name     string
		services []*v1.Service
		slices   []*discoveryv1.EndpointSlice
		opts     ComputeOptions
		want     map[string][]string
		warn     []string // reasons
	}{
		{
			name:     "clusterIP gets ready endpoints only",
			services: []*v1.Service{svc("web")},
			slices:   []*discoveryv1.EndpointSlice{slice("web", "web-1", 8080, ready("10.0.0.2", "a"), notReady("10.0.0.3", "b"), ready("10.0.0.1", "b"))},
			want:     map[string][]string{"ClusterIP 10.96.0.10:80/TCP": {"10.0.0.1:8080", "10.0.0.2:8080"}},
		},
		{
			name:     "no endpoints leaves a frontend that refuses",
			services: []*v1.Service{svc("web")},
			want:     map[string][]string{"ClusterIP 10.96.0.10:80/TCP": nil},
		},
		{
			name:     "serving terminating endpoints are used only when none is ready",
			services: []*v1.Service{svc("web")},
			slices:   []*discoveryv1.EndpointSlice{slice("web", "web-1", 8080, terminating("10.0.0.1", "a", true), terminating("10.0.0.2", "a", false))},
			want:     map[string][]string{"ClusterIP 10.96.0.10:80/TCP": {"10.0.0.1:8080(t)"}},
		},
		{
			name:     "terminating endpoints are dropped while a ready one exists",
			services: []*v1.Service{svc("web")},
			slices:   []*discoveryv1.EndpointSlice{slice("web", "web-1", 8080, terminating("10.0.0.1", "a", true), ready("10.0.0.2", "b"))},
			want:     map[string][]string{"ClusterIP 10.96.0.10:80/TCP": {"10.0.0.2:8080"}},
		},
		{
			name:     "endpoints are deduplicated across slices and a ready copy wins",
			services: []*v1.Service{svc("web")},
			slices: []*discoveryv1.EndpointSlice{
				slice("web", "web-1", 8080, notReady("10.0.0.1", "a"), ready("10.0.0.2", "a")),
				slice("web", "web-2", 8080, ready("10.0.0.1", "a"), ready("10.0.0.2", "a")),
			},
			want: map[string][]string{"ClusterIP 10.96.0.10:80/TCP": {"10.0.0.1:8080", "10.0.0.2:8080"}},
		},
		{
			name: "target port is found by port name across slices",
			services: []*v1.Service{svc("web", func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{{Name: "http", Port: 80}, {Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}}
			})},
			slices: []*discoveryv1.EndpointSlice{
				slice("web", "web-1", 8080, ready("10.0.0.1", "a")),
				func() *discoveryv1.EndpointSlice {
					es := slice("web", "web-2", 5353, ready("10.0.0.9", "b"))
					es.Ports[0].Name, es.Ports[0].Protocol = ptr.To("dns"), ptr.To(v1.ProtocolUDP)
					return es
				}(),
			},
			want: map[string][]string{
				"ClusterIP 10.96.0.10:80/TCP": {"10.0.0.1:8080"},
				"ClusterIP 10.96.0.10:53/UDP": {"10.0.0.9:5353"},
			},
		},
		{
			name: "SCTP ports are refused with a warning and other ports kept",
			services: []*v1.Service{svc("web", func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "sig", Port: 9, Protocol: v1.ProtocolSCTP})
			})},
			want: map[string][]string{"ClusterIP 10.96.0.10:80/TCP": nil},
			warn: []string{ReasonUnsupportedProtocol},
		},
		{
			name: "internalTrafficPolicy Local keeps only this node's endpoints",
			services: []*v1.Service{svc("web", func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
			})},
			slices: []*discoveryv1.EndpointSlice{slice("web", "web-1", 8080, ready("10.0.0.1", "a"), ready("10.0.0.2", "b"))},
			want:   map[string][]string{"ClusterIP 10.96.0.10:80/TCP": {"10.0.0.1:8080"}},
		},
		{
			name: "NodePort on node IPs and localhost, externalTrafficPolicy Local only for external frontends",
			services: []*v1.Service{svc("web", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			})},
			slices: []*discoveryv1.EndpointSlice{slice("web", "web-1", 8080, ready("10.0.0.1", "a"), ready("10.0.0.2", "b"))},
			want: map[string][]string{
				"ClusterIP 10.96.0.10:80/TCP":    {"10.0.0.1:8080", "10.0.0.2:8080"},
				"NodePort 192.168.1.1:30080/TCP": {"10.0.0.1:8080"},
				"NodePort 127.0.0.1:30080/TCP":   {"10.0.0.1:8080"},
			},
		},
		{
			name: "NoLoopbackNodePorts leaves out 127.0.0.1",
			services: []*v1.Service{svc("web", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
			})},
			opts: ComputeOptions{NoLoopbackNodePorts: true},
			want: map[string][]string{
				"ClusterIP 10.96.0.10:80/TCP":    nil,
				"NodePort 192.168.1.1:30080/TCP": nil,
			},
		},
		{
			name: "ExternalIPs and LoadBalancer ingress IPs, Proxy ipMode skipped",
			services: []*v1.Service{svc("web", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalIPs = []string{"203.0.113.5"}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.7"}, {IP: "198.51.100.8", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)}, {Hostname: "lb.example"}}
			})},
			slices: []*discoveryv1.EndpointSlice{slice("web", "web-1", 8080, ready("10.0.0.1", "b"))},
			opts:   ComputeOptions{NoLoopbackNodePorts: true},
			want: map[string][]string{
				"ClusterIP 10.96.0.10:80/TCP":      {"10.0.0.1:8080"},
				"ExternalIP 203.0.113.5:80/TCP":    {"10.0.0.1:8080"},
				"LoadBalancer 198.51.100.7:80/TCP": {"10.0.0.1:8080"},
			},
		},
		{
			name: "dual-stack clusterIPs get endpoints of their own family",
			services: []*v1.Service{svc("web", func(s *v1.Service) {
				s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
			})},
			slices: []*discoveryv1.EndpointSlice{
				slice("web", "web-4", 8080, ready("10.0.0.1", "a")),
				slice("web", "web-6", 8080, ready("fd00:10::1", "a")),
			},
			want: map[string][]string{
				"ClusterIP 10.96.0.10:80/TCP":    {"10.0.0.1:8080"},
				"ClusterIP [fd00:96::10]:80/TCP": {"[fd00:10::1]:8080"},
			},
		},
		{
			name: "dual-stack NodePort and LoadBalancer: each family on the node's address of that family",
			services: []*v1.Service{svc("web", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalIPs = []string{"fd00:ee::5"}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.7"}, {IP: "fd00:1b::7"}}
			})},
			slices: []*discoveryv1.EndpointSlice{
				slice("web", "web-4", 8080, ready("10.0.0.1", "a")),
				slice("web", "web-6", 8080, ready("fd00:10::1", "a")),
			},
			opts: ComputeOptions{NoLoopbackNodePorts: true},
			want: map[string][]string{
				"ClusterIP 10.96.0.10:80/TCP":      {"10.0.0.1:8080"},
				"ClusterIP [fd00:96::10]:80/TCP":   {"[fd00:10::1]:8080"},
				"NodePort 192.168.1.1:30080/TCP":   {"10.0.0.1:8080"},
				"NodePort [fd00::1]:30080/TCP":     {"[fd00:10::1]:8080"},
				"ExternalIP [fd00:ee::5]:80/TCP":   {"[fd00:10::1]:8080"},
				"LoadBalancer 198.51.100.7:80/TCP": {"10.0.0.1:8080"},
				"LoadBalancer [fd00:1b::7]:80/TCP": {"[fd00:10::1]:8080"},
			},
		},
		{
			name: "headless and ExternalName services have no frontends",
			services: []*v1.Service{
				svc("headless", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }),
				svc("ext", func(s *v1.Service) {
					s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ServiceTypeExternalName, "", nil
				}),
			},
			want: map[string][]string{},
		},
		{
			name: "two services on one externalIP: the first by name keeps it",
			services: []*v1.Service{
				svc("b", func(s *v1.Service) {
					s.Spec.ClusterIPs = []string{"10.96.0.11"}
					s.Spec.ExternalIPs = []string{"203.0.113.5"}
				}),
				svc("a", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.5"} }),
			},
			want: map[string][]string{
				"ClusterIP 10.96.0.10:80/TCP":   nil,
				"ClusterIP 10.96.0.11:80/TCP":   nil,
				"ExternalIP 203.0.113.5:80/TCP": nil,
			},
			warn: []string{ReasonFrontendConflict},
		},
		{
			name: "a bad address is a warning, not a crash",
			services: []*v1.Service{svc("web", func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"not-an-ip"}
			})},
			want: map[string][]string{"ClusterIP 10.96.0.10:80/TCP": nil},
			warn: []string{ReasonInvalidAddress},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var warns []string
			opts := tt.opts
			opts.Warn = func(w Warning) { warns = append(warns, w.Reason) }
			st := Compute("a", tt.services, tt.slices, nodes, opts)
			if err := st.Validate(); err != nil {
				t.Fatalf("computed state is invalid: %v\n%s", err, st.Dump())
			}
			got := summary(st)
			if len(got) != len(tt.want) {
				t.Fatalf("frontends:\n got %v\nwant %v", got, tt.want)
			}
			for k, w := range tt.want {
				g, ok := got[k]
				if !ok || strings.Join(g, ",") != strings.Join(w, ",") {
					t.Errorf("%s: got %v (present %v), want %v", k, g, ok, w)
				}
			}
			if strings.Join(warns, ",") != strings.Join(tt.warn, ",") {
				t.Errorf("warnings: got %v, want %v", warns, tt.warn)
			}
		})
	}
}

func TestComputeAffinityTimeout(t *testing.T) {
	for _, tt := range []struct {
		name    string
		timeout *int32
		want    time.Duration
	}{
		{"default timeout is three hours", nil, DefaultAffinityTimeout},
		{"explicit timeout is kept", ptr.To[int32](30), 30 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := svc("web", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				if tt.timeout != nil {
					s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: tt.timeout}}
				}
			})
			st := Compute("a", []*v1.Service{s}, nil, nil, ComputeOptions{})
			if len(st.Frontends) != 1 || st.Frontends[0].AffinityTimeout != tt.want {
				t.Fatalf("got %s", st.Dump())
			}
		})
	}
}

func TestComputeIsDeterministic(t *testing.T) {
	services := []*v1.Service{svc("b", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.11"} }), svc("a")}
	sl := []*discoveryv1.EndpointSlice{slice("a", "a-2", 80, ready("10.0.0.3", "")), slice("a", "a-1", 80, ready("10.0.0.1", ""))}
	first := Compute("a", services, sl, nil, ComputeOptions{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}}).Dump()
	services[0], services[1] = services[1], services[0]
	sl[0], sl[1] = sl[1], sl[0]
	if again := Compute("a", services, sl, nil, ComputeOptions{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}}).Dump(); again != first {
		t.Fatalf("input order changed the state:\n%s\nvs\n%s", first, again)
	}
}

// TestComputeGolden computes the state of each testdata/compute/*.yaml (a
// cluster's Services, EndpointSlices and Nodes, for node "node-a") and
// compares its dump with the .golden file beside it.
func TestComputeGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/compute/*.yaml")
	if len(files) == 0 {
		t.Fatal("no testdata/compute/*.yaml")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			services, sl, nodes, pods := loadObjects(t, f)
			var warns []string
			st := Compute("node-a", services, sl, nodes, ComputeOptions{
				Pods:         pods,
				ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
				Warn:         func(w Warning) { warns = append(warns, "warning "+w.Service.String()+" "+w.Reason+": "+w.Message) },
			})
			got := st.Dump() + strings.Join(warns, "\n")
			if len(warns) > 0 {
				got += "\n"
			}
			golden := strings.TrimSuffix(f, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if got != string(want) {
				t.Errorf("state differs from %s (run with -update if intended):\n--- got\n%s--- want\n%s", golden, got, want)
			}
		})
	}
}

func loadObjects(t *testing.T, path string) ([]*v1.Service, []*discoveryv1.EndpointSlice, []*v1.Node, []*v1.Pod) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		services []*v1.Service
		sl       []*discoveryv1.EndpointSlice
		nodes    []*v1.Node
		pods     []*v1.Pod
	)
	dec := scheme.Codecs.UniversalDeserializer()
	for i, doc := range strings.Split(string(data), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj, _, err := dec.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
		switch o := obj.(type) {
		case *v1.Service:
			services = append(services, o)
		case *discoveryv1.EndpointSlice:
			sl = append(sl, o)
		case *v1.Node:
			nodes = append(nodes, o)
		case *v1.Pod:
			pods = append(pods, o)
		default:
			t.Fatalf("%s document %d: unexpected %T", path, i, obj)
		}
	}
	return services, sl, nodes, pods
}
