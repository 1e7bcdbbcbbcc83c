package apiserver_test

import (
	"context"
	"encoding/json"
	"io"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
)

func newClient(t *testing.T) (*kubernetes.Clientset, *apiservertest.Server) {
	t.Helper()
	testutil.Privileged(t)
	s := apiservertest.Start(t, apiservertest.Options{})
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs, s
}

func pod(name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1.36"}}},
	}
}

func TestPodCreateGetUpdateDeleteRoundTrip(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	p, err := cs.CoreV1().Pods("default").Create(ctx, pod("a", map[string]string{"app": "x"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.UID == "" || p.CreationTimestamp.IsZero() || p.ResourceVersion == "" {
		t.Fatalf("server fields not set: %+v", p.ObjectMeta)
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyAlways || p.Spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent ||
		*p.Spec.TerminationGracePeriodSeconds != 30 || p.Status.Phase != corev1.PodPending {
		t.Fatalf("defaults not applied: %+v", p.Spec)
	}
	if len(p.Spec.Tolerations) != 2 {
		t.Fatalf("DefaultTolerationSeconds: tolerations = %+v", p.Spec.Tolerations)
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod("a", nil), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create: want AlreadyExists, got %v", err)
	}
	got, err := cs.CoreV1().Pods("default").Get(ctx, "a", metav1.GetOptions{})
	if err != nil || got.UID != p.UID {
		t.Fatalf("get: %v %v", got, err)
	}
	got.Labels["app"] = "y"
	upd, err := cs.CoreV1().Pods("default").Update(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if upd.ResourceVersion == got.ResourceVersion {
		t.Fatal("resourceVersion did not change on update")
	}
	// A stale resourceVersion is a conflict and changes nothing.
	got.Labels["app"] = "z"
	if _, err := cs.CoreV1().Pods("default").Update(ctx, got, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("stale update: want Conflict, got %v", err)
	}
	now, _ := cs.CoreV1().Pods("default").Get(ctx, "a", metav1.GetOptions{})
	if now.Labels["app"] != "y" {
		t.Fatalf("stale update was written: %v", now.Labels)
	}
	if err := cs.CoreV1().Pods("default").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("default").Get(ctx, "a", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after delete: want NotFound, got %v", err)
	}
}

func TestWatchSeesAddedModifiedDeletedAndSelectorMoves(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	pods := cs.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, pod("w1", map[string]string{"app": "x"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: "app=x"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	next := func() watch.Event {
		t.Helper()
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch closed")
			}
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("no event")
		}
		return watch.Event{}
	}
	if e := next(); e.Type != watch.Added || e.Object.(*corev1.Pod).Name != "w1" {
		t.Fatalf("initial: %v", e)
	}
	p, _ := pods.Get(ctx, "w1", metav1.GetOptions{})
	p.Labels["app"] = "other"
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Type != watch.Deleted {
		t.Fatalf("label moved out: want DELETED, got %v", e.Type)
	}
	p, _ = pods.Get(ctx, "w1", metav1.GetOptions{})
	p.Labels["app"] = "x"
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Type != watch.Added {
		t.Fatalf("label moved in: want ADDED, got %v", e.Type)
	}
	p, _ = pods.Get(ctx, "w1", metav1.GetOptions{})
	p.Annotations = map[string]string{"k": "v"}
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Type != watch.Modified {
		t.Fatalf("want MODIFIED, got %v", e.Type)
	}
	if err := pods.Delete(ctx, "w1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Type != watch.Deleted {
		t.Fatalf("want DELETED, got %v", e.Type)
	}
}

func isExists(err error) bool   { return apierrors.IsAlreadyExists(err) }
func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

func TestKubernetesServicePointsAtTheServerAndSurvivesRestart(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()
	check := func() {
		t.Helper()
		svc, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil || svc.Spec.ClusterIP != "10.96.0.1" || svc.Spec.Ports[0].Port != 443 {
			t.Fatalf("kubernetes service: %+v %v", svc, err)
		}
		port := int32(srv.Addr().(*net.TCPAddr).Port)
		ep, err := cs.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil || ep.Subsets[0].Ports[0].Port != port {
			t.Fatalf("kubernetes endpoints: %+v %v", ep, err)
		}
		sl, err := cs.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil || *sl.Ports[0].Port != port {
			t.Fatalf("kubernetes endpointslice: %+v %v", sl, err)
		}
		for _, ns := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
			if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
				t.Fatalf("namespace %s: %v", ns, err)
			}
		}
	}
	check()
	srv.Stop()
	srv = apiservertest.Start(t, apiservertest.Options{DataDir: srv.DataDir, Addr: srv.Addr().String()})
	check()
}

func TestShutdownEndsWatchesCleanly(t *testing.T) {
	cs, srv := newClient(t)
	w, err := cs.CoreV1().Pods("").Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for range w.ResultChan() {
		}
		close(done)
	}()
	stopped := make(chan struct{})
	go func() { srv.Stop(); close(stopped) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end at shutdown")
	}
	select {
	case <-stopped:
	case <-time.After(15 * time.Second):
		t.Fatal("server did not stop")
	}
}

func TestConsistentListOfAQuietResourceAfterOtherWrites(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "c-"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	raw := newRaw(t, srv.Config)
	for _, path := range []string{"/api/v1/nodes", "/api/v1/namespaces", "/apis/apps/v1/deployments"} {
		if code, _, b := raw.do("GET", path, "", nil, 0); code != 200 {
			t.Fatalf("GET %s: %d %.200s", path, code, b)
		}
	}
}

// TestNodeWatchSeesPodsWhenBound is the kubelet's view: a watch on
// spec.nodeName=<node> gets a pod as ADDED when it is bound to the node and
// as DELETED when it is finally removed.
func TestNodeWatchSeesPodsWhenBound(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	pods := cs.CoreV1().Pods("default")
	w, err := cs.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-k"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := pods.Create(ctx, pod("kp", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "kp"}, Target: corev1.ObjectReference{Name: "node-k"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []watch.EventType{watch.Added, watch.Modified, watch.Deleted}
	go func() {
		// Graceful deletion marks the pod (MODIFIED), the kubelet's grace 0
		// delete removes it (DELETED).
		pods.Delete(ctx, "kp", metav1.DeleteOptions{})
		pods.Delete(ctx, "kp", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	}()
	for i, typ := range want {
		select {
		case e := <-w.ResultChan():
			if e.Type != typ || e.Object.(*corev1.Pod).Name != "kp" {
				t.Fatalf("event %d: %s, want %s", i, e.Type, typ)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event %d (%s)", i, typ)
		}
	}
}

func TestMetricsCountRequestsWatchesAndEtcd(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod("m", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("default").Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	<-w.ResultChan()
	b, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`apiserver_request_total{code="201",resource="pods",subresource="",verb="create"} 1`,
		`apiserver_request_total{code="404",resource="pods",subresource="",verb="get"} 1`,
		`apiserver_registered_watchers 1`,
		`etcd_request_duration_seconds_count{operation="create",type="pods"} 1`,
		`apiserver_request_duration_seconds_bucket{resource="pods",subresource="",verb="create",le="+Inf"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	_ = srv
}

// TestMetadataClientGetsPartialObjectMetadata serves client-go's metadata
// client (and metadata informers): get, list and watch as
// PartialObjectMetadata.
func TestMetadataClientGetsPartialObjectMetadata(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod("meta", map[string]string{"a": "b"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mc := metadata.NewForConfigOrDie(srv.Config)
	pods := mc.Resource(corev1.SchemeGroupVersion.WithResource("pods")).Namespace("default")
	p, err := pods.Get(ctx, "meta", metav1.GetOptions{})
	if err != nil || p.Labels["a"] != "b" {
		t.Fatalf("metadata get: %+v %v", p, err)
	}
	l, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil || len(l.Items) != 1 || l.ResourceVersion == "" {
		t.Fatalf("metadata list: %+v %v", l, err)
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case e := <-w.ResultChan():
		if pm, ok := e.Object.(*metav1.PartialObjectMetadata); e.Type != watch.Added || !ok || pm.Name != "meta" {
			t.Fatalf("metadata watch: %s %T", e.Type, e.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no metadata watch event")
	}
}

// TestProtobufResponsesForClientsThatAskForThem: client-go's typed clients
// prefer protobuf; get, list and write responses come in Kubernetes'
// protobuf envelope and decode to the same objects.
func TestProtobufResponsesForClientsThatAskForThem(t *testing.T) {
	t.Run("watch streams length-delimited WatchEvents", func(t *testing.T) {
		cs, srv := newClient(t)
		ctx := context.Background()
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod("pbw", nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		raw := newRaw(t, srv.Config)
		req, _ := http.NewRequest("GET", raw.host+"/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1", nil)
		req.Header.Set("Accept", "application/vnd.kubernetes.protobuf, */*")
		resp, err := raw.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "application/vnd.kubernetes.protobuf;stream=watch" {
			t.Fatalf("watch content type %q", ct)
		}
		b, _ := io.ReadAll(resp.Body)
		if len(b) < 4 {
			t.Fatalf("no frame: %q", b)
		}
		n := int(b[0])<<24 | int(b[1])<<16 | int(b[2])<<8 | int(b[3])
		var ev metav1.WatchEvent
		if len(b) < 4+n || ev.Unmarshal(b[4:4+n]) != nil || ev.Type != "ADDED" {
			t.Fatalf("first frame: %d bytes of %d, event %+v", n, len(b), ev.Type)
		}
		obj, _, err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Decode(ev.Object.Raw, nil, nil)
		if p, ok := obj.(*corev1.Pod); err != nil || !ok || p.Name != "pbw" {
			t.Fatalf("frame object: %T %v", obj, err)
		}
	})

	cs, srv := newClient(t)
	ctx := context.Background()
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod("pb", map[string]string{"k": "v"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	raw := newRaw(t, srv.Config)
	codec := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	for _, tc := range []struct {
		path string
		into runtime.Object
	}{{"/api/v1/namespaces/default/pods/pb", &corev1.Pod{}}, {"/api/v1/namespaces/default/pods", &corev1.PodList{}}, {"/api/v1/namespaces/default/pods?limit=1", &corev1.PodList{}}} {
		req, _ := http.NewRequest("GET", raw.host+tc.path, nil)
		req.Header.Set("Accept", "application/vnd.kubernetes.protobuf, */*")
		resp, err := raw.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "application/vnd.kubernetes.protobuf" {
			t.Fatalf("%s: content type %q", tc.path, ct)
		}
		out, _, err := codec.Decode(b, nil, tc.into)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		switch o := out.(type) {
		case *corev1.Pod:
			if o.Name != "pb" || o.Labels["k"] != "v" || o.ResourceVersion == "" {
				t.Fatalf("pod: %+v", o.ObjectMeta)
			}
		case *corev1.PodList:
			if len(o.Items) != 1 || o.Items[0].Name != "pb" || o.ResourceVersion == "" {
				t.Fatalf("list: %+v", o)
			}
		}
	}
}

// TestWatchStreamFramesAndTimeout reads a watch as raw chunked JSON: one
// frame per line with type and an object carrying apiVersion and kind, and
// the stream ends by itself after timeoutSeconds.
func TestWatchStreamFramesAndTimeout(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "framed"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	raw := newRaw(t, srv.Config)
	start := time.Now()
	resp, err := raw.c.Get(raw.host + "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("watch response: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(resp.Body) // returns when the server ends the stream
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 30*time.Second {
		t.Fatal("timeoutSeconds did not end the watch")
	}
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	var frame struct {
		Type   string `json:"type"`
		Object struct {
			Kind       string `json:"kind"`
			APIVersion string `json:"apiVersion"`
			Metadata   struct {
				Name            string `json:"name"`
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		} `json:"object"`
	}
	found := false
	for _, l := range lines {
		if err := json.Unmarshal([]byte(l), &frame); err != nil {
			t.Fatalf("frame %q: %v", l, err)
		}
		if frame.Object.Metadata.Name == "framed" {
			found = frame.Type == "ADDED" && frame.Object.Kind == "ConfigMap" && frame.Object.APIVersion == "v1" && frame.Object.Metadata.ResourceVersion != ""
		}
	}
	if !found {
		t.Fatalf("no well-formed ADDED frame for the configmap in %q", body)
	}
}
