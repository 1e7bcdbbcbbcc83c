package apiserver

import (
	"context"
	"strconv"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/registry/upstream"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
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
}

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

// strategyFor returns the strategy of a catalog resource.
func strategyFor(res *catalog.Resource) *strategy {
	_, hasStatus := res.Sub("status")
	s := &strategy{hasStatus: hasStatus, nameFn: apivalidation.NameIsDNSSubdomain, fieldLabels: labelsOf()}
	ns := res.Namespaced
	s.fieldSet = func(o runtime.Object) fields.Set { return metaFields(o, ns) }
	key := res.Resource
	if res.Group == "events.k8s.io" {
		key = "events.k8s.io/events" // not core/v1 events: upstream validation below
	}
	switch key {
	case "pods":
		// PodObservedGenerationTracking (GA upstream): spec changes,
		// including through resize and ephemeralcontainers, and a scheduled
		// deletion bump metadata.generation.
		s.generation = true
		s.generationSubresources = []string{"resize", "ephemeralcontainers"}
		s.generationOnDelete = true
		s.fieldLabels = labelsOf("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
			"spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName")
		s.fieldSet = func(o runtime.Object) fields.Set {
			p := o.(*corev1.Pod)
			f := metaFields(o, true)
			f["spec.nodeName"] = p.Spec.NodeName
			f["spec.restartPolicy"] = string(p.Spec.RestartPolicy)
			f["spec.schedulerName"] = p.Spec.SchedulerName
			f["spec.serviceAccountName"] = p.Spec.ServiceAccountName
			f["spec.hostNetwork"] = strconv.FormatBool(p.Spec.HostNetwork)
			f["status.phase"] = string(p.Status.Phase)
			f["status.podIP"] = p.Status.PodIP
			f["status.nominatedNodeName"] = p.Status.NominatedNodeName
			return f
		}
		s.prepareCreate = func(o runtime.Object) {
			p := o.(*corev1.Pod)
			p.Status = corev1.PodStatus{Phase: corev1.PodPending, QOSClass: qosClass(&p.Spec)}
		}
		s.prepareUpdate = func(o, old runtime.Object, sub string) {
			switch sub {
			case "status":
				p := o.(*corev1.Pod)
				if p.Status.QOSClass == "" {
					p.Status.QOSClass = old.(*corev1.Pod).Status.QOSClass
				}
			case "ephemeralcontainers":
				ephemeralOnly(o.(*corev1.Pod), old.(*corev1.Pod))
			case "resize":
				resizeOnly(o.(*corev1.Pod), old.(*corev1.Pod))
			}
		}
		s.validateSub = map[string]func(o, old runtime.Object) field.ErrorList{
			"ephemeralcontainers": func(o, old runtime.Object) field.ErrorList {
				return validateEphemeralContainersUpdate(o.(*corev1.Pod), old.(*corev1.Pod))
			},
			"resize": func(o, old runtime.Object) field.ErrorList { return validateResize(o.(*corev1.Pod), old.(*corev1.Pod)) },
		}
		s.defaults = func(o runtime.Object) { defaultPod(o.(*corev1.Pod)) }
		s.validate = func(o runtime.Object) field.ErrorList { return validatePod(o.(*corev1.Pod)) }
		s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
			return validatePodUpdate(o.(*corev1.Pod), old.(*corev1.Pod))
		}
		s.graceful = podGrace
		s.statusMetaResets = []string{"ownerReferences"}
	case "services":
		s.nameFn = apivalidation.NameIsDNS1035Label
		s.fieldLabels = labelsOf("spec.clusterIP", "spec.type")
		s.fieldSet = func(o runtime.Object) fields.Set {
			svc := o.(*corev1.Service)
			f := metaFields(o, true)
			f["spec.clusterIP"] = svc.Spec.ClusterIP
			f["spec.type"] = string(svc.Spec.Type)
			return f
		}
		s.prepareCreate = func(o runtime.Object) { o.(*corev1.Service).Status = corev1.ServiceStatus{} }
		s.prepareUpdate = func(o, old runtime.Object, sub string) {
			if sub == "" {
				patchAllocatedValues(o.(*corev1.Service), old.(*corev1.Service))
			}
		}
		s.defaults = func(o runtime.Object) { defaultService(o.(*corev1.Service)) }
		s.validate = func(o runtime.Object) field.ErrorList { return validateService(o.(*corev1.Service)) }
		s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
			return validateServiceUpdate(o.(*corev1.Service), old.(*corev1.Service))
		}
		s.allocate = allocateService
		s.releaseUnused = releaseUnusedService
		s.released = releaseService
	case "namespaces":
		s.nameFn = apivalidation.ValidateNamespaceName
		s.fieldLabels = labelsOf("status.phase")
		s.fieldSet = func(o runtime.Object) fields.Set {
			f := metaFields(o, false)
			f["status.phase"] = string(o.(*corev1.Namespace).Status.Phase)
			return f
		}
		s.prepareCreate = func(o runtime.Object) {
			n := o.(*corev1.Namespace)
			n.Status = corev1.NamespaceStatus{Phase: corev1.NamespaceActive}
		}
		s.prepareUpdate = func(o, old runtime.Object, sub string) {
			n, on := o.(*corev1.Namespace), old.(*corev1.Namespace)
			switch sub {
			case "finalize":
				// Only spec.finalizers changes.
				fin := n.Spec.Finalizers
				*n = *on.DeepCopy()
				n.Spec.Finalizers = fin
			case "":
				// spec.finalizers changes through /finalize only.
				n.Spec.Finalizers = on.Spec.Finalizers
			}
		}
		s.defaults = func(o runtime.Object) {
			n := o.(*corev1.Namespace)
			defaultNamespace(n)
			// As upstream's Canonicalize: every namespace carries its name
			// as a label, which namespaceSelectors (webhooks, policies,
			// NetworkPolicy) match on.
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels[corev1.LabelMetadataName] = n.Name
		}
		s.mark = func(o runtime.Object) bool {
			n := o.(*corev1.Namespace)
			if len(n.Spec.Finalizers) == 0 {
				return false
			}
			n.Status.Phase = corev1.NamespaceTerminating
			return true
		}
		s.canRemove = func(o runtime.Object) bool { return len(o.(*corev1.Namespace).Spec.Finalizers) == 0 }
	case "nodes":
		s.fieldLabels = labelsOf("spec.unschedulable")
		s.fieldSet = func(o runtime.Object) fields.Set {
			f := metaFields(o, false)
			f["spec.unschedulable"] = strconv.FormatBool(o.(*corev1.Node).Spec.Unschedulable)
			return f
		}
		s.validate = func(o runtime.Object) field.ErrorList { return validateNode(o.(*corev1.Node)) }
	case "events":
		s.fieldLabels = labelsOf("involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
			"involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type")
		s.fieldSet = func(o runtime.Object) fields.Set {
			e := o.(*corev1.Event)
			f := metaFields(o, true)
			f["involvedObject.kind"] = e.InvolvedObject.Kind
			f["involvedObject.namespace"] = e.InvolvedObject.Namespace
			f["involvedObject.name"] = e.InvolvedObject.Name
			f["involvedObject.uid"] = string(e.InvolvedObject.UID)
			f["involvedObject.apiVersion"] = e.InvolvedObject.APIVersion
			f["involvedObject.resourceVersion"] = e.InvolvedObject.ResourceVersion
			f["involvedObject.fieldPath"] = e.InvolvedObject.FieldPath
			f["reason"] = e.Reason
			f["reportingComponent"] = e.ReportingController
			f["source"] = e.Source.Component
			f["type"] = e.Type
			return f
		}
		s.validate = func(o runtime.Object) field.ErrorList { return validateEvent(o.(*corev1.Event)) }
	case "configmaps":
		s.validate = func(o runtime.Object) field.ErrorList { return validateConfigMap(o.(*corev1.ConfigMap)) }
		s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
			return validateConfigMapUpdate(o.(*corev1.ConfigMap), old.(*corev1.ConfigMap))
		}
	case "secrets":
		s.fieldLabels = labelsOf("type")
		s.fieldSet = func(o runtime.Object) fields.Set {
			f := metaFields(o, true)
			f["type"] = string(o.(*corev1.Secret).Type)
			return f
		}
		s.defaults = func(o runtime.Object) {
			sec := o.(*corev1.Secret)
			if sec.Type == "" {
				sec.Type = corev1.SecretTypeOpaque
			}
			// stringData is write-only: merged over data and never stored
			// or served, as upstream's v1 → internal conversion does.
			for k, v := range sec.StringData {
				if sec.Data == nil {
					sec.Data = map[string][]byte{}
				}
				sec.Data[k] = []byte(v)
			}
			sec.StringData = nil
		}
		s.validate = func(o runtime.Object) field.ErrorList { return validateSecret(o.(*corev1.Secret)) }
		s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
			return validateSecretUpdate(o.(*corev1.Secret), old.(*corev1.Secret))
		}
	case "endpoints":
		s.defaults = func(o runtime.Object) { defaultEndpoints(o.(*corev1.Endpoints)) }
		s.validate = func(o runtime.Object) field.ErrorList { return validateEndpoints(o.(*corev1.Endpoints)) }
	case "serviceaccounts":
	case "endpointslices":
		s.generation, s.generationLabels = true, true
		s.defaults = func(o runtime.Object) { defaultEndpointSlice(o.(*discoveryv1.EndpointSlice)) }
		s.validate = func(o runtime.Object) field.ErrorList { return validateEndpointSlice(o.(*discoveryv1.EndpointSlice)) }
	case "leases":
		s.validate = func(o runtime.Object) field.ErrorList { return validateLease(o.(*coordinationv1.Lease)) }
	case "deployments":
		s.generation = true
		s.statusMetaResets = []string{"labels"}
		s.prepareCreate = func(o runtime.Object) { o.(*appsv1.Deployment).Status = appsv1.DeploymentStatus{} }
		s.defaults = func(o runtime.Object) { defaultDeployment(o.(*appsv1.Deployment)) }
		s.validate = func(o runtime.Object) field.ErrorList { return validateDeployment(o.(*appsv1.Deployment)) }
		s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
			return immutableSelector(o.(*appsv1.Deployment).Spec.Selector, old.(*appsv1.Deployment).Spec.Selector)
		}
	case "replicasets":
		s.generation = true
		s.fieldLabels = labelsOf("status.replicas")
		s.fieldSet = func(o runtime.Object) fields.Set {
			f := metaFields(o, true)
			f["status.replicas"] = strconv.Itoa(int(o.(*appsv1.ReplicaSet).Status.Replicas))
			return f
		}
		s.prepareCreate = func(o runtime.Object) { o.(*appsv1.ReplicaSet).Status = appsv1.ReplicaSetStatus{} }
		s.defaults = func(o runtime.Object) { defaultReplicaSet(o.(*appsv1.ReplicaSet)) }
		s.validate = func(o runtime.Object) field.ErrorList { return validateReplicaSet(o.(*appsv1.ReplicaSet)) }
		s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
			return immutableSelector(o.(*appsv1.ReplicaSet).Spec.Selector, old.(*appsv1.ReplicaSet).Spec.Selector)
		}
	case "daemonsets":
		s.generation = true
		s.prepareCreate = func(o runtime.Object) { o.(*appsv1.DaemonSet).Status = appsv1.DaemonSetStatus{} }
		s.defaults = func(o runtime.Object) { defaultDaemonSet(o.(*appsv1.DaemonSet)) }
		s.validate = func(o runtime.Object) field.ErrorList { return validateDaemonSet(o.(*appsv1.DaemonSet)) }
		s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
			return immutableSelector(o.(*appsv1.DaemonSet).Spec.Selector, old.(*appsv1.DaemonSet).Spec.Selector)
		}
	case "customresourcedefinitions":
		crdStrategy(s)
	default:
		upstreamStrategy(res, s)
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
