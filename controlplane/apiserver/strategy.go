package apiserver

import (
	"context"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/registry/upstream"
	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// strategy is what differs between resources: defaults, validation, status
// handling, field selectors, graceful deletion and allocations.
type strategy struct {
	hasStatus bool
	// generation: metadata.generation is 1 on create and grows with every
	// change outside metadata and status. generationSubresources are the
	// subresources whose writes change the spec and bump it too (pods/resize);
	// generationLabels bumps it on a label change as well (EndpointSlices);
	// generationOnDelete bumps it when a deletion is scheduled (pods).
	generation             bool
	generationSubresources []string
	generationLabels       bool
	generationOnDelete     bool
	// statusMetaResets are the metadata fields a status write may not
	// change ("labels", "annotations", "finalizers", "ownerReferences");
	// spec never changes through status. Upstream's status strategies
	// differ per kind: most keep metadata changes.
	statusMetaResets []string
	// upstream: defaults and validation are kube-apiserver's own (package
	// registry/upstream); validate and validateSpecUpdate are unused.
	upstream bool
	// fieldLabels are the field selector keys the resource supports.
	fieldLabels map[string]bool
	fieldSet    func(runtime.Object) fields.Set
	nameFn      apivalidation.ValidateNameFunc

	prepareCreate func(obj runtime.Object)
	// prepareCreateFor sees the request (its user): a CSR records who
	// asked for it.
	prepareCreateFor   func(ctx context.Context, obj runtime.Object)
	prepareUpdate      func(obj, old runtime.Object, sub string)
	defaults           func(obj runtime.Object)
	validate           func(obj runtime.Object) field.ErrorList
	validateSpecUpdate func(obj, old runtime.Object) field.ErrorList
	// validateSub replaces validateSpecUpdate for writes through a
	// subresource that changes one part of the spec (pods/resize).
	validateSub map[string]func(obj, old runtime.Object) field.ErrorList

	// allocate reserves what obj needs (ClusterIPs, NodePorts) that old did
	// not hold; release undoes it when the write fails.
	allocate      func(ctx context.Context, s *Server, obj, old runtime.Object, dryRun bool) (release func(), err error)
	releaseUnused func(ctx context.Context, s *Server, obj, old runtime.Object)
	released      func(ctx context.Context, s *Server, obj runtime.Object)

	// graceful decides the grace period of a deletion (pods); mark sets
	// resource-specific state on a marked object (namespaces).
	graceful func(obj runtime.Object, opts *metav1.DeleteOptions) int64
	mark     func(obj runtime.Object) bool
	// removable reports whether a marked object without finalizers may go
	// (namespaces wait for spec.finalizers too).
	canRemove func(obj runtime.Object) bool

	// validateAll, when set, is the whole validation (metadata included)
	// of a create (old nil) or update: CustomResourceDefinitions and custom
	// resources are validated by apiextensions-apiserver's strategies.
	validateAll func(obj, old runtime.Object, sub string) field.ErrorList
	// admitCreate refuses creates the resource cannot take now (custom
	// resources of a CRD being deleted).
	admitCreate func() error
	// ttl is how long an object lives after each write (upstream's
	// TTLFunc): etcd deletes it then, and watchers see DELETED. Zero or
	// nil: for good. Only Events have one (Config.EventTTL).
	ttl func(cfg *Config) time.Duration
}

// eventTTL is the lifetime of Events, kube-apiserver's --event-ttl.
func eventTTL(cfg *Config) time.Duration { return cfg.EventTTL }

func (s *strategy) removable(obj runtime.Object) bool {
	return s.canRemove == nil || s.canRemove(obj)
}

func (s *strategy) validateCreate(r *registry, obj runtime.Object) field.ErrorList {
	if s.validateAll != nil {
		return s.validateAll(obj, nil, "")
	}
	if s.upstream {
		// As kube-apiserver: the kind's validation, then (when it passed)
		// the generic metadata checks.
		if errs, _ := upstream.ValidateCreate(obj); len(errs) > 0 {
			return errs
		}
		return apivalidation.ValidateObjectMetaAccessor(objectMeta(obj), r.res.Namespaced, s.nameFn, field.NewPath("metadata"))
	}
	errs := apivalidation.ValidateObjectMetaAccessor(objectMeta(obj), r.res.Namespaced, s.nameFn, field.NewPath("metadata"))
	if s.validate != nil {
		errs = append(errs, s.validate(obj)...)
	}
	return errs
}

func (s *strategy) validateUpdate(r *registry, obj, old runtime.Object, sub string) field.ErrorList {
	if s.validateAll != nil {
		return s.validateAll(obj, old, sub)
	}
	if s.upstream {
		if errs, _ := upstream.ValidateUpdate(obj, old, sub); len(errs) > 0 {
			return errs
		}
		errs := apivalidation.ValidateObjectMetaAccessor(objectMeta(obj), r.res.Namespaced, s.nameFn, field.NewPath("metadata"))
		return append(errs, apivalidation.ValidateObjectMetaAccessorUpdate(objectMeta(obj), objectMeta(old), field.NewPath("metadata"))...)
	}
	errs := apivalidation.ValidateObjectMetaAccessor(objectMeta(obj), r.res.Namespaced, s.nameFn, field.NewPath("metadata"))
	errs = append(errs, apivalidation.ValidateObjectMetaAccessorUpdate(objectMeta(obj), objectMeta(old), field.NewPath("metadata"))...)
	if s.validate != nil {
		errs = append(errs, s.validate(obj)...)
	}
	if v := s.validateSub[sub]; v != nil {
		return append(errs, v(obj, old)...)
	}
	if s.validateSpecUpdate != nil {
		errs = append(errs, s.validateSpecUpdate(obj, old)...)
	}
	return errs
}

// markForDeletion decides whether a DELETE only marks the object (sets
// deletionTimestamp) and with which grace period: propagation finalizers,
// existing finalizers, a pod's grace period, a namespace's finalizers.
func (s *strategy) markForDeletion(obj runtime.Object, opts *metav1.DeleteOptions) (bool, int64) {
	m := objectMeta(obj)
	policy := opts.PropagationPolicy
	if policy == nil && opts.OrphanDependents != nil {
		p := metav1.DeletePropagationBackground
		if *opts.OrphanDependents {
			p = metav1.DeletePropagationOrphan
		}
		policy = &p
	}
	if policy != nil {
		fin := ""
		switch *policy {
		case metav1.DeletePropagationOrphan:
			fin = metav1.FinalizerOrphanDependents
		case metav1.DeletePropagationForeground:
			fin = metav1.FinalizerDeleteDependents
		}
		if fin != "" && m.GetDeletionTimestamp() == nil {
			m.SetFinalizers(appendUnique(m.GetFinalizers(), fin))
		}
	}
	var grace int64
	if s.graceful != nil {
		grace = s.graceful(obj, opts)
	}
	extra := false
	if s.mark != nil {
		extra = s.mark(obj)
	}
	if grace > 0 || extra || len(m.GetFinalizers()) > 0 {
		return true, grace
	}
	return false, 0
}

func appendUnique(list []string, v string) []string {
	for _, x := range list {
		if x == v {
			return list
		}
	}
	return append(list, v)
}

// Field sets for field selectors.
func metaFields(obj runtime.Object, namespaced bool) fields.Set {
	m := objectMeta(obj)
	f := fields.Set{"metadata.name": m.GetName()}
	if namespaced {
		f["metadata.namespace"] = m.GetNamespace()
	}
	return f
}

func labelsOf(keys ...string) map[string]bool {
	m := map[string]bool{"metadata.name": true, "metadata.namespace": true}
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// strategyFor returns the strategy of a catalog resource: the generic
// one, then the kind's own (kindStrategies), CRDs' or upstream's.
func strategyFor(res *catalog.Resource) *strategy {
	_, hasStatus := res.Sub("status")
	s := &strategy{hasStatus: hasStatus, nameFn: apivalidation.NameIsDNSSubdomain, fieldLabels: labelsOf()}
	ns := res.Namespaced
	s.fieldSet = func(o runtime.Object) fields.Set { return metaFields(o, ns) }
	key := res.Resource
	if res.Group == "events.k8s.io" {
		key = "events.k8s.io/events" // not core/v1 events: upstream validation below
	}
	switch kind, ok := kindStrategies[key]; {
	case ok:
		kind(s)
	case key == "customresourcedefinitions":
		crdStrategy(s)
	default:
		upstreamStrategy(res, s)
	}
	if key == "events.k8s.io/events" {
		eventsV1Fields(s)
		s.ttl = eventTTL // the core/v1 events' store, and their lifetime
	}
	return s
}

// podGrace is the grace period of a pod deletion: the request's, else the
// pod's terminationGracePeriodSeconds; zero (immediate) for pods no node
// runs (unscheduled or finished), as kube-apiserver does.
func podGrace(o runtime.Object, opts *metav1.DeleteOptions) int64 {
	p := o.(*corev1.Pod)
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if p.Spec.TerminationGracePeriodSeconds != nil {
		grace = *p.Spec.TerminationGracePeriodSeconds
	}
	if opts.GracePeriodSeconds != nil {
		grace = *opts.GracePeriodSeconds
	}
	if grace < 0 {
		grace = 1
	}
	if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return 0
	}
	if dg := p.DeletionGracePeriodSeconds; dg != nil && *dg < grace {
		grace = *dg
	}
	return grace
}
