package apiserver

import (
	"strings"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func validPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img"}}}}
}

func validService() *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
}

func validDeployment() *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns"}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "b"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img"}}}}}}
}

func checkCreate(t *testing.T, resource string, obj runtime.Object) []string {
	t.Helper()
	var res *catalog.Resource
	for _, r := range catalog.All() {
		if r.Resource == resource {
			r := r
			res = &r
		}
	}
	st := strategyFor(res)
	if st.defaults != nil {
		st.defaults(obj)
	}
	var fields []string
	for _, e := range st.validateCreate(&registry{res: res, st: st}, obj) {
		fields = append(fields, e.Field)
	}
	return fields
}

func TestValidationNamesTheFieldAtFault(t *testing.T) {
	cases := []struct {
		name     string
		resource string
		obj      func() runtime.Object
		want     string // field path prefix; "" means valid
	}{
		{"valid pod", "pods", func() runtime.Object { return validPod() }, ""},
		{"pod name not a DNS subdomain", "pods", func() runtime.Object { p := validPod(); p.Name = "Bad_Name"; return p }, "metadata.name"},
		{"pod without containers", "pods", func() runtime.Object { p := validPod(); p.Spec.Containers = nil; return p }, "spec.containers"},
		{"container without image", "pods", func() runtime.Object { p := validPod(); p.Spec.Containers[0].Image = ""; return p }, "spec.containers[0].image"},
		{"duplicate container names", "pods", func() runtime.Object {
			p := validPod()
			p.Spec.Containers = append(p.Spec.Containers, p.Spec.Containers[0])
			return p
		}, "spec.containers[1].name"},
		{"container port out of range", "pods", func() runtime.Object {
			p := validPod()
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 0}}
			return p
		}, "spec.containers[0].ports[0].containerPort"},
		{"bad protocol", "pods", func() runtime.Object {
			p := validPod()
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, Protocol: "ICMP"}}
			return p
		}, "spec.containers[0].ports[0].protocol"},
		{"valid image volume", "pods", func() runtime.Object {
			p := validPod()
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "busybox:1.37"}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/v"}}
			return p
		}, ""},
		{"image volume without reference", "pods", func() runtime.Object {
			p := validPod()
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{}}}}
			return p
		}, "spec.volumes[0].image.reference"},
		{"image volume bad pull policy", "pods", func() runtime.Object {
			p := validPod()
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "busybox", PullPolicy: "Sometimes"}}}}
			return p
		}, "spec.volumes[0].image.pullPolicy"},
		{"bad restart policy", "pods", func() runtime.Object { p := validPod(); p.Spec.RestartPolicy = "Sometimes"; return p }, "spec.restartPolicy"},
		{"label value too long", "pods", func() runtime.Object {
			p := validPod()
			p.Labels = map[string]string{"a": strings.Repeat("x", 64)}
			return p
		}, "metadata.labels"},
		{"valid service", "services", func() runtime.Object { return validService() }, ""},
		{"service name not DNS-1035", "services", func() runtime.Object { s := validService(); s.Name = "1abc"; return s }, "metadata.name"},
		{"service without ports", "services", func() runtime.Object { s := validService(); s.Spec.Ports = nil; return s }, "spec.ports"},
		{"two unnamed service ports", "services", func() runtime.Object {
			s := validService()
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: 81})
			return s
		}, "spec.ports[0].name"},
		{"bad service type", "services", func() runtime.Object { s := validService(); s.Spec.Type = "Magic"; return s }, "spec.type"},
		{"nodePort on ClusterIP", "services", func() runtime.Object { s := validService(); s.Spec.Ports[0].NodePort = 30001; return s }, "spec.ports[0].nodePort"},
		{"bad clusterIP", "services", func() runtime.Object { s := validService(); s.Spec.ClusterIP = "10.0.0.300"; return s }, "spec.clusterIP"},
		{"valid deployment", "deployments", func() runtime.Object { return validDeployment() }, ""},
		{"deployment without selector", "deployments", func() runtime.Object { d := validDeployment(); d.Spec.Selector = nil; return d }, "spec.selector"},
		{"selector does not match template", "deployments", func() runtime.Object {
			d := validDeployment()
			d.Spec.Template.Labels = map[string]string{"a": "c"}
			return d
		}, "spec.template.metadata.labels"},
		{"negative replicas", "deployments", func() runtime.Object { d := validDeployment(); d.Spec.Replicas = ptr(int32(-1)); return d }, "spec.replicas"},
		{"both surge and unavailable zero", "deployments", func() runtime.Object {
			d := validDeployment()
			d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxSurge: ptr(intstr.FromInt32(0)), MaxUnavailable: ptr(intstr.FromString("0%"))}
			return d
		}, "spec.strategy.rollingUpdate.maxUnavailable"},
		{"configmap key with a slash", "configmaps", func() runtime.Object {
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"}, Data: map[string]string{"a/b": "x"}}
		}, "data[a/b]"},
		{"namespace name with a dot", "namespaces", func() runtime.Object {
			return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a.b"}}
		}, "metadata.name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := checkCreate(t, tc.resource, tc.obj())
			if tc.want == "" {
				if len(got) != 0 {
					t.Fatalf("valid object refused: %v", got)
				}
				return
			}
			for _, f := range got {
				if strings.HasPrefix(f, tc.want) {
					return
				}
			}
			t.Fatalf("errors %v name no field under %s", got, tc.want)
		})
	}
}

func TestDefaultsUsersRelyOn(t *testing.T) {
	p := validPod()
	p.Spec.Containers[0].Image = "nginx"
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80}}
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(80)}}}
	defaultPod(p)
	c := p.Spec.Containers[0]
	switch {
	case p.Spec.RestartPolicy != corev1.RestartPolicyAlways, p.Spec.DNSPolicy != corev1.DNSClusterFirst,
		*p.Spec.TerminationGracePeriodSeconds != 30, p.Spec.SchedulerName != "default-scheduler",
		c.ImagePullPolicy != corev1.PullAlways, c.Ports[0].Protocol != corev1.ProtocolTCP,
		c.TerminationMessagePath != "/dev/termination-log", c.ReadinessProbe.PeriodSeconds != 10,
		c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTP, p.Spec.ServiceAccountName != "default":
		t.Fatalf("pod defaults: %+v", p.Spec)
	}
	for img, want := range map[string]corev1.PullPolicy{"nginx:1.25": corev1.PullIfNotPresent, "nginx:latest": corev1.PullAlways,
		"localhost:5000/x": corev1.PullAlways, "x@sha256:abc": corev1.PullIfNotPresent} {
		c := corev1.Container{Image: img}
		defaultContainer(&c)
		if c.ImagePullPolicy != want {
			t.Errorf("%s: pull policy %s, want %s", img, c.ImagePullPolicy, want)
		}
		// An image volume's pullPolicy defaults as upstream's, by the same rule.
		p := validPod()
		p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: img}}}}
		defaultPod(p)
		if got := p.Spec.Volumes[0].Image.PullPolicy; got != want {
			t.Errorf("image volume %s: pull policy %s, want %s", img, got, want)
		}
	}
	s := validService()
	s.Spec.Type = corev1.ServiceTypeNodePort
	defaultService(s)
	if s.Spec.SessionAffinity != corev1.ServiceAffinityNone || s.Spec.Ports[0].TargetPort.IntValue() != 80 ||
		s.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyCluster || *s.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyCluster {
		t.Fatalf("service defaults: %+v", s.Spec)
	}
	d := validDeployment()
	defaultDeployment(d)
	if *d.Spec.Replicas != 1 || d.Spec.Strategy.RollingUpdate.MaxSurge.StrVal != "25%" || d.Spec.Strategy.RollingUpdate.MaxUnavailable.StrVal != "25%" ||
		*d.Spec.RevisionHistoryLimit != 10 || *d.Spec.ProgressDeadlineSeconds != 600 || d.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		t.Fatalf("deployment defaults: %+v", d.Spec)
	}
}

func TestAllocatorRangesMapValuesAndOffsets(t *testing.T) {
	ips, err := newIPAllocator("10.96.0.0/12", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ips.value(1) != "10.96.0.1" || ips.value(ips.size-1) != "10.111.255.254" {
		t.Fatalf("ip values: %s %s", ips.value(1), ips.value(ips.size-1))
	}
	for _, tc := range []struct {
		v  string
		ok bool
	}{{"10.96.0.1", true}, {"10.96.0.0", false}, {"10.111.255.255", false}, {"10.112.0.1", false}, {"::1", false}, {"x", false}} {
		if off, ok := ips.offset(tc.v); ok != tc.ok || (ok && ips.value(off) != tc.v) {
			t.Errorf("offset(%s) = %d %v", tc.v, off, ok)
		}
	}
	ports, err := newPortAllocator("30000-32767", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ports.offset("29999"); ok {
		t.Error("29999 is outside the range")
	}
	if off, ok := ports.offset("32767"); !ok || ports.value(off) != "32767" {
		t.Error("32767 is inside the range")
	}
	for _, bad := range []string{"1-0", "a-b", "0-10", "30000"} {
		if _, err := newPortAllocator(bad, nil, nil); err == nil {
			t.Errorf("port range %q accepted", bad)
		}
	}
	for _, bad := range []string{"10.0.0.0/31", "fd00::/104", "fd00::/127", "x"} {
		if _, err := newIPAllocator(bad, nil, nil); err == nil {
			t.Errorf("ip range %q accepted", bad)
		}
	}
	six, err := newIPAllocator("fd00:10:96::/112", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if six.value(1) != "fd00:10:96::1" || six.family != corev1.IPv6Protocol {
		t.Errorf("IPv6 range: first value %s family %s", six.value(1), six.family)
	}
	if off, ok := six.offset("fd00:10:96::ffff"); !ok || off != 0xffff {
		t.Errorf("IPv6 has no broadcast address to skip: offset %d %v", off, ok)
	}
	for ranges, want := range map[string]int{"10.96.0.0/12": 1, "10.96.0.0/12,fd00::/108": 2, "fd00::/108, 10.96.0.0/12": 2,
		"10.0.0.0/16,10.1.0.0/16": 0, "10.0.0.0/16,fd00::/108,fd01::/108": 0} {
		got, err := newIPAllocators(ranges, nil, nil)
		if len(got) != want || (want == 0) != (err != nil) {
			t.Errorf("%q: %d allocators, %v; want %d", ranges, len(got), err, want)
		}
	}
}
