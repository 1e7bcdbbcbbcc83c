package apiserver

import (
	"context"
	"reflect"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/registry/upstream"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/api/validation/path"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// generationKinds are the kinds whose metadata.generation kube-apiserver
// sets to 1 on create and bumps on every spec change (the strategies that
// do so in k8s.io/kubernetes/pkg/registry), beyond those strategy.go sets.
var generationKinds = map[schema.GroupKind]bool{
	{Group: "apps", Kind: "StatefulSet"}:                                              true,
	{Group: "admissionregistration.k8s.io", Kind: "MutatingAdmissionPolicy"}:          true,
	{Group: "admissionregistration.k8s.io", Kind: "MutatingAdmissionPolicyBinding"}:   true,
	{Group: "admissionregistration.k8s.io", Kind: "MutatingWebhookConfiguration"}:     true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicy"}:        true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicyBinding"}: true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingWebhookConfiguration"}:   true,
	{Group: "autoscaling", Kind: "HorizontalPodAutoscaler"}:                           true,
	{Group: "batch", Kind: "CronJob"}:                                                 true,
	{Group: "batch", Kind: "Job"}:                                                     true,
	{Group: "", Kind: "PodTemplate"}:                                                  true,
	{Group: "", Kind: "ReplicationController"}:                                        true,
	{Group: "flowcontrol.apiserver.k8s.io", Kind: "FlowSchema"}:                       true,
	{Group: "flowcontrol.apiserver.k8s.io", Kind: "PriorityLevelConfiguration"}:       true,
	{Group: "networking.k8s.io", Kind: "Ingress"}:                                     true,
	{Group: "networking.k8s.io", Kind: "IngressClass"}:                                true,
	{Group: "networking.k8s.io", Kind: "NetworkPolicy"}:                               true,
	{Group: "policy", Kind: "PodDisruptionBudget"}:                                    true,
	{Group: "resource.k8s.io", Kind: "DeviceClass"}:                                   true,
	{Group: "resource.k8s.io", Kind: "DeviceTaintRule"}:                               true,
	{Group: "resource.k8s.io", Kind: "ResourceSlice"}:                                 true,
	{Group: "scheduling.k8s.io", Kind: "PriorityClass"}:                               true,
}

// upstreamStrategy makes s the strategy of a kind that kube-apiserver's
// own code defaults and validates (package upstream): status cleared on
// create where the kind has a status subresource, generation where
// upstream keeps one, upstream's defaults, and upstream's validation with
// the generic metadata checks after it (as kube-apiserver's BeforeCreate
// and BeforeUpdate run them).
func upstreamStrategy(res *catalog.Resource, s *strategy) {
	gk := res.GroupVersionKind().GroupKind()
	if !upstream.Has(gk) {
		return
	}
	s.upstream = true
	s.nameFn = path.ValidatePathSegmentName
	s.generation = generationKinds[gk]
	if s.hasStatus {
		s.prepareCreate = clearStatus
	}
	s.defaults = upstream.Default
	if gk == (schema.GroupKind{Group: "certificates.k8s.io", Kind: "CertificateSigningRequest"}) {
		s.prepareCreateFor = csrRequester
		s.prepareUpdate = csrPrepareUpdate
	}
	if f := certificateFieldSets[gk]; f != nil {
		// Upstream's selectable fields of the certificates.k8s.io kinds.
		keys := make([]string, 0, 3)
		for k := range f(nil) {
			keys = append(keys, k)
		}
		s.fieldLabels = labelsOf(keys...)
		s.fieldSet = func(o runtime.Object) fields.Set {
			set := metaFields(o, res.Namespaced)
			for k, v := range f(o) {
				set[k] = v
			}
			return set
		}
	}
	if gk == (schema.GroupKind{Group: "batch", Kind: "Job"}) {
		s.prepareCreate = func(o runtime.Object) {
			clearStatus(o)
			upstream.Default(o) // manualSelector is decided by then, as upstream decodes with defaults
			generateJobSelector(o.(*batchv1.Job))
		}
	}
}

// certificateFieldSets are the field selectors kube-apiserver serves for
// the certificates.k8s.io kinds (their strategies' GetAttrs): a nil object
// gives the keys.
var certificateFieldSets = map[schema.GroupKind]func(runtime.Object) fields.Set{
	{Group: "certificates.k8s.io", Kind: "CertificateSigningRequest"}: func(o runtime.Object) fields.Set {
		c, _ := o.(*certificatesv1.CertificateSigningRequest)
		if c == nil {
			return fields.Set{"spec.signerName": ""}
		}
		return fields.Set{"spec.signerName": c.Spec.SignerName}
	},
	{Group: "certificates.k8s.io", Kind: "ClusterTrustBundle"}: func(o runtime.Object) fields.Set {
		c, _ := o.(*certificatesv1.ClusterTrustBundle)
		if c == nil {
			return fields.Set{"spec.signerName": ""}
		}
		return fields.Set{"spec.signerName": c.Spec.SignerName}
	},
	{Group: "certificates.k8s.io", Kind: "PodCertificateRequest"}: func(o runtime.Object) fields.Set {
		c, _ := o.(*certificatesv1.PodCertificateRequest)
		if c == nil {
			return fields.Set{"spec.signerName": "", "spec.podName": "", "spec.nodeName": ""}
		}
		return fields.Set{"spec.signerName": c.Spec.SignerName, "spec.podName": c.Spec.PodName, "spec.nodeName": string(c.Spec.NodeName)}
	},
}

// generateJobSelector gives a Job without manualSelector the selector
// and pod labels kube-apiserver generates (job-name and controller-uid,
// legacy and batch.kubernetes.io/ forms); labels the user set are kept,
// and a conflict is left for validation to reject.
func generateJobSelector(j *batchv1.Job) {
	if j.Spec.ManualSelector != nil && *j.Spec.ManualSelector {
		return
	}
	if j.Spec.Template.Labels == nil {
		j.Spec.Template.Labels = map[string]string{}
	}
	for k, v := range map[string]string{
		"job-name": j.Name, batchv1.JobNameLabel: j.Name,
		"controller-uid": string(j.UID), batchv1.ControllerUidLabel: string(j.UID),
	} {
		if _, set := j.Spec.Template.Labels[k]; !set {
			j.Spec.Template.Labels[k] = v
		}
	}
	if j.Spec.Selector == nil {
		j.Spec.Selector = &metav1.LabelSelector{}
	}
	if j.Spec.Selector.MatchLabels == nil {
		j.Spec.Selector.MatchLabels = map[string]string{}
	}
	if _, set := j.Spec.Selector.MatchLabels[batchv1.ControllerUidLabel]; !set {
		j.Spec.Selector.MatchLabels[batchv1.ControllerUidLabel] = string(j.UID)
	}
}

// csrRequester records the requesting user in a new CSR's spec
// (username, uid, groups; extra once authn carries it), replacing what the client sent, and
// starts it with no conditions: nobody creates a pre-approved request.
func csrRequester(ctx context.Context, o runtime.Object) {
	csr := o.(*certificatesv1.CertificateSigningRequest)
	csr.Spec.Username, csr.Spec.UID, csr.Spec.Groups, csr.Spec.Extra = "", "", nil, nil
	if u, ok := authn.UserFrom(ctx); ok {
		csr.Spec.Username, csr.Spec.UID, csr.Spec.Groups = u.Name, u.UID, u.Groups
	}
	csr.Status = certificatesv1.CertificateSigningRequestStatus{Conditions: []certificatesv1.CertificateSigningRequestCondition{}}
}

// preserveCSRDecisions is upstream's preserveConditionInstances for
// Approved and Denied: when a status write carries as many of each as the
// stored object, the stored instances are put back in place (the order of
// the other conditions is the writer's). It reports whether it could.
func preserveCSRDecisions(csr, oc *certificatesv1.CertificateSigningRequest) bool {
	idx := func(c *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) []int {
		var out []int
		for i := range c.Status.Conditions {
			if c.Status.Conditions[i].Type == t {
				out = append(out, i)
			}
		}
		return out
	}
	types := []certificatesv1.RequestConditionType{certificatesv1.CertificateApproved, certificatesv1.CertificateDenied}
	for _, t := range types {
		if len(idx(csr, t)) != len(idx(oc, t)) {
			return false
		}
	}
	for _, t := range types {
		n, o := idx(csr, t), idx(oc, t)
		for i := range o {
			csr.Status.Conditions[n[i]] = oc.Status.Conditions[o[i]]
		}
	}
	return true
}

// csrPrepareUpdate is upstream's CSR status and approval split: approval
// writes change only the conditions; status writes keep the Approved and
// Denied conditions as they were (changing them is approval's job) and
// may set the certificate. New conditions get their timestamps.
func csrPrepareUpdate(o, old runtime.Object, sub string) {
	csr, oc := o.(*certificatesv1.CertificateSigningRequest), old.(*certificatesv1.CertificateSigningRequest)
	switch sub {
	case "approval":
		conds := csr.Status.Conditions
		csr.Status = *oc.Status.DeepCopy()
		csr.Status.Conditions = conds
	case "status":
		if preserveCSRDecisions(csr, oc) {
			break
		}
		var keep []certificatesv1.CertificateSigningRequestCondition
		for _, c := range csr.Status.Conditions {
			if c.Type != certificatesv1.CertificateApproved && c.Type != certificatesv1.CertificateDenied {
				keep = append(keep, c)
			}
		}
		for _, c := range oc.Status.Conditions {
			if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
				keep = append(keep, c)
			}
		}
		csr.Status.Conditions = keep
	}
	now := metav1.Now()
	for i := range csr.Status.Conditions {
		c := &csr.Status.Conditions[i]
		if c.LastUpdateTime.IsZero() {
			c.LastUpdateTime = now
		}
		if c.LastTransitionTime.IsZero() {
			c.LastTransitionTime = now
			for _, prev := range oc.Status.Conditions {
				if prev.Type == c.Type && prev.Status == c.Status && !prev.LastTransitionTime.IsZero() {
					c.LastTransitionTime = prev.LastTransitionTime
				}
			}
		}
	}
}

// clearStatus empties the Status field of a new object: status is written
// through the status subresource only.
func clearStatus(obj runtime.Object) {
	v := reflect.ValueOf(obj).Elem().FieldByName("Status")
	if v.IsValid() && v.CanSet() {
		v.Set(reflect.Zero(v.Type()))
	}
}

func init() {
	// autoscaling/v1 HorizontalPodAutoscalers are stored as autoscaling/v2
	// ones, converted through the internal type as kube-apiserver does
	// (what v1 cannot express travels in annotations).
	v1, v2 := autoscalingv1.SchemeGroupVersion, autoscalingv2.SchemeGroupVersion
	hpa := "HorizontalPodAutoscaler"
	conversions[[2]schema.GroupVersionKind{v1.WithKind(hpa), v2.WithKind(hpa)}] = func(o runtime.Object) (runtime.Object, error) {
		return upstream.Convert(o, v2)
	}
	conversions[[2]schema.GroupVersionKind{v2.WithKind(hpa), v1.WithKind(hpa)}] = func(o runtime.Object) (runtime.Object, error) {
		return upstream.Convert(o, v1)
	}
}
