package apiserver

import (
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// kindStrategies are the strategies Waggle writes itself, for the kinds it
// served first, keyed by resource: their defaults (defaults.go), validation
// (validation.go) and field selectors are written here; every other kind
// goes through upstream's code (upstreamStrategy).
var kindStrategies = map[string]func(*strategy){
	"pods":            podStrategy,
	"services":        serviceStrategy,
	"namespaces":      namespaceStrategy,
	"nodes":           nodeStrategy,
	"events":          eventStrategy,
	"configmaps":      configMapStrategy,
	"secrets":         secretStrategy,
	"endpoints":       endpointsStrategy,
	"serviceaccounts": serviceAccountStrategy,
	"endpointslices":  endpointSliceStrategy,
	"leases":          leaseStrategy,
	"deployments":     deploymentStrategy,
	"replicasets":     replicaSetStrategy,
	"daemonsets":      daemonSetStrategy,
}

// podStrategy adds field selectors of kubectl and the kubelet, status and QOS
// class set by the server, the resize and ephemeralcontainers subresources,
// graceful deletion.
func podStrategy(s *strategy) {
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
}

// serviceStrategy adds DNS-1035 names, ClusterIP and NodePort allocation and
// release.
func serviceStrategy(s *strategy) {
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
			dropTypeDependentFields(o.(*corev1.Service), old.(*corev1.Service))
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
}

// namespaceStrategy adds the finalize subresource, Terminating while finalizers
// remain, the metadata.name label.
func namespaceStrategy(s *strategy) {
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
}

// nodeStrategy adds the spec.unschedulable field selector.
func nodeStrategy(s *strategy) {
	s.fieldLabels = labelsOf("spec.unschedulable")
	s.fieldSet = func(o runtime.Object) fields.Set {
		f := metaFields(o, false)
		f["spec.unschedulable"] = strconv.FormatBool(o.(*corev1.Node).Spec.Unschedulable)
		return f
	}
	s.validate = func(o runtime.Object) field.ErrorList { return validateNode(o.(*corev1.Node)) }
}

// eventStrategy adds core/v1 Events and the field selectors kubectl describe
// uses, and their lifetime (--event-ttl).
func eventStrategy(s *strategy) {
	s.ttl = eventTTL
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
		// source falls back to reportingController, as upstream: an
		// events.k8s.io/v1 event has no deprecatedSource.
		f["source"] = e.Source.Component
		if f["source"] == "" {
			f["source"] = e.ReportingController
		}
		f["type"] = e.Type
		return f
	}
	s.validate = func(o runtime.Object) field.ErrorList { return validateEvent(o.(*corev1.Event)) }
}

// eventsV1Fields are the field selectors of events.k8s.io/v1 events:
// upstream's field label conversion of that version (regarding.* and
// reportingController name core's involvedObject.* and reportingComponent).
func eventsV1Fields(s *strategy) {
	s.fieldLabels = labelsOf("reason", "regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
		"regarding.apiVersion", "regarding.resourceVersion", "regarding.fieldPath", "reportingController", "type")
	s.fieldSet = func(o runtime.Object) fields.Set {
		e := o.(*eventsv1.Event)
		f := metaFields(o, true)
		f["reason"] = e.Reason
		f["regarding.kind"] = e.Regarding.Kind
		f["regarding.namespace"] = e.Regarding.Namespace
		f["regarding.name"] = e.Regarding.Name
		f["regarding.uid"] = string(e.Regarding.UID)
		f["regarding.apiVersion"] = e.Regarding.APIVersion
		f["regarding.resourceVersion"] = e.Regarding.ResourceVersion
		f["regarding.fieldPath"] = e.Regarding.FieldPath
		f["reportingController"] = e.ReportingController
		f["type"] = e.Type
		return f
	}
}

// configMapStrategy adds validation and immutability.
func configMapStrategy(s *strategy) {
	s.validate = func(o runtime.Object) field.ErrorList { return validateConfigMap(o.(*corev1.ConfigMap)) }
	s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
		return validateConfigMapUpdate(o.(*corev1.ConfigMap), old.(*corev1.ConfigMap))
	}
}

// secretStrategy adds the type field selector, Opaque by default, stringData
// merged into data.
func secretStrategy(s *strategy) {
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
}

// endpointsStrategy adds defaults and validation.
func endpointsStrategy(s *strategy) {
	s.defaults = func(o runtime.Object) { defaultEndpoints(o.(*corev1.Endpoints)) }
	s.validate = func(o runtime.Object) field.ErrorList { return validateEndpoints(o.(*corev1.Endpoints)) }
}

// serviceAccountStrategy keeps the generic strategy: metadata checks only.
func serviceAccountStrategy(*strategy) {}

// endpointSliceStrategy adds metadata.generation also on label changes.
func endpointSliceStrategy(s *strategy) {
	s.generation, s.generationLabels = true, true
	s.defaults = func(o runtime.Object) { defaultEndpointSlice(o.(*discoveryv1.EndpointSlice)) }
	s.validate = func(o runtime.Object) field.ErrorList { return validateEndpointSlice(o.(*discoveryv1.EndpointSlice)) }
}

// leaseStrategy adds validation.
func leaseStrategy(s *strategy) {
	s.validate = func(o runtime.Object) field.ErrorList { return validateLease(o.(*coordinationv1.Lease)) }
}

// deploymentStrategy adds generation, immutable selector, status only through
// /status.
func deploymentStrategy(s *strategy) {
	s.generation = true
	s.statusMetaResets = []string{"labels"}
	s.prepareCreate = func(o runtime.Object) { o.(*appsv1.Deployment).Status = appsv1.DeploymentStatus{} }
	s.defaults = func(o runtime.Object) { defaultDeployment(o.(*appsv1.Deployment)) }
	s.validate = func(o runtime.Object) field.ErrorList { return validateDeployment(o.(*appsv1.Deployment)) }
	s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
		return immutableSelector(o.(*appsv1.Deployment).Spec.Selector, old.(*appsv1.Deployment).Spec.Selector)
	}
}

// replicaSetStrategy adds generation, the status.replicas field selector,
// immutable selector.
func replicaSetStrategy(s *strategy) {
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
}

// daemonSetStrategy adds generation, immutable selector.
func daemonSetStrategy(s *strategy) {
	s.generation = true
	s.prepareCreate = func(o runtime.Object) { o.(*appsv1.DaemonSet).Status = appsv1.DaemonSetStatus{} }
	s.defaults = func(o runtime.Object) { defaultDaemonSet(o.(*appsv1.DaemonSet)) }
	s.validate = func(o runtime.Object) field.ErrorList { return validateDaemonSet(o.(*appsv1.DaemonSet)) }
	s.validateSpecUpdate = func(o, old runtime.Object) field.ErrorList {
		return immutableSelector(o.(*appsv1.DaemonSet).Spec.Selector, old.(*appsv1.DaemonSet).Spec.Selector)
	}
}
