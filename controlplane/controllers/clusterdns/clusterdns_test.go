package clusterdns

import (
	"context"
	"log/slog"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

func node(name, ip string, ready bool) *v1.Node {
	st := v1.ConditionFalse
	if ready {
		st = v1.ConditionTrue
	}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.NodeStatus{
		Addresses:  []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}},
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: st}}}}
}

func TestPublishesServiceAndNodeEndpoints(t *testing.T) {
	cs := fake.NewSimpleClientset(node("a", "192.0.2.1", true), node("b", "192.0.2.2", false))
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler), Options{ClusterIP: "10.96.0.10"})
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	defer f.Shutdown()
	defer cancel()
	cache.WaitForCacheSync(ctx.Done(), c.synced...)
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(Namespace).Get(ctx, ServiceName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != "10.96.0.10" || svc.Spec.Selector != nil || *svc.Spec.InternalTrafficPolicy != v1.ServiceInternalTrafficPolicyLocal ||
		len(svc.Spec.Ports) != 2 || svc.Spec.Ports[0].Port != 53 || svc.Spec.Ports[0].TargetPort.IntVal != DefaultPort {
		t.Errorf("service spec %+v", svc.Spec)
	}
	es, err := cs.DiscoveryV1().EndpointSlices(Namespace).Get(ctx, SliceName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(es.Endpoints) != 2 || es.Endpoints[0].Addresses[0] != "192.0.2.1" || !*es.Endpoints[0].Conditions.Ready ||
		*es.Endpoints[1].Conditions.Ready || *es.Endpoints[1].NodeName != "b" || *es.Ports[0].Port != DefaultPort {
		t.Errorf("slice %+v", es)
	}
	// Node b turns Ready: the next sync updates the slice; a sync with no
	// change writes nothing.
	// (Written to the informer's store directly: the fake clientset's watch
	// may open after the list, and its events would be lost.)
	if err := f.Core().V1().Nodes().Informer().GetIndexer().Update(node("b", "192.0.2.2", true)); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	es, _ = cs.DiscoveryV1().EndpointSlices(Namespace).Get(ctx, SliceName, metav1.GetOptions{})
	if !*es.Endpoints[1].Conditions.Ready {
		t.Errorf("node b's endpoint not ready after the node became Ready")
	}
	before := len(cs.Actions())
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range cs.Actions()[before:] {
		if a.GetVerb() != "get" {
			t.Errorf("an unchanged sync wrote: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}
