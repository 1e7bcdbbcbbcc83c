package apiserver_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kptr "k8s.io/utils/ptr"
)

// BenchmarkValidatingWebhookWritePath measures what one validating webhook
// (a real HTTPS server in this process, allowing everything) adds to a
// ConfigMap create as the client sees it: on one server, creates in a
// namespace the webhook's namespaceSelector selects and in one it does not,
// interleaved one by one so the machine's load weighs on both alike.
//
//	go test -run '^$' -bench BenchmarkValidatingWebhookWritePath -benchtime 1x ./controlplane/apiserver/
func BenchmarkValidatingWebhookWritePath(b *testing.B) {
	ctx := context.Background()
	s := apiservertest.Start(b, apiservertest.Options{})
	cs := kubernetes.NewForConfigOrDie(s.Config)
	wh := startWebhookB(b)
	for _, ns := range []string{"hooked", "free"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "bench.waggle.test", ClientConfig: wh.clientConfig("/bench"), Rules: configMapRule,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "hooked"}},
			SideEffects:       kptr.To(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	testutil.Eventually(b, 45*time.Second, func() error {
		before := wh.calls.Load()
		if _, err := cs.CoreV1().ConfigMaps("hooked").Create(ctx, cm(fmt.Sprintf("warm-%d", time.Now().UnixNano()), nil), metav1.CreateOptions{}); err != nil {
			return err
		}
		if wh.calls.Load() == before {
			return fmt.Errorf("webhook not called yet")
		}
		return nil
	})
	const n = 1000
	create := func(ns string, i int) time.Duration {
		t0 := time.Now()
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm(fmt.Sprintf("c-%d", i), nil), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for it := 0; it < b.N; it++ {
		var hooked, free []time.Duration
		calls := wh.calls.Load()
		for j := 0; j < n; j++ {
			k := it*n + j
			hooked = append(hooked, create("hooked", k))
			free = append(free, create("free", k))
		}
		if got := wh.calls.Load() - calls; got != n {
			b.Fatalf("webhook called %d times for %d selected creates", got, n)
		}
		pct := func(d []time.Duration, p float64) time.Duration {
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			return d[int(float64(len(d)-1)*p)]
		}
		hp50, hp99, fp50, fp99 := pct(hooked, .5), pct(hooked, .99), pct(free, .5), pct(free, .99)
		b.Logf("ConfigMap create, %d each, interleaved, one client: with 1 validating webhook p50 %v p99 %v | no webhook called p50 %v p99 %v | ratio p50 %.2fx p99 %.2fx | %s",
			n, hp50, hp99, fp50, fp99, float64(hp50)/float64(fp50), float64(hp99)/float64(fp99), loadavg())
		fmt.Printf("BENCH_JSON {\"bench\":\"validating_webhook_write\",\"n\":%d,\"hooked_p50_ms\":%.3f,\"hooked_p99_ms\":%.3f,\"free_p50_ms\":%.3f,\"free_p99_ms\":%.3f}\n",
			n, msf(hp50), msf(hp99), msf(fp50), msf(fp99))
	}
}

// startWebhookB is startWebhook for benchmarks: it allows everything.
func startWebhookB(b *testing.B) *webhookServer {
	w := startWebhookTB(b, "webhook.default.svc")
	w.answer(func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{Allowed: true}
	})
	return w
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
