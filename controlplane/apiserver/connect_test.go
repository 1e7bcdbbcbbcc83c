package apiserver_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLogsAndProxiesReachTheNode checks the connect subresources end to end
// over real HTTPS: pods/log reaches the kubelet API of the pod's node (here
// an HTTPS endpoint recording what it is asked), with the apiserver's client
// certificate and without the user's credentials; pods/proxy reaches the pod
// IP; nodes/proxy reaches the kubelet.
func TestLogsAndProxiesReachTheNode(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	var got []string
	kubelet := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			t.Errorf("user credentials leaked to the kubelet")
		}
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			t.Errorf("no client certificate presented to the kubelet")
		}
		got = append(got, r.URL.Path+"?"+r.URL.RawQuery)
		io.WriteString(w, "hello from "+r.URL.Path)
	}))
	kubelet.TLS = &tlsConfigRequestingClientCert
	kubelet.StartTLS()
	defer kubelet.Close()
	_, portStr, _ := net.SplitHostPort(strings.TrimPrefix(kubelet.URL, "https://"))
	port, _ := strconv.Atoi(portStr)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	node, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := pod("logged", nil)
	p.Spec.NodeName = "node-a"
	if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tail := int64(5)
	b, err := cs.CoreV1().Pods("default").GetLogs("logged", &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if string(b) != "hello from /containerLogs/default/logged/c" || len(got) != 1 || !strings.Contains(got[0], "tailLines=5") {
		t.Fatalf("log: %q, kubelet saw %v", b, got)
	}
	b, err = cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/node-a/proxy/stats/summary").DoRaw(ctx)
	if err != nil || string(b) != "hello from /stats/summary" {
		t.Fatalf("node proxy: %q %v", b, err)
	}

	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app "+r.URL.Path) }))
	defer app.Close()
	_, appPort, _ := net.SplitHostPort(strings.TrimPrefix(app.URL, "http://"))
	pp, _ := cs.CoreV1().Pods("default").Get(ctx, "logged", metav1.GetOptions{})
	pp.Status.PodIP = "127.0.0.1"
	if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, pp, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err = cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/default/pods/logged:" + appPort + "/proxy/index.html").DoRaw(ctx)
	if err != nil || string(b) != "app /index.html" {
		t.Fatalf("pod proxy: %q %v", b, err)
	}
	// services/<name>:<port>/proxy reaches a ready endpoint of the Service.
	ap, _ := strconv.Atoi(appPort)
	if _, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "web", Port: 8080}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	port32, name, ready := int32(ap), "web", true
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "app-1", Labels: map[string]string{discoveryv1.LabelServiceName: "app"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port32}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err = cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/default/services/app:web/proxy/hello").DoRaw(ctx)
	if err != nil || string(b) != "app /hello" {
		t.Fatalf("service proxy: %q %v", b, err)
	}
	// The legacy paths older guides document answer as the current ones.
	for path, want := range map[string]string{
		"/api/v1/proxy/nodes/node-a/stats/summary":                         "hello from /stats/summary",
		"/api/v1/proxy/namespaces/default/services/app:web/hello":          "app /hello",
		"/api/v1/proxy/namespaces/default/pods/logged:" + appPort + "/a/b": "app /a/b",
	} {
		if b, err := cs.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(ctx); err != nil || string(b) != want {
			t.Errorf("legacy %s: %q %v, want %q", path, b, err, want)
		}
	}
	// nodes/<name>:<kubelet port>/proxy is the kubelet too (the conformance
	// suite asks so); another port of the node is reached over plain http,
	// without the kubelet client certificate.
	before := len(got)
	if b, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/node-a:" + portStr + "/proxy/pods").DoRaw(ctx); err != nil || string(b) != "hello from /pods" || len(got) != before+1 {
		t.Fatalf("node proxy with the kubelet port: %q %v", b, err)
	}
	if b, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/https:node-a:" + portStr + "/proxy/pods").DoRaw(ctx); err != nil || string(b) != "hello from /pods" {
		t.Fatalf("node proxy with scheme and the kubelet port: %q %v", b, err)
	}
	if b, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/node-a:" + appPort + "/proxy/x").DoRaw(ctx); err != nil || string(b) != "app /x" {
		t.Fatalf("node proxy to another port: %q %v", b, err)
	}
	if b, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/ftp:node-a:1/proxy/x").DoRaw(ctx); !apierrors.IsBadRequest(err) {
		t.Fatalf("node proxy with a bad scheme: %v %s, want 400", err, b)
	}
	// A port that does not speak HTTP: 503 that says so.
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	go func() {
		for {
			c, err := raw.Accept()
			if err != nil {
				return
			}
			// Greets as an SSH server does and keeps the connection
			// until the client hangs up, so the proxy reads the greeting.
			go func() {
				defer c.Close()
				io.WriteString(c, "SSH-2.0-OpenSSH_9.2\r\n")
				io.Copy(io.Discard, c)
			}()
		}
	}()
	_, rawPort, _ := net.SplitHostPort(raw.Addr().String())
	b, err = cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/default/pods/logged:" + rawPort + "/proxy/").DoRaw(ctx)
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(string(b), "did not answer HTTP") || !strings.Contains(string(b), "error trying to reach pod") {
		t.Fatalf("pod proxy to a non-HTTP port: %v %s", err, b)
	}
	// A pod that is not scheduled has no logs to reach: 400.
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod("pending", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := cs.CoreV1().Pods("default").GetLogs("pending", &corev1.PodLogOptions{}).DoRaw(ctx); !apierrors.IsBadRequest(err) || !strings.Contains(string(b), "not scheduled") {
		t.Fatalf("log of an unscheduled pod: %v %s", err, b)
	}
}

var tlsConfigRequestingClientCert = tls.Config{ClientAuth: tls.RequestClientCert}
