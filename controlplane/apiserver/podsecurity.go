package apiserver

import (
	"context"
	"errors"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/warning"
	psadmission "k8s.io/pod-security-admission/admission"
	psapi "k8s.io/pod-security-admission/admission/api"
	"k8s.io/pod-security-admission/admission/api/load"
	"k8s.io/pod-security-admission/api"
	psmetrics "k8s.io/pod-security-admission/metrics"
	"k8s.io/pod-security-admission/policy"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/storage"
)

// podSecurity is upstream's PodSecurity admission plugin, run with
// k8s.io/pod-security-admission itself: the namespace labels
// pod-security.kubernetes.io/{enforce,audit,warn}[-version] choose the
// Pod Security Standard (privileged, baseline, restricted) each pod, and
// each workload's pod template, is checked against; the configuration
// (--pod-security-config-file, a PodSecurityConfiguration as kube-apiserver's
// admission config takes it) gives the defaults for unlabelled namespaces
// and the exempt usernames, namespaces and runtime classes. Enforce refuses
// with upstream's 403; warn adds Warning headers; audit adds the
// pod-security.kubernetes.io/audit-violations annotation to the audit event.
// A namespace whose labels change gets warnings for its existing pods that
// the new enforce level would refuse.
type podSecurity struct {
	s *Server
	a *psadmission.Admission
}

func (*podSecurity) Name() string { return "PodSecurity" }

// newPodSecurity builds the plugin from the configuration file (empty:
// upstream's defaults, privileged at latest for every mode).
func (s *Server) newPodSecurity(path string) (*podSecurity, error) {
	var conf *psapi.PodSecurityConfiguration
	var err error
	if path != "" {
		conf, err = load.LoadFromFile(path)
	} else {
		conf, err = load.LoadFromData(nil)
	}
	if err != nil {
		return nil, fmt.Errorf("--pod-security-config-file %s: %w", path, err)
	}
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return nil, fmt.Errorf("pod security evaluator: %w", err)
	}
	p := &podSecurity{s: s}
	p.a = &psadmission.Admission{
		Configuration:    conf,
		Evaluator:        eval,
		Metrics:          noPSMetrics{},
		PodSpecExtractor: psadmission.DefaultPodSpecExtractor{},
		NamespaceGetter:  psNamespaces{s},
		PodLister:        psPods{s},
	}
	if err := p.a.CompleteConfiguration(); err != nil {
		return nil, fmt.Errorf("--pod-security-config-file %s: %w", path, err)
	}
	if err := p.a.ValidateConfiguration(); err != nil {
		return nil, fmt.Errorf("--pod-security-config-file %s: %w", path, err)
	}
	return p, nil
}

// check runs the plugin on one write (a validating step: after mutation
// and the kind's own validation).
func (p *podSecurity) check(ctx context.Context, a *AdmissionAttributes) error {
	if a.Operation != OpCreate && a.Operation != OpUpdate {
		return nil
	}
	gvr := a.Resource.GroupVersionResource
	if gvr.Resource != "namespaces" && gvr.Resource != "pods" && !p.a.PodSpecExtractor.HasPodSpec(gvr.GroupResource()) {
		return nil
	}
	rec := &api.AttributesRecord{
		Name: a.Name, Namespace: a.Namespace, Kind: a.Resource.GroupVersionKind(), Resource: gvr,
		Subresource: a.Subresource, Operation: admissionv1.Operation(a.Operation), Object: a.Object, OldObject: a.OldObject,
	}
	if u, ok := authn.UserFrom(ctx); ok {
		rec.Username = u.Name
	}
	resp := p.a.Validate(ctx, rec)
	for _, w := range resp.Warnings {
		warning.AddWarning(ctx, "", w)
	}
	for k, v := range resp.AuditAnnotations {
		auditAnnotate(ctx, "pod-security.kubernetes.io/"+k, v)
	}
	if resp.Allowed {
		return nil
	}
	st := metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden}
	if resp.Result != nil {
		st = *resp.Result
	}
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	return &apierrors.StatusError{ErrStatus: st}
}

type psNamespaces struct{ s *Server }

func (n psNamespaces) GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	reg := n.s.registries["namespaces"]
	o, _, err := reg.cache.Get(ctx, 0, reg.key("", name))
	if errors.Is(err, storage.ErrNotFound) {
		o, err = reg.get(ctx, "", name, "")
	}
	if err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return nil, apierrors.NewNotFound(corev1.Resource("namespaces"), name)
		}
		return nil, err
	}
	return o.Obj.(*corev1.Namespace), nil
}

type psPods struct{ s *Server }

func (p psPods) ListPods(ctx context.Context, namespace string) ([]*corev1.Pod, error) {
	reg := p.s.registries["pods"]
	objs, _, err := reg.cache.List(ctx, 0, storage.Predicate{KeyPrefix: reg.prefix(namespace)})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if pod, ok := o.Obj.(*corev1.Pod); ok {
			out = append(out, pod)
		}
	}
	return out, nil
}

// noPSMetrics: the plugin's Prometheus recorder registers into
// component-base's global registry, which Waggle does not serve.
type noPSMetrics struct{}

func (noPSMetrics) RecordEvaluation(psmetrics.Decision, api.LevelVersion, psmetrics.Mode, api.Attributes) {
}
func (noPSMetrics) RecordExemption(api.Attributes)   {}
func (noPSMetrics) RecordError(bool, api.Attributes) {}
