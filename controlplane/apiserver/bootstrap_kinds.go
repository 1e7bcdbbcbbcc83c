package apiserver

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// defaultServiceCIDRName is the ServiceCIDR kube-apiserver keeps for its
// --service-cluster-ip-range (pkg/controlplane/controller/defaultservicecidr).
const defaultServiceCIDRName = "kubernetes"

// bootstrapServiceCIDR creates the default ServiceCIDR, the cluster's
// Service range(s) as clients read it (kubectl get servicecidr), and marks
// it Ready. The object reports the configured range; the allocator itself
// is the range the server was started with, and further ServiceCIDRs are
// stored but do not extend it (documented in the API README).
func (s *Server) bootstrapServiceCIDR(ctx context.Context) error {
	var cidrs []string
	for _, r := range strings.Split(s.cfg.ServiceClusterIPRange, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			return fmt.Errorf("apiserver: service cluster IP range %q: %w", r, err)
		}
		cidrs = append(cidrs, p.Masked().String())
	}
	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: defaultServiceCIDRName}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
	reg := s.registries["servicecidrs"]
	if _, err := reg.create(ctx, "", sc, writeOpts{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("apiserver: create servicecidr %s: %w", sc.Name, err)
	}
	_, err := reg.guaranteedUpdate(ctx, "", defaultServiceCIDRName, "status", writeOpts{}, func(cur runtime.Object) (runtime.Object, error) {
		c := cur.(*networkingv1.ServiceCIDR)
		if meta.IsStatusConditionTrue(c.Status.Conditions, networkingv1.ServiceCIDRConditionReady) {
			return nil, nil
		}
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionTrue,
			Reason: "Ready", Message: "Kubernetes default Service CIDR is ready", ObservedGeneration: c.Generation})
		c.ResourceVersion = ""
		return c, nil
	})
	if err != nil {
		return fmt.Errorf("apiserver: servicecidr %s status: %w", defaultServiceCIDRName, err)
	}
	return nil
}
