package catalog

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestEveryResourceHasItsTypeRegistered(t *testing.T) {
	for _, r := range All() {
		gvks, _, err := Scheme.ObjectKinds(r.New())
		if err != nil || len(gvks) == 0 || gvks[0] != r.GroupVersionKind() {
			t.Errorf("%s: kind %v (err %v), want %v", r.GroupVersionResource, gvks, err, r.GroupVersionKind())
		}
		if r.Virtual && r.NewList == nil {
			if !slices.Equal(r.Verbs, []string{"create"}) {
				t.Errorf("%s: a virtual resource without a list is create-only", r.GroupVersionResource)
			}
		} else if r.Virtual && r.HasVerb("create") {
			t.Errorf("%s: a readable virtual resource (componentstatuses) is read-only", r.GroupVersionResource)
		} else if _, _, err := Scheme.ObjectKinds(r.NewList()); err != nil {
			t.Errorf("%s: list type not registered: %v", r.GroupVersionResource, err)
		}
		if got, ok := Lookup(r.GroupVersionResource); !ok || got.Kind != r.Kind {
			t.Errorf("Lookup(%s) = %v, %v", r.GroupVersionResource, got, ok)
		}
		if r.StoredAs != nil {
			if _, ok := Lookup(*r.StoredAs); !ok {
				t.Errorf("%s is stored as %s, which is not served", r.GroupVersionResource, r.StoredAs)
			}
		}
	}
}

func TestEtcdPrefixFollowsKubernetesLayout(t *testing.T) {
	for gvr, want := range map[schema.GroupVersionResource]string{
		{Version: "v1", Resource: "pods"}:                                           "/registry/pods/",
		{Group: "apps", Version: "v1", Resource: "deployments"}:                     "/registry/deployments/",
		{Group: "events.k8s.io", Version: "v1", Resource: "events"}:                 "/registry/events/",
		{Group: "autoscaling", Version: "v1", Resource: "horizontalpodautoscalers"}: "/registry/horizontalpodautoscalers/",
	} {
		r, ok := Lookup(gvr)
		if !ok || r.EtcdPrefix() != want {
			t.Errorf("%s: prefix %q (served %v), want %q", gvr, r.EtcdPrefix(), ok, want)
		}
	}
}

func TestResourcesAreAddedAndRemovedAtRunTime(t *testing.T) {
	c := Builtin()
	gen := c.Generation()
	gv := schema.GroupVersion{Group: "example.com", Version: "v1"}
	r := Resource{GroupVersionResource: gv.WithResource("widgets"), Kind: "Widget", Namespaced: true,
		New: func() runtime.Object { return &corev1.ConfigMap{} }, NewList: func() runtime.Object { return &corev1.ConfigMapList{} }}
	if err := c.Add(r); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(r); err == nil {
		t.Error("adding a served resource twice succeeded")
	}
	got, ok := c.Lookup(r.GroupVersionResource)
	if !ok || got.Singular != "widget" || got.ListKind != "WidgetList" || !got.HasVerb("watch") {
		t.Errorf("added resource = %+v, %v (defaults: singular, list kind, all verbs)", got, ok)
	}
	if gs := c.Groups(); gs[len(gs)-1] != gv || c.Generation() == gen {
		t.Errorf("groups %v, generation %d → %d", gs, gen, c.Generation())
	}
	if _, ok := Lookup(r.GroupVersionResource); ok {
		t.Error("adding to one catalog changed the built-in one")
	}
	c.Remove(r.GroupVersionResource)
	if _, ok := c.Lookup(r.GroupVersionResource); ok || slices.Contains(c.Groups(), gv) {
		t.Error("removed resource is still served")
	}
}
