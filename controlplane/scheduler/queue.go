package scheduler

import (
	"container/heap"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
)

// queuedPod is a pending pod and its scheduling history.
type queuedPod struct {
	pod       *v1.Pod
	key       string
	added     time.Time // first time it entered the queue (for latency)
	attempts  int
	readyAt   time.Time // end of its back-off
	failedAt  time.Time // end of its last failed attempt
	heapIndex int
	where     string // active, backoff, unschedulable, inflight
}

// podHeap orders the active queue: higher priority first, then oldest first.
type podHeap struct {
	items []*queuedPod
	less  func(a, b *queuedPod) bool
}

func (h *podHeap) Len() int           { return len(h.items) }
func (h *podHeap) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h *podHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].heapIndex, h.items[j].heapIndex = i, j
}
func (h *podHeap) Push(x any) {
	q := x.(*queuedPod)
	q.heapIndex = len(h.items)
	h.items = append(h.items, q)
}
func (h *podHeap) Pop() any {
	n := len(h.items)
	q := h.items[n-1]
	h.items = h.items[:n-1]
	q.heapIndex = -1
	return q
}

func activeLess(a, b *queuedPod) bool {
	pa, pb := corev1helpers.PodPriority(a.pod), corev1helpers.PodPriority(b.pod)
	if pa != pb {
		return pa > pb
	}
	return a.added.Before(b.added)
}

func backoffLess(a, b *queuedPod) bool { return a.readyAt.Before(b.readyAt) }

// queue is the scheduling queue, in three parts as in Kubernetes:
//   - active: pods to try now;
//   - backoff: pods that failed recently, waiting out an exponential back-off;
//   - unschedulable: pods that fit nowhere, parked until a node or pod
//     change could make them fit (or until maxUnschedulable passes).
//
// A pod being scheduled is "in flight": updates to it are kept for when it
// comes back, and a cluster change during its attempt sends it to back-off
// rather than parking it, so the change is not missed.
type queue struct {
	mu               sync.Mutex
	cond             *sync.Cond
	active           podHeap
	backoff          podHeap
	unschedulable    map[string]*queuedPod
	inFlight         map[string]*queuedPod
	all              map[string]*queuedPod // every pod above, by key
	cycle            int64                 // scheduling attempts started
	moveRequestCycle int64                 // cycle at the last cluster change
	initialBackoff   time.Duration
	maxBackoff       time.Duration
	maxUnschedulable time.Duration
	closed           bool
	now              func() time.Time
}

func newQueue(initialBackoff, maxBackoff, maxUnschedulable time.Duration) *queue {
	q := &queue{
		active:           podHeap{less: activeLess},
		backoff:          podHeap{less: backoffLess},
		unschedulable:    map[string]*queuedPod{},
		inFlight:         map[string]*queuedPod{},
		all:              map[string]*queuedPod{},
		initialBackoff:   initialBackoff,
		maxBackoff:       maxBackoff,
		maxUnschedulable: maxUnschedulable,
		moveRequestCycle: -1,
		now:              time.Now,
	}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// findLocked returns a pod and where it is: active, backoff,
// unschedulable, inflight.
func (q *queue) findLocked(key string) (*queuedPod, string) {
	it, ok := q.all[key]
	if !ok {
		return nil, ""
	}
	return it, it.where
}

// put places it in a part of the queue.
func (q *queue) put(it *queuedPod, where string) {
	it.where = where
	q.all[it.key] = it
	switch where {
	case "active":
		heap.Push(&q.active, it)
		q.cond.Broadcast()
	case "backoff":
		heap.Push(&q.backoff, it)
	case "unschedulable":
		q.unschedulable[it.key] = it
	case "inflight":
		q.inFlight[it.key] = it
	}
}

// take removes it from whichever part holds it.
func (q *queue) take(it *queuedPod) {
	switch it.where {
	case "active":
		heap.Remove(&q.active, it.heapIndex)
	case "backoff":
		heap.Remove(&q.backoff, it.heapIndex)
	case "unschedulable":
		delete(q.unschedulable, it.key)
	case "inflight":
		delete(q.inFlight, it.key)
	}
	delete(q.all, it.key)
	it.where = ""
}

// Add puts a new pending pod, or its update, in the queue.
func (q *queue) Add(pod *v1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := podKey(pod)
	if it, where := q.findLocked(key); it != nil {
		it.pod = pod
		switch where {
		case "active":
			heap.Fix(&q.active, it.heapIndex)
		case "unschedulable":
			// The pod itself changed (new tolerations, selector, ...): retry.
			q.take(it)
			q.requeueLocked(it)
		}
		return
	}
	q.put(&queuedPod{pod: pod, key: key, added: q.now()}, "active")
}

// UpdateObject replaces the stored object of a queued pod without moving
// it (a status-only change).
func (q *queue) UpdateObject(pod *v1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it, _ := q.findLocked(podKey(pod)); it != nil && it.pod != nil {
		it.pod = pod
	}
}

// Delete drops a pod that was deleted or got bound elsewhere.
func (q *queue) Delete(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	it, where := q.findLocked(key)
	switch where {
	case "":
	case "inflight":
		it.pod = nil // do not requeue when its attempt ends
	default:
		q.take(it)
	}
}

// Pop blocks until a pod is active (or the queue is closed: nil) and marks
// it in flight. It returns the scheduling cycle the attempt belongs to.
func (q *queue) Pop() (*queuedPod, int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.active.Len() == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return nil, 0
	}
	it := q.active.items[0]
	q.take(it)
	it.attempts++
	q.put(it, "inflight")
	q.cycle++
	return it, q.cycle
}

// Done ends an in-flight attempt that succeeded (the pod was assumed).
func (q *queue) Done(it *queuedPod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it.where == "inflight" {
		q.take(it)
	}
}

// Requeue ends an in-flight attempt that failed. An unschedulable pod is
// parked unless the cluster changed during its attempt; an error sends the
// pod to back-off.
func (q *queue) Requeue(it *queuedPod, cycle int64, unschedulable bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it.where == "inflight" {
		q.take(it)
	}
	if it.pod == nil || q.closed { // deleted meanwhile
		return
	}
	if _, where := q.findLocked(it.key); where != "" { // re-added meanwhile
		return
	}
	it.failedAt = q.now()
	if unschedulable && q.moveRequestCycle < cycle {
		q.put(it, "unschedulable")
		return
	}
	q.requeueLocked(it)
}

func (q *queue) backoffFor(it *queuedPod) time.Duration {
	d := q.initialBackoff
	for i := 1; i < it.attempts && d < q.maxBackoff; i++ {
		d *= 2
	}
	return min(d, q.maxBackoff)
}

// requeueLocked sends it to back-off, or straight to active if its back-off
// is already over. it must not be in any part.
func (q *queue) requeueLocked(it *queuedPod) {
	from := it.failedAt
	if from.IsZero() {
		from = q.now()
	}
	it.readyAt = from.Add(q.backoffFor(it))
	if it.attempts == 0 || !q.now().Before(it.readyAt) {
		q.put(it, "active")
		return
	}
	q.put(it, "backoff")
}

// MoveAll is called on a cluster change that may make parked pods fit: they
// go to back-off (or active once their back-off is over), and pods in
// flight will not be parked.
func (q *queue) MoveAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range q.unschedulable {
		q.take(it)
		q.requeueLocked(it)
	}
	q.moveRequestCycle = q.cycle
}

// Flush moves pods whose back-off ended to active, and pods parked longer
// than maxUnschedulable back to the queue. Called periodically.
func (q *queue) Flush() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	for q.backoff.Len() > 0 && !now.Before(q.backoff.items[0].readyAt) {
		it := q.backoff.items[0]
		q.take(it)
		q.put(it, "active")
	}
	for _, it := range q.unschedulable {
		if now.Sub(it.failedAt) >= q.maxUnschedulable {
			q.take(it)
			q.requeueLocked(it)
		}
	}
}

// Len returns the pods in each part.
func (q *queue) Len() (active, backoff, unschedulable int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.active.Len(), q.backoff.Len(), len(q.unschedulable)
}

// Close wakes Pop for shutdown.
func (q *queue) Close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}
