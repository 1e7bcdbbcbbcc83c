package controllers

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/controllers/deployment"
	"github.com/waggle-io/waggle/controlplane/controllers/replicaset"
	"github.com/waggle-io/waggle/internal/testutil"
)

// loadKubelet serves /metrics/resource as a kubelet does (Prometheus text,
// cumulative CPU seconds per container, over TLS asking for the API
// server's client certificate) for the running pods bound to one node: the
// pods of each "app" label share a fixed total CPU load evenly, as a fixed
// amount of work spread over a Deployment's replicas; pods of an app with
// no load are not reported at all (a target without metrics).
type loadKubelet struct {
	cs   kubernetes.Interface
	node string

	mu    sync.Mutex
	load  map[string]float64 // app -> total cores
	cpu   map[types.UID]float64
	last  map[types.UID]time.Time
	start map[types.UID]time.Time
}

func (k *loadKubelet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/metrics/resource" || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		http.Error(w, "want /metrics/resource with a client certificate", http.StatusUnauthorized)
		return
	}
	pods, err := k.cs.CoreV1().Pods("").List(r.Context(), metav1.ListOptions{ResourceVersion: "0", FieldSelector: "spec.nodeName=" + k.node})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	// Whole milliseconds, the samples' timestamps: the rate between two
	// samples is then exactly the load (no rounding up to the next
	// millicore).
	now := time.Now().Truncate(time.Millisecond)
	running := map[string][]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running[p.Labels["app"]] = append(running[p.Labels["app"]], p)
		}
	}
	ts := now.UnixMilli()
	var node float64
	for app, ps := range running {
		total, ok := k.load[app]
		if !ok {
			continue
		}
		for _, p := range ps {
			if _, seen := k.start[p.UID]; !seen {
				k.start[p.UID], k.last[p.UID] = now, now
			}
			k.cpu[p.UID] += total / float64(len(ps)) * now.Sub(k.last[p.UID]).Seconds()
			k.last[p.UID] = now
			node += k.cpu[p.UID]
			c := p.Spec.Containers[0].Name
			lbl := fmt.Sprintf(`{container=%q,namespace=%q,pod=%q}`, c, p.Namespace, p.Name)
			fmt.Fprintf(w, "container_cpu_usage_seconds_total%s %g %d\n", lbl, k.cpu[p.UID], ts)
			fmt.Fprintf(w, "container_memory_working_set_bytes%s %d %d\n", lbl, 16<<20, ts)
			fmt.Fprintf(w, "container_start_time_seconds%s %d %d\n", lbl, k.start[p.UID].Unix(), ts)
		}
	}
	fmt.Fprintf(w, "node_cpu_usage_seconds_total %g %d\nnode_memory_working_set_bytes %d %d\n", node, ts, 1<<30, ts)
}

// TestHorizontalPodAutoscalerScalesOnResourceMetrics: upstream's HPA
// controller, run by the controller-manager under its own identity (so
// RBAC is the bootstrap policy's), reads CPU through the API server's
// native metrics.k8s.io (scraped from a kubelet endpoint) and scales a
// Deployment created with `kubectl autoscale`: pods at 4× their request
// with a 50% target ask for 8 replicas, clamped at maxReplicas 5
// (ScalingLimited TooManyReplicas); raising maxReplicas lets it reach the
// computed 8 (DesiredWithinRange, 50%/50%). A target whose pods have no
// metrics, and a custom (Pods) metric with no custom metrics API, give
// ScalingActive=False with upstream's reasons. `kubectl get hpa` prints
// upstream's columns. It runs as the controller-manager's own identity and,
// with --use-service-account-credentials, as kube-system/horizontal-pod-autoscaler
// (upstream's role, bound by the bootstrap policy).
func TestHorizontalPodAutoscalerScalesOnResourceMetrics(t *testing.T) {
	testutil.Privileged(t)
	t.Run("ControllerManagerIdentity", func(t *testing.T) { testHPAScales(t, false) })
	t.Run("ServiceAccountCredentials", func(t *testing.T) { testHPAScales(t, true) })
}

func testHPAScales(t *testing.T, serviceAccounts bool) {
	srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) {
		c.MetricsAPI, c.MetricsResolution = "native", 500*time.Millisecond
	}})
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, rc: srv.Config, cs: cs, kubeconfig: filepath.Join(srv.DataDir, "admin.kubeconfig")}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// One simulated node whose kubelet endpoint serves the load: 400m in
	// all over hpa-web's pods (4× a pod's 100m request while there is one).
	kl := &loadKubelet{cs: cs, node: "node-0", load: map[string]float64{"hpa-web": 0.4},
		cpu: map[types.UID]float64{}, last: map[types.UID]time.Time{}, start: map[types.UID]time.Time{}}
	ks := httptest.NewUnstartedServer(kl)
	ks.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	ks.StartTLS()
	t.Cleanup(ks.Close)
	c.startKubelets(ctx, 1, nil)
	host, port, _ := net.SplitHostPort(ks.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	node, err := cs.CoreV1().Nodes().Get(ctx, "node-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(p)
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	c.startManager("cm-hpa", func(cfg *Config) {
		cfg.RestConfig = srv.UserConfig(t, "system:kube-controller-manager")
		cfg.Controllers = []string{deployment.Name, replicaset.Name, HPAName}
		cfg.HPASyncPeriod = time.Second
		cfg.UseServiceAccountCredentials = serviceAccounts
	})

	for _, name := range []string{"hpa-web", "hpa-idle", "hpa-custom"} {
		labels := map[string]string{"app": name}
		if _, err := cs.AppsV1().Deployments("default").Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "burn", Image: "busybox",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.kubectlOK("autoscale", "deployment", "hpa-web", "--cpu-percent=50", "--min=1", "--max=5")

	hpas := cs.AutoscalingV2().HorizontalPodAutoscalers("default")
	cond := func(h *autoscalingv2.HorizontalPodAutoscaler, typ autoscalingv2.HorizontalPodAutoscalerConditionType) autoscalingv2.HorizontalPodAutoscalerCondition {
		for _, c := range h.Status.Conditions {
			if c.Type == typ {
				return c
			}
		}
		return autoscalingv2.HorizontalPodAutoscalerCondition{}
	}
	type want struct {
		typ            autoscalingv2.HorizontalPodAutoscalerConditionType
		status         corev1.ConditionStatus
		reason, inText string
	}
	waitHPA := func(name string, replicas int32, utilization int32, conds ...want) {
		t.Helper()
		eventually(t, 90*time.Second, func() error {
			h, err := hpas.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, w := range conds {
				got := cond(h, w.typ)
				if got.Status != w.status || got.Reason != w.reason || !strings.Contains(got.Message, w.inText) {
					return fmt.Errorf("%s condition %s = %s %s %q, want %s %s %q", name, w.typ, got.Status, got.Reason, got.Message, w.status, w.reason, w.inText)
				}
			}
			if replicas == 0 {
				return nil
			}
			d, err := cs.AppsV1().Deployments("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if *d.Spec.Replicas != replicas || d.Status.ReadyReplicas != replicas {
				return fmt.Errorf("deployment %s: %d replicas (%d ready), want %d", name, *d.Spec.Replicas, d.Status.ReadyReplicas, replicas)
			}
			st := h.Status
			if st.CurrentReplicas != replicas || st.DesiredReplicas != replicas || st.LastScaleTime == nil || st.ObservedGeneration == nil {
				return fmt.Errorf("%s status replicas %d/%d lastScaleTime %v observedGeneration %v, want %d", name, st.CurrentReplicas, st.DesiredReplicas, st.LastScaleTime, st.ObservedGeneration, replicas)
			}
			if len(st.CurrentMetrics) != 1 || st.CurrentMetrics[0].Resource == nil || st.CurrentMetrics[0].Resource.Name != corev1.ResourceCPU ||
				st.CurrentMetrics[0].Resource.Current.AverageUtilization == nil ||
				*st.CurrentMetrics[0].Resource.Current.AverageUtilization != utilization {
				return fmt.Errorf("%s currentMetrics %+v, want cpu at %d%%", name, st.CurrentMetrics, utilization)
			}
			return nil
		})
	}

	// 1 pod at 400% of its request, target 50%: 8 wanted, 5 allowed. At 5
	// pods each burns 80m (80%).
	waitHPA("hpa-web", 5, 80,
		want{autoscalingv2.AbleToScale, corev1.ConditionTrue, "ReadyForNewScale", "recommended size matches current size"},
		want{autoscalingv2.ScalingActive, corev1.ConditionTrue, "ValidMetricFound", "the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)"},
		want{autoscalingv2.ScalingLimited, corev1.ConditionTrue, "TooManyReplicas", "the desired replica count is more than the maximum replica count"})
	eventually(t, 30*time.Second, func() error {
		h, err := hpas.Get(ctx, "hpa-web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		out := c.kubectlOK("get", "hpa", "hpa-web")
		fields := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[1])
		header := strings.Fields(strings.Split(out, "\n")[0])
		if strings.Join(header, " ") != "NAME REFERENCE TARGETS MINPODS MAXPODS REPLICAS AGE" {
			return fmt.Errorf("header %v", header)
		}
		want := fmt.Sprintf("hpa-web Deployment/hpa-web cpu: %d%%/50%% 1 5 5", *h.Status.CurrentMetrics[0].Resource.Current.AverageUtilization)
		if got := strings.Join(fields[:7], " "); got != want {
			return fmt.Errorf("row %q, want %q", got, want)
		}
		return nil
	})
	ev, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=hpa-web,reason=SuccessfulRescale"})
	if err != nil || len(ev.Items) == 0 || !strings.HasSuffix(ev.Items[0].Message, "; reason: cpu resource utilization (percentage of request) above target") {
		t.Errorf("SuccessfulRescale events: %v %v", ev, err)
	}

	// With room to grow the computed count is reached: 8 pods at 50m each.
	c.kubectlOK("patch", "hpa", "hpa-web", "--type=merge", "-p", `{"spec":{"maxReplicas":10}}`)
	waitHPA("hpa-web", 8, 50,
		want{autoscalingv2.AbleToScale, corev1.ConditionTrue, "ReadyForNewScale", ""},
		want{autoscalingv2.ScalingActive, corev1.ConditionTrue, "ValidMetricFound", ""},
		want{autoscalingv2.ScalingLimited, corev1.ConditionFalse, "DesiredWithinRange", "the desired count is within the acceptable range"})

	// No metrics for the target's pods, and a custom metric nobody serves.
	for _, h := range []*autoscalingv2.HorizontalPodAutoscaler{
		{ObjectMeta: metav1.ObjectMeta{Name: "hpa-idle"}, Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "hpa-idle"},
			MaxReplicas:    3,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](50)}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "hpa-custom"}, Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "hpa-custom"},
			MaxReplicas:    3,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.PodsMetricSourceType, Pods: &autoscalingv2.PodsMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: "requests_per_second"},
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr.To(resource.MustParse("10"))}}}}}},
	} {
		if _, err := hpas.Create(ctx, h, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitHPA("hpa-idle", 0, 0,
		want{autoscalingv2.AbleToScale, corev1.ConditionTrue, "SucceededGetScale", "the HPA controller was able to get the target's current scale"},
		want{autoscalingv2.ScalingActive, corev1.ConditionFalse, "FailedGetResourceMetric", "no metrics returned from resource metrics API"})
	waitHPA("hpa-custom", 0, 0,
		want{autoscalingv2.AbleToScale, corev1.ConditionTrue, "SucceededGetScale", ""},
		want{autoscalingv2.ScalingActive, corev1.ConditionFalse, "FailedGetPodsMetric", "unable to get metric requests_per_second"})
	if serviceAccounts {
		// The controller asked for its own credentials (the client
		// builder made its ServiceAccount) and scaled with them.
		if _, err := cs.CoreV1().ServiceAccounts(ServiceAccountNamespace).Get(ctx, ControllerServiceAccount(HPAName), metav1.GetOptions{}); err != nil {
			t.Errorf("ServiceAccount %s/%s: %v", ServiceAccountNamespace, ControllerServiceAccount(HPAName), err)
		}
	}
	for _, name := range []string{"hpa-idle", "hpa-custom"} {
		if d, err := cs.AppsV1().Deployments("default").Get(ctx, name, metav1.GetOptions{}); err != nil || *d.Spec.Replicas != 1 {
			t.Errorf("%s was scaled without metrics: %v", name, err)
		}
	}
}
