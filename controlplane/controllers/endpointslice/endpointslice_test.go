package endpointslice

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
)

func service(ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc", Namespace: "default", UID: "svc-uid"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "a"}, Ports: ports, ClusterIP: "10.96.0.10"}}
}

func testPod(i int, ready bool, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%03d", i), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%03d", i)),
			Labels: map[string]string{"app": "a"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c",
			Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)},
	}
	if ready {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	if mod != nil {
		mod(p)
	}
	return p
}

func newTestController(t *testing.T, max int, objs ...runtime.Object) *Controller {
	cs := ctrltest.NewClient(objs...)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t), Options{MaxEndpointsPerSlice: max})
	ctrltest.Start(t, cs, f)
	return c
}

func plan(c *Controller, svc *corev1.Service, pods []*corev1.Pod, existing []*discoveryv1.EndpointSlice) Plan {
	desired := map[discoveryv1.AddressType]map[string]*PortGroup{}
	for _, at := range addressTypes(svc) {
		desired[at] = c.Desired(svc, pods, at)
	}
	return PlanSlices(svc, desired, existing, c.opts.MaxEndpointsPerSlice, c.sliceLabels(svc))
}

// apply turns a plan into the resulting set of slices (named for tests).
func apply(existing []*discoveryv1.EndpointSlice, p Plan) []*discoveryv1.EndpointSlice {
	byName := map[string]*discoveryv1.EndpointSlice{}
	for _, s := range existing {
		byName[s.Name] = s
	}
	for _, s := range p.Delete {
		delete(byName, s.Name)
	}
	for _, s := range p.Update {
		byName[s.Name] = s
	}
	for i, s := range p.Create {
		s = s.DeepCopy()
		s.Name = fmt.Sprintf("%s%d-%d", s.GenerateName, len(byName), i)
		byName[s.Name] = s
	}
	var out []*discoveryv1.EndpointSlice
	for _, s := range byName {
		out = append(out, s)
	}
	return out
}

func TestSlicesHoldAtMostMaxEndpointsAndChangeInPlace(t *testing.T) {
	c := newTestController(t, 100)
	svc := service(corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromString("web")})
	var pods []*corev1.Pod
	for i := 0; i < 250; i++ {
		pods = append(pods, testPod(i, true, nil))
	}
	p := plan(c, svc, pods, nil)
	if len(p.Create) != 3 || len(p.Update)+len(p.Delete) != 0 {
		t.Fatalf("plan: %d create, %d update, %d delete", len(p.Create), len(p.Update), len(p.Delete))
	}
	sizes := map[int]int{}
	for _, s := range p.Create {
		sizes[len(s.Endpoints)]++
		if s.Labels[discoveryv1.LabelServiceName] != "svc" || s.Labels[discoveryv1.LabelManagedBy] != ManagedBy {
			t.Fatalf("labels %v", s.Labels)
		}
		if ref := metav1.GetControllerOf(s); ref == nil || ref.UID != "svc-uid" || ref.Kind != "Service" {
			t.Fatalf("owner %+v", ref)
		}
		if s.AddressType != discoveryv1.AddressTypeIPv4 || len(s.Ports) != 1 || *s.Ports[0].Port != 8080 || *s.Ports[0].Name != "http" {
			t.Fatalf("slice ports %+v", s.Ports)
		}
	}
	if sizes[100] != 2 || sizes[50] != 1 {
		t.Fatalf("slice sizes %v, want 100, 100, 50", sizes)
	}
	slices := apply(nil, p)

	// Nothing changed: nothing to write.
	if p := plan(c, svc, pods, slices); len(p.Create)+len(p.Update)+len(p.Delete) != 0 {
		t.Fatalf("idempotence: %d create, %d update, %d delete", len(p.Create), len(p.Update), len(p.Delete))
	}
	// One pod turns not ready: exactly one slice is rewritten.
	pods[7] = testPod(7, false, nil)
	p = plan(c, svc, pods, slices)
	if len(p.Update) != 1 || len(p.Create)+len(p.Delete) != 0 {
		t.Fatalf("readiness change: %d create, %d update, %d delete", len(p.Create), len(p.Update), len(p.Delete))
	}
	found := false
	for _, e := range p.Update[0].Endpoints {
		if e.TargetRef.Name == "p007" {
			found = true
			if *e.Conditions.Ready || *e.Conditions.Serving || *e.Conditions.Terminating {
				t.Fatalf("conditions %+v", e.Conditions)
			}
		}
	}
	if !found {
		t.Fatal("the changed endpoint is not in the updated slice")
	}
	// A new pod goes into the slice with room, not a new slice.
	slices = apply(slices, p)
	pods = append(pods, testPod(300, true, nil))
	p = plan(c, svc, pods, slices)
	if len(p.Update) != 1 || len(p.Create) != 0 || len(p.Update[0].Endpoints) != 51 {
		t.Fatalf("added pod: %d create, %d update", len(p.Create), len(p.Update))
	}
}

func TestEndpointConditions(t *testing.T) {
	now := metav1.NewTime(time.Now())
	tests := []struct {
		name                        string
		pod                         *corev1.Pod
		publishNotReady             bool
		wantIncluded                bool
		ready, serving, terminating bool
	}{
		{"ready", testPod(1, true, nil), false, true, true, true, false},
		{"not ready", testPod(1, false, nil), false, true, false, false, false},
		{"terminating but ready", testPod(1, true, func(p *corev1.Pod) { p.DeletionTimestamp = &now }), false, true, false, true, true},
		{"publishNotReadyAddresses", testPod(1, false, nil), true, true, true, true, false},
		{"no IP yet", testPod(1, true, func(p *corev1.Pod) { p.Status.PodIP = "" }), false, false, false, false, false},
		{"succeeded", testPod(1, false, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), false, false, false, false, false},
	}
	c := newTestController(t, 100)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := service(corev1.ServicePort{Name: "http", Port: 80})
			svc.Spec.PublishNotReadyAddresses = tc.publishNotReady
			groups := c.Desired(svc, []*corev1.Pod{tc.pod}, discoveryv1.AddressTypeIPv4)
			var eps []discoveryv1.Endpoint
			for _, g := range groups {
				for _, e := range g.Endpoints {
					eps = append(eps, e)
				}
			}
			if (len(eps) == 1) != tc.wantIncluded {
				t.Fatalf("included=%v, want %v", len(eps) == 1, tc.wantIncluded)
			}
			if !tc.wantIncluded {
				return
			}
			cond := eps[0].Conditions
			if *cond.Ready != tc.ready || *cond.Serving != tc.serving || *cond.Terminating != tc.terminating {
				t.Fatalf("ready=%v serving=%v terminating=%v", *cond.Ready, *cond.Serving, *cond.Terminating)
			}
		})
	}
}

func TestNamedTargetPortResolvesPerPod(t *testing.T) {
	c := newTestController(t, 100)
	svc := service(corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromString("web")})
	other := testPod(2, true, func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 9090 })
	missing := testPod(3, true, func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil })
	groups := c.Desired(svc, []*corev1.Pod{testPod(1, true, nil), other, missing}, discoveryv1.AddressTypeIPv4)
	ports := map[int32]int{}
	noPorts := 0
	for _, g := range groups {
		if len(g.Ports) == 0 {
			noPorts += len(g.Endpoints)
			continue
		}
		ports[*g.Ports[0].Port] += len(g.Endpoints)
	}
	// Pods group by their resolved port: two port sets, two slices; a pod
	// without the named port is published without that port, as Kubernetes.
	if ports[8080] != 1 || ports[9090] != 1 || noPorts != 1 {
		t.Fatalf("endpoints by port %v, without ports %d", ports, noPorts)
	}
	if _, err := FindPort(missing, &svc.Spec.Ports[0]); err == nil {
		t.Fatal("want an error for a missing named port")
	}
}

func TestPlaceholderSliceWhenNoEndpoints(t *testing.T) {
	c := newTestController(t, 100)
	svc := service(corev1.ServicePort{Name: "http", Port: 80})
	p := plan(c, svc, nil, nil)
	if len(p.Create) != 1 || len(p.Create[0].Endpoints) != 0 {
		t.Fatalf("want one empty placeholder slice, got %+v", p)
	}
	slices := apply(nil, p)
	if p := plan(c, svc, nil, slices); len(p.Create)+len(p.Update)+len(p.Delete) != 0 {
		t.Fatalf("placeholder not stable: %+v", p)
	}
	// Endpoints arrive: the placeholder is reused... or replaced; either
	// way one slice remains.
	slices = apply(slices, plan(c, svc, []*corev1.Pod{testPod(1, true, nil)}, slices))
	if len(slices) != 1 || len(slices[0].Endpoints) != 1 {
		t.Fatalf("slices %d", len(slices))
	}
}

func TestDualStackServiceGetsASlicePerAddressType(t *testing.T) {
	c := newTestController(t, 100)
	svc := service(corev1.ServicePort{Name: "http", Port: 80})
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	pod := testPod(1, true, func(p *corev1.Pod) {
		p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}, {IP: "fd00::1"}}
	})
	p := plan(c, svc, []*corev1.Pod{pod}, nil)
	types := map[discoveryv1.AddressType]string{}
	for _, s := range p.Create {
		types[s.AddressType] = s.Endpoints[0].Addresses[0]
	}
	if types[discoveryv1.AddressTypeIPv4] != "10.0.0.2" || types[discoveryv1.AddressTypeIPv6] != "fd00::1" {
		t.Fatalf("slices by type %v", types)
	}
}

func TestTrackerWaitsForTheInformerToCatchUp(t *testing.T) {
	tr := newTracker()
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{UID: "a", ResourceVersion: "10"}}
	tr.wrote("ns/svc", s)
	if !tr.stale("ns/svc", nil) {
		t.Fatal("a created slice missing from the cache must be stale")
	}
	old := s.DeepCopy()
	old.ResourceVersion = "9"
	if !tr.stale("ns/svc", []*discoveryv1.EndpointSlice{old}) {
		t.Fatal("an older cached copy must be stale")
	}
	if tr.stale("ns/svc", []*discoveryv1.EndpointSlice{s}) {
		t.Fatal("an up-to-date cache is not stale")
	}
	tr.deleted("ns/svc", s)
	if !tr.stale("ns/svc", []*discoveryv1.EndpointSlice{s}) {
		t.Fatal("a deleted slice still cached must be stale")
	}
	if tr.stale("ns/svc", nil) {
		t.Fatal("once gone from the cache it is not stale")
	}
}

// FuzzPlanSlices checks the slice planner's invariants on arbitrary pod
// sets and changes: every eligible pod appears exactly once, no slice holds
// more than the maximum, and planning again from the result writes nothing.
func FuzzPlanSlices(f *testing.F) {
	f.Add([]byte{3, 200, 1, 7}, uint8(5))
	f.Add([]byte{0}, uint8(1))
	f.Add([]byte("some pods, some ready, some terminating"), uint8(3))
	f.Fuzz(func(t *testing.T, spec []byte, maxPer uint8) {
		if maxPer == 0 || len(spec) > 400 {
			return
		}
		c := &Controller{log: ctrltest.Log(t), opts: Options{MaxEndpointsPerSlice: int(maxPer)}}
		c.nodes = nil
		svc := service(corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromString("web")})
		build := func(spec []byte) []*corev1.Pod {
			var pods []*corev1.Pod
			for i, b := range spec {
				now := metav1.Now()
				pods = append(pods, testPod(i, b&1 == 1, func(p *corev1.Pod) {
					p.Spec.NodeName = ""
					if b&2 == 2 {
						p.DeletionTimestamp = &now
					}
					if b&4 == 4 {
						p.Spec.Containers[0].Ports[0].ContainerPort = 9090
					}
					if b&8 == 8 {
						p.Status.PodIP = ""
					}
				}))
			}
			return pods
		}
		pods := build(spec)
		slices := apply(nil, plan(c, svc, pods, nil))
		check := func(slices []*discoveryv1.EndpointSlice, pods []*corev1.Pod) {
			seen := map[string]int{}
			for _, s := range slices {
				if len(s.Endpoints) > int(maxPer) {
					t.Fatalf("slice with %d endpoints, max %d", len(s.Endpoints), maxPer)
				}
				for _, e := range s.Endpoints {
					seen[e.TargetRef.Name]++
				}
			}
			want := 0
			for _, p := range pods {
				if include(p) {
					want++
					if seen[p.Name] != 1 {
						t.Fatalf("pod %s appears %d times", p.Name, seen[p.Name])
					}
				}
			}
			if len(seen) != want {
				t.Fatalf("%d endpoints for %d eligible pods", len(seen), want)
			}
			if p := plan(c, svc, pods, slices); len(p.Create)+len(p.Update)+len(p.Delete) != 0 {
				t.Fatalf("not idempotent: %d create, %d update, %d delete", len(p.Create), len(p.Update), len(p.Delete))
			}
		}
		check(slices, pods)
		// Change every other pod and plan from the existing slices.
		changed := append([]byte(nil), spec...)
		for i := range changed {
			if i%2 == 0 {
				changed[i] ^= 3
			}
		}
		pods2 := build(changed)
		check(apply(slices, plan(c, svc, pods2, slices)), pods2)
	})
}

func TestSyncPublishesSelectedPodsButNothingForExternalNameOrSelectorless(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*corev1.Service)
		want int // slices
	}{
		{"selector", func(*corev1.Service) {}, 1},
		{"ExternalName", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
			s.Spec.ExternalName = "example.com"
		}, 0},
		{"no selector", func(s *corev1.Service) { s.Spec.Selector = nil }, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := service(corev1.ServicePort{Name: "http", Port: 80})
			tc.mod(svc)
			c := newTestController(t, 100, svc, testPod(1, true, nil), testPod(2, false, nil))
			if err := c.sync(context.Background(), "default/svc"); err != nil {
				t.Fatal(err)
			}
			l, err := c.client.DiscoveryV1().EndpointSlices("default").List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Items) != tc.want {
				t.Fatalf("%d slices, want %d", len(l.Items), tc.want)
			}
			if tc.want == 1 && len(l.Items[0].Endpoints) != 2 {
				t.Fatalf("%d endpoints, want 2", len(l.Items[0].Endpoints))
			}
			if err := c.syncEndpoints(context.Background(), "default/svc"); err != nil {
				t.Fatal(err)
			}
			ep, err := c.client.CoreV1().Endpoints("default").Get(context.Background(), "svc", metav1.GetOptions{})
			if tc.want == 0 {
				if err == nil {
					t.Fatalf("legacy Endpoints written: %+v", ep.Subsets)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(ep.Subsets) != 1 || len(ep.Subsets[0].Addresses) != 1 || len(ep.Subsets[0].NotReadyAddresses) != 1 ||
				ep.Labels[discoveryv1.LabelSkipMirror] != "true" {
				t.Fatalf("legacy Endpoints %+v labels %v", ep.Subsets, ep.Labels)
			}
		})
	}
}
