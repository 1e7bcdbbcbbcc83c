package policy

import (
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func np(ns, name string, subject *metav1.LabelSelector, types ...networkingv1.PolicyType) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: *subject, PolicyTypes: types},
	}
}

func tcpPort(p int) networkingv1.NetworkPolicyPort {
	proto := v1.ProtocolTCP
	port := intstr.FromInt32(int32(p))
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port}
}

const (
	ingress = networkingv1.PolicyTypeIngress
	egress  = networkingv1.PolicyTypeEgress
)
