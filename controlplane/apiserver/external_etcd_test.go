package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/storage"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestTwoServersOnOneExternalEtcdNeverShareAllocations runs two API servers
// against one etcd given by --etcd-servers and creates Services on both at
// once: every ClusterIP and NodePort is handed out once, and each server
// sees the other's writes.
func TestTwoServersOnOneExternalEtcdNeverShareAllocations(t *testing.T) {
	testutil.Privileged(t)
	e, err := storage.StartEmbedded(context.Background(), storage.EmbeddedConfig{DataDir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ext := func(c *apiserver.Config) { c.EtcdServers = []string{e.ClientURL} }
	a := apiservertest.Start(t, apiservertest.Options{Configure: ext})
	b := apiservertest.Start(t, apiservertest.Options{Configure: ext})
	clients := []*kubernetes.Clientset{kubernetes.NewForConfigOrDie(a.Config), kubernetes.NewForConfigOrDie(b.Config)}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 60)
	for i := 0; i < 60; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, err := clients[i%2].CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d", i)},
				Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
			if err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, cs := range clients {
		l, err := cs.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 61 { // and the kubernetes Service
			t.Fatalf("a server sees %d services, want 61", len(l.Items))
		}
		ips, ports := map[string]string{}, map[int32]string{}
		for _, s := range l.Items {
			if other, dup := ips[s.Spec.ClusterIP]; dup {
				t.Fatalf("%s and %s share %s", s.Name, other, s.Spec.ClusterIP)
			}
			ips[s.Spec.ClusterIP] = s.Name
			for _, p := range s.Spec.Ports {
				if p.NodePort == 0 {
					continue
				}
				if other, dup := ports[p.NodePort]; dup {
					t.Fatalf("%s and %s share node port %d", s.Name, other, p.NodePort)
				}
				ports[p.NodePort] = s.Name
			}
		}
	}
}

// TestEtcdOutageGives503AndRecovers stops the external etcd under a running
// server: requests fail with 503 (not hang, not 500), and once etcd is back
// on the same address the server serves again and its caches resume.
func TestEtcdOutageGives503AndRecovers(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	e, err := storage.StartEmbedded(context.Background(), storage.EmbeddedConfig{DataDir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(e.ClientURL, "http://")
	srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) {
		c.EtcdServers = []string{e.ClientURL}
		c.EtcdTimeout = 2 * time.Second
	}})
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ctx := context.Background()
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Close()
	raw := newRaw(t, srv.Config)
	code, st, b := raw.do("POST", "/api/v1/namespaces/default/configmaps", "application/json", strings.NewReader(cmJSON("during", 1)), int64(len(cmJSON("during", 1))))
	if code != 503 && code != 504 {
		t.Fatalf("write during the outage: %d %+v %.200s", code, st, b)
	}
	// A namespace the cache does not hold sends NamespaceLifecycle to etcd,
	// which is down: that is a 503/504 to retry, never a final 403.
	code, st, b = raw.do("POST", "/api/v1/namespaces/ghost/configmaps", "application/json", strings.NewReader(cmJSON("ghost", 1)), int64(len(cmJSON("ghost", 1))))
	if code != 503 && code != 504 {
		t.Fatalf("write whose admission cannot read the namespace: %d %+v %.200s", code, st, b)
	}
	e, err = storage.StartEmbedded(context.Background(), storage.EmbeddedConfig{DataDir: dir, ClientAddr: addr, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}}, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after etcd came back: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The watch cache resumed too: a consistent list sees both.
	l, err := cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range l.Items {
		names[c.Name] = true
	}
	if !names["before"] || !names["after"] || names["during"] {
		t.Fatalf("after recovery: %v", names)
	}
}
