package kubelet

import (
	"testing"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

// Which instance's log `kubectl logs [--previous]` gets, as upstream's
// kubelet chooses from the container status: a container waiting to start
// again (a restart created its next instance, not started yet) answers with
// its last terminated instance, not the new one's empty log.
func TestLogInstance(t *testing.T) {
	running := runtime.Container{ID: "r", State: runtime.StateRunning}
	created := runtime.Container{ID: "c", State: runtime.StateCreated}
	exited := runtime.Container{ID: "e", State: runtime.StateExited}
	older := runtime.Container{ID: "o", State: runtime.StateExited}
	for _, tc := range []struct {
		name     string
		l        []runtime.Container
		previous bool
		want     string // "" for none
	}{
		{"running", []runtime.Container{running, exited}, false, "r"},
		{"running, previous", []runtime.Container{running, exited}, true, "e"},
		{"exited (not restarted yet)", []runtime.Container{exited, older}, false, "e"},
		{"restart created, not started", []runtime.Container{created, exited}, false, "e"},
		{"restart created, previous", []runtime.Container{created, exited, older}, true, "e"},
		{"first instance created", []runtime.Container{created}, false, "c"},
		{"no previous", []runtime.Container{running}, true, ""},
		{"none", nil, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := logInstance(tc.l, tc.previous)
			if got := map[bool]string{true: c.ID}[ok]; got != tc.want || (ok && got == "") {
				t.Errorf("logInstance(%v, previous=%v) = %q, %v; want %q", tc.l, tc.previous, c.ID, ok, tc.want)
			}
		})
	}
}
