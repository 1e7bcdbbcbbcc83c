package apiserver_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

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
