package ctrltest

import (
	"errors"
	"reflect"
	"strconv"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
)

// versionedTracker gives client-go's object tracker the two behaviours of the
// API server that controllers rely on and the fake lacks:
//
//   - optimistic concurrency: every write stamps metadata.resourceVersion,
//     and an update or patch that carries a stale resourceVersion fails with
//     409 Conflict. Without it, a controller's write from a stale informer
//     cache silently overwrites what a test (or another worker) just wrote.
//   - the status subresource: an update of "<resource>/status" changes only
//     .status and keeps the stored spec and metadata (see statusReactor).
//
// The resourceVersion it stamps is the tracker's own per-resource counter,
// which the tracker also uses to replay objects to a watch that starts at a
// resourceVersion, so informers re-watching from an object's version see
// every later write.
type versionedTracker struct {
	k8stesting.ObjectTracker

	mu  sync.Mutex
	rvs map[schema.GroupVersionResource]int64
}

func newVersionedTracker(t k8stesting.ObjectTracker) *versionedTracker {
	return &versionedTracker{ObjectTracker: t, rvs: map[schema.GroupVersionResource]int64{}}
}

// write stamps the next resourceVersion of gvr on a copy of obj and hands it
// to do; the counter advances only if do succeeds, as the tracker's does.
func (t *versionedTracker) write(gvr schema.GroupVersionResource, obj runtime.Object, do func(runtime.Object) error) error {
	next, ok := t.rvs[gvr]
	if !ok {
		next = 1 // the tracker's first stored object has version 2
	}
	next++
	obj = obj.DeepCopyObject()
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	m.SetResourceVersion(strconv.FormatInt(next, 10))
	if err := do(obj); err != nil {
		return err
	}
	t.rvs[gvr] = next
	return nil
}

// checkVersion fails with 409 Conflict when obj names a resourceVersion that
// is not the stored one. An empty resourceVersion is an unconditional
// update, which the API server allows for the built-in kinds.
func (t *versionedTracker) checkVersion(gvr schema.GroupVersionResource, obj runtime.Object, ns string) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	if m.GetResourceVersion() == "" {
		return nil
	}
	cur, err := t.ObjectTracker.Get(gvr, ns, m.GetName())
	if err != nil {
		return err
	}
	cm, err := meta.Accessor(cur)
	if err != nil {
		return err
	}
	if cm.GetResourceVersion() != m.GetResourceVersion() {
		return apierrors.NewConflict(gvr.GroupResource(), m.GetName(),
			errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	}
	return nil
}

func (t *versionedTracker) Add(obj runtime.Object) error {
	if meta.IsListType(obj) {
		return meta.EachListItem(obj, t.Add)
	}
	gvks, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil {
		return err
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	gvr, _ := meta.UnsafeGuessKindToResource(gvks[0])
	return t.Create(gvr, obj, m.GetNamespace())
}

func (t *versionedTracker) Create(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.CreateOptions) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.write(gvr, obj, func(o runtime.Object) error { return t.ObjectTracker.Create(gvr, o, ns, opts...) })
}

func (t *versionedTracker) Update(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.UpdateOptions) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkVersion(gvr, obj, ns); err != nil {
		return err
	}
	return t.write(gvr, obj, func(o runtime.Object) error { return t.ObjectTracker.Update(gvr, o, ns, opts...) })
}

// Patch stores what the fake's patch reaction computed from the stored
// object; its resourceVersion is the stored one unless the patch set one,
// which makes that version a precondition, as on the API server.
func (t *versionedTracker) Patch(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.PatchOptions) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkVersion(gvr, obj, ns); err != nil {
		return err
	}
	return t.write(gvr, obj, func(o runtime.Object) error { return t.ObjectTracker.Patch(gvr, o, ns, opts...) })
}

// statusReactor serves updates of the status subresource as the API server
// does: the stored object keeps its spec and metadata and takes only the
// request's .status (the request's resourceVersion still guards the write).
func statusReactor(t *versionedTracker) k8stesting.ReactionFunc {
	return func(a k8stesting.Action) (bool, runtime.Object, error) {
		ua, ok := a.(k8stesting.UpdateAction)
		if !ok || a.GetSubresource() != "status" {
			return false, nil, nil
		}
		in := ua.GetObject()
		m, err := meta.Accessor(in)
		if err != nil {
			return true, nil, err
		}
		cur, err := t.Get(a.GetResource(), a.GetNamespace(), m.GetName())
		if err != nil {
			return true, nil, err
		}
		merged := cur.DeepCopyObject()
		src := reflect.ValueOf(in).Elem().FieldByName("Status")
		dst := reflect.ValueOf(merged).Elem().FieldByName("Status")
		if !src.IsValid() || !dst.IsValid() || !dst.CanSet() {
			return false, nil, nil
		}
		dst.Set(src)
		mm, err := meta.Accessor(merged)
		if err != nil {
			return true, nil, err
		}
		mm.SetResourceVersion(m.GetResourceVersion())
		if err := t.Update(a.GetResource(), merged, a.GetNamespace()); err != nil {
			return true, nil, err
		}
		out, err := t.Get(a.GetResource(), a.GetNamespace(), m.GetName())
		return true, out, err
	}
}
