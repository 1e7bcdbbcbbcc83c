package apiserver_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const protobufMagic = "k8s\x00"

// TestReadsJSONStoredByEarlierBuilds starts the API server on a data dir
// that the build before protobuf storage wrote (every built-in object
// stored as JSON): it serves those objects, from etcd and from its watch
// caches, in JSON and protobuf, and a write stores the object again as
// protobuf. testdata/json-storage-datadir.tar.gz is that build's etcd
// member/ directory after its bootstrap plus a Pod, a ConfigMap, a Secret, a
// Deployment and an events.k8s.io Event (stored as a core/v1 Event), all in
// the default namespace, written through client-go.
func TestReadsJSONStoredByEarlierBuilds(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	etcdDir := filepath.Join(dir, "etcd")
	if err := os.MkdirAll(etcdDir, 0o700); err != nil {
		t.Fatal(err)
	}
	tarball, err := filepath.Abs("testdata/json-storage-datadir.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xzf", tarball, "-C", etcdDir).CombinedOutput(); err != nil {
		t.Fatalf("unpack: %v: %s", err, out)
	}
	srv := apiservertest.Start(t, apiservertest.Options{DataDir: dir})
	for _, key := range []string{"/registry/pods/default/legacy-pod", "/registry/configmaps/default/legacy-cm", "/registry/secrets/default/legacy-secret",
		"/registry/deployments/default/legacy-deploy", "/registry/events/default/legacy-event"} {
		if raw := rawEtcd(t, srv, key); !strings.HasPrefix(raw, "{") {
			t.Fatalf("the fixture's %s is not JSON: %.40q", key, raw)
		}
	}
	ctx := context.Background()
	for _, proto := range []bool{false, true} {
		cfg := *srv.Config
		if proto {
			cfg.ContentType = "application/vnd.kubernetes.protobuf"
			cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf"
		}
		cs := kubernetes.NewForConfigOrDie(&cfg)
		// resourceVersion "0" reads the watch cache, "" etcd.
		for _, rv := range []string{"0", ""} {
			opts := metav1.GetOptions{ResourceVersion: rv}
			p, err := cs.CoreV1().Pods("default").Get(ctx, "legacy-pod", opts)
			if err != nil || p.Spec.Containers[0].Image != "registry.example.com/web:1.2.3" || p.Labels["tier"] != "web" || len(p.ManagedFields) == 0 || p.CreationTimestamp.IsZero() {
				t.Fatalf("protobuf %v rv %q: pod %v %+v", proto, rv, err, p)
			}
			s, err := cs.CoreV1().Secrets("default").Get(ctx, "legacy-secret", opts)
			if err != nil || string(s.Data["password"]) != "hunter2" {
				t.Fatalf("protobuf %v rv %q: secret %v %+v", proto, rv, err, s)
			}
			d, err := cs.AppsV1().Deployments("default").Get(ctx, "legacy-deploy", opts)
			if err != nil || *d.Spec.Replicas != 1 || d.Spec.Selector.MatchLabels["app"] != "legacy" {
				t.Fatalf("protobuf %v rv %q: deployment %v %+v", proto, rv, err, d)
			}
			e, err := cs.EventsV1().Events("default").Get(ctx, "legacy-event", opts)
			if err != nil || e.Note != "written by the JSON build" || e.Regarding.Name != "legacy-pod" {
				t.Fatalf("protobuf %v rv %q: events.k8s.io event %v %+v", proto, rv, err, e)
			}
			ce, err := cs.CoreV1().Events("default").Get(ctx, "legacy-event", opts)
			if err != nil || ce.Message != "written by the JSON build" {
				t.Fatalf("protobuf %v rv %q: core event %v %+v", proto, rv, err, ce)
			}
			l, err := cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{ResourceVersion: rv, LabelSelector: "era=json"})
			if err != nil || len(l.Items) != 1 || l.Items[0].Data["k"] != "v" {
				t.Fatalf("protobuf %v rv %q: configmaps %v %+v", proto, rv, err, l)
			}
		}
	}
	// A write stores the object as protobuf; it reads back the same.
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	cm, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "legacy-cm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["k2"] = "v2"
	if _, err := cs.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if raw := rawEtcd(t, srv, "/registry/configmaps/default/legacy-cm"); !strings.HasPrefix(raw, protobufMagic) || !strings.Contains(raw, "v2") {
		t.Fatalf("the updated ConfigMap is stored as %.40q, want protobuf", raw)
	}
	got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "legacy-cm", metav1.GetOptions{})
	if err != nil || got.Data["k"] != "v" || got.Data["k2"] != "v2" || got.Labels["era"] != "json" {
		t.Fatalf("after the update: %v %+v", err, got)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "new-cm"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if raw := rawEtcd(t, srv, "/registry/configmaps/default/new-cm"); !strings.HasPrefix(raw, protobufMagic) {
		t.Fatalf("a new ConfigMap is stored as %.40q, want protobuf", raw)
	}

	// --storage-media-type=application/json (a rolling upgrade, while
	// servers of the JSON build share the etcd) writes JSON again and still
	// reads protobuf.
	srv.Stop()
	srv = apiservertest.Start(t, apiservertest.Options{DataDir: dir, Configure: func(c *apiserver.Config) { c.StorageMediaType = "application/json" }})
	cs = kubernetes.NewForConfigOrDie(srv.Config)
	got, err = cs.CoreV1().ConfigMaps("default").Get(ctx, "legacy-cm", metav1.GetOptions{})
	if err != nil || got.Data["k2"] != "v2" {
		t.Fatalf("protobuf value under --storage-media-type=application/json: %v %+v", err, got)
	}
	got.Data["k3"] = "v3"
	if _, err := cs.CoreV1().ConfigMaps("default").Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if raw := rawEtcd(t, srv, "/registry/configmaps/default/legacy-cm"); !strings.HasPrefix(raw, `{"kind":"ConfigMap"`) || !strings.Contains(raw, `"k3":"v3"`) {
		t.Fatalf("under --storage-media-type=application/json the ConfigMap is stored as %.60q", raw)
	}
}

func TestStorageMediaTypeIsChecked(t *testing.T) {
	_, err := apiserver.New(context.Background(), apiserver.Config{DataDir: t.TempDir(), StorageMediaType: "application/yaml"})
	if err == nil || !strings.Contains(err.Error(), "--storage-media-type") {
		t.Fatalf("New with --storage-media-type=application/yaml: %v", err)
	}
}
