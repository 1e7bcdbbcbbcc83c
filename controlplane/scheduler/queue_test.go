package scheduler

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time       { return c.t }
func (c *fakeClock) step(d time.Duration) { c.t = c.t.Add(d) }
func newTestQueue() (*queue, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	q := newQueue(time.Second, 4*time.Second, time.Minute)
	q.now = clk.now
	return q, clk
}

func popKey(t *testing.T, q *queue) (*queuedPod, int64) {
	t.Helper()
	a, _, _ := q.Len()
	if a == 0 {
		t.Fatal("active queue is empty")
	}
	return q.Pop()
}

func TestQueuePopsHigherPriorityThenOlder(t *testing.T) {
	q, clk := newTestQueue()
	q.Add(newPod("old"))
	clk.step(time.Second)
	q.Add(newPod("new"))
	q.Add(newPod("urgent", func(p *v1.Pod) { p.Spec.Priority = new(int32(1000)) }))
	var order []string
	for range 3 {
		it, _ := popKey(t, q)
		order = append(order, it.pod.Name)
	}
	if order[0] != "urgent" || order[1] != "old" || order[2] != "new" {
		t.Fatalf("order = %v", order)
	}
}

func TestUnschedulablePodWaitsForAClusterChangeThenBacksOff(t *testing.T) {
	q, clk := newTestQueue()
	q.Add(newPod("p"))
	it, cycle := popKey(t, q)
	q.Requeue(it, cycle, true)
	if a, b, u := q.Len(); a != 0 || b != 0 || u != 1 {
		t.Fatalf("after unschedulable: active %d backoff %d unschedulable %d", a, b, u)
	}
	clk.step(30 * time.Second)
	q.Flush()
	if _, _, u := q.Len(); u != 1 {
		t.Fatal("parked pod left before a change or the max unschedulable time")
	}
	q.MoveAll() // a node appeared; its 1 s back-off is long over
	if a, _, _ := q.Len(); a != 1 {
		t.Fatal("parked pod did not become active after a cluster change")
	}
	it, cycle = popKey(t, q)
	q.Requeue(it, cycle, true)
	q.MoveAll() // right after its second failure: back-off of 2 s
	if _, b, _ := q.Len(); b != 1 {
		t.Fatal("pod that just failed did not wait out its back-off")
	}
	clk.step(1500 * time.Millisecond)
	q.Flush()
	if a, _, _ := q.Len(); a != 0 {
		t.Fatal("pod left back-off early")
	}
	clk.step(600 * time.Millisecond)
	q.Flush()
	if a, _, _ := q.Len(); a != 1 {
		t.Fatal("pod did not leave back-off after 2 s")
	}
}

func TestChangeDuringAttemptIsNotMissed(t *testing.T) {
	q, _ := newTestQueue()
	q.Add(newPod("p"))
	it, cycle := popKey(t, q)
	q.MoveAll() // a node was added while the pod was being scheduled
	q.Requeue(it, cycle, true)
	if _, b, u := q.Len(); u != 0 || b != 1 {
		t.Fatalf("pod was parked although the cluster changed during its attempt (backoff %d, unschedulable %d)", b, u)
	}
}

func TestMaxUnschedulableDurationRetriesAnyway(t *testing.T) {
	q, clk := newTestQueue()
	q.Add(newPod("p"))
	it, cycle := popKey(t, q)
	q.Requeue(it, cycle, true)
	clk.step(time.Minute)
	q.Flush()
	if a, _, u := q.Len(); a != 1 || u != 0 {
		t.Fatalf("after max unschedulable duration: active %d unschedulable %d", a, u)
	}
}

func TestBackoffDoublesUpToTheMax(t *testing.T) {
	q, _ := newTestQueue()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}
	for i, w := range want {
		if got := q.backoffFor(&queuedPod{attempts: i + 1}); got != w {
			t.Fatalf("attempt %d: back-off %v, want %v", i+1, got, w)
		}
	}
}

func TestDeletedPodIsNotRequeued(t *testing.T) {
	q, _ := newTestQueue()
	q.Add(newPod("a"))
	q.Add(newPod("b"))
	it, cycle := popKey(t, q)
	q.Delete(it.key) // deleted while in flight
	q.Requeue(it, cycle, false)
	q.Delete("default/b") // deleted while active
	if a, b, u := q.Len(); a+b+u != 0 {
		t.Fatalf("deleted pods still queued: %d %d %d", a, b, u)
	}
}

func TestSpecUpdateRetriesAParkedPodButStatusUpdateDoesNot(t *testing.T) {
	q, _ := newTestQueue()
	p := newPod("p")
	q.Add(p)
	it, cycle := popKey(t, q)
	q.Requeue(it, cycle, true)
	withStatus := p.DeepCopy()
	withStatus.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse}}
	if specChanged(p, withStatus) {
		t.Fatal("a status-only change counts as a spec change")
	}
	q.UpdateObject(withStatus)
	if _, _, u := q.Len(); u != 1 {
		t.Fatal("status update moved a parked pod")
	}
	tolerating := withStatus.DeepCopy()
	tolerating.Spec.Tolerations = []v1.Toleration{{Operator: v1.TolerationOpExists}}
	if !specChanged(withStatus, tolerating) {
		t.Fatal("a new toleration is not a spec change")
	}
	q.Add(tolerating)
	if _, _, u := q.Len(); u != 0 {
		t.Fatal("spec update left the pod parked")
	}
}

func TestCloseWakesPop(t *testing.T) {
	q, _ := newTestQueue()
	done := make(chan *queuedPod)
	go func() { it, _ := q.Pop(); done <- it }()
	// Let Pop block first (there is no event for "blocked"); if it has not
	// yet, Close still must make it return nil.
	time.Sleep(10 * time.Millisecond) // see above: no event for "Pop is blocked"; the test holds either way
	q.Close()
	select {
	case it := <-done:
		if it != nil {
			t.Fatal("Pop returned a pod from an empty closed queue")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Pop did not return after Close")
	}
}
