package apiserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	kptr "k8s.io/utils/ptr"
)

// aggGet is a GET through the admin's HTTPS client, returning the code and
// body as they are.
func aggGet(t *testing.T, cfg *rest.Config, path string) (int, string) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(cfg.Host + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func availableCondition(s *apiregistrationv1.APIService) *apiregistrationv1.APIServiceCondition {
	for i := range s.Status.Conditions {
		if s.Status.Conditions[i].Type == apiregistrationv1.Available {
			return &s.Status.Conditions[i]
		}
	}
	return nil
}

func waitCondition(t *testing.T, ac aggregatorclient.Interface, name string, status apiregistrationv1.ConditionStatus, reason, msg string) {
	t.Helper()
	testutil.Eventually(t, 45*time.Second, func() error {
		s, err := ac.ApiregistrationV1().APIServices().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c := availableCondition(s)
		if c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
			return fmt.Errorf("%s Available = %+v", name, c)
		}
		return nil
	})
}

func TestLocalAPIServicesAndExtensionAuthentication(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	ac := aggregatorclient.NewForConfigOrDie(s.Config)
	for _, name := range []string{"v1.", "v1.apps", "v2.autoscaling", "v1.apiregistration.k8s.io", "v1.admissionregistration.k8s.io"} {
		waitCondition(t, ac, name, apiregistrationv1.ConditionTrue, "Local", "Local APIServices are always available")
	}
	apps, err := ac.ApiregistrationV1().APIServices().Get(ctx, "v1.apps", metav1.GetOptions{})
	if err != nil || apps.Spec.GroupPriorityMinimum != 17800 || apps.Spec.VersionPriority != 15 || apps.Spec.Service != nil {
		t.Errorf("v1.apps = %+v %v", apps, err)
	}
	cm, err := cs.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"requestheader-allowed-names": `["front-proxy-client"]`, "requestheader-username-headers": `["X-Remote-User"]`,
		"requestheader-group-headers": `["X-Remote-Group"]`, "requestheader-extra-headers-prefix": `["X-Remote-Extra-"]`,
	} {
		if cm.Data[k] != want {
			t.Errorf("%s = %q, want %q", k, cm.Data[k], want)
		}
	}
	if !strings.Contains(cm.Data["requestheader-client-ca-file"], "BEGIN CERTIFICATE") || !strings.Contains(cm.Data["client-ca-file"], "BEGIN CERTIFICATE") ||
		cm.Data["requestheader-client-ca-file"] == cm.Data["client-ca-file"] {
		t.Errorf("CAs: the front-proxy CA must be its own: %v", cm.Data)
	}
}

// TestAPIServicePointingNowhere: Available=False with upstream's reason,
// and requests for its group version are 503s.
func TestAPIServicePointingNowhere(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	ac := aggregatorclient.NewForConfigOrDie(s.Config)
	_, err := ac.ApiregistrationV1().APIServices().Create(ctx, &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: "v1alpha1.nowhere.waggle.test"},
		Spec: apiregistrationv1.APIServiceSpec{Group: "nowhere.waggle.test", Version: "v1alpha1", InsecureSkipTLSVerify: true,
			GroupPriorityMinimum: 1000, VersionPriority: 15,
			Service: &apiregistrationv1.ServiceReference{Namespace: "default", Name: "missing", Port: kptr.To[int32](443)}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ac, "v1alpha1.nowhere.waggle.test", apiregistrationv1.ConditionFalse, "ServiceNotFound", `service/missing in "default" is not present`)
	if code, body := aggGet(t, s.Config, "/apis/nowhere.waggle.test/v1alpha1/things"); code != http.StatusServiceUnavailable || body != "service unavailable\n" {
		t.Errorf("request for an unavailable APIService: %d %q", code, body)
	}
	// A bad APIService is refused with upstream's validation.
	_, err = ac.ApiregistrationV1().APIServices().Create(ctx, &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: "wrong-name"},
		Spec:       apiregistrationv1.APIServiceSpec{Group: "x.waggle.test", Version: "v1", GroupPriorityMinimum: 1, VersionPriority: 1},
	}, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `must be `+"`"+`spec.version+"."+spec.group`+"`"+`: "v1.x.waggle.test"`) {
		t.Errorf("misnamed APIService: %v", err)
	}
}

// extensionServer is a real HTTPS extension API server: it trusts the
// front proxy only with a client certificate from the requestheader CA,
// and answers with who it was told the user is.
func startExtensionServer(t *testing.T, frontProxyCA []byte, svcDNS string) (port int32, ca []byte) {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(svcDNS, nil, []string{svcDNS})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(frontProxyCA)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/apis/wardle.example.com/v1alpha1", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(&metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: "wardle.example.com/v1alpha1",
			APIResources: []metav1.APIResource{{Name: "flunders", SingularName: "flunder", Namespaced: true, Kind: "Flunder", Verbs: []string{"get", "list"}}}})
	})
	mux.HandleFunc("/apis/wardle.example.com/v1alpha1/namespaces/default/flunders", func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != "front-proxy-client" {
			http.Error(w, "not the front proxy", http.StatusUnauthorized)
			return
		}
		if r.Header.Get("Authorization") != "" {
			http.Error(w, "credentials leaked to the extension server", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"kind":"FlunderList","apiVersion":"wardle.example.com/v1alpha1","metadata":{},"items":[],"user":%q,"groups":%q}`,
			r.Header.Get("X-Remote-User"), strings.Join(r.Header.Values("X-Remote-Group"), ","))
	})
	mux.HandleFunc("/openapi/v3/apis/wardle.example.com/v1alpha1", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"openapi":"3.0.0","info":{"title":"wardle","version":"v1alpha1"},"paths":{}}`))
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return int32(ln.Addr().(*net.TCPAddr).Port), certPEM
}

// TestAPIServiceProxiesToAnExtensionServer: a remote APIService becomes
// Available once its Service answers discovery, requests are proxied with
// the front-proxy certificate and X-Remote-* headers, and its group joins
// discovery and the OpenAPI v3 index.
func TestAPIServiceProxiesToAnExtensionServer(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	ac := aggregatorclient.NewForConfigOrDie(s.Config)
	auth, err := cs.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port, ca := startExtensionServer(t, []byte(auth.Data["requestheader-client-ca-file"]), "wardle.default.svc")
	if _, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "wardle"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(port)}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "wardle-1", Labels: map[string]string{discoveryv1.LabelServiceName: "wardle"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: kptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: kptr.To("https"), Port: kptr.To(port)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.ApiregistrationV1().APIServices().Create(ctx, &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: "v1alpha1.wardle.example.com"},
		Spec: apiregistrationv1.APIServiceSpec{Group: "wardle.example.com", Version: "v1alpha1", CABundle: ca,
			GroupPriorityMinimum: 2000, VersionPriority: 200,
			Service: &apiregistrationv1.ServiceReference{Namespace: "default", Name: "wardle", Port: kptr.To[int32](443)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ac, "v1alpha1.wardle.example.com", apiregistrationv1.ConditionTrue, "Passed", "all checks passed")

	// The proxy reads the APIService's Available condition and the
	// Service's endpoints from its own caches, which may trail the status
	// just read by a moment: until then it answers 503, as kube-aggregator.
	var body []byte
	testutil.Eventually(t, 30*time.Second, func() error {
		var err error
		if body, err = cs.CoreV1().RESTClient().Get().AbsPath("/apis/wardle.example.com/v1alpha1/namespaces/default/flunders").DoRaw(ctx); err != nil {
			return fmt.Errorf("proxied request: %v %s", err, body)
		}
		return nil
	})
	var got struct{ User, Groups string }
	_ = json.Unmarshal(body, &got)
	if got.User != "admin" || !strings.Contains(got.Groups, "system:masters") || !strings.Contains(got.Groups, "system:authenticated") {
		t.Errorf("extension server saw user %q groups %q (%s)", got.User, got.Groups, body)
	}
	// Discovery, aggregated (client-go's default) and legacy.
	_, lists, err := cs.Discovery().ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range lists {
		for _, r := range l.APIResources {
			if l.GroupVersion == "wardle.example.com/v1alpha1" && r.Name == "flunders" && r.Namespaced {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("flunders not in discovery")
	}
	legacy, err := cs.CoreV1().RESTClient().Get().AbsPath("/apis").SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil || !strings.Contains(string(legacy), `"name":"wardle.example.com"`) {
		t.Errorf("legacy /apis: %v %s", err, legacy)
	}
	group, err := cs.CoreV1().RESTClient().Get().AbsPath("/apis/wardle.example.com").DoRaw(ctx)
	if err != nil || !strings.Contains(string(group), `"preferredVersion":{"groupVersion":"wardle.example.com/v1alpha1"`) {
		t.Errorf("/apis/wardle.example.com: %v %s", err, group)
	}
	idx, err := cs.CoreV1().RESTClient().Get().AbsPath("/openapi/v3").DoRaw(ctx)
	if err != nil || !strings.Contains(string(idx), `"apis/wardle.example.com/v1alpha1"`) {
		t.Errorf("/openapi/v3: %v %s", err, idx)
	}
	doc, err := cs.CoreV1().RESTClient().Get().AbsPath("/openapi/v3/apis/wardle.example.com/v1alpha1").DoRaw(ctx)
	if err != nil || !strings.Contains(string(doc), `"title":"wardle"`) {
		t.Errorf("proxied OpenAPI: %v %s", err, doc)
	}

	// The Service losing its endpoints: Available=False, then 503s.
	if err := cs.DiscoveryV1().EndpointSlices("default").Delete(ctx, "wardle-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ac, "v1alpha1.wardle.example.com", apiregistrationv1.ConditionFalse, "EndpointsNotFound", `cannot find endpointslices for service/wardle in "default"`)
	if code, _ := aggGet(t, s.Config, "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders"); code != http.StatusServiceUnavailable {
		t.Errorf("after the endpoints went: %d", code)
	}
}

// TestCRDGroupVersionsGetLocalAPIServices: as kube-apiserver's
// crdregistration controller, a CRD's served versions get local
// APIServices (priority 1000/100), removed with the CRD.
func TestCRDGroupVersionsGetLocalAPIServices(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	ac := aggregatorclient.NewForConfigOrDie(s.Config)
	xc, _ := crdClients(t, s.Config)
	c, err := xc.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, widgetCRD("apisvc.waggle.io"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, xc, c.Name)
	waitCondition(t, ac, "v1.apisvc.waggle.io", apiregistrationv1.ConditionTrue, "Local", "Local APIServices are always available")
	got, err := ac.ApiregistrationV1().APIServices().Get(ctx, "v1.apisvc.waggle.io", metav1.GetOptions{})
	if err != nil || got.Spec.Service != nil || got.Spec.GroupPriorityMinimum != 1000 || got.Spec.VersionPriority != 100 {
		t.Fatalf("CRD APIService = %+v %v", got, err)
	}
	if err := xc.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 45*time.Second, func() error {
		_, err := ac.ApiregistrationV1().APIServices().Get(ctx, "v1.apisvc.waggle.io", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("APIService of a deleted CRD: %v", err)
		}
		return nil
	})
}
