package apiserver_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

// TestMetricsAPIServedNatively: with --metrics-api=native the server
// scrapes each node's kubelet /metrics/resource and serves
// metrics.k8s.io/v1beta1 NodeMetrics and PodMetrics (discovered, listed by
// label, read by anyone with view through the aggregated reader role), with
// CPU as the rate between two scrapes, as metrics-server.
func TestMetricsAPIServedNatively(t *testing.T) {
	start := time.Now()
	kl := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics/resource" || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "want /metrics/resource with a client cert", http.StatusUnauthorized)
			return
		}
		now := time.Now()
		el := now.Sub(start).Seconds()
		ts := now.UnixMilli()
		// Two cores busy on the node, half a core in the pod's container.
		fmt.Fprintf(w, "node_cpu_usage_seconds_total %g %d\nnode_memory_working_set_bytes 1073741824 %d\n", 2*el, ts, ts)
		fmt.Fprintf(w, "container_cpu_usage_seconds_total{container=\"c\",namespace=\"default\",pod=\"web\"} %g %d\n", el/2, ts)
		fmt.Fprintf(w, "container_memory_working_set_bytes{container=\"c\",namespace=\"default\",pod=\"web\"} 8388608 %d\n", ts)
		fmt.Fprintf(w, "container_start_time_seconds{container=\"c\",namespace=\"default\",pod=\"web\"} %d %d\n", start.Unix(), ts)
	}))
	kl.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	kl.StartTLS()
	t.Cleanup(kl.Close)
	s := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) {
		c.MetricsAPI, c.MetricsResolution = "native", 200*time.Millisecond
	}})
	cs := kubernetes.NewForConfigOrDie(s.Config)
	mc := metricsclient.NewForConfigOrDie(s.Config)
	ctx := context.Background()

	host, port, _ := net.SplitHostPort(kl.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "a"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(p)
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "img"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	groups, err := cs.Discovery().ServerGroups()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range groups.Groups {
		found = found || (g.Name == "metrics.k8s.io" && g.PreferredVersion.Version == "v1beta1")
	}
	if !found {
		t.Fatal("metrics.k8s.io/v1beta1 is not discovered")
	}

	testutil.Eventually(t, 30*time.Second, func() error {
		l, err := mc.MetricsV1beta1().NodeMetricses().List(ctx, metav1.ListOptions{LabelSelector: "pool=a"})
		if err != nil {
			return err
		}
		if len(l.Items) != 1 {
			return fmt.Errorf("%d node metrics", len(l.Items))
		}
		cpu := l.Items[0].Usage[corev1.ResourceCPU]
		if cpu.MilliValue() < 1500 || cpu.MilliValue() > 2500 {
			return fmt.Errorf("node CPU %s, want about 2", cpu.String())
		}
		return nil
	})
	testutil.Eventually(t, 30*time.Second, func() error {
		m, err := mc.MetricsV1beta1().PodMetricses("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cpu, mem := m.Containers[0].Usage[corev1.ResourceCPU], m.Containers[0].Usage[corev1.ResourceMemory]
		if cpu.MilliValue() < 300 || cpu.MilliValue() > 700 || mem.Value() != 8<<20 {
			return fmt.Errorf("pod usage cpu %s memory %s", cpu.String(), mem.String())
		}
		return nil
	})
	if l, err := mc.MetricsV1beta1().PodMetricses("default").List(ctx, metav1.ListOptions{LabelSelector: "app=other"}); err != nil || len(l.Items) != 0 {
		t.Errorf("selector app=other: %v %v", l, err)
	}
	if _, err := mc.MetricsV1beta1().PodMetricses("default").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"}); !apierrors.IsBadRequest(err) {
		t.Errorf("unsupported field selector: %v, want 400", err)
	}
	if _, err := mc.MetricsV1beta1().PodMetricses("default").Get(ctx, "nope", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("missing pod: %v, want 404", err)
	}

	// The reader role aggregates into view, edit and admin (the
	// controller-manager's aggregation fills them); bound alone, it lets a
	// user read pod metrics; a user with nothing gets 403.
	reader, err := cs.RbacV1().ClusterRoles().Get(ctx, "system:aggregated-metrics-reader", metav1.GetOptions{})
	if err != nil || reader.Labels["rbac.authorization.k8s.io/aggregate-to-view"] != "true" {
		t.Fatalf("reader role: %v %v", reader, err)
	}
	if _, err := cs.RbacV1().RoleBindings("default").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "viewer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:aggregated-metrics-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "viewer"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	viewer := metricsclient.NewForConfigOrDie(s.UserConfig(t, "viewer"))
	testutil.Eventually(t, 30*time.Second, func() error {
		_, err := viewer.MetricsV1beta1().PodMetricses("default").List(ctx, metav1.ListOptions{})
		return err
	})
	nobody := metricsclient.NewForConfigOrDie(s.UserConfig(t, "nobody"))
	if _, err := nobody.MetricsV1beta1().PodMetricses("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a user without roles: %v, want 403", err)
	}
}
