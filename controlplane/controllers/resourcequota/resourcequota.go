// Package resourcequota runs Kubernetes' ResourceQuota controller
// (k8s.io/kubernetes/pkg/controller/resourcequota) in the
// controller-manager: it fills every ResourceQuota's status.hard and
// status.used — compute requests and limits, storage, object counts
// (pods, services, configmaps, ... and count/<resource>.<group> of every
// quotable resource the API server serves), under the quota's scopes
// (Terminating, NotTerminating, BestEffort, NotBestEffort, PriorityClass
// scopeSelector, CrossNamespacePodAffinity) — with upstream's evaluators
// (k8s.io/kubernetes/pkg/quota/v1/evaluator/core).
//
// Usage is recalculated when a quota's spec changes, when a tracked object
// is deleted or changes in a way that changes its usage (a pod finishing,
// a Service changing type, a PVC resized), and for every quota each
// ResyncPeriod. New resources (CRDs) are discovered every 30 s.
//
// The API server's ResourceQuota admission does the charging at write
// time; this controller corrects the totals (it gives back what a refused
// or deleted object held). It is not the admission plugin.
package resourcequota

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	quota "k8s.io/apiserver/pkg/quota/v1"
	"k8s.io/apiserver/pkg/quota/v1/generic"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/kubernetes/pkg/controller"
	upstream "k8s.io/kubernetes/pkg/controller/resourcequota"
	"k8s.io/kubernetes/pkg/quota/v1/evaluator/core"
	"k8s.io/utils/clock"
)

// Name is the controller's name (--controllers), as kube-controller-manager's.
const Name = "resourcequota"

// Defaults as kube-controller-manager's flags.
const (
	// DefaultResyncPeriod is --resource-quota-sync-period.
	DefaultResyncPeriod = 5 * time.Minute
	// DefaultWorkers is --concurrent-resource-quota-syncs.
	DefaultWorkers = 5
	// discoveryPeriod is how often new quotable resources are looked for.
	discoveryPeriod = 30 * time.Second
	// replenishmentResync: full resync of the monitors' informers.
	replenishmentResync = 12 * time.Hour
)

// Options tune the controller.
type Options struct {
	// ResyncPeriod: every quota's usage is recalculated this often.
	ResyncPeriod time.Duration
	// Ignored are resources never counted (the API server's admission
	// ignores the same ones).
	Ignored map[schema.GroupResource]struct{}
	// InformersStarted is closed once the shared factory has been started;
	// the controller starts the informers it adds after that.
	InformersStarted <-chan struct{}
}

// Controller is the upstream controller with the discovery loop.
type Controller struct {
	c     *upstream.Controller
	disco upstream.NamespacedResourcesFunc
	log   *slog.Logger
}

// New builds the controller over the shared factory (typed informers for
// the kinds client-go knows) and a metadata informer factory for every
// other resource it counts.
func New(ctx context.Context, client kubernetes.Interface, meta metadata.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) (*Controller, error) {
	if opts.ResyncPeriod <= 0 {
		opts.ResyncPeriod = DefaultResyncPeriod
	}
	if opts.Ignored == nil {
		opts.Ignored = map[schema.GroupResource]struct{}{}
	}
	inf := informerfactory.NewInformerFactory(factory, metadatainformer.NewSharedInformerFactory(meta, replenishmentResync))
	listerFor := generic.ListerFuncForResourceFunc(inf.ForResource)
	evaluators, err := core.NewEvaluators(listerFor, factory, nil)
	if err != nil {
		return nil, fmt.Errorf("resourcequota: evaluators: %w", err)
	}
	disco := func() ([]*metav1.APIResourceList, error) {
		return discovery.ServerPreferredNamespacedResources(client.Discovery())
	}
	c, err := upstream.NewController(ctx, &upstream.ControllerOptions{
		QuotaClient:               client.CoreV1(),
		ResourceQuotaInformer:     factory.Core().V1().ResourceQuotas(),
		ResyncPeriod:              controller.StaticResyncPeriodFunc(opts.ResyncPeriod),
		Registry:                  generic.NewRegistry(evaluators),
		DiscoveryFunc:             disco,
		IgnoredResourcesFunc:      func() map[schema.GroupResource]struct{} { return opts.Ignored },
		InformersStarted:          opts.InformersStarted,
		InformerFactory:           inf,
		ReplenishmentResyncPeriod: controller.StaticResyncPeriodFunc(replenishmentResync),
		UpdateFilter:              updateFilter,
	})
	if err != nil {
		return nil, fmt.Errorf("resourcequota: %w", err)
	}
	return &Controller{c: c, disco: disco, log: log.With("controller", Name)}, nil
}

// Run runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.log.Info("starting")
	defer c.log.Info("stopped")
	go c.c.Sync(ctx, c.disco, discoveryPeriod)
	c.c.Run(ctx, workers)
}

// updateFilter is upstream's install.DefaultUpdateFilter: which updates of
// a tracked object change quota usage (its deletion always does).
func updateFilter(resource schema.GroupVersionResource, oldObj, newObj any) bool {
	switch resource.GroupResource() {
	case schema.GroupResource{Resource: "pods"}:
		oldPod, newPod := oldObj.(*corev1.Pod), newObj.(*corev1.Pod)
		if podResourcesChanged(oldPod, newPod) {
			return true
		}
		if core.IsTerminating(oldPod) != core.IsTerminating(newPod) {
			return true
		}
		return core.QuotaV1Pod(oldPod, clock.RealClock{}) && !core.QuotaV1Pod(newPod, clock.RealClock{})
	case schema.GroupResource{Resource: "services"}:
		return core.GetQuotaServiceType(oldObj.(*corev1.Service)) != core.GetQuotaServiceType(newObj.(*corev1.Service))
	case schema.GroupResource{Resource: "persistentvolumeclaims"}:
		return core.RequiresQuotaReplenish(newObj.(*corev1.PersistentVolumeClaim), oldObj.(*corev1.PersistentVolumeClaim))
	}
	return false
}

// podResourcesChanged: the resources a container status reports changed
// (an in-place resize took effect).
func podResourcesChanged(oldPod, newPod *corev1.Pod) bool {
	changed := func(olds, news []corev1.ContainerStatus) bool {
		for _, o := range olds {
			for _, n := range news {
				if n.Name == o.Name && !quota.Equals(resourcesOf(o), resourcesOf(n)) {
					return true
				}
			}
		}
		return false
	}
	return changed(oldPod.Status.ContainerStatuses, newPod.Status.ContainerStatuses) ||
		changed(oldPod.Status.InitContainerStatuses, newPod.Status.InitContainerStatuses)
}

func resourcesOf(s corev1.ContainerStatus) corev1.ResourceList {
	if s.Resources == nil {
		return nil
	}
	out := corev1.ResourceList{}
	for k, v := range s.Resources.Requests {
		out["requests."+k] = v
	}
	for k, v := range s.Resources.Limits {
		out["limits."+k] = v
	}
	return out
}
