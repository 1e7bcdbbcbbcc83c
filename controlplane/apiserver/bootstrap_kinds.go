package apiserver

import (
	"context"
	"fmt"

	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Built-in PriorityClasses, as kube-apiserver creates them at start
// (pkg/apis/scheduling: SystemCriticalPriority = 2,000,000,000).
const systemCriticalPriority = 2000000000

var systemPriorityClasses = []*schedulingv1.PriorityClass{
	{
		ObjectMeta:  metav1.ObjectMeta{Name: "system-node-critical"},
		Value:       systemCriticalPriority + 1000,
		Description: "Used for system critical pods that must not be moved from their current node.",
	},
	{
		ObjectMeta:  metav1.ObjectMeta{Name: "system-cluster-critical"},
		Value:       systemCriticalPriority,
		Description: "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
	},
}

// bootstrapPriorityClasses creates the built-in PriorityClasses that are
// missing; existing ones are left as they are (kube-apiserver too only
// creates them).
func (s *Server) bootstrapPriorityClasses(ctx context.Context) error {
	reg := s.registries["priorityclasses"]
	for _, pc := range systemPriorityClasses {
		if _, err := reg.create(ctx, "", pc.DeepCopy(), writeOpts{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("apiserver: create priorityclass %s: %w", pc.Name, err)
		}
	}
	return nil
}
