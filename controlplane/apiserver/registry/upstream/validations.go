package upstream

import (
	"context"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"k8s.io/kube-aggregator/pkg/apis/apiregistration"
	apiregvalidation "k8s.io/kube-aggregator/pkg/apis/apiregistration/validation"
	"k8s.io/kubernetes/pkg/apis/admissionregistration"
	admregvalidation "k8s.io/kubernetes/pkg/apis/admissionregistration/validation"
	"k8s.io/kubernetes/pkg/apis/apps"
	appsvalidation "k8s.io/kubernetes/pkg/apis/apps/validation"
	"k8s.io/kubernetes/pkg/apis/autoscaling"
	autoscalingvalidation "k8s.io/kubernetes/pkg/apis/autoscaling/validation"
	"k8s.io/kubernetes/pkg/apis/batch"
	batchvalidation "k8s.io/kubernetes/pkg/apis/batch/validation"
	"k8s.io/kubernetes/pkg/apis/certificates"
	certvalidation "k8s.io/kubernetes/pkg/apis/certificates/validation"
	api "k8s.io/kubernetes/pkg/apis/core"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/apis/flowcontrol"
	flowcontrolvalidation "k8s.io/kubernetes/pkg/apis/flowcontrol/validation"
	"k8s.io/kubernetes/pkg/apis/networking"
	netvalidation "k8s.io/kubernetes/pkg/apis/networking/validation"
	"k8s.io/kubernetes/pkg/apis/node"
	nodevalidation "k8s.io/kubernetes/pkg/apis/node/validation"
	"k8s.io/kubernetes/pkg/apis/policy"
	policyvalidation "k8s.io/kubernetes/pkg/apis/policy/validation"
	"k8s.io/kubernetes/pkg/apis/rbac"
	rbacvalidation "k8s.io/kubernetes/pkg/apis/rbac/validation"
	"k8s.io/kubernetes/pkg/apis/resource"
	resourcevalidation "k8s.io/kubernetes/pkg/apis/resource/validation"
	"k8s.io/kubernetes/pkg/apis/scheduling"
	schedulingvalidation "k8s.io/kubernetes/pkg/apis/scheduling/validation"
	"k8s.io/kubernetes/pkg/apis/storage"
	storagevalidation "k8s.io/kubernetes/pkg/apis/storage/validation"
	"k8s.io/kubernetes/pkg/apis/storagemigration"
	svmvalidation "k8s.io/kubernetes/pkg/apis/storagemigration/validation"
	"k8s.io/utils/clock"
)

// kind registers the validation of internal type T under its group.
func kind[T runtime.Object](group, name string, create func(T) field.ErrorList, update func(T, T) field.ErrorList, status func(T, T) field.ErrorList) {
	v := Validation{Create: func(o runtime.Object) field.ErrorList { return create(o.(T)) }}
	if update != nil {
		v.Update = func(o, old runtime.Object) field.ErrorList { return update(o.(T), old.(T)) }
	}
	if status != nil {
		v.Status = func(o, old runtime.Object) field.ErrorList { return status(o.(T), old.(T)) }
	}
	register(schema.GroupKind{Group: group, Kind: name}, v)
}

// The options kube-apiserver's strategies pass for objects written today
// (the Allow* switches only ratchet data stored by older releases).
var (
	podOpts  = corevalidation.PodValidationOptions{}
	pvcOpts  = corevalidation.PersistentVolumeClaimSpecValidationOptions{EnableRecoverFromExpansionFailure: true}
	pvOpts   = corevalidation.PersistentVolumeSpecValidationOptions{EnableVolumeAttributesClass: true}
	jobOpts  = batchvalidation.JobValidationOptions{PodValidationOptions: podOpts, RequirePrefixedLabels: true}
	hpaOpts  = autoscalingvalidation.HorizontalPodAutoscalerSpecValidationOptions{MinReplicasLowerBound: 1}
	stsOpts  = appsvalidation.StatefulSetValidationOptions{}
	jobState = batchvalidation.JobStatusValidationOptions{
		RejectDecreasingSucceededCounter: true, RejectDecreasingFailedCounter: true, RejectDisablingTerminalCondition: true,
		RejectInvalidCompletedIndexes: true, RejectInvalidFailedIndexes: true, RejectFailedIndexesOverlappingCompleted: true,
		RejectCompletedIndexesForNonIndexedJob: true, RejectFailedIndexesForNoBackoffLimitPerIndex: true,
		RejectFailedJobWithoutFailureTarget: true, RejectCompleteJobWithoutSuccessCriteriaMet: true,
		RejectFinishedJobWithActivePods: true, RejectFinishedJobWithoutStartTime: true,
	}
)

func init() {
	// core/v1
	kind("", "ReplicationController",
		func(o *api.ReplicationController) field.ErrorList {
			return corevalidation.ValidateReplicationController(o, podOpts)
		},
		func(o, old *api.ReplicationController) field.ErrorList {
			return corevalidation.ValidateReplicationControllerUpdate(o, old, podOpts)
		},
		corevalidation.ValidateReplicationControllerStatusUpdate)
	kind("", "PodTemplate",
		func(o *api.PodTemplate) field.ErrorList { return corevalidation.ValidatePodTemplate(o, podOpts) },
		func(o, old *api.PodTemplate) field.ErrorList {
			return corevalidation.ValidatePodTemplateUpdate(o, old, podOpts)
		}, nil)
	kind("", "ResourceQuota", corevalidation.ValidateResourceQuota, corevalidation.ValidateResourceQuotaUpdate, corevalidation.ValidateResourceQuotaStatusUpdate)
	kind("", "LimitRange", corevalidation.ValidateLimitRange,
		func(o, old *api.LimitRange) field.ErrorList {
			return append(corevalidation.ValidateObjectMetaUpdate(&o.ObjectMeta, &old.ObjectMeta, field.NewPath("metadata")), corevalidation.ValidateLimitRange(o)...)
		}, nil)
	kind("", "PersistentVolume",
		func(o *api.PersistentVolume) field.ErrorList {
			return corevalidation.ValidatePersistentVolume(o, pvOpts)
		},
		func(o, old *api.PersistentVolume) field.ErrorList {
			return corevalidation.ValidatePersistentVolumeUpdate(o, old, pvOpts)
		},
		corevalidation.ValidatePersistentVolumeStatusUpdate)
	kind("", "PersistentVolumeClaim",
		func(o *api.PersistentVolumeClaim) field.ErrorList {
			return corevalidation.ValidatePersistentVolumeClaim(o, pvcOpts)
		},
		func(o, old *api.PersistentVolumeClaim) field.ErrorList {
			return corevalidation.ValidatePersistentVolumeClaimUpdate(o, old, pvcOpts)
		},
		func(o, old *api.PersistentVolumeClaim) field.ErrorList {
			return corevalidation.ValidatePersistentVolumeClaimStatusUpdate(o, old, pvcOpts)
		})

	// events.k8s.io/v1 (internally core's Event, checked for that version)
	eventsGV := schema.GroupVersion{Group: "events.k8s.io", Version: "v1"}
	kind("events.k8s.io", "Event",
		func(o *api.Event) field.ErrorList { return corevalidation.ValidateEventCreate(o, eventsGV) },
		func(o, old *api.Event) field.ErrorList { return corevalidation.ValidateEventUpdate(o, old, eventsGV) }, nil)

	// apps/v1
	kind(apps.GroupName, "StatefulSet",
		func(o *apps.StatefulSet) field.ErrorList {
			return appsvalidation.ValidateStatefulSet(o, stsOpts, podOpts)
		},
		func(o, old *apps.StatefulSet) field.ErrorList {
			return appsvalidation.ValidateStatefulSetUpdate(o, old, stsOpts, podOpts)
		},
		appsvalidation.ValidateStatefulSetStatusUpdate)
	kind(apps.GroupName, "ControllerRevision", appsvalidation.ValidateControllerRevisionCreate, appsvalidation.ValidateControllerRevisionUpdate, nil)

	// autoscaling (internal HPA serves v1 and v2)
	kind(autoscaling.GroupName, "HorizontalPodAutoscaler",
		func(o *autoscaling.HorizontalPodAutoscaler) field.ErrorList {
			return autoscalingvalidation.ValidateHorizontalPodAutoscaler(o, hpaOpts)
		},
		func(o, old *autoscaling.HorizontalPodAutoscaler) field.ErrorList {
			return autoscalingvalidation.ValidateHorizontalPodAutoscalerUpdate(o, old, hpaOpts)
		},
		autoscalingvalidation.ValidateHorizontalPodAutoscalerStatusUpdate)

	// batch/v1
	kind(batch.GroupName, "Job",
		func(o *batch.Job) field.ErrorList { return batchvalidation.ValidateJobCreate(o, jobOpts) },
		func(o, old *batch.Job) field.ErrorList { return batchvalidation.ValidateJobUpdate(o, old, jobOpts) },
		func(o, old *batch.Job) field.ErrorList {
			return batchvalidation.ValidateJobUpdateStatus(o, old, jobState)
		})
	kind(batch.GroupName, "CronJob",
		func(o *batch.CronJob) field.ErrorList { return batchvalidation.ValidateCronJobCreate(o, podOpts) },
		func(o, old *batch.CronJob) field.ErrorList {
			return batchvalidation.ValidateCronJobUpdate(o, old, podOpts)
		},
		func(o, old *batch.CronJob) field.ErrorList {
			return corevalidation.ValidateObjectMetaUpdate(&o.ObjectMeta, &old.ObjectMeta, field.NewPath("metadata"))
		})

	// certificates.k8s.io/v1
	kind(certificates.GroupName, "CertificateSigningRequest", certvalidation.ValidateCertificateSigningRequestCreate,
		certvalidation.ValidateCertificateSigningRequestUpdate, certvalidation.ValidateCertificateSigningRequestStatusUpdate)
	csr := validations[schema.GroupKind{Group: certificates.GroupName, Kind: "CertificateSigningRequest"}]
	csr.Subs = map[string]func(obj, old runtime.Object) field.ErrorList{
		"approval": func(o, old runtime.Object) field.ErrorList {
			return certvalidation.ValidateCertificateSigningRequestApprovalUpdate(o.(*certificates.CertificateSigningRequest), old.(*certificates.CertificateSigningRequest))
		},
	}
	validations[schema.GroupKind{Group: certificates.GroupName, Kind: "CertificateSigningRequest"}] = csr
	kind(certificates.GroupName, "ClusterTrustBundle",
		func(o *certificates.ClusterTrustBundle) field.ErrorList {
			return certvalidation.ValidateClusterTrustBundle(o, certvalidation.ValidateClusterTrustBundleOptions{})
		},
		certvalidation.ValidateClusterTrustBundleUpdate, nil)
	kind(certificates.GroupName, "PodCertificateRequest", certvalidation.ValidatePodCertificateRequestCreate,
		certvalidation.ValidatePodCertificateRequestUpdate,
		func(o, old *certificates.PodCertificateRequest) field.ErrorList {
			return certvalidation.ValidatePodCertificateRequestStatusUpdate(o, old, clock.RealClock{})
		})

	// networking.k8s.io/v1
	kind(networking.GroupName, "NetworkPolicy",
		func(o *networking.NetworkPolicy) field.ErrorList {
			return netvalidation.ValidateNetworkPolicy(o, netvalidation.NetworkPolicyValidationOptions{})
		},
		func(o, old *networking.NetworkPolicy) field.ErrorList {
			return netvalidation.ValidateNetworkPolicyUpdate(o, old, netvalidation.NetworkPolicyValidationOptions{})
		}, nil)
	kind(networking.GroupName, "Ingress", netvalidation.ValidateIngressCreate, netvalidation.ValidateIngressUpdate, netvalidation.ValidateIngressStatusUpdate)
	kind(networking.GroupName, "IngressClass", netvalidation.ValidateIngressClass, netvalidation.ValidateIngressClassUpdate, nil)
	kind(networking.GroupName, "IPAddress", netvalidation.ValidateIPAddress, netvalidation.ValidateIPAddressUpdate, nil)
	kind(networking.GroupName, "ServiceCIDR", netvalidation.ValidateServiceCIDR, netvalidation.ValidateServiceCIDRUpdate, netvalidation.ValidateServiceCIDRStatusUpdate)

	// policy/v1
	pdbOpts := policyvalidation.PodDisruptionBudgetValidationOptions{}
	kind(policy.GroupName, "PodDisruptionBudget",
		func(o *policy.PodDisruptionBudget) field.ErrorList {
			return policyvalidation.ValidatePodDisruptionBudget(o, pdbOpts)
		}, nil,
		func(o, old *policy.PodDisruptionBudget) field.ErrorList {
			return policyvalidation.ValidatePodDisruptionBudgetStatusUpdate(o.Status, old.Status, field.NewPath("status"), schema.GroupVersion{Group: policy.GroupName, Version: "v1"})
		})

	// rbac.authorization.k8s.io/v1
	crOpts := rbacvalidation.ClusterRoleValidationOptions{}
	kind(rbac.GroupName, "Role", rbacvalidation.ValidateRole, rbacvalidation.ValidateRoleUpdate, nil)
	kind(rbac.GroupName, "ClusterRole",
		func(o *rbac.ClusterRole) field.ErrorList { return rbacvalidation.ValidateClusterRole(o, crOpts) },
		func(o, old *rbac.ClusterRole) field.ErrorList {
			return rbacvalidation.ValidateClusterRoleUpdate(o, old, crOpts)
		}, nil)
	kind(rbac.GroupName, "RoleBinding", rbacvalidation.ValidateRoleBinding, rbacvalidation.ValidateRoleBindingUpdate, nil)
	kind(rbac.GroupName, "ClusterRoleBinding", rbacvalidation.ValidateClusterRoleBinding, rbacvalidation.ValidateClusterRoleBindingUpdate, nil)

	// storage.k8s.io/v1
	kind(storage.GroupName, "StorageClass", storagevalidation.ValidateStorageClass, storagevalidation.ValidateStorageClassUpdate, nil)
	kind(storage.GroupName, "VolumeAttachment", storagevalidation.ValidateVolumeAttachment, storagevalidation.ValidateVolumeAttachmentUpdate,
		func(o, old *storage.VolumeAttachment) field.ErrorList {
			return storagevalidation.ValidateVolumeAttachmentUpdate(o, old)
		})
	kind(storage.GroupName, "CSINode", storagevalidation.ValidateCSINode, storagevalidation.ValidateCSINodeUpdate, storagevalidation.ValidateCSINodeStatusUpdate)
	kind(storage.GroupName, "CSIDriver", storagevalidation.ValidateCSIDriver, storagevalidation.ValidateCSIDriverUpdate, nil)
	kind(storage.GroupName, "CSIStorageCapacity",
		func(o *storage.CSIStorageCapacity) field.ErrorList {
			return storagevalidation.ValidateCSIStorageCapacity(o, storagevalidation.CSIStorageCapacityValidateOptions{})
		},
		storagevalidation.ValidateCSIStorageCapacityUpdate, nil)
	kind(storage.GroupName, "VolumeAttributesClass", storagevalidation.ValidateVolumeAttributesClass, storagevalidation.ValidateVolumeAttributesClassUpdate, nil)

	// scheduling.k8s.io/v1
	kind(scheduling.GroupName, "PriorityClass", schedulingvalidation.ValidatePriorityClass, schedulingvalidation.ValidatePriorityClassUpdate, nil)

	// node.k8s.io/v1
	kind(node.GroupName, "RuntimeClass", nodevalidation.ValidateRuntimeClass, nodevalidation.ValidateRuntimeClassUpdate, nil)

	// resource.k8s.io/v1
	kind(resource.GroupName, "DeviceClass", resourcevalidation.ValidateDeviceClass, resourcevalidation.ValidateDeviceClassUpdate, nil)
	kind(resource.GroupName, "DeviceTaintRule", resourcevalidation.ValidateDeviceTaintRule, resourcevalidation.ValidateDeviceTaintRuleUpdate, resourcevalidation.ValidateDeviceTaintRuleStatusUpdate)
	kind(resource.GroupName, "ResourceClaim", resourcevalidation.ValidateResourceClaim, resourcevalidation.ValidateResourceClaimUpdate, resourcevalidation.ValidateResourceClaimStatusUpdate)
	kind(resource.GroupName, "ResourceClaimTemplate", resourcevalidation.ValidateResourceClaimTemplate, resourcevalidation.ValidateResourceClaimTemplateUpdate, nil)
	kind(resource.GroupName, "ResourceSlice", resourcevalidation.ValidateResourceSlice, resourcevalidation.ValidateResourceSliceUpdate, nil)

	// flowcontrol.apiserver.k8s.io/v1
	flowGV := schema.GroupVersion{Group: flowcontrol.GroupName, Version: "v1"}
	kind(flowcontrol.GroupName, "FlowSchema", flowcontrolvalidation.ValidateFlowSchema,
		func(o, old *flowcontrol.FlowSchema) field.ErrorList {
			return flowcontrolvalidation.ValidateFlowSchemaUpdate(old, o)
		},
		func(o, old *flowcontrol.FlowSchema) field.ErrorList {
			return flowcontrolvalidation.ValidateFlowSchemaStatusUpdate(old, o)
		})
	kind(flowcontrol.GroupName, "PriorityLevelConfiguration",
		func(o *flowcontrol.PriorityLevelConfiguration) field.ErrorList {
			return flowcontrolvalidation.ValidatePriorityLevelConfiguration(o, flowGV, flowcontrolvalidation.PriorityLevelValidationOptions{})
		}, nil,
		func(o, old *flowcontrol.PriorityLevelConfiguration) field.ErrorList {
			return flowcontrolvalidation.ValidatePriorityLevelConfigurationStatusUpdate(old, o)
		})

	// storagemigration.k8s.io/v1
	kind(storagemigration.GroupName, "StorageVersionMigration", svmvalidation.ValidateStorageVersionMigration,
		svmvalidation.ValidateStorageVersionMigrationUpdate, svmvalidation.ValidateStorageVersionMigrationStatusUpdate)

	// admissionregistration.k8s.io/v1
	adm := admissionregistration.GroupName
	kind(adm, "ValidatingWebhookConfiguration", admregvalidation.ValidateValidatingWebhookConfiguration,
		admregvalidation.ValidateValidatingWebhookConfigurationUpdate, nil)
	kind(adm, "MutatingWebhookConfiguration", admregvalidation.ValidateMutatingWebhookConfiguration,
		admregvalidation.ValidateMutatingWebhookConfigurationUpdate, nil)
	kind(adm, "ValidatingAdmissionPolicy", admregvalidation.ValidateValidatingAdmissionPolicy,
		admregvalidation.ValidateValidatingAdmissionPolicyUpdate, admregvalidation.ValidateValidatingAdmissionPolicyStatusUpdate)
	kind(adm, "ValidatingAdmissionPolicyBinding", admregvalidation.ValidateValidatingAdmissionPolicyBinding,
		admregvalidation.ValidateValidatingAdmissionPolicyBindingUpdate, nil)
	kind(adm, "MutatingAdmissionPolicy", admregvalidation.ValidateMutatingAdmissionPolicy,
		admregvalidation.ValidateMutatingAdmissionPolicyUpdate, nil)
	kind(adm, "MutatingAdmissionPolicyBinding", admregvalidation.ValidateMutatingAdmissionPolicyBinding,
		admregvalidation.ValidateMutatingAdmissionPolicyBindingUpdate, nil)

	// apiregistration.k8s.io/v1 (kube-aggregator's types, installed into
	// the same scheme in upstream.go)
	kind(apiregistration.GroupName, "APIService",
		func(o *apiregistration.APIService) field.ErrorList {
			return apiregvalidation.ValidateAPIService(context.Background(), o)
		},
		func(o, old *apiregistration.APIService) field.ErrorList {
			return apiregvalidation.ValidateAPIServiceUpdate(context.Background(), o, old)
		},
		func(o, old *apiregistration.APIService) field.ErrorList {
			return apiregvalidation.ValidateAPIServiceStatusUpdate(context.Background(), o, old)
		})
}
