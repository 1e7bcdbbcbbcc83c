package apiserver

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/plugin/pkg/admission/limitranger"
)

// limitRanger is kube-apiserver's LimitRanger admission plugin, with
// upstream's own logic (k8s.io/kubernetes/plugin/pkg/admission/limitranger):
// in the mutating phase it fills containers' missing requests and limits
// from each LimitRange's Container defaults (annotating the pod
// kubernetes.io/limit-ranger, as upstream); in the validating phase it
// refuses, with upstream's 403 messages, a pod or container outside a
// LimitRange's min/max/maxLimitRequestRatio (Container and Pod types) and a
// PersistentVolumeClaim outside its PersistentVolumeClaim storage min/max.
//
// Upstream's plugin works on the internal API types, so the object is
// converted to them and back (the conversion kube-apiserver itself does on
// every request).
type limitRanger struct {
	s        *Server
	validate bool
	actions  limitranger.DefaultLimitRangerActions
}

func (limitRanger) Name() string { return "LimitRanger" }

func (p limitRanger) Admit(ctx context.Context, a *AdmissionAttributes) error {
	var op admission.Operation
	switch a.Operation {
	case OpCreate:
		op = admission.Create
	case OpUpdate:
		op = admission.Update
	default:
		return nil
	}
	attrs := admission.NewAttributesRecord(a.Object, a.OldObject, a.Resource.GroupVersionKind(), a.Namespace, a.Name,
		a.Resource.GroupVersionResource, a.Subresource, op, nil, a.DryRun, nil)
	if a.Resource.Group != "" || !p.actions.SupportsAttributes(attrs) {
		return nil
	}
	if a.OldObject != nil {
		if m, err := meta.Accessor(a.OldObject); err == nil && m.GetDeletionTimestamp() != nil {
			return nil
		}
	}
	ranges, err := p.limitRanges(ctx, a.Namespace)
	if err != nil || len(ranges) == 0 {
		return err
	}
	var internal runtime.Object
	switch a.Object.(type) {
	case *corev1.Pod:
		internal = &api.Pod{}
	case *corev1.PersistentVolumeClaim:
		internal = &api.PersistentVolumeClaim{}
	default:
		return nil
	}
	if err := legacyscheme.Scheme.Convert(a.Object, internal, nil); err != nil {
		return fmt.Errorf("limitranger: convert %T: %w", a.Object, err)
	}
	fn := p.actions.MutateLimit
	if p.validate {
		fn = p.actions.ValidateLimit
	}
	for _, lr := range ranges {
		if err := fn(lr, a.Resource.Resource, internal); err != nil {
			return admission.NewForbidden(attrs, err)
		}
	}
	if p.validate {
		return nil
	}
	if err := legacyscheme.Scheme.Convert(internal, a.Object, nil); err != nil {
		return fmt.Errorf("limitranger: convert back %T: %w", internal, err)
	}
	return nil
}

// limitRanges reads the namespace's LimitRanges from the watch cache. When
// the cache holds none there, a LimitRange created a moment ago may not have
// reached it yet, so, as upstream's plugin does when its informer is empty,
// it reads them consistently and remembers the answer for liveTTL.
func (p limitRanger) limitRanges(ctx context.Context, ns string) ([]*corev1.LimitRange, error) {
	r := p.s.registries["limitranges"]
	if r == nil {
		return nil, nil
	}
	out, err := listLimitRanges(ctx, r, ns, "0")
	if err != nil || len(out) > 0 {
		return out, err
	}
	return p.s.limitRangesLive.get(ns, func() ([]*corev1.LimitRange, error) { return listLimitRanges(ctx, r, ns, "") })
}

func listLimitRanges(ctx context.Context, r *registry, ns, rv string) ([]*corev1.LimitRange, error) {
	res, err := r.list(ctx, ns, &metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.LimitRange, 0, len(res.items))
	for _, o := range res.items {
		out = append(out, o.Obj.(*corev1.LimitRange))
	}
	return out, nil
}

// liveTTL is how long a live lookup of a namespace's LimitRanges stands in
// for an empty watch cache (upstream's LimitRanger uses 30 s).
const liveTTL = 30 * time.Second

// liveLimitRanges holds the live lookups LimitRanger made per namespace.
type liveLimitRanges struct {
	mu sync.Mutex
	m  map[string]liveLookup
}

type liveLookup struct {
	items  []*corev1.LimitRange
	expiry time.Time
}

// get returns the namespace's remembered lookup, or makes one with read.
func (l *liveLimitRanges) get(ns string, read func() ([]*corev1.LimitRange, error)) ([]*corev1.LimitRange, error) {
	l.mu.Lock()
	e, ok := l.m[ns]
	l.mu.Unlock()
	if ok && time.Now().Before(e.expiry) {
		return e.items, nil
	}
	items, err := read()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]liveLookup{}
	}
	now := time.Now()
	if len(l.m) >= 1024 { // bounded, as upstream's LRU: drop what has expired
		for k, e := range l.m {
			if !now.Before(e.expiry) {
				delete(l.m, k)
			}
		}
	}
	l.m[ns] = liveLookup{items: items, expiry: now.Add(liveTTL)}
	l.mu.Unlock()
	return items, nil
}
