package apiserver

import (
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The defaults below are the ones kube-apiserver applies to core/v1 and
// apps/v1 (k8s.io/kubernetes/pkg/apis/*/v1/defaults.go, which cannot be
// imported outside that module): the fields users and controllers rely on
// being set after a create.

func ptr[T any](v T) *T { return &v }

func defaultPodSpec(s *corev1.PodSpec, mirror bool) {
	if s.RestartPolicy == "" {
		s.RestartPolicy = corev1.RestartPolicyAlways
	}
	if s.DNSPolicy == "" {
		s.DNSPolicy = corev1.DNSClusterFirst
	}
	if s.TerminationGracePeriodSeconds == nil {
		s.TerminationGracePeriodSeconds = ptr(int64(corev1.DefaultTerminationGracePeriodSeconds))
	}
	if s.SchedulerName == "" {
		s.SchedulerName = corev1.DefaultSchedulerName
	}
	if s.SecurityContext == nil {
		s.SecurityContext = &corev1.PodSecurityContext{}
	}
	if s.EnableServiceLinks == nil {
		s.EnableServiceLinks = ptr(corev1.DefaultEnableServiceLinks)
	}
	// As upstream's ServiceAccount admission: every pod runs as a
	// ServiceAccount, "default" unless named, except mirror pods, which
	// may reference no API object.
	if !mirror && s.ServiceAccountName == "" && s.DeprecatedServiceAccount == "" {
		s.ServiceAccountName = "default"
	}
	if s.DeprecatedServiceAccount == "" {
		s.DeprecatedServiceAccount = s.ServiceAccountName
	}
	for i := range s.InitContainers {
		defaultContainer(&s.InitContainers[i])
	}
	for i := range s.Containers {
		defaultContainer(&s.Containers[i])
	}
	for i := range s.Volumes {
		v := &s.Volumes[i]
		switch {
		case v.ConfigMap != nil && v.ConfigMap.DefaultMode == nil:
			v.ConfigMap.DefaultMode = ptr(corev1.ConfigMapVolumeSourceDefaultMode)
		case v.Secret != nil && v.Secret.DefaultMode == nil:
			v.Secret.DefaultMode = ptr(corev1.SecretVolumeSourceDefaultMode)
		case v.HostPath != nil && v.HostPath.Type == nil:
			v.HostPath.Type = ptr(corev1.HostPathUnset)
		case v.Image != nil && v.Image.PullPolicy == "":
			v.Image.PullPolicy = defaultPullPolicy(v.Image.Reference)
		}
	}
}

func defaultProbe(p *corev1.Probe) {
	if p == nil {
		return
	}
	if p.TimeoutSeconds == 0 {
		p.TimeoutSeconds = 1
	}
	if p.PeriodSeconds == 0 {
		p.PeriodSeconds = 10
	}
	if p.SuccessThreshold == 0 {
		p.SuccessThreshold = 1
	}
	if p.FailureThreshold == 0 {
		p.FailureThreshold = 3
	}
	if p.HTTPGet != nil && p.HTTPGet.Scheme == "" {
		p.HTTPGet.Scheme = corev1.URISchemeHTTP
	}
	if p.HTTPGet != nil && p.HTTPGet.Path == "" {
		p.HTTPGet.Path = "/"
	}
}

// defaultPullPolicy is a container's imagePullPolicy and an image
// volume's pullPolicy when unset: Always for :latest or no tag,
// IfNotPresent otherwise (a digest included).
func defaultPullPolicy(img string) corev1.PullPolicy {
	if strings.Contains(img, "@") {
		return corev1.PullIfNotPresent
	}
	tag := ""
	if i := strings.LastIndex(img, ":"); i >= 0 && !strings.Contains(img[i:], "/") {
		tag = img[i+1:]
	}
	if tag == "" || tag == "latest" {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

func defaultContainer(c *corev1.Container) {
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = defaultPullPolicy(c.Image)
	}
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = corev1.TerminationMessagePathDefault
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = corev1.ProtocolTCP
		}
	}
	for i := range c.Env {
		if vf := c.Env[i].ValueFrom; vf != nil && vf.FieldRef != nil && vf.FieldRef.APIVersion == "" {
			vf.FieldRef.APIVersion = "v1"
		}
	}
	// Requests default to limits where only limits are given.
	for name, q := range c.Resources.Limits {
		if c.Resources.Requests == nil {
			c.Resources.Requests = corev1.ResourceList{}
		}
		if _, ok := c.Resources.Requests[name]; !ok {
			c.Resources.Requests[name] = q.DeepCopy()
		}
	}
	defaultProbe(c.LivenessProbe)
	defaultProbe(c.ReadinessProbe)
	defaultProbe(c.StartupProbe)
}

func defaultPod(p *corev1.Pod) {
	_, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]
	defaultPodSpec(&p.Spec, mirror)
	// spec.priority is not defaulted here: the Priority admission plugin
	// sets it from the pod's PriorityClass (or the global default), as
	// upstream, and refuses a value that differs from the class's.
}

func defaultPodTemplate(t *corev1.PodTemplateSpec) { defaultPodSpec(&t.Spec, false) }

// qosClass computes the pod's QoS class as the kubelet and apiserver do.
func qosClass(s *corev1.PodSpec) corev1.PodQOSClass {
	requests, limits := 0, 0
	guaranteed := true
	for _, c := range append(append([]corev1.Container{}, s.InitContainers...), s.Containers...) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, hasReq := c.Resources.Requests[r]
			lim, hasLim := c.Resources.Limits[r]
			if hasReq && !req.IsZero() {
				requests++
			}
			if hasLim && !lim.IsZero() {
				limits++
			}
			if !hasLim || (hasReq && req.Cmp(lim) != 0) {
				guaranteed = false
			}
		}
	}
	switch {
	case requests == 0 && limits == 0:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

func defaultService(s *corev1.Service) {
	if s.Spec.Type == "" {
		s.Spec.Type = corev1.ServiceTypeClusterIP
	}
	if s.Spec.SessionAffinity == "" {
		s.Spec.SessionAffinity = corev1.ServiceAffinityNone
	}
	if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP && s.Spec.SessionAffinityConfig == nil {
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(corev1.DefaultClientIPServiceAffinitySeconds)}}
	}
	for i := range s.Spec.Ports {
		p := &s.Spec.Ports[i]
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		if p.TargetPort == (intstr.IntOrString{}) {
			p.TargetPort = intstr.FromInt32(p.Port)
		}
	}
	if s.Spec.Type != corev1.ServiceTypeExternalName {
		if s.Spec.InternalTrafficPolicy == nil {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyCluster)
		}
		// ipFamilies and ipFamilyPolicy are settled by the allocator
		// (resolveIPFamilies), which knows the cluster's families.
	}
	if (s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer) && s.Spec.ExternalTrafficPolicy == "" {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.AllocateLoadBalancerNodePorts == nil {
		s.Spec.AllocateLoadBalancerNodePorts = ptr(true)
	}
}

func defaultNamespace(n *corev1.Namespace) {
	if n.Status.Phase == "" {
		n.Status.Phase = corev1.NamespaceActive
	}
	if n.DeletionTimestamp == nil && len(n.Spec.Finalizers) == 0 && n.ResourceVersion == "" {
		n.Spec.Finalizers = []corev1.FinalizerName{corev1.FinalizerKubernetes}
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[corev1.LabelMetadataName] = n.Name
}

func defaultEndpoints(e *corev1.Endpoints) {
	for i := range e.Subsets {
		for j := range e.Subsets[i].Ports {
			if e.Subsets[i].Ports[j].Protocol == "" {
				e.Subsets[i].Ports[j].Protocol = corev1.ProtocolTCP
			}
		}
	}
}

func defaultEndpointSlice(s *discoveryv1.EndpointSlice) {
	for i := range s.Ports {
		if s.Ports[i].Protocol == nil {
			s.Ports[i].Protocol = ptr(corev1.ProtocolTCP)
		}
		if s.Ports[i].Name == nil {
			s.Ports[i].Name = ptr("")
		}
	}
}

func defaultDeployment(d *appsv1.Deployment) {
	if d.Spec.Replicas == nil {
		d.Spec.Replicas = ptr(int32(1))
	}
	if d.Spec.Strategy.Type == "" {
		d.Spec.Strategy.Type = appsv1.RollingUpdateDeploymentStrategyType
	}
	if d.Spec.Strategy.Type == appsv1.RollingUpdateDeploymentStrategyType {
		if d.Spec.Strategy.RollingUpdate == nil {
			d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{}
		}
		if d.Spec.Strategy.RollingUpdate.MaxUnavailable == nil {
			d.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromString("25%"))
		}
		if d.Spec.Strategy.RollingUpdate.MaxSurge == nil {
			d.Spec.Strategy.RollingUpdate.MaxSurge = ptr(intstr.FromString("25%"))
		}
	}
	if d.Spec.RevisionHistoryLimit == nil {
		d.Spec.RevisionHistoryLimit = ptr(int32(10))
	}
	if d.Spec.ProgressDeadlineSeconds == nil {
		d.Spec.ProgressDeadlineSeconds = ptr(int32(600))
	}
	defaultPodTemplate(&d.Spec.Template)
}

func defaultReplicaSet(r *appsv1.ReplicaSet) {
	if r.Spec.Replicas == nil {
		r.Spec.Replicas = ptr(int32(1))
	}
	defaultPodTemplate(&r.Spec.Template)
}

func defaultDaemonSet(d *appsv1.DaemonSet) {
	if d.Spec.UpdateStrategy.Type == "" {
		d.Spec.UpdateStrategy.Type = appsv1.RollingUpdateDaemonSetStrategyType
	}
	if d.Spec.UpdateStrategy.Type == appsv1.RollingUpdateDaemonSetStrategyType {
		if d.Spec.UpdateStrategy.RollingUpdate == nil {
			d.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateDaemonSet{}
		}
		if d.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable == nil {
			d.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromInt32(1))
		}
		if d.Spec.UpdateStrategy.RollingUpdate.MaxSurge == nil {
			d.Spec.UpdateStrategy.RollingUpdate.MaxSurge = ptr(intstr.FromInt32(0))
		}
	}
	if d.Spec.RevisionHistoryLimit == nil {
		d.Spec.RevisionHistoryLimit = ptr(int32(10))
	}
	defaultPodTemplate(&d.Spec.Template)
}
