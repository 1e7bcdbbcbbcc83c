package apiserver

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The pod subresources that change one part of the spec, as upstream's
// ephemeralContainersStrategy and podResizeStrategy: everything but that
// part is taken from the stored pod, and the part is validated on its own.

// ephemeralOnly returns old with new's spec.ephemeralContainers.
func ephemeralOnly(pod, old *corev1.Pod) {
	ec := pod.Spec.EphemeralContainers
	meta := pod.ObjectMeta
	*pod = *old.DeepCopy()
	pod.Spec.EphemeralContainers = ec
	pod.ResourceVersion, pod.ManagedFields = meta.ResourceVersion, meta.ManagedFields
}

// validateEphemeralContainersUpdate: ephemeral containers are only added,
// never changed or removed, and each is a valid container whose name no
// other container has, without ports, probes, lifecycle or resources.
func validateEphemeralContainersUpdate(pod, old *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec", "ephemeralContainers")
	now := map[string]*corev1.EphemeralContainer{}
	for i := range pod.Spec.EphemeralContainers {
		now[pod.Spec.EphemeralContainers[i].Name] = &pod.Spec.EphemeralContainers[i]
	}
	for i := range old.Spec.EphemeralContainers {
		o := &old.Spec.EphemeralContainers[i]
		n, ok := now[o.Name]
		if !ok {
			errs = append(errs, field.Forbidden(p, fmt.Sprintf("existing ephemeral containers %q may not be removed", o.Name)))
			continue
		}
		if !apiequality.Semantic.DeepEqual(o, n) {
			errs = append(errs, field.Forbidden(p.Index(i), fmt.Sprintf("existing ephemeral containers %q may not be changed", o.Name)))
		}
	}
	names := map[string]bool{}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		names[c.Name] = true
	}
	seen := map[string]bool{}
	for i, ec := range pod.Spec.EphemeralContainers {
		ip := p.Index(i)
		switch {
		case ec.Name == "":
			errs = append(errs, field.Required(ip.Child("name"), ""))
		case names[ec.Name] || seen[ec.Name]:
			errs = append(errs, field.Duplicate(ip.Child("name"), ec.Name))
		default:
			errs = append(errs, validateDNSLabel(ec.Name, ip.Child("name"))...)
		}
		seen[ec.Name] = true
		if ec.Image == "" {
			errs = append(errs, field.Required(ip.Child("image"), ""))
		}
		if len(ec.Ports) > 0 {
			errs = append(errs, field.Forbidden(ip.Child("ports"), "cannot be set for an Ephemeral Container"))
		}
		for name, set := range map[string]bool{"livenessProbe": ec.LivenessProbe != nil, "readinessProbe": ec.ReadinessProbe != nil,
			"startupProbe": ec.StartupProbe != nil, "lifecycle": ec.Lifecycle != nil} {
			if set {
				errs = append(errs, field.Forbidden(ip.Child(name), "cannot be set for an Ephemeral Container"))
			}
		}
		if len(ec.Resources.Limits) > 0 || len(ec.Resources.Requests) > 0 {
			errs = append(errs, field.Forbidden(ip.Child("resources"), "cannot be set for an Ephemeral Container"))
		}
		if ec.TargetContainerName != "" && !names[ec.TargetContainerName] {
			errs = append(errs, field.NotFound(ip.Child("targetContainerName"), ec.TargetContainerName))
		}
	}
	return errs
}

// resizeOnly returns old with new's container resources and resize
// policies (sidecar init containers included).
func resizeOnly(pod, old *corev1.Pod) {
	n := pod.DeepCopy()
	meta := pod.ObjectMeta
	*pod = *old.DeepCopy()
	pod.ResourceVersion, pod.ManagedFields = meta.ResourceVersion, meta.ManagedFields
	take := func(dst, src []corev1.Container) {
		for i := range dst {
			for j := range src {
				if src[j].Name == dst[i].Name {
					dst[i].Resources, dst[i].ResizePolicy = src[j].Resources, src[j].ResizePolicy
				}
			}
		}
	}
	take(pod.Spec.Containers, n.Spec.Containers)
	take(pod.Spec.InitContainers, n.Spec.InitContainers)
}

// validateResize: only cpu and memory change, the QoS class stays, and only
// running pods' regular or sidecar containers are resized.
func validateResize(pod, old *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	if qosClass(&pod.Spec) != qosClass(&old.Spec) {
		errs = append(errs, field.Forbidden(field.NewPath("spec"), "Pod QOS Class may not change as a result of resizing"))
	}
	check := func(cs, olds []corev1.Container, p *field.Path, sidecarsOnly bool) {
		for i, c := range cs {
			o := olds[i]
			if apiequality.Semantic.DeepEqual(c.Resources, o.Resources) {
				continue
			}
			cp := p.Index(i).Child("resources")
			if sidecarsOnly && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				errs = append(errs, field.Forbidden(cp, "resources for non-sidecar init containers are immutable"))
				continue
			}
			for _, rl := range []struct {
				name     string
				now, was corev1.ResourceList
			}{{"requests", c.Resources.Requests, o.Resources.Requests}, {"limits", c.Resources.Limits, o.Resources.Limits}} {
				for r := range merged(rl.now, rl.was) {
					if r == corev1.ResourceCPU || r == corev1.ResourceMemory {
						continue
					}
					if !rl.now[r].Equal(rl.was[r]) {
						errs = append(errs, field.Forbidden(cp.Child(rl.name).Key(string(r)), "only cpu and memory resources are mutable"))
					}
				}
			}
			for r := range merged(c.Resources.Limits, o.Resources.Limits) {
				if _, had := o.Resources.Limits[r]; had {
					if _, has := c.Resources.Limits[r]; !has {
						errs = append(errs, field.Forbidden(cp.Child("limits").Key(string(r)), "resource limits cannot be removed"))
					}
				}
			}
		}
	}
	check(pod.Spec.Containers, old.Spec.Containers, field.NewPath("spec", "containers"), false)
	check(pod.Spec.InitContainers, old.Spec.InitContainers, field.NewPath("spec", "initContainers"), true)
	if len(errs) == 0 && (old.Status.Phase == corev1.PodSucceeded || old.Status.Phase == corev1.PodFailed) {
		errs = append(errs, field.Forbidden(field.NewPath("spec"), "pod resize may not be applied to a terminated pod"))
	}
	return errs
}

func merged(a, b corev1.ResourceList) map[corev1.ResourceName]bool {
	out := map[corev1.ResourceName]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}
