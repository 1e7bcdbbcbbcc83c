package catalog

import "testing"

func TestEveryResourceHasItsTypeRegistered(t *testing.T) {
	for _, r := range All() {
		gvks, _, err := Scheme.ObjectKinds(r.New())
		if err != nil || len(gvks) == 0 || gvks[0] != r.GroupVersionKind() {
			t.Errorf("%s: kind %v (err %v), want %v", r.GroupVersionResource, gvks, err, r.GroupVersionKind())
		}
		if _, _, err := Scheme.ObjectKinds(r.NewList()); err != nil {
			t.Errorf("%s: list type not registered: %v", r.GroupVersionResource, err)
		}
		if got, ok := Lookup(r.GroupVersionResource); !ok || got.Kind != r.Kind {
			t.Errorf("Lookup(%s) = %v, %v", r.GroupVersionResource, got, ok)
		}
	}
}

func TestEtcdPrefixFollowsKubernetesLayout(t *testing.T) {
	for gvr, want := range map[string]string{"pods": "/registry/pods/", "deployments": "/registry/deployments/"} {
		for _, r := range All() {
			if r.Resource == gvr && r.EtcdPrefix() != want {
				t.Errorf("%s: prefix %q, want %q", gvr, r.EtcdPrefix(), want)
			}
		}
	}
}
