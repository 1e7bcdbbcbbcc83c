package apiserver

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/util/tolerations"
)

// runtimeClassAdmission is kube-apiserver's RuntimeClass admission plugin
// (on by default): a pod created with spec.runtimeClassName is refused
// (403) when that RuntimeClass does not exist; otherwise it gets the
// class's overhead (spec.overhead; a different overhead the pod already
// names is refused) and its scheduling constraints (node selector merged,
// a conflicting key refused; tolerations merged by upstream's rule). The
// validating half checks, after the mutating webhooks, that spec.overhead
// is still the class's, and that a pod without such a class sets none.
type runtimeClassAdmission struct {
	s        *Server
	validate bool
}

func (runtimeClassAdmission) Name() string { return "RuntimeClass" }

func (p runtimeClassAdmission) Admit(ctx context.Context, a *AdmissionAttributes) error {
	if a.Resource.Group != "" || a.Resource.Resource != "pods" || a.Operation != OpCreate || a.Subresource != "" {
		return nil
	}
	pod, ok := a.Object.(*corev1.Pod)
	if !ok {
		return nil
	}
	rc, err := p.runtimeClass(ctx, a, pod)
	if err != nil {
		return err
	}
	if p.validate {
		if rc != nil && rc.Overhead != nil {
			if !apiequality.Semantic.DeepEqual(rc.Overhead.PodFixed, pod.Spec.Overhead) {
				return p.forbidden(a, errors.New("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"))
			}
		} else if pod.Spec.Overhead != nil {
			return p.forbidden(a, errors.New("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"))
		}
		return nil
	}
	if rc == nil {
		return nil
	}
	if rc.Overhead != nil {
		if len(pod.Spec.Overhead) > 0 && !apiequality.Semantic.DeepEqual(rc.Overhead.PodFixed, pod.Spec.Overhead) {
			return p.forbidden(a, errors.New("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"))
		}
		pod.Spec.Overhead = rc.Overhead.PodFixed.DeepCopy()
	}
	if sc := rc.Scheduling; sc != nil {
		if pod.Spec.NodeSelector == nil && len(sc.NodeSelector) > 0 {
			pod.Spec.NodeSelector = map[string]string{}
		}
		for k, v := range sc.NodeSelector {
			if pv, ok := pod.Spec.NodeSelector[k]; ok && pv != v {
				return p.forbidden(a, fmt.Errorf("conflict: runtimeClass.scheduling.nodeSelector[%s] = %s; pod.spec.nodeSelector[%s] = %s", k, v, k, pv))
			}
			pod.Spec.NodeSelector[k] = v
		}
		merged := tolerations.MergeTolerations(toInternalTolerations(pod.Spec.Tolerations), toInternalTolerations(sc.Tolerations))
		pod.Spec.Tolerations = fromInternalTolerations(merged)
	}
	return nil
}

// runtimeClass reads the pod's RuntimeClass (nil when it names none).
func (p runtimeClassAdmission) runtimeClass(ctx context.Context, a *AdmissionAttributes, pod *corev1.Pod) (*nodev1.RuntimeClass, error) {
	if pod.Spec.RuntimeClassName == nil {
		return nil, nil
	}
	name := *pod.Spec.RuntimeClassName
	r := p.s.registries["runtimeclasses"]
	if r == nil {
		return nil, p.forbidden(a, fmt.Errorf("pod rejected: RuntimeClass %q not found", name))
	}
	// A consistent read: a class deleted a moment ago may still be in the
	// watch cache, and its pods must be refused (pods naming a RuntimeClass
	// are few, so the read costs little).
	o, err := r.get(ctx, "", name, "")
	if apierrors.IsNotFound(err) {
		return nil, p.forbidden(a, fmt.Errorf("pod rejected: RuntimeClass %q not found", name))
	}
	if err != nil {
		return nil, err
	}
	rc, ok := o.Obj.(*nodev1.RuntimeClass)
	if !ok {
		return nil, fmt.Errorf("RuntimeClass %q: unexpected %T", name, o.Obj)
	}
	return rc, nil
}

// forbidden is upstream's admission.NewForbidden for a pod.
func (p runtimeClassAdmission) forbidden(a *AdmissionAttributes, err error) error {
	return apierrors.NewForbidden(a.Resource.GroupResource(), a.Name, err)
}

func toInternalTolerations(ts []corev1.Toleration) []api.Toleration {
	out := make([]api.Toleration, 0, len(ts))
	for _, t := range ts {
		out = append(out, api.Toleration{Key: t.Key, Operator: api.TolerationOperator(t.Operator), Value: t.Value,
			Effect: api.TaintEffect(t.Effect), TolerationSeconds: t.TolerationSeconds})
	}
	return out
}

func fromInternalTolerations(ts []api.Toleration) []corev1.Toleration {
	if len(ts) == 0 {
		return nil
	}
	out := make([]corev1.Toleration, 0, len(ts))
	for _, t := range ts {
		out = append(out, corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOperator(t.Operator), Value: t.Value,
			Effect: corev1.TaintEffect(t.Effect), TolerationSeconds: t.TolerationSeconds})
	}
	return out
}
