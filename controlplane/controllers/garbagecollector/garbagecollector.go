// Package garbagecollector is the garbage collector: it watches every
// listed resource, keeps a graph of ownerReferences (owner UID → dependents),
// and deletes or releases dependents as Kubernetes' does:
//
//   - background: once an owner is gone (checked live: 404 or another UID),
//     its dependents without another live owner are deleted;
//   - foreground: an owner with deletionTimestamp and the foregroundDeletion
//     finalizer has its dependents deleted (dependents that own others are
//     themselves deleted in the foreground); once no dependent with
//     blockOwnerDeletion remains, the finalizer is removed and the API server
//     lets the owner go;
//   - orphan: an owner with the orphan finalizer has its ownerReference
//     removed from every dependent, then the finalizer removed.
//
// It does not set finalizers or deletionTimestamps: the API server does that
// from the DeleteOptions' propagationPolicy.
package garbagecollector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name.
const Name = "garbagecollector"

// Resource is one resource the collector watches and can resolve owner
// references to.
type Resource struct {
	GVR        schema.GroupVersionResource
	Kind       string
	Namespaced bool
}

// Options configure the collector.
type Options struct {
	// Dynamic reads and writes objects of any resource. Required.
	Dynamic dynamic.Interface
	// Resources lists what to watch (the API server's catalog, minus
	// events).
	Resources []Resource
}

// ErrNoDynamicClient is returned by Run when Options.Dynamic is nil.
var ErrNoDynamicClient = errors.New("garbage collector needs a dynamic client")

// Controller is the garbage collector.
type Controller struct {
	log      *slog.Logger
	dyn      dynamic.Interface
	factory  dynamicinformer.DynamicSharedInformerFactory
	byKind   map[schema.GroupVersionKind]Resource
	synced   []cache.InformerSynced
	toDelete workqueue.TypedRateLimitingInterface[string]
	toOrphan workqueue.TypedRateLimitingInterface[string]

	mu    sync.Mutex
	nodes map[types.UID]*node
}

// node is one object in the ownership graph.
type node struct {
	res        Resource
	namespace  string
	name       string
	uid        types.UID
	owners     []metav1.OwnerReference
	dependents map[types.UID]bool
	// foreground: deletionTimestamp set and foregroundDeletion finalizer.
	foreground bool
	deleting   bool
}

// New registers a dynamic informer for each resource. The typed factory is
// unused: the collector sees every resource through the dynamic client.
func New(_ kubernetes.Interface, _ informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	c := &Controller{
		log: log.With("controller", Name), dyn: opts.Dynamic,
		byKind:   map[schema.GroupVersionKind]Resource{},
		toDelete: ctrlutil.NewQueue("garbage_collector_attempt_to_delete"),
		toOrphan: ctrlutil.NewQueue("garbage_collector_attempt_to_orphan"),
		nodes:    map[types.UID]*node{},
	}
	if opts.Dynamic == nil {
		return c
	}
	c.factory = dynamicinformer.NewDynamicSharedInformerFactory(opts.Dynamic, 0)
	for _, r := range opts.Resources {
		c.byKind[r.GVR.GroupVersion().WithKind(r.Kind)] = r
		inf := c.factory.ForResource(r.GVR).Informer()
		res := r
		inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.observe(res, obj) },
			UpdateFunc: func(_, cur any) { c.observe(res, cur) },
			DeleteFunc: func(obj any) { c.forget(ctrlutil.Unwrap(obj)) },
		})
		c.synced = append(c.synced, inf.HasSynced)
	}
	return c
}

// Run watches and collects until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	if c.dyn == nil {
		c.log.Error("not started", "err", ErrNoDynamicClient)
		return
	}
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctrlutil.RunWorkers(ctx, c.log, "garbage_collector_attempt_to_orphan", c.toOrphan, 1, c.orphan, c.synced...)
	}()
	ctrlutil.RunWorkers(ctx, c.log, Name, c.toDelete, workers, c.attemptToDelete, c.synced...)
	wg.Wait()
}

func has(finalizers []string, f string) bool { return slices.Contains(finalizers, f) }

// observe updates the graph with an added or changed object and enqueues
// the work the change calls for.
func (c *Controller) observe(res Resource, obj any) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	uid := m.GetUID()
	n := c.nodes[uid]
	if n == nil {
		n = &node{uid: uid, dependents: map[types.UID]bool{}}
		c.nodes[uid] = n
	}
	n.res, n.namespace, n.name = res, m.GetNamespace(), m.GetName()
	oldOwners := n.owners
	n.owners = append([]metav1.OwnerReference(nil), m.GetOwnerReferences()...)
	n.deleting = m.GetDeletionTimestamp() != nil
	wasForeground := n.foreground
	n.foreground = n.deleting && has(m.GetFinalizers(), metav1.FinalizerDeleteDependents)

	// Unlink owners that went away from this object's references; an owner
	// waiting for its dependents may now be done.
	for _, o := range oldOwners {
		if !slices.ContainsFunc(n.owners, func(r metav1.OwnerReference) bool { return r.UID == o.UID }) {
			if on := c.nodes[o.UID]; on != nil {
				delete(on.dependents, uid)
				if on.foreground {
					c.toDelete.Add(string(o.UID))
				}
			}
		}
	}
	for _, o := range n.owners {
		on := c.nodes[o.UID]
		if on == nil {
			// Not seen (yet, or ever): a virtual node; verify live.
			on = &node{uid: o.UID, dependents: map[types.UID]bool{}}
			c.nodes[o.UID] = on
			c.toDelete.Add(string(uid))
		} else if on.res.Kind == "" || on.foreground {
			c.toDelete.Add(string(uid))
		}
		on.dependents[uid] = true
		if on.foreground && (blocking(n, o.UID) || n.deleting) {
			c.toDelete.Add(string(o.UID))
		}
	}
	if n.deleting && has(m.GetFinalizers(), metav1.FinalizerOrphanDependents) {
		c.toOrphan.Add(string(uid))
	}
	if n.foreground {
		c.toDelete.Add(string(uid))
		if !wasForeground {
			for d := range n.dependents {
				c.toDelete.Add(string(d))
			}
		}
	}
}

func blocking(dep *node, owner types.UID) bool {
	for _, r := range dep.owners {
		if r.UID == owner && r.BlockOwnerDeletion != nil && *r.BlockOwnerDeletion {
			return true
		}
	}
	return false
}

// forget removes a deleted object; its dependents are checked (their owner
// may be gone) and its owners in foreground deletion re-examined.
func (c *Controller) forget(obj any) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	uid := m.GetUID()
	n := c.nodes[uid]
	if n == nil {
		return
	}
	for d := range n.dependents {
		c.toDelete.Add(string(d))
	}
	for _, o := range n.owners {
		if on := c.nodes[o.UID]; on != nil {
			delete(on.dependents, uid)
			if on.foreground {
				c.toDelete.Add(string(o.UID))
			}
			if on.res.Kind == "" && len(on.dependents) == 0 {
				delete(c.nodes, o.UID)
			}
		}
	}
	if len(n.dependents) > 0 {
		// Keep a virtual node so dependents still find their owner entry.
		c.nodes[uid] = &node{uid: uid, dependents: n.dependents}
	} else {
		delete(c.nodes, uid)
	}
}

// ownersSolidInGraph reports whether the object is not being deleted and
// every owner it names is in the graph as an observed object (same UID)
// that is neither being deleted nor waiting for its dependents.
func (c *Controller) ownersSolidInGraph(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[uid]
	if n == nil || n.deleting || len(n.owners) == 0 {
		return false
	}
	for _, o := range n.owners {
		on := c.nodes[o.UID]
		if on == nil || on.res.Kind == "" || on.deleting || on.res.Kind != o.Kind {
			return false
		}
	}
	return true
}

// snapshot copies what a worker needs of a node.
type snapshot struct {
	res        Resource
	namespace  string
	name       string
	owners     []metav1.OwnerReference
	dependents []*node
	virtual    bool
}

func (c *Controller) snapshot(uid types.UID) (snapshot, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[uid]
	if n == nil {
		return snapshot{}, false
	}
	s := snapshot{res: n.res, namespace: n.namespace, name: n.name, virtual: n.res.Kind == "",
		owners: append([]metav1.OwnerReference(nil), n.owners...)}
	for d := range n.dependents {
		if dn := c.nodes[d]; dn != nil && dn.res.Kind != "" {
			cp := *dn
			cp.owners = append([]metav1.OwnerReference(nil), dn.owners...)
			s.dependents = append(s.dependents, &cp)
		}
	}
	return s, true
}

func (c *Controller) client(r Resource, ns string) dynamic.ResourceInterface {
	if r.Namespaced {
		return c.dyn.Resource(r.GVR).Namespace(ns)
	}
	return c.dyn.Resource(r.GVR)
}

// live fetches the current object, or nil if it is gone or was replaced.
func (c *Controller) live(ctx context.Context, s snapshot, uid types.UID) (*unstructured.Unstructured, error) {
	obj, err := c.client(s.res, s.namespace).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get %s %s/%s: %w", s.res.Kind, s.namespace, s.name, err)
	}
	if obj.GetUID() != uid {
		return nil, nil
	}
	return obj, nil
}

type ownerState int

const (
	ownerSolid ownerState = iota
	ownerDangling
	ownerWaiting // in foreground deletion
)

// ownerState looks the owner up live, as the cache may lag.
func (c *Controller) ownerState(ctx context.Context, ref metav1.OwnerReference, depNS string) (ownerState, error) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return ownerSolid, fmt.Errorf("owner %s: bad apiVersion %q: %w", ref.Name, ref.APIVersion, err)
	}
	r, ok := c.byKind[gv.WithKind(ref.Kind)]
	if !ok {
		// An owner kind this server does not serve cannot exist.
		return ownerDangling, nil
	}
	ns := ""
	if r.Namespaced {
		ns = depNS
		if ns == "" {
			// A cluster-scoped dependent cannot have a namespaced owner.
			return ownerDangling, nil
		}
	}
	obj, err := c.client(r, ns).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ownerDangling, nil
	}
	if err != nil {
		return ownerSolid, fmt.Errorf("get owner %s %s: %w", ref.Kind, ref.Name, err)
	}
	if obj.GetUID() != ref.UID {
		return ownerDangling, nil
	}
	if obj.GetDeletionTimestamp() != nil && has(obj.GetFinalizers(), metav1.FinalizerDeleteDependents) {
		return ownerWaiting, nil
	}
	return ownerSolid, nil
}

func (c *Controller) attemptToDelete(ctx context.Context, key string) error {
	uid := types.UID(key)
	s, ok := c.snapshot(uid)
	if !ok || s.virtual {
		// A virtual node: an owner never observed; its dependents were
		// enqueued themselves and check it live.
		return nil
	}
	if c.ownersSolidInGraph(uid) {
		// Every owner is an observed object that is not being deleted in
		// the foreground: nothing to do, and no need to ask the API server
		// (after a restart, every dependent passes here).
		return nil
	}
	obj, err := c.live(ctx, s, uid)
	if err != nil || obj == nil {
		return err
	}
	if obj.GetDeletionTimestamp() != nil {
		if has(obj.GetFinalizers(), metav1.FinalizerDeleteDependents) {
			return c.processForeground(ctx, s, obj)
		}
		return nil // already going
	}
	owners := obj.GetOwnerReferences()
	if len(owners) == 0 {
		return nil
	}
	var solid, dangling, waiting []metav1.OwnerReference
	for _, ref := range owners {
		st, err := c.ownerState(ctx, ref, obj.GetNamespace())
		if err != nil {
			return err
		}
		switch st {
		case ownerSolid:
			solid = append(solid, ref)
		case ownerDangling:
			dangling = append(dangling, ref)
		case ownerWaiting:
			waiting = append(waiting, ref)
		}
	}
	if len(solid) > 0 {
		if len(dangling)+len(waiting) == 0 {
			return nil
		}
		// Keep the object for its live owners; drop the others' references.
		drop := map[types.UID]bool{}
		for _, r := range append(dangling, waiting...) {
			drop[r.UID] = true
		}
		return c.removeOwnerRefs(ctx, s.res, obj.GetNamespace(), obj.GetName(), uid, drop)
	}
	policy := metav1.DeletePropagationBackground
	switch {
	case len(waiting) > 0 && len(s.dependents) > 0:
		policy = metav1.DeletePropagationForeground
		if slices.ContainsFunc(s.dependents, func(d *node) bool { return d.foreground }) {
			// A dependent is itself waiting for its dependents while an
			// owner waits for this object: possibly a cycle of blocking
			// references (a → b → c → a), where each would wait for the
			// next forever. As Kubernetes' collector does, stop blocking
			// the owners before deleting this object in the foreground; the
			// ring then unwinds from here.
			if err := c.unblockOwnerRefs(ctx, s.res, obj); err != nil {
				return err
			}
		}
	case has(obj.GetFinalizers(), metav1.FinalizerOrphanDependents):
		policy = metav1.DeletePropagationOrphan
	case has(obj.GetFinalizers(), metav1.FinalizerDeleteDependents):
		policy = metav1.DeletePropagationForeground
	}
	c.log.Info("deleting object whose owners are gone", "kind", s.res.Kind, "namespace", s.namespace, "name", s.name, "propagation", policy)
	err = c.client(s.res, s.namespace).Delete(ctx, s.name, metav1.DeleteOptions{
		PropagationPolicy: &policy, Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete %s %s/%s: %w", s.res.Kind, s.namespace, s.name, err)
	}
	return nil
}

// processForeground handles an owner in foreground deletion: delete its
// dependents; when none that blocks remains and every other one is at least
// being deleted (or has let go of this owner), remove the finalizer.
//
// Waiting for the non-blocking ones too matters: once the finalizer is gone
// the owner no longer reads as waiting for its dependents, and a dependent
// not yet processed would then see a live owner and be kept.
func (c *Controller) processForeground(ctx context.Context, s snapshot, obj *unstructured.Unstructured) error {
	uid := obj.GetUID()
	var pending int
	for _, d := range s.dependents {
		if blocking(d, uid) || !d.deleting {
			pending++
		}
		if !d.deleting {
			c.toDelete.Add(string(d.uid))
		}
	}
	if pending > 0 {
		return nil
	}
	return c.removeFinalizer(ctx, s.res, s.namespace, s.name, uid, metav1.FinalizerDeleteDependents)
}

// orphan releases every dependent of an owner with the orphan finalizer,
// then removes the finalizer.
func (c *Controller) orphan(ctx context.Context, key string) error {
	uid := types.UID(key)
	s, ok := c.snapshot(uid)
	if !ok || s.virtual {
		return nil
	}
	obj, err := c.live(ctx, s, uid)
	if err != nil || obj == nil {
		return err
	}
	if obj.GetDeletionTimestamp() == nil || !has(obj.GetFinalizers(), metav1.FinalizerOrphanDependents) {
		return nil
	}
	var errs []error
	for _, d := range s.dependents {
		if err := c.removeOwnerRefs(ctx, d.res, d.namespace, d.name, d.uid, map[types.UID]bool{uid: true}); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.log.Info("orphaned dependents", "kind", s.res.Kind, "namespace", s.namespace, "name", s.name, "dependents", len(s.dependents))
	return c.removeFinalizer(ctx, s.res, s.namespace, s.name, uid, metav1.FinalizerOrphanDependents)
}

// unblockOwnerRefs sets blockOwnerDeletion false on every ownerReference of
// obj, with obj's resourceVersion as precondition (a conflict retries the
// whole decision).
func (c *Controller) unblockOwnerRefs(ctx context.Context, r Resource, obj *unstructured.Unstructured) error {
	refs := obj.GetOwnerReferences()
	changed := false
	for i := range refs {
		if refs[i].BlockOwnerDeletion != nil && *refs[i].BlockOwnerDeletion {
			refs[i].BlockOwnerDeletion = new(bool)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	obj = obj.DeepCopy()
	obj.SetOwnerReferences(refs)
	_, err := c.client(r, obj.GetNamespace()).Update(ctx, obj, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unblock owner references of %s %s/%s: %w", r.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	c.log.Info("unblocked owner references to break a possible cycle", "kind", r.Kind, "namespace", obj.GetNamespace(), "name", obj.GetName())
	return nil
}

func (c *Controller) removeOwnerRefs(ctx context.Context, r Resource, ns, name string, uid types.UID, drop map[types.UID]bool) error {
	api := c.client(r, ns)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := api.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if obj.GetUID() != uid {
			return nil
		}
		refs := obj.GetOwnerReferences()
		kept := slices.DeleteFunc(slices.Clone(refs), func(r metav1.OwnerReference) bool { return drop[r.UID] })
		if len(kept) == len(refs) {
			return nil
		}
		obj.SetOwnerReferences(kept)
		_, err = api.Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("remove owner references from %s %s/%s: %w", r.Kind, ns, name, err)
		}
		return nil
	})
}

func (c *Controller) removeFinalizer(ctx context.Context, r Resource, ns, name string, uid types.UID, fin string) error {
	api := c.client(r, ns)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := api.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if obj.GetUID() != uid || !has(obj.GetFinalizers(), fin) {
			return nil
		}
		obj.SetFinalizers(slices.DeleteFunc(slices.Clone(obj.GetFinalizers()), func(f string) bool { return f == fin }))
		_, err = api.Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("remove finalizer %s from %s %s/%s: %w", fin, r.Kind, ns, name, err)
		}
		c.log.Info("removed finalizer", "finalizer", fin, "kind", r.Kind, "namespace", ns, "name", name)
		return nil
	})
}
