package kubelet

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

// A listing that began before the worker's start returned cannot show that
// start: under load a container's task appears seconds after the container,
// and such a listing says the container has no task, or has exited
// (ContainerCannotRun). The worker keeps what it started until a listing
// that began later, and then believes that listing, exits included.
func TestContainersTrustOnlyListingsBegunAfterTheStart(t *testing.T) {
	const uid = types.UID("u1")
	k := &Kubelet{snapshot: map[types.UID][]runtime.Container{}}
	w := &podWorker{k: k, uid: uid, pending: map[string]runtime.Container{}, pendingAt: map[string]time.Time{},
		removed: map[string]bool{}, resized: map[string]string{}}
	listStart := time.Now()
	started := listStart.Add(time.Second)
	w.pending["c1"] = runtime.Container{ID: "c1", PodUID: string(uid), Name: "app", State: runtime.StateRunning, StartedAt: started}
	w.pendingAt["c1"] = started
	set := func(at time.Time, c runtime.Container) {
		k.mu.Lock()
		k.snapshot, k.snapshotAt = map[types.UID][]runtime.Container{uid: {c}}, at
		k.mu.Unlock()
	}
	state := func() runtime.Container {
		t.Helper()
		cs := w.containers()
		if len(cs) != 1 {
			t.Fatalf("containers = %+v, want c1 alone", cs)
		}
		return cs[0]
	}

	set(listStart, runtime.Container{ID: "c1", PodUID: string(uid), Name: "app", State: runtime.StateExited,
		ExitCode: 128, Reason: "ContainerCannotRun"})
	if c := state(); c.State != runtime.StateRunning {
		t.Fatalf("an older listing's %s (%s) replaced the start", c.State, c.Reason)
	}
	set(listStart, runtime.Container{ID: "c1", PodUID: string(uid), Name: "app", State: runtime.StateCreated})
	if c := state(); c.State != runtime.StateRunning {
		t.Fatalf("an older listing's %s replaced the start", c.State)
	}

	// A listing begun after the start: it says what the container does.
	set(started.Add(time.Millisecond), runtime.Container{ID: "c1", PodUID: string(uid), Name: "app", State: runtime.StateExited,
		ExitCode: 1, Reason: "Error"})
	if c := state(); c.State != runtime.StateExited || c.ExitCode != 1 {
		t.Fatalf("a newer listing's exit was not believed: %+v", c)
	}
	if _, ok := w.pending["c1"]; ok {
		t.Fatal("the start is still pending after a newer listing showed the container")
	}
	if _, ok := w.pendingAt["c1"]; ok {
		t.Fatal("the start's time is kept after a newer listing showed the container")
	}
}
