package apiserver_test

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPrivilegedPodTemplatesAllowed: with --allow-privileged (the default,
// as kubeadm's and k3s's clusters) a Job's or DaemonSet's privileged pod
// template is accepted like a privileged pod. Upstream's template
// validation reads a process-wide switch that is off until the server sets
// it, so these were refused with "disallowed by cluster policy" while bare
// pods passed (the Job pod-failure-policy conformance specs hit it).
func TestPrivilegedPodTemplatesAllowed(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	priv := true
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "priv"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox",
			SecurityContext: &corev1.SecurityContext{Privileged: &priv}}}},
	}
	if _, err := cs.BatchV1().Jobs("default").Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "priv"},
		Spec: batchv1.JobSpec{Template: tmpl}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("privileged Job: %v", err)
	}
	ds := tmpl.DeepCopy()
	ds.Spec.RestartPolicy = corev1.RestartPolicyAlways
	if _, err := cs.AppsV1().DaemonSets("default").Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "priv"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "priv"}}, Template: *ds}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("privileged DaemonSet: %v", err)
	}
}
