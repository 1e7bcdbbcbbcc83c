package catalog

import (
	"reflect"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	storagemigrationv1 "k8s.io/api/storagemigration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// builtinGroups is kube-apiserver's discovery order of its default-enabled
// group versions (pkg/controlplane's stable lists; the preferred version of
// a group first; apiregistration.k8s.io, the aggregator's own group, is
// listed first among the named groups, as kube-apiserver's aggregator
// serves it). apiextensions.k8s.io (CustomResourceDefinitions) sits where
// kube-apiserver lists it; the custom resources' group versions join at
// run time.
func builtinGroups() []schema.GroupVersion {
	return []schema.GroupVersion{
		corev1.SchemeGroupVersion,
		apiregistrationv1.SchemeGroupVersion,
		appsv1.SchemeGroupVersion,
		eventsv1.SchemeGroupVersion,
		authenticationv1.SchemeGroupVersion,
		authorizationv1.SchemeGroupVersion,
		autoscalingv2.SchemeGroupVersion,
		autoscalingv1.SchemeGroupVersion,
		batchv1.SchemeGroupVersion,
		certificatesv1.SchemeGroupVersion,
		networkingv1.SchemeGroupVersion,
		policyv1.SchemeGroupVersion,
		rbacv1.SchemeGroupVersion,
		storagev1.SchemeGroupVersion,
		admissionregistrationv1.SchemeGroupVersion,
		apiextensionsv1.SchemeGroupVersion,
		schedulingv1.SchemeGroupVersion,
		coordinationv1.SchemeGroupVersion,
		nodev1.SchemeGroupVersion,
		discoveryv1.SchemeGroupVersion,
		resourcev1.SchemeGroupVersion,
		flowcontrolv1.SchemeGroupVersion,
		storagemigrationv1.SchemeGroupVersion,
	}
}

var (
	statusSub   = Subresource{Name: "status", Verbs: []string{"get", "patch", "update"}}
	scaleSub    = Subresource{Name: "scale", Kind: "Scale", Group: autoscalingv1.GroupName, Version: "v1", Verbs: []string{"get", "patch", "update"}}
	approvalSub = Subresource{Name: "approval", Verbs: []string{"get", "patch", "update"}}
	proxyVerbs  = []string{"create", "delete", "get", "patch", "update"}
)

// def describes a resource from an example object and list: the kind is
// the Go type's name, the singular its lower case, verbs all of them.
func def(gv schema.GroupVersion, plural string, namespaced bool, obj, list runtime.Object, opts ...func(*Resource)) Resource {
	ot, lt := reflect.TypeOf(obj).Elem(), reflect.TypeOf(list).Elem()
	r := Resource{
		GroupVersionResource: gv.WithResource(plural),
		Kind:                 ot.Name(),
		ListKind:             lt.Name(),
		Namespaced:           namespaced,
		New:                  func() runtime.Object { return reflect.New(ot).Interface().(runtime.Object) },
		NewList:              func() runtime.Object { return reflect.New(lt).Interface().(runtime.Object) },
	}
	for _, o := range opts {
		o(&r)
	}
	return r
}

// virtual describes a create-only resource that is never stored.
func virtual(gv schema.GroupVersion, plural string, namespaced bool, obj runtime.Object) Resource {
	ot := reflect.TypeOf(obj).Elem()
	return Resource{
		GroupVersionResource: gv.WithResource(plural),
		Kind:                 ot.Name(),
		Namespaced:           namespaced,
		Verbs:                createOnly,
		New:                  func() runtime.Object { return reflect.New(ot).Interface().(runtime.Object) },
		Virtual:              true,
	}
}

func short(names ...string) func(*Resource) { return func(r *Resource) { r.ShortNames = names } }
func inAll(r *Resource)                     { r.Categories = []string{"all"} }
func inAPIMachinery(r *Resource)            { r.Categories = []string{"api-extensions"} }
func withStatus(r *Resource)                { r.Subs = append(r.Subs, statusSub) }
func withScale(r *Resource)                 { r.Subs = append(r.Subs, scaleSub) }
func verbs(v ...string) func(*Resource)     { return func(r *Resource) { r.Verbs = v } }
func subs(s ...Subresource) func(*Resource) {
	return func(r *Resource) { r.Subs = append(r.Subs, s...) }
}
func storedAs(gvr schema.GroupVersionResource) func(*Resource) {
	return func(r *Resource) { r.StoredAs = &gvr }
}

// builtinResources lists what kube-apiserver serves by default, group by
// group in discovery order (resources alphabetical within a group, as
// discovery lists them).
func builtinResources() []Resource {
	core := corev1.SchemeGroupVersion
	apps := appsv1.SchemeGroupVersion
	authn := authenticationv1.SchemeGroupVersion
	authz := authorizationv1.SchemeGroupVersion
	as1, as2 := autoscalingv1.SchemeGroupVersion, autoscalingv2.SchemeGroupVersion
	batch := batchv1.SchemeGroupVersion
	certs := certificatesv1.SchemeGroupVersion
	netw := networkingv1.SchemeGroupVersion
	policy := policyv1.SchemeGroupVersion
	rbac := rbacv1.SchemeGroupVersion
	stor := storagev1.SchemeGroupVersion
	sched := schedulingv1.SchemeGroupVersion
	adm := admissionregistrationv1.SchemeGroupVersion
	apireg := apiregistrationv1.SchemeGroupVersion
	coord := coordinationv1.SchemeGroupVersion
	node := nodev1.SchemeGroupVersion
	disc := discoveryv1.SchemeGroupVersion
	res := resourcev1.SchemeGroupVersion
	flow := flowcontrolv1.SchemeGroupVersion
	svm := storagemigrationv1.SchemeGroupVersion

	return []Resource{
		// core/v1
		// bindings bind the pod they name (as pods/binding); componentstatuses
		// are read from the components' health endpoints. Neither is stored.
		virtual(core, "bindings", true, &corev1.Binding{}),
		func() Resource {
			r := virtual(core, "componentstatuses", false, &corev1.ComponentStatus{})
			r.Verbs, r.ShortNames, r.ListKind = []string{"get", "list"}, []string{"cs"}, "ComponentStatusList"
			r.NewList = func() runtime.Object { return &corev1.ComponentStatusList{} }
			return r
		}(),
		def(core, "configmaps", true, &corev1.ConfigMap{}, &corev1.ConfigMapList{}, short("cm")),
		def(core, "endpoints", true, &corev1.Endpoints{}, &corev1.EndpointsList{}, short("ep"), func(r *Resource) { r.Singular = "endpoints" }),
		def(core, "events", true, &corev1.Event{}, &corev1.EventList{}, short("ev")),
		def(core, "limitranges", true, &corev1.LimitRange{}, &corev1.LimitRangeList{}, short("limits")),
		def(core, "namespaces", false, &corev1.Namespace{}, &corev1.NamespaceList{}, short("ns"), verbs(noCollection...),
			subs(Subresource{Name: "finalize", Verbs: []string{"update"}}), withStatus),
		def(core, "nodes", false, &corev1.Node{}, &corev1.NodeList{}, short("no"),
			subs(Subresource{Name: "proxy", Kind: "NodeProxyOptions", Verbs: proxyVerbs}), withStatus),
		def(core, "persistentvolumeclaims", true, &corev1.PersistentVolumeClaim{}, &corev1.PersistentVolumeClaimList{}, short("pvc"), withStatus),
		def(core, "persistentvolumes", false, &corev1.PersistentVolume{}, &corev1.PersistentVolumeList{}, short("pv"), withStatus),
		def(core, "pods", true, &corev1.Pod{}, &corev1.PodList{}, short("po"), inAll, withStatus, subs(
			Subresource{Name: "binding", Kind: "Binding", Verbs: createOnly},
			Subresource{Name: "log", Kind: "Pod", Verbs: []string{"get"}},
			Subresource{Name: "exec", Kind: "PodExecOptions", Verbs: []string{"create", "get"}},
			Subresource{Name: "attach", Kind: "PodAttachOptions", Verbs: []string{"create", "get"}},
			Subresource{Name: "portforward", Kind: "PodPortForwardOptions", Verbs: []string{"create", "get"}},
			Subresource{Name: "ephemeralcontainers", Kind: "Pod", Verbs: []string{"get", "patch", "update"}},
			Subresource{Name: "resize", Kind: "Pod", Verbs: []string{"get", "patch", "update"}},
			Subresource{Name: "proxy", Kind: "PodProxyOptions", Verbs: proxyVerbs},
			Subresource{Name: "eviction", Kind: "Eviction", Group: policyv1.GroupName, Version: "v1", Verbs: createOnly},
		)),
		def(core, "podtemplates", true, &corev1.PodTemplate{}, &corev1.PodTemplateList{}),
		def(core, "replicationcontrollers", true, &corev1.ReplicationController{}, &corev1.ReplicationControllerList{}, short("rc"), inAll, withStatus, withScale),
		def(core, "resourcequotas", true, &corev1.ResourceQuota{}, &corev1.ResourceQuotaList{}, short("quota"), withStatus),
		def(core, "secrets", true, &corev1.Secret{}, &corev1.SecretList{}),
		def(core, "serviceaccounts", true, &corev1.ServiceAccount{}, &corev1.ServiceAccountList{}, short("sa"),
			subs(Subresource{Name: "token", Kind: "TokenRequest", Group: authenticationv1.GroupName, Version: "v1", Verbs: createOnly})),
		def(core, "services", true, &corev1.Service{}, &corev1.ServiceList{}, short("svc"), inAll, withStatus,
			subs(Subresource{Name: "proxy", Kind: "ServiceProxyOptions", Verbs: proxyVerbs})),

		// apiregistration.k8s.io/v1 (API aggregation)
		def(apireg, "apiservices", false, &apiregistrationv1.APIService{}, &apiregistrationv1.APIServiceList{}, inAPIMachinery, withStatus),

		// apps/v1
		def(apps, "controllerrevisions", true, &appsv1.ControllerRevision{}, &appsv1.ControllerRevisionList{}),
		def(apps, "daemonsets", true, &appsv1.DaemonSet{}, &appsv1.DaemonSetList{}, short("ds"), inAll, withStatus),
		def(apps, "deployments", true, &appsv1.Deployment{}, &appsv1.DeploymentList{}, short("deploy"), inAll, withStatus, withScale),
		def(apps, "replicasets", true, &appsv1.ReplicaSet{}, &appsv1.ReplicaSetList{}, short("rs"), inAll, withStatus, withScale),
		def(apps, "statefulsets", true, &appsv1.StatefulSet{}, &appsv1.StatefulSetList{}, short("sts"), inAll, withStatus, withScale),

		// events.k8s.io/v1: the same store as core/v1 events.
		def(eventsv1.SchemeGroupVersion, "events", true, &eventsv1.Event{}, &eventsv1.EventList{}, short("ev"),
			storedAs(core.WithResource("events"))),

		// authentication.k8s.io/v1, authorization.k8s.io/v1: reviews,
		// answered by the authenticators and authorizers, never stored.
		virtual(authn, "selfsubjectreviews", false, &authenticationv1.SelfSubjectReview{}),
		virtual(authn, "tokenreviews", false, &authenticationv1.TokenReview{}),
		virtual(authz, "localsubjectaccessreviews", true, &authorizationv1.LocalSubjectAccessReview{}),
		virtual(authz, "selfsubjectaccessreviews", false, &authorizationv1.SelfSubjectAccessReview{}),
		virtual(authz, "selfsubjectrulesreviews", false, &authorizationv1.SelfSubjectRulesReview{}),
		virtual(authz, "subjectaccessreviews", false, &authorizationv1.SubjectAccessReview{}),

		// autoscaling: v2 is the storage version; v1 is a view of it.
		def(as2, "horizontalpodautoscalers", true, &autoscalingv2.HorizontalPodAutoscaler{}, &autoscalingv2.HorizontalPodAutoscalerList{}, short("hpa"), inAll, withStatus),
		def(as1, "horizontalpodautoscalers", true, &autoscalingv1.HorizontalPodAutoscaler{}, &autoscalingv1.HorizontalPodAutoscalerList{}, short("hpa"), inAll, withStatus,
			storedAs(as2.WithResource("horizontalpodautoscalers"))),

		// batch/v1
		def(batch, "cronjobs", true, &batchv1.CronJob{}, &batchv1.CronJobList{}, short("cj"), inAll, withStatus),
		def(batch, "jobs", true, &batchv1.Job{}, &batchv1.JobList{}, inAll, withStatus),

		// certificates.k8s.io/v1
		def(certs, "certificatesigningrequests", false, &certificatesv1.CertificateSigningRequest{}, &certificatesv1.CertificateSigningRequestList{}, short("csr"),
			subs(approvalSub), withStatus),
		def(certs, "clustertrustbundles", false, &certificatesv1.ClusterTrustBundle{}, &certificatesv1.ClusterTrustBundleList{}),
		def(certs, "podcertificaterequests", true, &certificatesv1.PodCertificateRequest{}, &certificatesv1.PodCertificateRequestList{}, withStatus),

		// networking.k8s.io/v1
		def(netw, "ingressclasses", false, &networkingv1.IngressClass{}, &networkingv1.IngressClassList{}),
		def(netw, "ingresses", true, &networkingv1.Ingress{}, &networkingv1.IngressList{}, short("ing"), withStatus),
		def(netw, "ipaddresses", false, &networkingv1.IPAddress{}, &networkingv1.IPAddressList{}, short("ip")),
		def(netw, "networkpolicies", true, &networkingv1.NetworkPolicy{}, &networkingv1.NetworkPolicyList{}, short("netpol")),
		def(netw, "servicecidrs", false, &networkingv1.ServiceCIDR{}, &networkingv1.ServiceCIDRList{}, withStatus),

		// policy/v1
		def(policy, "poddisruptionbudgets", true, &policyv1.PodDisruptionBudget{}, &policyv1.PodDisruptionBudgetList{}, short("pdb"), withStatus),

		// rbac.authorization.k8s.io/v1
		def(rbac, "clusterrolebindings", false, &rbacv1.ClusterRoleBinding{}, &rbacv1.ClusterRoleBindingList{}),
		def(rbac, "clusterroles", false, &rbacv1.ClusterRole{}, &rbacv1.ClusterRoleList{}),
		def(rbac, "rolebindings", true, &rbacv1.RoleBinding{}, &rbacv1.RoleBindingList{}),
		def(rbac, "roles", true, &rbacv1.Role{}, &rbacv1.RoleList{}),

		// storage.k8s.io/v1
		def(stor, "csidrivers", false, &storagev1.CSIDriver{}, &storagev1.CSIDriverList{}),
		def(stor, "csinodes", false, &storagev1.CSINode{}, &storagev1.CSINodeList{}),
		def(stor, "csistoragecapacities", true, &storagev1.CSIStorageCapacity{}, &storagev1.CSIStorageCapacityList{}),
		def(stor, "storageclasses", false, &storagev1.StorageClass{}, &storagev1.StorageClassList{}, short("sc")),
		def(stor, "volumeattachments", false, &storagev1.VolumeAttachment{}, &storagev1.VolumeAttachmentList{}, withStatus),
		def(stor, "volumeattributesclasses", false, &storagev1.VolumeAttributesClass{}, &storagev1.VolumeAttributesClassList{}, short("vac")),

		// admissionregistration.k8s.io/v1 (MutatingAdmissionPolicy is GA and
		// on by default since 1.36)
		def(adm, "mutatingadmissionpolicies", false, &admissionregistrationv1.MutatingAdmissionPolicy{}, &admissionregistrationv1.MutatingAdmissionPolicyList{}, inAPIMachinery),
		def(adm, "mutatingadmissionpolicybindings", false, &admissionregistrationv1.MutatingAdmissionPolicyBinding{}, &admissionregistrationv1.MutatingAdmissionPolicyBindingList{}, inAPIMachinery),
		def(adm, "mutatingwebhookconfigurations", false, &admissionregistrationv1.MutatingWebhookConfiguration{}, &admissionregistrationv1.MutatingWebhookConfigurationList{}, inAPIMachinery),
		def(adm, "validatingadmissionpolicies", false, &admissionregistrationv1.ValidatingAdmissionPolicy{}, &admissionregistrationv1.ValidatingAdmissionPolicyList{}, inAPIMachinery, withStatus),
		def(adm, "validatingadmissionpolicybindings", false, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, &admissionregistrationv1.ValidatingAdmissionPolicyBindingList{}, inAPIMachinery),
		def(adm, "validatingwebhookconfigurations", false, &admissionregistrationv1.ValidatingWebhookConfiguration{}, &admissionregistrationv1.ValidatingWebhookConfigurationList{}, inAPIMachinery),
		// apiextensions.k8s.io/v1: stored where kube-apiserver stores them.
		def(apiextensionsv1.SchemeGroupVersion, "customresourcedefinitions", false, &apiextensionsv1.CustomResourceDefinition{}, &apiextensionsv1.CustomResourceDefinitionList{},
			short("crd", "crds"), withStatus, func(r *Resource) {
				r.Categories = []string{"api-extensions"}
				r.Prefix = "/registry/apiextensions.k8s.io/customresourcedefinitions/"
			}),

		// scheduling.k8s.io/v1
		def(sched, "priorityclasses", false, &schedulingv1.PriorityClass{}, &schedulingv1.PriorityClassList{}, short("pc")),

		// coordination.k8s.io/v1
		def(coord, "leases", true, &coordinationv1.Lease{}, &coordinationv1.LeaseList{}),

		// node.k8s.io/v1
		def(node, "runtimeclasses", false, &nodev1.RuntimeClass{}, &nodev1.RuntimeClassList{}),

		// discovery.k8s.io/v1
		def(disc, "endpointslices", true, &discoveryv1.EndpointSlice{}, &discoveryv1.EndpointSliceList{}),

		// resource.k8s.io/v1 (dynamic resource allocation)
		def(res, "deviceclasses", false, &resourcev1.DeviceClass{}, &resourcev1.DeviceClassList{}),
		def(res, "devicetaintrules", false, &resourcev1.DeviceTaintRule{}, &resourcev1.DeviceTaintRuleList{}, withStatus),
		def(res, "resourceclaims", true, &resourcev1.ResourceClaim{}, &resourcev1.ResourceClaimList{}, withStatus),
		def(res, "resourceclaimtemplates", true, &resourcev1.ResourceClaimTemplate{}, &resourcev1.ResourceClaimTemplateList{}),
		def(res, "resourceslices", false, &resourcev1.ResourceSlice{}, &resourcev1.ResourceSliceList{}),

		// flowcontrol.apiserver.k8s.io/v1
		def(flow, "flowschemas", false, &flowcontrolv1.FlowSchema{}, &flowcontrolv1.FlowSchemaList{}, withStatus),
		def(flow, "prioritylevelconfigurations", false, &flowcontrolv1.PriorityLevelConfiguration{}, &flowcontrolv1.PriorityLevelConfigurationList{}, withStatus),

		// storagemigration.k8s.io/v1
		def(svm, "storageversionmigrations", false, &storagemigrationv1.StorageVersionMigration{}, &storagemigrationv1.StorageVersionMigrationList{}, withStatus),
	}
}
