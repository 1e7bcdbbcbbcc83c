package apiserver

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// priorityAdmission is kube-apiserver's Priority admission plugin (on by
// default): a pod created with spec.priorityClassName gets that class's
// value in spec.priority and its preemptionPolicy; a pod without one gets
// the globalDefault class (the lowest-valued one should a race have made
// two) or priority 0. A class that does not exist, or a priority or
// preemptionPolicy in the pod that differs from the computed one, is
// refused with 403, as upstream. The scheduler's preemption reads
// spec.priority, so without this plugin every pod would be equal.
type priorityAdmission struct{ s *Server }

func (priorityAdmission) Name() string { return "Priority" }

func (p priorityAdmission) Admit(ctx context.Context, a *AdmissionAttributes) error {
	if a.Resource.Group != "" || a.Resource.Resource != "pods" || a.Operation != OpCreate || a.Subresource != "" {
		return nil
	}
	pod, ok := a.Object.(*corev1.Pod)
	if !ok {
		return nil
	}
	var (
		priority int32
		policy   *corev1.PreemptionPolicy
	)
	if pod.Spec.PriorityClassName == "" {
		pc, err := p.globalDefault(ctx)
		if err != nil {
			return fmt.Errorf("failed to get default priority class: %w", err)
		}
		if pc != nil {
			pod.Spec.PriorityClassName = pc.Name
			priority, policy = pc.Value, pc.PreemptionPolicy
		}
	} else {
		pc, err := p.class(ctx, pod.Spec.PriorityClassName)
		if apierrors.IsNotFound(err) {
			return apierrors.NewForbidden(a.Resource.GroupResource(), a.Name,
				fmt.Errorf("no PriorityClass with name %v was found", pod.Spec.PriorityClassName))
		}
		if err != nil {
			return fmt.Errorf("failed to get PriorityClass with name %s: %w", pod.Spec.PriorityClassName, err)
		}
		priority, policy = pc.Value, pc.PreemptionPolicy
	}
	if pod.Spec.Priority != nil && *pod.Spec.Priority != priority {
		return apierrors.NewForbidden(a.Resource.GroupResource(), a.Name, fmt.Errorf(
			"the integer value of priority (%d) must not be provided in pod spec; priority admission controller computed %d from the given PriorityClass name",
			*pod.Spec.Priority, priority))
	}
	pod.Spec.Priority = &priority
	if policy != nil {
		if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy != *policy {
			return apierrors.NewForbidden(a.Resource.GroupResource(), a.Name, fmt.Errorf(
				"the string value of PreemptionPolicy (%s) must not be provided in pod spec; priority admission controller computed %s from the given PriorityClass name",
				*pod.Spec.PreemptionPolicy, *policy))
		}
		pod.Spec.PreemptionPolicy = policy
	}
	return nil
}

// class reads one PriorityClass: the watch cache first, then etcd, so a
// class created a moment before its pods counts.
func (p priorityAdmission) class(ctx context.Context, name string) (*schedulingv1.PriorityClass, error) {
	r := p.s.registries["priorityclasses"]
	if r == nil {
		return nil, apierrors.NewNotFound(schedulingv1.Resource("priorityclasses"), name)
	}
	o, err := r.get(ctx, "", name, "0")
	if apierrors.IsNotFound(err) {
		o, err = r.get(ctx, "", name, "")
	}
	if err != nil {
		return nil, err
	}
	pc, ok := o.Obj.(*schedulingv1.PriorityClass)
	if !ok {
		return nil, fmt.Errorf("PriorityClass %q: unexpected %T", name, o.Obj)
	}
	return pc, nil
}

// globalDefault is the PriorityClass marked globalDefault, nil when none is.
func (p priorityAdmission) globalDefault(ctx context.Context) (*schedulingv1.PriorityClass, error) {
	r := p.s.registries["priorityclasses"]
	if r == nil {
		return nil, nil
	}
	res, err := r.list(ctx, "", &metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, err
	}
	var def *schedulingv1.PriorityClass
	for _, o := range res.items {
		pc, ok := o.Obj.(*schedulingv1.PriorityClass)
		if ok && pc.GlobalDefault && (def == nil || pc.Value < def.Value) {
			def = pc
		}
	}
	return def, nil
}
