package apiserver

import (
	"fmt"
	"net/netip"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/waggle-io/waggle/controlplane/apiserver/registry/upstream"
)

// Validation of the served types: the checks users meet most (names,
// labels, ports, protocols, selectors, required fields, immutable fields),
// each error with its field path, as kube-apiserver reports them.

var protocols = sets.New(string(corev1.ProtocolTCP), string(corev1.ProtocolUDP), string(corev1.ProtocolSCTP))

func validatePortNumber(port int32, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsValidPortNum(int(port)) {
		errs = append(errs, field.Invalid(p, port, msg))
	}
	return errs
}

func validateProtocol(proto corev1.Protocol, p *field.Path) field.ErrorList {
	if proto == "" {
		return field.ErrorList{field.Required(p, "")}
	}
	if !protocols.Has(string(proto)) {
		return field.ErrorList{field.NotSupported(p, proto, sets.List(protocols))}
	}
	return nil
}

func validateDNSLabel(v string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(v) {
		errs = append(errs, field.Invalid(p, v, msg))
	}
	return errs
}

func validateContainers(cs []corev1.Container, p *field.Path, required bool, names sets.Set[string]) field.ErrorList {
	var errs field.ErrorList
	if required && len(cs) == 0 {
		errs = append(errs, field.Required(p, ""))
	}
	for i, c := range cs {
		cp := p.Index(i)
		if c.Name == "" {
			errs = append(errs, field.Required(cp.Child("name"), ""))
		} else {
			errs = append(errs, validateDNSLabel(c.Name, cp.Child("name"))...)
			if names.Has(c.Name) {
				errs = append(errs, field.Duplicate(cp.Child("name"), c.Name))
			}
			names.Insert(c.Name)
		}
		if c.Image == "" {
			errs = append(errs, field.Required(cp.Child("image"), ""))
		}
		portNames := sets.New[string]()
		for j, port := range c.Ports {
			pp := cp.Child("ports").Index(j)
			errs = append(errs, validatePortNumber(port.ContainerPort, pp.Child("containerPort"))...)
			if port.HostPort != 0 {
				errs = append(errs, validatePortNumber(port.HostPort, pp.Child("hostPort"))...)
			}
			errs = append(errs, validateProtocol(port.Protocol, pp.Child("protocol"))...)
			if port.Name != "" {
				for _, msg := range validation.IsValidPortName(port.Name) {
					errs = append(errs, field.Invalid(pp.Child("name"), port.Name, msg))
				}
				if portNames.Has(port.Name) {
					errs = append(errs, field.Duplicate(pp.Child("name"), port.Name))
				}
				portNames.Insert(port.Name)
			}
		}
		for j, e := range c.Env {
			if e.Name == "" {
				errs = append(errs, field.Required(cp.Child("env").Index(j).Child("name"), ""))
			}
		}
		for name, q := range c.Resources.Requests {
			if q.Sign() < 0 {
				errs = append(errs, field.Invalid(cp.Child("resources", "requests").Key(string(name)), q.String(), "must be greater than or equal to 0"))
			}
			if lim, ok := c.Resources.Limits[name]; ok && q.Cmp(lim) > 0 {
				errs = append(errs, field.Invalid(cp.Child("resources", "requests").Key(string(name)), q.String(), fmt.Sprintf("must be less than or equal to %s limit of %s", name, lim.String())))
			}
		}
		if c.ImagePullPolicy != "" {
			errs = append(errs, validatePullPolicy(c.ImagePullPolicy, cp.Child("imagePullPolicy"))...)
		}
	}
	return errs
}

// validatePullPolicy checks a container's imagePullPolicy or an image
// volume's pullPolicy (both defaulted before validation).
func validatePullPolicy(policy corev1.PullPolicy, p *field.Path) field.ErrorList {
	switch policy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
		return nil
	case "":
		return field.ErrorList{field.Required(p, "")}
	}
	return field.ErrorList{field.NotSupported(p, policy, []string{"Always", "IfNotPresent", "Never"})}
}

func validatePodSpec(s *corev1.PodSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := sets.New[string]()
	errs = append(errs, validateContainers(s.Containers, p.Child("containers"), true, names)...)
	errs = append(errs, validateContainers(s.InitContainers, p.Child("initContainers"), false, names)...)
	switch s.RestartPolicy {
	case "", corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever:
	default:
		errs = append(errs, field.NotSupported(p.Child("restartPolicy"), s.RestartPolicy, []string{"Always", "OnFailure", "Never"}))
	}
	switch s.DNSPolicy {
	case "", corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet, corev1.DNSDefault, corev1.DNSNone:
	default:
		errs = append(errs, field.NotSupported(p.Child("dnsPolicy"), s.DNSPolicy, []string{"ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"}))
	}
	if g := s.TerminationGracePeriodSeconds; g != nil && *g < 0 {
		errs = append(errs, field.Invalid(p.Child("terminationGracePeriodSeconds"), *g, "must be >= 0"))
	}
	if s.ActiveDeadlineSeconds != nil && *s.ActiveDeadlineSeconds <= 0 {
		errs = append(errs, field.Invalid(p.Child("activeDeadlineSeconds"), *s.ActiveDeadlineSeconds, "must be greater than 0"))
	}
	if s.NodeName != "" {
		for _, msg := range apivalidation.NameIsDNSSubdomain(s.NodeName, false) {
			errs = append(errs, field.Invalid(p.Child("nodeName"), s.NodeName, msg))
		}
	}
	vols := sets.New[string]()
	for i, v := range s.Volumes {
		vp := p.Child("volumes").Index(i)
		errs = append(errs, validateDNSLabel(v.Name, vp.Child("name"))...)
		if vols.Has(v.Name) {
			errs = append(errs, field.Duplicate(vp.Child("name"), v.Name))
		}
		vols.Insert(v.Name)
		if v.Image != nil {
			// As upstream's validateImageVolumeSource (after defaulting).
			if v.Image.Reference == "" {
				errs = append(errs, field.Required(vp.Child("image", "reference"), ""))
			}
			errs = append(errs, validatePullPolicy(v.Image.PullPolicy, vp.Child("image", "pullPolicy"))...)
		}
	}
	// Projected volumes (podCertificate's maxExpirationSeconds bounds among
	// them) are checked by kube-apiserver's own code.
	errs = append(errs, upstream.ValidateProjectedVolumes(s.Volumes, p.Child("volumes"))...)
	for i, c := range s.Containers {
		for j, vm := range c.VolumeMounts {
			if !vols.Has(vm.Name) {
				errs = append(errs, field.NotFound(p.Child("containers").Index(i).Child("volumeMounts").Index(j).Child("name"), vm.Name))
			}
		}
	}
	for i, t := range s.Tolerations {
		tp := p.Child("tolerations").Index(i)
		if t.Operator == corev1.TolerationOpExists && t.Value != "" {
			errs = append(errs, field.Invalid(tp.Child("operator"), t.Value, "value must be empty when `operator` is 'Exists'"))
		}
		if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
			errs = append(errs, field.Invalid(tp.Child("effect"), t.Effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"))
		}
	}
	errs = append(errs, metav1validation.ValidateLabels(s.NodeSelector, p.Child("nodeSelector"))...)
	return errs
}

func validatePod(pod *corev1.Pod) field.ErrorList {
	errs := validatePodSpec(&pod.Spec, field.NewPath("spec"))
	errs = append(errs, validateSysctls(&pod.Spec, field.NewPath("spec", "securityContext", "sysctls"))...)
	if pod.Status.PodIP != "" {
		if _, err := netip.ParseAddr(pod.Status.PodIP); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("status", "podIP"), pod.Status.PodIP, "must be a valid IP address"))
		}
	}
	return errs
}

// validatePodUpdate allows only what kube-apiserver allows to change in a
// running pod's spec: container images, activeDeadlineSeconds, added
// tolerations, and nodeName only through binding.
func validatePodUpdate(pod, old *corev1.Pod) field.ErrorList {
	a, b := pod.Spec.DeepCopy(), old.Spec.DeepCopy()
	for i := range a.Containers {
		if i < len(b.Containers) {
			a.Containers[i].Image = b.Containers[i].Image
		}
	}
	for i := range a.InitContainers {
		if i < len(b.InitContainers) {
			a.InitContainers[i].Image = b.InitContainers[i].Image
		}
	}
	a.ActiveDeadlineSeconds = b.ActiveDeadlineSeconds
	if len(a.Tolerations) >= len(b.Tolerations) {
		a.Tolerations = b.Tolerations
	}
	if old.Spec.NodeName == "" {
		a.NodeName = b.NodeName
	}
	if !apiequality.Semantic.DeepEqual(a, b) {
		return field.ErrorList{field.Forbidden(field.NewPath("spec"), "pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations)")}
	}
	return nil
}

func validateService(s *corev1.Service) field.ErrorList {
	var errs field.ErrorList
	sp := field.NewPath("spec")
	switch s.Spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName:
	default:
		errs = append(errs, field.NotSupported(sp.Child("type"), s.Spec.Type, []string{"ClusterIP", "ExternalName", "LoadBalancer", "NodePort"}))
	}
	headless := s.Spec.ClusterIP == corev1.ClusterIPNone
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		if s.Spec.ExternalName == "" {
			errs = append(errs, field.Required(sp.Child("externalName"), ""))
		}
	} else if len(s.Spec.Ports) == 0 && !headless {
		errs = append(errs, field.Required(sp.Child("ports"), ""))
	}
	if headless && (s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer) {
		errs = append(errs, field.Invalid(sp.Child("clusterIP"), s.Spec.ClusterIP, "may not be set to 'None' for "+string(s.Spec.Type)+" services"))
	}
	if ip := s.Spec.ClusterIP; ip != "" && !headless {
		if _, err := netip.ParseAddr(ip); err != nil {
			errs = append(errs, field.Invalid(sp.Child("clusterIP"), ip, "must be empty, 'None', or a valid IP address"))
		}
	}
	names := sets.New[string]()
	for i, port := range s.Spec.Ports {
		pp := sp.Child("ports").Index(i)
		if len(s.Spec.Ports) > 1 && port.Name == "" {
			errs = append(errs, field.Required(pp.Child("name"), ""))
		}
		if port.Name != "" {
			errs = append(errs, validateDNSLabel(port.Name, pp.Child("name"))...)
			if names.Has(port.Name) {
				errs = append(errs, field.Duplicate(pp.Child("name"), port.Name))
			}
			names.Insert(port.Name)
		}
		errs = append(errs, validatePortNumber(port.Port, pp.Child("port"))...)
		errs = append(errs, validateProtocol(port.Protocol, pp.Child("protocol"))...)
		switch port.TargetPort.Type {
		case intstr.Int:
			errs = append(errs, validatePortNumber(port.TargetPort.IntVal, pp.Child("targetPort"))...)
		case intstr.String:
			for _, msg := range validation.IsValidPortName(port.TargetPort.StrVal) {
				errs = append(errs, field.Invalid(pp.Child("targetPort"), port.TargetPort.StrVal, msg))
			}
		}
		if port.NodePort != 0 && s.Spec.Type != corev1.ServiceTypeNodePort && s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			errs = append(errs, field.Forbidden(pp.Child("nodePort"), "may not be used when `type` is '"+string(s.Spec.Type)+"'"))
		}
	}
	switch s.Spec.SessionAffinity {
	case corev1.ServiceAffinityNone, corev1.ServiceAffinityClientIP:
	default:
		errs = append(errs, field.NotSupported(sp.Child("sessionAffinity"), s.Spec.SessionAffinity, []string{"ClientIP", "None"}))
	}
	if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		if t := *c.ClientIP.TimeoutSeconds; t <= 0 || t > maxClientIPAffinitySeconds {
			errs = append(errs, field.Invalid(sp.Child("sessionAffinityConfig", "clientIP", "timeoutSeconds"), t, fmt.Sprintf("must be greater than 0 and less than %d", maxClientIPAffinitySeconds)))
		}
	}
	for i, ip := range s.Spec.ExternalIPs {
		if _, err := netip.ParseAddr(ip); err != nil {
			errs = append(errs, field.Invalid(sp.Child("externalIPs").Index(i), ip, "must be a valid IP address"))
		}
	}
	errs = append(errs, metav1validation.ValidateLabels(s.Spec.Selector, sp.Child("selector"))...)
	return errs
}

func validateServiceUpdate(s, old *corev1.Service) field.ErrorList {
	// clusterIP is immutable once set (unless switching to/from ExternalName).
	if old.Spec.ClusterIP != "" && s.Spec.Type != corev1.ServiceTypeExternalName && old.Spec.Type != corev1.ServiceTypeExternalName &&
		s.Spec.ClusterIP != old.Spec.ClusterIP {
		return field.ErrorList{field.Invalid(field.NewPath("spec", "clusterIP"), s.Spec.ClusterIP, "field is immutable")}
	}
	return nil
}

func validateNode(n *corev1.Node) field.ErrorList {
	var errs field.ErrorList
	if n.Spec.PodCIDR != "" {
		if _, err := netip.ParsePrefix(n.Spec.PodCIDR); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("spec", "podCIDR"), n.Spec.PodCIDR, "must be a valid CIDR"))
		}
	}
	for i, t := range n.Spec.Taints {
		tp := field.NewPath("spec", "taints").Index(i)
		for _, msg := range validation.IsQualifiedName(t.Key) {
			errs = append(errs, field.Invalid(tp.Child("key"), t.Key, msg))
		}
		switch t.Effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			errs = append(errs, field.NotSupported(tp.Child("effect"), t.Effect, []string{"NoExecute", "NoSchedule", "PreferNoSchedule"}))
		}
	}
	return errs
}

func validateEvent(e *corev1.Event) field.ErrorList {
	if e.InvolvedObject.Namespace != "" && e.Namespace != "" && e.InvolvedObject.Namespace != e.Namespace {
		return field.ErrorList{field.Invalid(field.NewPath("involvedObject", "namespace"), e.InvolvedObject.Namespace, "does not match event.namespace")}
	}
	return nil
}

func validateDataKeys[V any](data map[string]V, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for k := range data {
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(p.Key(k), k, msg))
		}
	}
	return errs
}

func validateConfigMap(c *corev1.ConfigMap) field.ErrorList {
	errs := validateDataKeys(c.Data, field.NewPath("data"))
	errs = append(errs, validateDataKeys(c.BinaryData, field.NewPath("binaryData"))...)
	for k := range c.Data {
		if _, ok := c.BinaryData[k]; ok {
			errs = append(errs, field.Invalid(field.NewPath("data").Key(k), k, "duplicate of key present in binaryData"))
		}
	}
	return errs
}

func validateSecret(s *corev1.Secret) field.ErrorList {
	return validateDataKeys(s.Data, field.NewPath("data"))
}

func validateEndpoints(e *corev1.Endpoints) field.ErrorList {
	var errs field.ErrorList
	for i, ss := range e.Subsets {
		sp := field.NewPath("subsets").Index(i)
		for j, a := range append(append([]corev1.EndpointAddress{}, ss.Addresses...), ss.NotReadyAddresses...) {
			if _, err := netip.ParseAddr(a.IP); err != nil {
				errs = append(errs, field.Invalid(sp.Child("addresses").Index(j).Child("ip"), a.IP, "must be a valid IP address"))
			}
		}
		for j, p := range ss.Ports {
			errs = append(errs, validatePortNumber(p.Port, sp.Child("ports").Index(j).Child("port"))...)
			errs = append(errs, validateProtocol(p.Protocol, sp.Child("ports").Index(j).Child("protocol"))...)
		}
	}
	return errs
}

func validateEndpointSlice(s *discoveryv1.EndpointSlice) field.ErrorList {
	var errs field.ErrorList
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("addressType"), s.AddressType, []string{"FQDN", "IPv4", "IPv6"}))
	}
	if len(s.Endpoints) > 1000 {
		errs = append(errs, field.TooMany(field.NewPath("endpoints"), len(s.Endpoints), 1000))
	}
	for i, ep := range s.Endpoints {
		ep := ep
		if len(ep.Addresses) == 0 || len(ep.Addresses) > 100 {
			errs = append(errs, field.Invalid(field.NewPath("endpoints").Index(i).Child("addresses"), len(ep.Addresses), "must contain between 1 and 100 addresses"))
		}
		if s.AddressType != discoveryv1.AddressTypeFQDN {
			for j, a := range ep.Addresses {
				addr, err := netip.ParseAddr(a)
				if err != nil || (s.AddressType == discoveryv1.AddressTypeIPv4) != addr.Is4() {
					errs = append(errs, field.Invalid(field.NewPath("endpoints").Index(i).Child("addresses").Index(j), a, "must be a valid "+string(s.AddressType)+" address"))
				}
			}
		}
	}
	for i, p := range s.Ports {
		pp := field.NewPath("ports").Index(i)
		if p.Port != nil {
			errs = append(errs, validatePortNumber(*p.Port, pp.Child("port"))...)
		}
		if p.Protocol != nil {
			errs = append(errs, validateProtocol(*p.Protocol, pp.Child("protocol"))...)
		}
	}
	return errs
}

func validateLease(l *coordinationv1.Lease) field.ErrorList {
	var errs field.ErrorList
	if d := l.Spec.LeaseDurationSeconds; d != nil && *d <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("spec", "leaseDurationSeconds"), *d, "must be greater than 0"))
	}
	if t := l.Spec.LeaseTransitions; t != nil && *t < 0 {
		errs = append(errs, field.Invalid(field.NewPath("spec", "leaseTransitions"), *t, "must be greater than or equal to 0"))
	}
	return errs
}

// validateWorkload checks selector, template labels and replicas of the
// apps/v1 controllers.
func validateWorkload(sel *metav1.LabelSelector, tmpl *corev1.PodTemplateSpec, replicas *int32, sp *field.Path, restartAlways bool) field.ErrorList {
	var errs field.ErrorList
	if sel == nil {
		errs = append(errs, field.Required(sp.Child("selector"), ""))
	} else {
		errs = append(errs, metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, sp.Child("selector"))...)
		if len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
			errs = append(errs, field.Invalid(sp.Child("selector"), sel, "empty selector is invalid for deployment"))
		} else if s, err := metav1.LabelSelectorAsSelector(sel); err == nil && !s.Matches(labelsSet(tmpl.Labels)) {
			errs = append(errs, field.Invalid(sp.Child("template", "metadata", "labels"), tmpl.Labels, "`selector` does not match template `labels`"))
		}
	}
	errs = append(errs, metav1validation.ValidateLabels(tmpl.Labels, sp.Child("template", "metadata", "labels"))...)
	if replicas != nil && *replicas < 0 {
		errs = append(errs, field.Invalid(sp.Child("replicas"), *replicas, "must be greater than or equal to 0"))
	}
	errs = append(errs, validatePodSpec(&tmpl.Spec, sp.Child("template", "spec"))...)
	if restartAlways && tmpl.Spec.RestartPolicy != "" && tmpl.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(sp.Child("template", "spec", "restartPolicy"), tmpl.Spec.RestartPolicy, []string{"Always"}))
	}
	return errs
}

func validateDeployment(d *appsv1.Deployment) field.ErrorList {
	errs := validateWorkload(d.Spec.Selector, &d.Spec.Template, d.Spec.Replicas, field.NewPath("spec"), true)
	switch d.Spec.Strategy.Type {
	case appsv1.RollingUpdateDeploymentStrategyType, appsv1.RecreateDeploymentStrategyType:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("spec", "strategy", "type"), d.Spec.Strategy.Type, []string{"Recreate", "RollingUpdate"}))
	}
	if d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType && d.Spec.Strategy.RollingUpdate != nil {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "strategy", "rollingUpdate"), "may not be specified when strategy `type` is 'Recreate'"))
	}
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxSurge != nil && ru.MaxUnavailable != nil {
		if isZero(*ru.MaxSurge) && isZero(*ru.MaxUnavailable) {
			errs = append(errs, field.Invalid(field.NewPath("spec", "strategy", "rollingUpdate", "maxUnavailable"), ru.MaxUnavailable.String(), "may not be 0 when `maxSurge` is 0"))
		}
	}
	return errs
}

func isZero(v intstr.IntOrString) bool {
	return (v.Type == intstr.Int && v.IntVal == 0) || (v.Type == intstr.String && (v.StrVal == "0%" || v.StrVal == "0"))
}

func validateReplicaSet(r *appsv1.ReplicaSet) field.ErrorList {
	return validateWorkload(r.Spec.Selector, &r.Spec.Template, r.Spec.Replicas, field.NewPath("spec"), true)
}

func validateDaemonSet(d *appsv1.DaemonSet) field.ErrorList {
	return validateWorkload(d.Spec.Selector, &d.Spec.Template, nil, field.NewPath("spec"), true)
}

func immutableSelector(sel, old *metav1.LabelSelector) field.ErrorList {
	if !apiequality.Semantic.DeepEqual(sel, old) {
		return field.ErrorList{field.Invalid(field.NewPath("spec", "selector"), sel, "field is immutable")}
	}
	return nil
}

func labelsSet(m map[string]string) labels.Set { return labels.Set(m) }

const maxClientIPAffinitySeconds = 86400
