package apiserver_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// TestEphemeralContainersAndResize: pods/ephemeralcontainers only adds
// ephemeral containers and pods/resize only changes cpu and memory, each
// ignoring the rest of the body, refusing what upstream refuses with 422,
// and recording its own managedFields entry.
func TestEphemeralContainersAndResize(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	pods := cs.CoreV1().Pods("default")
	p := pod("debugged", map[string]string{"app": "x"})
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}}
	p, err := pods.Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Ephemeral containers: added (kubectl debug's path), the image change in
	// the same body ignored.
	p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "debugger", Image: "busybox:1.36", Command: []string{"sh"}}, TargetContainerName: "c"}}
	p.Spec.Containers[0].Image = "ignored:1"
	got, err := pods.UpdateEphemeralContainers(ctx, "debugged", p, metav1.UpdateOptions{FieldManager: "debugger"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.EphemeralContainers) != 1 || got.Spec.Containers[0].Image != "busybox:1.36" ||
		!strings.Contains(strings.Join(managers(got), ","), "debugger/Update/ephemeralcontainers") {
		t.Fatalf("after adding: %+v image %s managers %v", got.Spec.EphemeralContainers, got.Spec.Containers[0].Image, managers(got))
	}
	if sub, err := cs.CoreV1().RESTClient().Get().Namespace("default").Resource("pods").Name("debugged").SubResource("ephemeralcontainers").Do(ctx).Get(); err != nil ||
		len(sub.(*corev1.Pod).Spec.EphemeralContainers) != 1 {
		t.Fatalf("GET ephemeralcontainers: %v", err)
	}
	for name, c := range map[string]struct {
		patch, field string
	}{
		"removing":          {`{"spec":{"ephemeralContainers":[]}}`, "spec.ephemeralContainers"},
		"changing":          {`{"spec":{"ephemeralContainers":[{"name":"debugger","image":"busybox:2","targetContainerName":"c"}]}}`, "spec.ephemeralContainers[0]"},
		"a duplicate name":  {`{"spec":{"ephemeralContainers":[{"name":"debugger","image":"busybox:1.36","command":["sh"],"targetContainerName":"c"},{"name":"c","image":"x"}]}}`, "spec.ephemeralContainers[1].name"},
		"ports":             {`{"spec":{"ephemeralContainers":[{"name":"debugger","image":"busybox:1.36","command":["sh"],"targetContainerName":"c"},{"name":"p","image":"x","ports":[{"containerPort":80}]}]}}`, "spec.ephemeralContainers[1].ports"},
		"an unknown target": {`{"spec":{"ephemeralContainers":[{"name":"debugger","image":"busybox:1.36","command":["sh"],"targetContainerName":"c"},{"name":"t","image":"x","targetContainerName":"nope"}]}}`, "spec.ephemeralContainers[1].targetContainerName"},
	} {
		_, err := pods.Patch(ctx, "debugged", types.MergePatchType, []byte(c.patch), metav1.PatchOptions{}, "ephemeralcontainers")
		if !invalidAt(err, c.field) {
			t.Errorf("%s: want 422 at %s, got %v", name, c.field, err)
		}
	}
	// Through the main resource, ephemeral containers do not change.
	if _, err := pods.Patch(ctx, "debugged", types.StrategicMergePatchType, []byte(`{"spec":{"ephemeralContainers":[{"name":"sneaky","image":"x"}]}}`), metav1.PatchOptions{}); err == nil {
		if got, _ := pods.Get(ctx, "debugged", metav1.GetOptions{}); len(got.Spec.EphemeralContainers) != 1 {
			t.Errorf("the main resource added an ephemeral container: %+v", got.Spec.EphemeralContainers)
		}
	}

	// Resize: cpu and memory change; other resources, the QoS class and the
	// rest of the spec do not.
	got, err = pods.Patch(ctx, "debugged", types.StrategicMergePatchType,
		[]byte(`{"spec":{"containers":[{"name":"c","image":"ignored:2","resources":{"requests":{"cpu":"200m","memory":"128Mi"}}}]}}`),
		metav1.PatchOptions{FieldManager: "resizer"}, "resize")
	if err != nil {
		t.Fatal(err)
	}
	if q := got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]; q.String() != "200m" || got.Spec.Containers[0].Image != "busybox:1.36" ||
		!strings.Contains(strings.Join(managers(got), ","), "resizer/Update/resize") {
		t.Fatalf("after resize: cpu %s image %s managers %v", q.String(), got.Spec.Containers[0].Image, managers(got))
	}
	for name, c := range map[string]struct {
		patch, field string
	}{
		"another resource":   {`{"spec":{"containers":[{"name":"c","resources":{"requests":{"ephemeral-storage":"1Gi"}}}]}}`, "spec.containers[0].resources.requests[ephemeral-storage]"},
		"a QoS class change": {`{"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"200m","memory":"128Mi"}}}]}}`, "spec"},
	} {
		_, err := pods.Patch(ctx, "debugged", types.StrategicMergePatchType, []byte(c.patch), metav1.PatchOptions{}, "resize")
		if !invalidAt(err, c.field) {
			t.Errorf("resize with %s: want 422 at %s, got %v", name, c.field, err)
		}
	}
	if got, _ := pods.Get(ctx, "debugged", metav1.GetOptions{}); got.Spec.Containers[0].Resources.Requests.Cpu().String() != "200m" || len(got.Spec.Containers[0].Resources.Limits) != 0 {
		t.Errorf("a refused resize changed the pod: %+v", got.Spec.Containers[0].Resources)
	}
}

// TestAttachAndPortForwardReachTheKubelet: pods/attach and pods/portforward
// are routed to the pod's kubelet with the connection upgrade (SPDY, as
// kubectl up to 1.29 speaks, and WebSocket, as 1.30+ does) passed through.
func TestAttachAndPortForwardReachTheKubelet(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()
	var seen = make(chan string, 10)
	kubelet := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.URL.Path + "?" + r.URL.RawQuery
		if r.Header.Get("Upgrade") == "" {
			http.Error(w, "upgrade required", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", r.Header.Get("Upgrade"))
		brw.Flush()
		line, _ := brw.ReadString('\n')
		brw.WriteString("echo " + line)
		brw.Flush()
	}))
	kubelet.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	kubelet.StartTLS()
	defer kubelet.Close()
	_, portStr, _ := net.SplitHostPort(strings.TrimPrefix(kubelet.URL, "https://"))
	port, _ := strconv.Atoi(portStr)
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := pod("streamed", nil)
	p.Spec.NodeName = "node-b"
	if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := rest.TLSConfigFor(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.Config.Host, "https://")
	for _, c := range []struct{ path, upgrade, kubeletPath string }{
		{"/api/v1/namespaces/default/pods/streamed/portforward?ports=8080", "SPDY/3.1", "/portForward/default/streamed?ports=8080"},
		{"/api/v1/namespaces/default/pods/streamed/portforward?ports=8080", "websocket", "/portForward/default/streamed?ports=8080"},
		{"/api/v1/namespaces/default/pods/streamed/attach?container=c&stdout=true&stdin=true", "SPDY/3.1", "/attach/default/streamed/c"},
		{"/api/v1/namespaces/default/pods/streamed/attach?container=c&stdout=true", "websocket", "/attach/default/streamed/c"},
	} {
		conn, err := tls.Dial("tcp", host, tlsCfg)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n\r\n", c.path, host, c.upgrade)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			conn.Close()
			t.Fatalf("%s over %s: %v", c.path, c.upgrade, err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			b, _ := io.ReadAll(resp.Body)
			conn.Close()
			t.Fatalf("%s over %s: %d %s", c.path, c.upgrade, resp.StatusCode, b)
		}
		fmt.Fprintf(conn, "ping\n")
		line, err := br.ReadString('\n')
		conn.Close()
		if err != nil || line != "echo ping\n" {
			t.Fatalf("%s over %s: stream %q %v", c.path, c.upgrade, line, err)
		}
		if got := <-seen; !strings.HasPrefix(got, c.kubeletPath) {
			t.Errorf("%s: the kubelet was asked for %s, want %s", c.path, got, c.kubeletPath)
		}
	}
}
