// Package ctrlutil holds the machinery Waggle's workload controllers share:
// named client-go work queues and their worker loops, creation/deletion
// expectations (so a controller never acts twice on a stale cache), pod
// readiness and availability as Kubernetes defines them, and claiming objects
// by controller ownerReference (adoption and release by label selector).
//
// It holds no controller logic of its own and no package state.
package ctrlutil

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	corelisters "k8s.io/client-go/listers/core/v1"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/dump"
	"k8s.io/apimachinery/pkg/util/rand"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

// NewQueue returns a rate-limited work queue named name; the name labels its
// workqueue_* metrics (depth, work duration, retries).
func NewQueue(name string) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
}

// KeyFunc is cache.DeletionHandlingMetaNamespaceKeyFunc without the error:
// objects that have no key are logged and yield "".
func KeyFunc(obj any) string {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return ""
	}
	return k
}

// Unwrap returns the object of a delete notification, resolving tombstones.
func Unwrap(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// RunWorkers waits for the caches, then runs workers goroutines that pop keys
// from q and call sync, retrying failures with back-off, until ctx ends.
func RunWorkers(ctx context.Context, log *slog.Logger, name string, q workqueue.TypedRateLimitingInterface[string], workers int, syncFn func(ctx context.Context, key string) error, synced ...cache.InformerSynced) {
	defer utilruntime.HandleCrash()
	defer q.ShutDown()
	log.Info("starting controller", "controller", name, "workers", workers)
	defer log.Info("stopped controller", "controller", name)
	if !cache.WaitForNamedCacheSync(name, ctx.Done(), synced...) {
		return
	}
	if workers < 1 {
		workers = 1
	}
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				for processNext(ctx, log, name, q, syncFn) {
				}
			}, time.Second)
		}()
	}
	<-ctx.Done()
	q.ShutDown()
	wg.Wait()
}

func processNext(ctx context.Context, log *slog.Logger, name string, q workqueue.TypedRateLimitingInterface[string], syncFn func(context.Context, string) error) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	err := syncFn(ctx, key)
	if err == nil {
		q.Forget(key)
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	if apierrors.IsConflict(err) {
		log.Debug("sync conflict, retrying", "controller", name, "key", key, "err", err)
	} else {
		log.Warn("sync failed, retrying", "controller", name, "key", key, "err", err)
	}
	q.AddRateLimited(key)
	return true
}

// ExpectationsTimeout is how long an unmet expectation blocks a controller
// before it trusts its cache again (Kubernetes uses five minutes).
const ExpectationsTimeout = 5 * time.Minute

// Expectations records, per controller key, the creations and deletions a
// controller has asked for but not yet seen in its informer, as Kubernetes'
// UIDTrackingControllerExpectations does: a controller whose expectations are
// not satisfied must not compute a new diff from its cache.
type Expectations struct {
	mu  sync.Mutex
	m   map[string]*expectation
	now func() time.Time
}

type expectation struct {
	adds      int
	deletions map[string]bool // object keys expected to go
	at        time.Time
}

// NewExpectations returns empty expectations.
func NewExpectations() *Expectations {
	return &Expectations{m: map[string]*expectation{}, now: time.Now}
}

func (e *Expectations) get(key string) *expectation {
	x, ok := e.m[key]
	if !ok {
		x = &expectation{deletions: map[string]bool{}}
		e.m[key] = x
	}
	return x
}

// ExpectCreations records that key is about to create n objects.
func (e *Expectations) ExpectCreations(key string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.get(key)
	x.adds += n
	x.at = e.now()
}

// ExpectDeletions records that key is about to delete the objects objKeys.
func (e *Expectations) ExpectDeletions(key string, objKeys []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.get(key)
	for _, k := range objKeys {
		x.deletions[k] = true
	}
	x.at = e.now()
}

// CreationObserved lowers key's pending creations by one (also used when a
// creation failed, so the controller does not wait for it).
func (e *Expectations) CreationObserved(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.m[key]; ok && x.adds > 0 {
		x.adds--
	}
}

// DeletionObserved records that objKey, expected to go, went (or that its
// deletion failed).
func (e *Expectations) DeletionObserved(key, objKey string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.m[key]; ok {
		delete(x.deletions, objKey)
	}
}

// Satisfied reports whether key may act on its cache: nothing is pending, or
// the pending expectations are older than ExpectationsTimeout.
func (e *Expectations) Satisfied(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.m[key]
	if !ok {
		return true
	}
	if x.adds <= 0 && len(x.deletions) == 0 {
		return true
	}
	return e.now().Sub(x.at) > ExpectationsTimeout
}

// Pending returns key's outstanding creations and deletions.
func (e *Expectations) Pending(key string) (adds, dels int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.m[key]; ok {
		return x.adds, len(x.deletions)
	}
	return 0, 0
}

// Forget drops key's expectations (its controller object is gone, or it is
// about to set fresh ones).
func (e *Expectations) Forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, key)
}

// ActiveNamespace returns the namespace name from lister, or nil when it is
// gone or terminating: the controllers that put objects into every
// namespace (service accounts, the root CA bundle) leave those alone.
func ActiveNamespace(lister corelisters.NamespaceLister, name string) (*corev1.Namespace, error) {
	ns, err := lister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
		return nil, nil
	}
	return ns, nil
}

// IsPodReady reports whether the pod's Ready condition is True.
func IsPodReady(p *corev1.Pod) bool {
	c := PodReadyCondition(p)
	return c != nil && c.Status == corev1.ConditionTrue
}

// PodReadyCondition returns the pod's Ready condition, or nil.
func PodReadyCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// IsPodAvailable reports whether the pod has been ready for at least
// minReadySeconds at now.
func IsPodAvailable(p *corev1.Pod, minReadySeconds int32, now time.Time) bool {
	c := PodReadyCondition(p)
	if c == nil || c.Status != corev1.ConditionTrue {
		return false
	}
	if minReadySeconds == 0 {
		return true
	}
	d := time.Duration(minReadySeconds) * time.Second
	return !c.LastTransitionTime.IsZero() && c.LastTransitionTime.Add(d).Before(now)
}

// IsPodActive reports whether the pod counts towards its controller's
// replicas: not finished and not being deleted.
func IsPodActive(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && p.DeletionTimestamp == nil
}

// IsPodTerminal reports whether the pod has finished.
func IsPodTerminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// NewControllerRef returns the controller ownerReference that owner's
// dependents carry.
// ResolveController returns obj's controller if it is of kind and get (a
// lister) finds it with the UID the reference names: a same-named object from
// an earlier life is not the controller.
func ResolveController[T metav1.Object](obj metav1.Object, kind string, get func(ns, name string) (T, error)) (T, bool) {
	var zero T
	ref := metav1.GetControllerOf(obj)
	if ref == nil || ref.Kind != kind {
		return zero, false
	}
	o, err := get(obj.GetNamespace(), ref.Name)
	if err != nil || o.GetUID() != ref.UID {
		return zero, false
	}
	return o, true
}

func NewControllerRef(owner metav1.Object, apiVersion, kind string) metav1.OwnerReference {
	t := true
	return metav1.OwnerReference{
		APIVersion: apiVersion, Kind: kind, Name: owner.GetName(), UID: owner.GetUID(),
		Controller: &t, BlockOwnerDeletion: &t,
	}
}

// Claimer decides, for the objects a controller sees, which ones it owns:
// those whose controllerRef is the controller and whose labels still match
// (releasing the others), plus orphans that match the selector (adopting
// them), as Kubernetes' ControllerRefManager does.
type Claimer[T metav1.Object] struct {
	Owner      metav1.Object
	APIVersion string
	Kind       string
	Selector   labels.Selector
	// CanAdopt is checked once before the first adoption: it re-reads the
	// owner uncached and fails if it is being deleted or was replaced.
	CanAdopt func(ctx context.Context) error
	// Patch applies a strategic-merge patch to the named object (the
	// owner reference added or removed, with the object's UID as a
	// precondition), as upstream's ControllerRefManager patches rather
	// than updates: the controllers' roles grant patch, not update.
	Patch func(ctx context.Context, name string, patch []byte) error
	// Copy returns a deep copy.
	Copy func(T) T
}

// Claim returns the objects the owner controls after adopting and releasing.
func (c *Claimer[T]) Claim(ctx context.Context, objs []T) ([]T, error) {
	var claimed []T
	var errs []error
	adoptChecked := false
	var adoptErr error
	for _, o := range objs {
		ref := metav1.GetControllerOf(o)
		match := c.Selector.Matches(labels.Set(o.GetLabels()))
		switch {
		case ref != nil && ref.UID != c.Owner.GetUID():
			continue // someone else's
		case ref != nil:
			if match || c.Owner.GetDeletionTimestamp() != nil {
				claimed = append(claimed, o)
				continue
			}
			if o.GetDeletionTimestamp() != nil {
				continue
			}
			if err := c.patch(ctx, o, releasePatch{Metadata: patchMeta[releaseRef]{
				OwnerReferences: []releaseRef{{Patch: "delete", UID: c.Owner.GetUID()}}, UID: o.GetUID()}}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("release %s: %w", o.GetName(), err))
			}
		default:
			if !match || c.Owner.GetDeletionTimestamp() != nil || o.GetDeletionTimestamp() != nil || o.GetNamespace() != c.Owner.GetNamespace() {
				continue
			}
			if !adoptChecked {
				adoptChecked = true
				if c.CanAdopt != nil {
					adoptErr = c.CanAdopt(ctx)
				}
			}
			if adoptErr != nil {
				continue
			}
			ref := NewControllerRef(c.Owner, c.APIVersion, c.Kind)
			cp := c.Copy(o)
			cp.SetOwnerReferences(append(cp.GetOwnerReferences(), ref))
			if err := c.patch(ctx, o, adoptPatch{Metadata: patchMeta[metav1.OwnerReference]{OwnerReferences: []metav1.OwnerReference{ref}, UID: o.GetUID()}}); err != nil {
				if !apierrors.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("adopt %s: %w", o.GetName(), err))
				}
				continue
			}
			claimed = append(claimed, cp)
		}
	}
	if adoptErr != nil {
		errs = append(errs, adoptErr)
	}
	if len(errs) > 0 {
		return claimed, fmt.Errorf("claim %s: %v", c.Kind, errs)
	}
	return claimed, nil
}

// The strategic-merge patches of upstream's ControllerRefManager: the
// ownerReferences list merges by uid, so adopting adds one entry and
// releasing deletes one ($patch: delete) without touching the others; the
// object's own uid makes a patch of a re-created namesake fail.
type patchMeta[R any] struct {
	OwnerReferences []R       `json:"ownerReferences"`
	UID             types.UID `json:"uid"`
}

type releaseRef struct {
	Patch string    `json:"$patch"`
	UID   types.UID `json:"uid"`
}

type releasePatch struct {
	Metadata patchMeta[releaseRef] `json:"metadata"`
}

type adoptPatch struct {
	Metadata patchMeta[metav1.OwnerReference] `json:"metadata"`
}

func (c *Claimer[T]) patch(ctx context.Context, o T, p any) error {
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return c.Patch(ctx, o.GetName(), data)
}

// RecheckOwner returns a CanAdopt function that fetches the owner with get
// and refuses adoption when it is gone, replaced (another UID) or being
// deleted.
func RecheckOwner(owner metav1.Object, get func(ctx context.Context) (metav1.Object, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		fresh, err := get(ctx)
		if err != nil {
			return fmt.Errorf("recheck %s before adopting: %w", owner.GetName(), err)
		}
		if fresh.GetUID() != owner.GetUID() {
			return fmt.Errorf("%s was replaced (uid %s, want %s): not adopting", owner.GetName(), fresh.GetUID(), owner.GetUID())
		}
		if fresh.GetDeletionTimestamp() != nil {
			return fmt.Errorf("%s is being deleted: not adopting", owner.GetName())
		}
		return nil
	}
}

// ComputeHash returns the hash Kubernetes' controllers give a pod template
// (pod-template-hash, controller-revision-hash): FNV-32a over the dumped
// object, then the collision count, safe-encoded.
func ComputeHash(template *corev1.PodTemplateSpec, collisionCount *int32) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%v", dump.ForHash(*template))
	if collisionCount != nil {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint32(b, uint32(*collisionCount))
		h.Write(b)
	}
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}

// SameVersion reports whether an update notification carries no change (a
// resync): both copies have the same, non-empty resourceVersion.
func SameVersion(old, cur metav1.Object) bool {
	return old.GetResourceVersion() != "" && old.GetResourceVersion() == cur.GetResourceVersion()
}

// NewRecorder returns an event recorder that writes core/v1 Events as
// component (e.g. "deployment-controller", as Kubernetes names its sources)
// and a function that stops it. Events are best-effort: a failed write is
// logged by client-go and dropped.
func NewRecorder(client kubernetes.Interface, component string) (record.EventRecorder, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component}), b.Shutdown
}

// SlowStartBatch calls fn count times in batches of growing size (initial,
// 2*initial, ...), concurrently within a batch, stopping after the first
// batch with a failure. It returns how many calls succeeded, so a controller
// hitting quota or a broken webhook fails once, not count times.
func SlowStartBatch(count, initial int, fn func() error) (int, error) {
	done := 0
	for batch := min(count, initial); batch > 0; batch = min(2*batch, count-done) {
		errc := make(chan error, batch)
		var wg sync.WaitGroup
		for i := 0; i < batch; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := fn(); err != nil {
					errc <- err
				}
			}()
		}
		wg.Wait()
		close(errc)
		done += batch - len(errc)
		if err := <-errc; err != nil {
			return done, err
		}
	}
	return done, nil
}

// PodFromTemplate returns a new pod for controller owner from a template,
// named with generateName "<owner>-" and carrying the controller
// ownerReference.
func PodFromTemplate(owner metav1.Object, t *corev1.PodTemplateSpec, apiVersion, kind string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    owner.GetName() + "-",
			Namespace:       owner.GetNamespace(),
			Labels:          copyMap(t.Labels),
			Annotations:     copyMap(t.Annotations),
			Finalizers:      append([]string(nil), t.Finalizers...),
			OwnerReferences: []metav1.OwnerReference{NewControllerRef(owner, apiVersion, kind)},
		},
		Spec: *t.Spec.DeepCopy(),
	}
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
