package dataplane

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// trackerWorld is the informers' view that the tracker is fed from, so the
// test can check the tracker against Compute over the same objects.
type trackerWorld struct {
	services map[string]*v1.Service
	slices   map[string]*discoveryv1.EndpointSlice
	pods     map[string]*v1.Pod
	node     *v1.Node
}

func (w *trackerWorld) compute(noLoopback bool) (*State, []Warning) {
	var ss []*v1.Service
	for _, s := range w.services {
		ss = append(ss, s)
	}
	var es []*discoveryv1.EndpointSlice
	for _, e := range w.slices {
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b *discoveryv1.EndpointSlice) int { return compareStrings(a.Name, b.Name) })
	var nodes []*v1.Node
	if w.node != nil {
		nodes = []*v1.Node{w.node}
	}
	var pods []*v1.Pod
	for _, p := range w.pods {
		pods = append(pods, p)
	}
	var warns []Warning
	st := Compute("a", ss, es, nodes, ComputeOptions{NoLoopbackNodePorts: noLoopback, Pods: pods, Warn: func(x Warning) { warns = append(warns, x) }})
	return st, warns
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// randomService is one of a few shapes, with addresses drawn from a small
// pool so that Services collide on frontends now and then.
func randomService(rng *rand.Rand, name string) *v1.Service {
	return svc(name, func(s *v1.Service) {
		ip := fmt.Sprintf("10.96.0.%d", rng.IntN(6))
		s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
		if rng.IntN(3) == 0 {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = int32(30000 + rng.IntN(3))
		}
		if rng.IntN(4) == 0 {
			s.Spec.ExternalIPs = []string{fmt.Sprintf("192.0.2.%d", rng.IntN(3))}
		}
		if rng.IntN(5) == 0 {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}
		if rng.IntN(6) == 0 {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "sctp", Port: 9, Protocol: v1.ProtocolSCTP})
		}
	})
}

// randomHostPortPod is a pod of node "a" or "b" with a hostPort that may
// collide with another pod's or a Service's NodePort, on every node address
// or one address.
func randomHostPortPod(rng *rand.Rand, name string) *v1.Pod {
	hostIP := []string{"", "192.168.1.1", "127.0.0.1"}[rng.IntN(3)]
	proto := []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP}[rng.IntN(2)]
	p := &v1.Pod{}
	p.Namespace, p.Name = "default", name
	p.Spec.NodeName = []string{"a", "a", "b"}[rng.IntN(3)]
	p.Spec.Containers = []v1.Container{{Name: "c", Ports: []v1.ContainerPort{
		{HostPort: int32(30000 + rng.IntN(3)), ContainerPort: 8080, Protocol: proto, HostIP: hostIP}}}}
	if rng.IntN(4) > 0 {
		ip := fmt.Sprintf("10.244.0.%d", 100+rng.IntN(8))
		p.Status.PodIP, p.Status.PodIPs = ip, []v1.PodIP{{IP: ip}}
	}
	return p
}

func randomSlice(rng *rand.Rand, svcName, name string) *discoveryv1.EndpointSlice {
	var eps []epSpec
	for range rng.IntN(4) {
		addr := fmt.Sprintf("10.244.0.%d", rng.IntN(8))
		n := []string{"a", "b"}[rng.IntN(2)]
		switch rng.IntN(4) {
		case 0:
			eps = append(eps, terminating(addr, n, rng.IntN(2) == 0))
		case 1:
			eps = append(eps, notReady(addr, n))
		default:
			eps = append(eps, ready(addr, n))
		}
	}
	return slice(svcName, name, int32(8080+rng.IntN(2)), eps...)
}

// TestTrackerMatchesCompute feeds random event sequences to the tracker and
// checks after every Drain that (1) its State equals Compute over the same
// objects, (2) applying every Change in turn to a mirror gives that State,
// (3) a Change names only Services that had an event or lost/gained a
// contested frontend.
func TestTrackerMatchesCompute(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		noLoopback := seed%2 == 1
		tr := NewTracker("a", noLoopback)
		w := &trackerWorld{services: map[string]*v1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{}, pods: map[string]*v1.Pod{}}
		mirror := map[FrontendKey]Frontend{}
		for step := range 200 {
			for range 1 + rng.IntN(3) {
				name := fmt.Sprintf("s%d", rng.IntN(8))
				switch rng.IntN(9) {
				case 7:
					p := randomHostPortPod(rng, "p"+name)
					w.pods[p.Name] = p
					tr.Pod(p, false)
				case 8:
					if p := w.pods["p"+name]; p != nil {
						delete(w.pods, p.Name)
						tr.Pod(p, true)
					}
				case 0, 1:
					s := randomService(rng, name)
					w.services[name] = s
					tr.Service(s, false)
				case 2:
					if s := w.services[name]; s != nil {
						delete(w.services, name)
						tr.Service(s, true)
					}
				case 3, 4:
					es := randomSlice(rng, name, fmt.Sprintf("%s-%d", name, rng.IntN(2)))
					w.slices[es.Name] = es
					tr.EndpointSlice(es, false)
				case 5:
					sn := fmt.Sprintf("%s-%d", name, rng.IntN(2))
					if es := w.slices[sn]; es != nil {
						delete(w.slices, sn)
						tr.EndpointSlice(es, true)
					}
				case 6:
					switch rng.IntN(3) {
					case 0:
						w.node = nil
					default:
						w.node = node("a", fmt.Sprintf("192.168.1.%d", 1+rng.IntN(2)))
					}
					tr.Node(w.node)
				}
			}
			var got []Warning
			ch := tr.Drain(func(x Warning) { got = append(got, x) })
			for _, k := range ch.Remove {
				if _, ok := mirror[k]; !ok {
					t.Fatalf("seed %d step %d: Remove %s, which was never upserted", seed, step, k)
				}
				delete(mirror, k)
			}
			for _, f := range ch.Upsert {
				mirror[f.FrontendKey] = f
			}
			want, wantWarns := w.compute(noLoopback)
			st := tr.State(nil)
			if len(st.Frontends) == 0 {
				st.Frontends = nil
			}
			if !reflect.DeepEqual(st.Frontends, want.Frontends) {
				t.Fatalf("seed %d step %d: tracker state\n%v\nwant (Compute)\n%v", seed, step, summary(st), summary(want))
			}
			fromMirror := &State{}
			for _, f := range mirror {
				fromMirror.Frontends = append(fromMirror.Frontends, f)
			}
			slices.SortFunc(fromMirror.Frontends, func(a, b Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
			if !reflect.DeepEqual(fromMirror.Frontends, want.Frontends) {
				t.Fatalf("seed %d step %d: applying the changes gives\n%v\nwant\n%v", seed, step, summary(fromMirror), summary(want))
			}
			// Every warning the tracker reports is one Compute reports.
			for _, x := range got {
				if !slices.Contains(wantWarns, x) {
					t.Fatalf("seed %d step %d: tracker warned %+v, which Compute does not", seed, step, x)
				}
			}
			s, f, e := tr.Counts()
			ws, wf, we := 0, len(want.Frontends), 0
			seen := map[ServiceRef]bool{}
			for _, fr := range want.Frontends {
				we += len(fr.Endpoints)
				seen[ServiceRef{fr.Service.Namespace, fr.Service.Name}] = true
			}
			ws = len(seen)
			if s != ws || f != wf || e != we {
				t.Fatalf("seed %d step %d: counts %d/%d/%d, want %d/%d/%d", seed, step, s, f, e, ws, wf, we)
			}
		}
	}
}

// TestTrackerDrainIsProportionalToTheChange: with 1,000 Services, one
// EndpointSlice update hands out exactly that Service's frontend.
func TestTrackerDrainIsProportionalToTheChange(t *testing.T) {
	tr := NewTracker("a", false)
	for i := range 1000 {
		name := fmt.Sprintf("s%d", i)
		ip := fmt.Sprintf("10.96.%d.%d", i/256, i%256)
		tr.Service(svc(name, func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip} }), false)
		tr.EndpointSlice(slice(name, name+"-1", 8080, ready("10.244.0.1", "a")), false)
	}
	if ch := tr.Drain(nil); len(ch.Upsert) != 1000 {
		t.Fatalf("first drain upserts %d frontends, want 1000", len(ch.Upsert))
	}
	if ch := tr.Drain(nil); !ch.Empty() || len(ch.Services) != 0 {
		t.Fatalf("a drain without events changed %+v", ch)
	}
	tr.EndpointSlice(slice("s42", "s42-1", 8080, ready("10.244.0.1", "a"), ready("10.244.0.2", "a")), false)
	ch := tr.Drain(nil)
	if len(ch.Upsert) != 1 || len(ch.Remove) != 0 || len(ch.Endpoints()) != 2 || ch.Services[0].Name != "s42" {
		t.Fatalf("one slice update gave %+v", ch)
	}
	if st := tr.State(nil); len(st.Frontends) != 1000 {
		t.Fatalf("state has %d frontends", len(st.Frontends))
	}
}

// Endpoints lists the endpoints of a Change's upserts (test helper).
func (c *Change) Endpoints() []Endpoint {
	var out []Endpoint
	for _, f := range c.Upsert {
		out = append(out, f.Endpoints...)
	}
	return out
}

func BenchmarkTrackerOneEndpointChangeAt10k(b *testing.B) {
	tr := NewTracker("a", false)
	for i := range 10000 {
		name := fmt.Sprintf("s%d", i)
		ip := fmt.Sprintf("10.96.%d.%d", i/256, i%256)
		tr.Service(svc(name, func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip} }), false)
		var eps []epSpec
		for j := range 10 {
			eps = append(eps, ready(fmt.Sprintf("10.%d.%d.%d", 128+i/65536, (i/256)%256, j), "a"))
		}
		tr.EndpointSlice(slice(name, name+"-1", 8080, eps...), false)
	}
	tr.Drain(nil)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("s%d", i%10000)
		tr.EndpointSlice(slice(name, name+"-1", 8080, ready("10.244.0.1", "a"), ready(fmt.Sprintf("10.245.0.%d", i%250), "a")), false)
		tr.Drain(nil)
	}
}
