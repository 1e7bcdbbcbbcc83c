package apiserver_test

import (
	"context"
	"fmt"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
)

// TestHPAManagedFieldsAcrossVersions: an HPA created through autoscaling/v1
// (as `kubectl autoscale` does) whose status the controller then writes
// through autoscaling/v2 keeps both writers in managedFields, each in its
// own version, as kube-apiserver does: the field manager converts between
// the versions through the internal type instead of dropping the update's
// managedFields.
func TestHPAManagedFieldsAcrossVersions(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	cs := kubernetes.NewForConfigOrDie(s.Config)
	ctx := context.Background()
	if _, err := cs.AutoscalingV1().HorizontalPodAutoscalers("default").Create(ctx, &autoscalingv1.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: autoscalingv1.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv1.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			MinReplicas:    ptr(int32(1)), MaxReplicas: 5, TargetCPUUtilizationPercentage: ptr(int32(50))},
	}, metav1.CreateOptions{FieldManager: "kubectl-autoscale"}); err != nil {
		t.Fatal(err)
	}
	hpas := cs.AutoscalingV2().HorizontalPodAutoscalers("default")
	h, err := hpas.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.Status = autoscalingv2.HorizontalPodAutoscalerStatus{CurrentReplicas: 1, DesiredReplicas: 3}
	h, err = hpas.UpdateStatus(ctx, h, metav1.UpdateOptions{FieldManager: "horizontal-pod-autoscaler"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range h.ManagedFields {
		got[e.Manager] = fmt.Sprintf("%s %s %s", e.Operation, e.APIVersion, e.Subresource)
	}
	want := map[string]string{"kubectl-autoscale": "Update autoscaling/v1 ", "horizontal-pod-autoscaler": "Update autoscaling/v2 status"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("managedFields %v, want %v", got, want)
	}
	// And back: a v1 spec update keeps the v2 status writer's entry.
	h1, err := cs.AutoscalingV1().HorizontalPodAutoscalers("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h1.Spec.MaxReplicas = 10
	h1, err = cs.AutoscalingV1().HorizontalPodAutoscalers("default").Update(ctx, h1, metav1.UpdateOptions{FieldManager: "kubectl-edit"})
	if err != nil {
		t.Fatal(err)
	}
	managers := map[string]bool{}
	for _, e := range h1.ManagedFields {
		managers[e.Manager] = true
	}
	if !managers["kubectl-edit"] || !managers["horizontal-pod-autoscaler"] || !managers["kubectl-autoscale"] {
		t.Fatalf("managedFields after a v1 update: %v", managers)
	}
}

// TestControllerManagerMayDoWhatTheHPAControllerNeeds: the
// controller-manager runs the HPA controller under its own identity, which
// the bootstrap policy binds to upstream's
// system:controller:horizontal-pod-autoscaler: read HPAs and write their
// status, get and update any /scale, list pods, read the resource, custom
// and external metrics APIs, record Events; and nothing beyond (no HPA
// spec writes through this role).
func TestControllerManagerMayDoWhatTheHPAControllerNeeds(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	cs := kubernetes.NewForConfigOrDie(s.Config)
	ctx := context.Background()
	for _, c := range []struct {
		group, resource, sub, verb string
	}{
		{"autoscaling", "horizontalpodautoscalers", "", "list"},
		{"autoscaling", "horizontalpodautoscalers", "", "watch"},
		{"autoscaling", "horizontalpodautoscalers", "status", "update"},
		{"apps", "deployments", "scale", "get"},
		{"apps", "deployments", "scale", "update"},
		{"example.com", "widgets", "scale", "update"},
		{"", "pods", "", "list"},
		{"metrics.k8s.io", "pods", "", "list"},
		{"custom.metrics.k8s.io", "pods", "", "get"},
		{"external.metrics.k8s.io", "queue_length", "", "list"},
		{"", "events", "", "create"},
	} {
		sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: bootstrap.ControllerManagerUser,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "default", Verb: c.verb, Group: c.group,
				Resource: c.resource, Subresource: c.sub}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !sar.Status.Allowed {
			t.Errorf("%s may not %s %s/%s in %q: %s", bootstrap.ControllerManagerUser, c.verb, c.resource, c.sub, c.group, sar.Status.Reason)
		}
	}
}
