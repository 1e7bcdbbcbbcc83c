package apiserver_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	kptr "k8s.io/utils/ptr"
)

// webhookServer is a real HTTPS admission webhook: it decodes each
// AdmissionReview v1 and answers with review(req).
type webhookServer struct {
	url    string
	ca     []byte
	port   int32
	calls  atomic.Int64
	review atomic.Pointer[func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse]
	srv    *http.Server
}

// startWebhook serves on 127.0.0.1 with a self-signed certificate valid for
// 127.0.0.1 and for the service name <svc>.<ns>.svc.
func startWebhook(t *testing.T, svcDNS string) *webhookServer { return startWebhookTB(t, svcDNS) }

func startWebhookTB(t testing.TB, svcDNS string) *webhookServer {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, []string{svcDNS})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	w := &webhookServer{ca: certPEM, port: int32(ln.Addr().(*net.TCPAddr).Port)}
	w.url = "https://" + ln.Addr().String()
	allow := func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	w.review.Store(&allow)
	w.srv = &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		var rev admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &rev); err != nil || rev.Request == nil {
			http.Error(rw, "bad review", http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/garbage" {
			_, _ = rw.Write([]byte("this is not a review"))
			return
		}
		resp := (*w.review.Load())(rev.Request)
		if resp == nil { // hang until the caller gives up
			<-r.Context().Done()
			return
		}
		resp.UID = rev.Request.UID
		rev.Response, rev.Request = resp, nil
		out, _ := json.Marshal(&rev)
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write(out)
	})}
	go func() { _ = w.srv.Serve(ln) }()
	t.Cleanup(func() { w.srv.Close() })
	return w
}

func (w *webhookServer) answer(f func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse) {
	w.review.Store(&f)
}

func (w *webhookServer) clientConfig(path string) admissionregistrationv1.WebhookClientConfig {
	u := w.url + path
	return admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: w.ca}
}

// configMapRule matches CREATE and UPDATE of configmaps.
var configMapRule = []admissionregistrationv1.RuleWithOperations{{
	Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
	Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
}}

func cm(name string, labels map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: map[string]string{"k": "v"}}
}

// waitForMarker creates marker objects until the webhook configuration in
// force answers them as want says (the configuration reaches the
// server's informers asynchronously, as upstream's).
func waitForMarker(t *testing.T, cs kubernetes.Interface, ns string, labels map[string]string, want func(error) bool) {
	t.Helper()
	i := 0
	testutil.Eventually(t, 45*time.Second, func() error {
		i++
		name := fmt.Sprintf("marker-%d-%d", time.Now().UnixNano(), i)
		_, err := cs.CoreV1().ConfigMaps(ns).Create(context.Background(), cm(name, labels), metav1.CreateOptions{})
		if err == nil {
			_ = cs.CoreV1().ConfigMaps(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		}
		if !want(err) {
			return fmt.Errorf("marker answered %v", err)
		}
		return nil
	})
}

func TestValidatingAndMutatingWebhooks(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	wh := startWebhook(t, "webhook.default.svc")
	wh.answer(func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		var obj corev1.ConfigMap
		_ = json.Unmarshal(r.Object.Raw, &obj)
		if obj.Data["deny"] != "" {
			return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Message: "no " + obj.Data["deny"] + " here", Code: http.StatusForbidden}}
		}
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{"validated by the test webhook"},
			AuditAnnotations: map[string]string{"checked": "yes"}}
	})
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"webhook": "on"}}
	_, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "deny"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "deny.waggle.test", ClientConfig: wh.clientConfig("/validate"), Rules: configMapRule,
			ObjectSelector: sel, SideEffects: kptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: kptr.To[int32](5),
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]string{"webhook": "on"}
	waitForMarker(t, cs, "default", on, func(err error) bool { return err == nil && wh.calls.Load() > 0 })

	// Denied: the webhook's code and message, nothing stored.
	bad := cm("bad", on)
	bad.Data["deny"] = "secrets"
	_, err = cs.CoreV1().ConfigMaps("default").Create(ctx, bad, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `admission webhook "deny.waggle.test" denied the request: no secrets here`) {
		t.Fatalf("denied create: %v", err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("denied object stored: %v", err)
	}
	// Not selected by objectSelector: the webhook is not called.
	before := wh.calls.Load()
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, func() *corev1.ConfigMap { c := cm("unselected", nil); c.Data["deny"] = "x"; return c }(), metav1.CreateOptions{}); err != nil {
		t.Errorf("unselected object: %v", err)
	}
	if wh.calls.Load() != before {
		t.Errorf("webhook called for an object its objectSelector excludes")
	}
	// Allowed with a warning, returned to the client.
	var warnings []string
	wcfg := rest.CopyConfig(s.Config)
	wcfg.WarningHandlerWithContext = warningCollector(func(m string) { warnings = append(warnings, m) })
	wcs := kubernetes.NewForConfigOrDie(wcfg)
	if _, err := wcs.CoreV1().ConfigMaps("default").Create(ctx, cm("good", on), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !contains(warnings, "validated by the test webhook") {
		t.Errorf("warnings = %q", warnings)
	}
	// Updates are checked too.
	cur, _ := cs.CoreV1().ConfigMaps("default").Get(ctx, "good", metav1.GetOptions{})
	cur.Data["deny"] = "updates"
	if _, err := cs.CoreV1().ConfigMaps("default").Update(ctx, cur, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("denied update: %v", err)
	}

	// Mutating webhook with a JSONPatch.
	wh.answer(func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		if strings.HasSuffix(r.Name, "") && r.Kind.Kind == "ConfigMap" && r.Operation == admissionv1.Create {
			pt := admissionv1.PatchTypeJSONPatch
			return &admissionv1.AdmissionResponse{Allowed: true, PatchType: &pt,
				Patch: []byte(`[{"op":"add","path":"/data/mutated","value":"yes"}]`)}
		}
		return &admissionv1.AdmissionResponse{Allowed: true}
	})
	_, err = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "mutate"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "mutate.waggle.test", ClientConfig: wh.clientConfig("/mutate"), Rules: configMapRule,
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"mutate": "on"}},
			SideEffects:    kptr.To(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mut := map[string]string{"mutate": "on"}
	testutil.Eventually(t, 45*time.Second, func() error {
		name := fmt.Sprintf("m-%d", time.Now().UnixNano())
		out, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm(name, mut), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if out.Data["mutated"] != "yes" {
			return fmt.Errorf("not mutated yet: %v", out.Data)
		}
		stored, err := cs.CoreV1().ConfigMaps("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil || stored.Data["mutated"] != "yes" {
			return fmt.Errorf("stored without the patch: %v %v", stored, err)
		}
		return nil
	})
}

func TestWebhookFailuresFollowFailurePolicy(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	wh := startWebhook(t, "webhook.default.svc")
	on := map[string]string{"webhook": "on"}
	mk := func(name, path string, fp admissionregistrationv1.FailurePolicyType, timeout int32, clientCfg *admissionregistrationv1.WebhookClientConfig) {
		t.Helper()
		cc := wh.clientConfig(path)
		if clientCfg != nil {
			cc = *clientCfg
		}
		_, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name: name + ".waggle.test", ClientConfig: cc, Rules: configMapRule, ObjectSelector: &metav1.LabelSelector{MatchLabels: on},
				FailurePolicy: &fp, SideEffects: kptr.To(admissionregistrationv1.SideEffectClassNone),
				AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: &timeout,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	del := func(name string) {
		if err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	notStored := func(name string) {
		t.Helper()
		if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s stored after a failed webhook: %v", name, err)
		}
	}

	// A webhook that never answers: with Fail, the request fails after
	// timeoutSeconds with upstream's message and nothing is stored.
	wh.answer(func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse { return nil })
	mk("slow", "/slow", admissionregistrationv1.Fail, 1, nil)
	waitForMarker(t, cs, "default", on, func(err error) bool { return err != nil })
	start := time.Now()
	_, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm("timed-out", on), metav1.CreateOptions{})
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("a 1 s webhook held the request %v", took)
	}
	if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), `failed calling webhook "slow.waggle.test"`) || !strings.Contains(err.Error(), "context deadline exceeded") {
		t.Errorf("timed-out webhook: %v", err)
	}
	notStored("timed-out")
	del("slow")

	// Down (nothing listens) with Fail: 500, nothing stored.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	downURL := "https://" + ln.Addr().String() + "/down"
	ln.Close()
	down := admissionregistrationv1.WebhookClientConfig{URL: &downURL, CABundle: wh.ca}
	mk("down", "", admissionregistrationv1.Fail, 5, &down)
	waitForMarker(t, cs, "default", on, func(err error) bool {
		return err != nil && strings.Contains(err.Error(), `failed calling webhook "down.waggle.test"`)
	})
	_, err = cs.CoreV1().ConfigMaps("default").Create(ctx, cm("down-fail", on), metav1.CreateOptions{})
	if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("down webhook, Fail: %v", err)
	}
	notStored("down-fail")
	del("down")

	// Down with Ignore: the write goes through.
	mk("down-ignore", "", admissionregistrationv1.Ignore, 5, &down)
	wh.answer(func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Message: "marker"}}
	})
	mk("marker", "/marker", admissionregistrationv1.Fail, 5, nil)
	waitForMarker(t, cs, "default", on, func(err error) bool { return err != nil && strings.Contains(err.Error(), "marker") })
	del("marker")
	waitForMarker(t, cs, "default", on, func(err error) bool { return err == nil })
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm("down-ignore", on), metav1.CreateOptions{}); err != nil {
		t.Errorf("down webhook, Ignore: %v", err)
	}
	del("down-ignore")

	// Garbage answers with Fail: 500, nothing stored.
	mk("garbage", "/garbage", admissionregistrationv1.Fail, 5, nil)
	waitForMarker(t, cs, "default", on, func(err error) bool { return err != nil })
	_, err = cs.CoreV1().ConfigMaps("default").Create(ctx, cm("garbage", on), metav1.CreateOptions{})
	if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), `failed calling webhook "garbage.waggle.test"`) {
		t.Errorf("garbage answer: %v", err)
	}
	notStored("garbage")
	del("garbage")

	// dryRun: a webhook declaring NoneOnDryRun is called with dryRun set,
	// and nothing is stored.
	var sawDry atomic.Bool
	wh.answer(func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		if r.DryRun != nil && *r.DryRun {
			sawDry.Store(true)
		}
		return &admissionv1.AdmissionResponse{Allowed: true}
	})
	_, err = cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "dry-run"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "dry-run.waggle.test", ClientConfig: wh.clientConfig("/dry"), Rules: configMapRule,
			ObjectSelector: &metav1.LabelSelector{MatchLabels: on},
			SideEffects:    kptr.To(admissionregistrationv1.SideEffectClassNoneOnDryRun), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 45*time.Second, func() error {
		if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm("dry", on), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			return err
		}
		if !sawDry.Load() {
			return fmt.Errorf("webhook not yet called with dryRun")
		}
		return nil
	})
	notStored("dry")
}

// TestWebhookThroughService: a service reference is resolved to the
// Service's endpoints and checked against caBundle for
// <service>.<namespace>.svc, as upstream.
func TestWebhookThroughService(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	wh := startWebhook(t, "hook.default.svc")
	wh.answer(func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Message: "denied through the service " + r.Namespace}}
	})
	_, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hook"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstrFrom(int(wh.port))}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "hook-1", Labels: map[string]string{discoveryv1.LabelServiceName: "hook"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: kptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: kptr.To("https"), Port: kptr.To(wh.port)}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "guarded", Labels: map[string]string{"guard": "on"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "svc"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "svc.waggle.test",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: wh.ca,
				Service: &admissionregistrationv1.ServiceReference{Namespace: "default", Name: "hook", Path: kptr.To("/svc"), Port: kptr.To[int32](443)}},
			Rules:             configMapRule,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"guard": "on"}},
			SideEffects:       kptr.To(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitForMarker(t, cs, "guarded", nil, func(err error) bool {
		return apierrors.IsForbidden(err) || strings.Contains(fmt.Sprint(err), "denied through the service guarded")
	})
	_, err = cs.CoreV1().ConfigMaps("guarded").Create(ctx, cm("x", nil), metav1.CreateOptions{})
	if !strings.Contains(fmt.Sprint(err), `admission webhook "svc.waggle.test" denied the request: denied through the service guarded`) {
		t.Errorf("through the service: %v", err)
	}
	// Namespaces the namespaceSelector leaves out are not checked.
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm("free", nil), metav1.CreateOptions{}); err != nil {
		t.Errorf("unselected namespace: %v", err)
	}
}

func intstrFrom(p int) intstr.IntOrString { return intstr.FromInt32(int32(p)) }

// warningCollector hands each Warning header's text to f.
type warningCollector func(string)

func (f warningCollector) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	f(text)
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestWebhookMatchPolicyEquivalent: a rule on autoscaling/v1 catches an
// autoscaling/v2 write, converted to v1 for the webhook, as upstream's
// default matchPolicy Equivalent.
func TestWebhookMatchPolicyEquivalent(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	wh := startWebhook(t, "webhook.default.svc")
	type seen struct{ kind, requestKind, apiVersion string }
	got := make(chan seen, 100)
	wh.answer(func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		var tm metav1.TypeMeta
		_ = json.Unmarshal(r.Object.Raw, &tm)
		rk := ""
		if r.RequestKind != nil {
			rk = r.RequestKind.Group + "/" + r.RequestKind.Version
		}
		got <- seen{r.Kind.Group + "/" + r.Kind.Version, rk, tm.APIVersion}
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Message: "seen"}}
	})
	_, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "hpa-v1"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "hpa-v1.waggle.test", ClientConfig: wh.clientConfig("/hpa"),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"autoscaling"}, APIVersions: []string{"v1"}, Resources: []string{"horizontalpodautoscalers"}},
			}},
			SideEffects: kptr.To(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "h"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{MaxReplicas: 3,
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "d"}},
	}
	testutil.Eventually(t, 45*time.Second, func() error {
		_, err := cs.AutoscalingV2().HorizontalPodAutoscalers("default").Create(ctx, hpa, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), "seen") {
			return fmt.Errorf("v2 create: %v", err)
		}
		return nil
	})
	sn := <-got
	if sn.kind != "autoscaling/v1" || sn.requestKind != "autoscaling/v2" || sn.apiVersion != "autoscaling/v1" {
		t.Errorf("webhook saw kind %s, requestKind %s, object %s; want autoscaling/v1, autoscaling/v2, autoscaling/v1", sn.kind, sn.requestKind, sn.apiVersion)
	}
}

// TestWebhookOnConnect: a CONNECT to pods/attach is admitted with the
// PodAttachOptions, as upstream, and a denial stops it before the kubelet.
func TestWebhookOnConnect(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	wh := startWebhook(t, "webhook.default.svc")
	wh.answer(func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		var opts corev1.PodAttachOptions
		_ = json.Unmarshal(r.Object.Raw, &opts)
		if r.Operation == admissionv1.Connect && r.SubResource == "attach" && opts.Kind == "PodAttachOptions" && opts.Container == "container1" {
			return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Message: "attaching to pod '" + r.Name + "' is not allowed"}}
		}
		return &admissionv1.AdmissionResponse{Allowed: true}
	})
	_, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "attach"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "attach.waggle.test", ClientConfig: wh.clientConfig("/attach"),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Connect},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods/attach"}},
			}},
			SideEffects: kptr.To(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 45*time.Second, func() error {
		err := cs.CoreV1().RESTClient().Post().Namespace("default").Resource("pods").Name("to-be-attached-pod").SubResource("attach").
			Param("container", "container1").Param("stdin", "true").Do(ctx).Error()
		if err == nil || !strings.Contains(err.Error(), `admission webhook "attach.waggle.test" denied the request: attaching to pod 'to-be-attached-pod' is not allowed`) {
			return fmt.Errorf("attach: %v", err)
		}
		return nil
	})
}

// TestMutatingWebhookOnCustomResource: a webhook's patch to a custom
// resource is pruned by the CRD's schema and defaulted, as upstream's CRD
// handler does: the known field it adds is kept, the unknown one dropped.
func TestMutatingWebhookOnCustomResource(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	ac, dc := crdClients(t, s.Config)
	c, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, widgetCRD("example.waggle.io"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, ac, c.Name)
	wh := startWebhook(t, "webhook.default.svc")
	wh.answer(func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		pt := admissionv1.PatchTypeJSONPatch
		return &admissionv1.AdmissionResponse{Allowed: true, PatchType: &pt,
			Patch: []byte(`[{"op":"add","path":"/spec/color","value":"blue"},{"op":"add","path":"/spec/unknownByTheSchema","value":"x"}]`)}
	})
	_, err = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "widgets.waggle.test", ClientConfig: wh.clientConfig("/widgets"),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"example.waggle.io"}, APIVersions: []string{"v1"}, Resources: []string{"widgets"}},
			}},
			SideEffects: kptr.To(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "example.waggle.io", Version: "v1", Resource: "widgets"}
	i := 0
	testutil.Eventually(t, 45*time.Second, func() error {
		i++
		name := fmt.Sprintf("w-%d", i)
		// The create's answer, as the conformance spec checks it (a read
		// back from storage is pruned anyway).
		got, err := dc.Resource(gvr).Namespace("default").Create(ctx, widget(name, map[string]any{"replicas": int64(1)}), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		spec, _ := got.Object["spec"].(map[string]any)
		if spec["color"] != "blue" {
			return fmt.Errorf("not mutated yet: %v", spec)
		}
		if _, ok := spec["unknownByTheSchema"]; ok {
			return fmt.Errorf("webhook's unknown field stored: %v", spec)
		}
		if spec["maxReplicas"] == nil {
			return fmt.Errorf("not defaulted: %v", spec)
		}
		return nil
	})
}
