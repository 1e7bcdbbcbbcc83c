package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/scale"
	"k8s.io/kubernetes/pkg/controller/podautoscaler"
	hpametrics "k8s.io/kubernetes/pkg/controller/podautoscaler/metrics"
	resourceclient "k8s.io/metrics/pkg/client/clientset/versioned/typed/metrics/v1beta1"
	"k8s.io/metrics/pkg/client/custom_metrics"
	"k8s.io/metrics/pkg/client/external_metrics"
)

// HPAName is the HorizontalPodAutoscaler controller's name in
// --controllers (kube-controller-manager's).
const HPAName = "horizontalpodautoscaling"

// restMapperResetPeriod is how often the HPA's discovery-backed RESTMapper
// forgets what it learned, so kinds added later (CRDs with a /scale
// subresource) can be targets: kube-controller-manager's 30s.
const restMapperResetPeriod = 30 * time.Second

func autoscalingStarters() []starter {
	return []starter{
		{name: HPAName, serviceAccount: "horizontal-pod-autoscaler", build: buildHPA},
	}
}

// buildHPA wires kube-controller-manager's own HorizontalPodAutoscaler
// controller (k8s.io/kubernetes/pkg/controller/podautoscaler) as
// kube-controller-manager does (cmd/kube-controller-manager/app/autoscaling.go):
// the targets' /scale through a scale client whose kinds come from
// discovery, resource metrics from metrics.k8s.io (the API server serves it
// natively), custom and external metrics from custom.metrics.k8s.io and
// external.metrics.k8s.io, which only an aggregated adapter serves (without
// one, an HPA using them reports ScalingActive=False, FailedGetPodsMetric,
// FailedGetObjectMetric or FailedGetExternalMetric, as upstream).
func buildHPA(d Deps) (func(context.Context), error) {
	if err := served(d, "autoscaling/v2", "horizontalpodautoscalers"); err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(d.RestConfig)
	rc.UserAgent = "waggle-controller-manager/horizontal-pod-autoscaler"
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(d.Client.Discovery()))
	// Not cached: the resolver caches on its own and must see new kinds.
	scaleKinds := scale.NewDiscoveryScaleKindResolver(d.Client.Discovery())
	scales, err := scale.NewForConfig(rc, mapper, dynamic.LegacyAPIPathResolverFunc, scaleKinds)
	if err != nil {
		return nil, fmt.Errorf("HPA scale client: %w", err)
	}
	resources, err := resourceclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("HPA resource metrics client: %w", err)
	}
	external, err := external_metrics.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("HPA external metrics client: %w", err)
	}
	customVersions := custom_metrics.NewAvailableAPIsGetter(d.Client.Discovery())
	metricsClient := hpametrics.NewRESTMetricsClient(resources,
		custom_metrics.NewForConfig(rc, mapper, customVersions), external)
	cfg := d.Config
	c := podautoscaler.NewHorizontalController(d.Ctx, d.Client.CoreV1(), scales, d.Client.AutoscalingV2(), mapper, metricsClient,
		d.Factory.Autoscaling().V2().HorizontalPodAutoscalers(), d.Factory.Core().V1().Pods(),
		cfg.HPASyncPeriod, cfg.HPADownscaleStabilization, cfg.HPATolerance,
		cfg.HPACPUInitializationPeriod, cfg.HPAInitialReadinessDelay)
	return func(ctx context.Context) {
		var wg sync.WaitGroup
		wg.Go(func() { wait.Until(mapper.Reset, restMapperResetPeriod, ctx.Done()) })
		wg.Go(func() { custom_metrics.PeriodicallyInvalidate(customVersions, cfg.HPASyncPeriod, ctx.Done()) })
		c.Run(ctx, cfg.ConcurrentHPASyncs)
		wg.Wait()
	}, nil
}
