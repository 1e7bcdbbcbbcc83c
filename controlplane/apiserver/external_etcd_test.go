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
	e := apiservertest.StartEtcd(t, "", "")
	ext := e.Configure
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
	e := apiservertest.StartEtcd(t, dir, "")
	addr := strings.TrimPrefix(e.ClientURL, "https://")
	srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) {
		e.Configure(c)
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
	e = apiservertest.StartEtcd(t, dir, addr)
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}}, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after etcd came back: %v", err)
		}
		time.Sleep(200 * time.Millisecond) // poll interval while etcd is down (bounded by the deadline)
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

// TestExternalEtcdNeedsItsCertificates: an API server pointed at a TLS etcd
// without --etcd-cafile/--etcd-certfile/--etcd-keyfile, or with a
// certificate etcd does not trust, does not start, and says why.
func TestExternalEtcdNeedsItsCertificates(t *testing.T) {
	testutil.Privileged(t)
	e := apiservertest.StartEtcd(t, "", "")
	other := apiservertest.StartEtcd(t, "", "") // its CA is not e's
	for name, conf := range map[string]func(*apiserver.Config){
		"no certificates": func(c *apiserver.Config) { c.EtcdServers = []string{e.ClientURL} },
		"only the CA": func(c *apiserver.Config) {
			c.EtcdServers, c.EtcdCAFile = []string{e.ClientURL}, e.PKI.CAFile
		},
		"another etcd's client certificate": func(c *apiserver.Config) {
			c.EtcdServers, c.EtcdCAFile = []string{e.ClientURL}, e.PKI.CAFile
			c.EtcdCertFile, c.EtcdKeyFile = other.PKI.ClientCertFile, other.PKI.ClientKeyFile
		},
		"a certificate without its key": func(c *apiserver.Config) {
			e.Configure(c)
			c.EtcdKeyFile = ""
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := apiserver.Config{DataDir: t.TempDir(), EtcdTimeout: 3 * time.Second}
			conf(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv, err := apiserver.New(ctx, cfg)
			if err == nil {
				srv.Close()
				t.Fatal("the API server started")
			}
			if !strings.Contains(err.Error(), "etcd") {
				t.Fatalf("error does not name etcd: %v", err)
			}
		})
	}
}
