package apiserver_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Pods (PodObservedGenerationTracking) and EndpointSlices keep
// metadata.generation as upstream: 1 on create, +1 on a spec change
// (for pods also through resize, and when a deletion is scheduled; for
// EndpointSlices also on a label change), unchanged by status and
// metadata-only writes.
func TestPodAndEndpointSliceGeneration(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	pods := cs.CoreV1().Pods("default")
	want := func(what string, got, want int64) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: generation %d, want %d", what, got, want)
		}
	}
	np := pod("gen", nil)
	np.Spec.NodeName = "node-a" // bound: its deletion is graceful
	p, err := pods.Create(ctx, np, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want("pod create", p.Generation, 1)
	p.Labels = map[string]string{"a": "b"}
	if p, err = pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("pod label change", p.Generation, 1)
	p.Spec.Containers[0].Image = "busybox:1.37"
	if p, err = pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("pod image change", p.Generation, 2)
	p.Status.Phase = corev1.PodRunning
	if p, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("pod status write", p.Generation, 2)
	grace := int64(30)
	if err := pods.Delete(ctx, "gen", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	if p, err = pods.Get(ctx, "gen", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("pod after a graceful delete: %v %v", p, err)
	}
	want("pod deletion scheduled", p.Generation, 3)

	slices := cs.DiscoveryV1().EndpointSlices("default")
	es, err := slices.Create(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "gen"}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want("slice create", es.Generation, 1)
	es.Labels = map[string]string{discoveryv1.LabelServiceName: "x"}
	if es, err = slices.Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("slice label change", es.Generation, 2)
	es.Annotations = map[string]string{"note": "x"}
	if es, err = slices.Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("slice annotation change", es.Generation, 2)
	es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}})
	if es, err = slices.Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("slice endpoints change", es.Generation, 3)
}
