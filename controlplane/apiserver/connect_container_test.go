package apiserver

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestHasContainerCoversEveryKind: exec, attach and logs name init, app and
// ephemeral containers (kubectl debug execs into an ephemeral one; the
// Ephemeral Containers conformance specs were refused with "container
// debugger is not valid"); an unknown name is not a container.
func TestHasContainerCoversEveryKind(t *testing.T) {
	p := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers:      []corev1.Container{{Name: "init"}},
		Containers:          []corev1.Container{{Name: "app"}},
		EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger"}}},
	}}
	for name, want := range map[string]bool{"init": true, "app": true, "debugger": true, "nosuch": false} {
		if got := hasContainer(p, name); got != want {
			t.Errorf("hasContainer(%q) = %v, want %v", name, got, want)
		}
	}
}
