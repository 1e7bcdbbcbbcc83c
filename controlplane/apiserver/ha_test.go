package apiserver_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

// endpointIPs returns the addresses of the kubernetes Endpoints and
// EndpointSlice, which must agree.
func endpointIPs(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	ep, err := cs.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var ips []string
	for _, ss := range ep.Subsets {
		for _, a := range ss.Addresses {
			ips = append(ips, a.IP)
		}
	}
	sl, err := cs.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var sips []string
	for _, e := range sl.Endpoints {
		sips = append(sips, e.Addresses...)
	}
	if !slices.Equal(ips, sips) {
		return nil, fmt.Errorf("Endpoints %v and EndpointSlice %v disagree", ips, sips)
	}
	return ips, nil
}

// Three API servers on one etcd, as an HA control plane: the kubernetes
// Service's endpoints list every live server (lease reconciler), a server
// that shuts down leaves them at once, and every server's watch cache holds
// exactly what the others wrote.
func TestSeveralServersShareEndpointsAndStore(t *testing.T) {
	testutil.Privileged(t)
	e := apiservertest.StartEtcd(t, "", "")
	var srvs []*apiservertest.Server
	var clients []*kubernetes.Clientset
	for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		s := apiservertest.Start(t, apiservertest.Options{Addr: ip + ":26443", Configure: func(c *apiserver.Config) {
			e.Configure(c)
			c.AdvertiseAddress = ip
		}})
		srvs = append(srvs, s)
		clients = append(clients, kubernetes.NewForConfigOrDie(s.Config))
	}
	ctx := context.Background()
	testutil.Eventually(t, 45*time.Second, func() error {
		ips, err := endpointIPs(ctx, clients[0])
		if err != nil {
			return err
		}
		if strings.Join(ips, ",") != "127.0.0.2,127.0.0.3,127.0.0.4" {
			return fmt.Errorf("kubernetes endpoints %v, want the three servers", ips)
		}
		return nil
	})

	// Writes through every server, then a consistent LIST on each: the
	// same objects at the same resourceVersions everywhere.
	var last string
	for i := range 30 {
		cm, err := clients[i%3].CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm%d", i)},
			Data: map[string]string{"i": fmt.Sprint(i)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		last = cm.ResourceVersion
	}
	var want []string
	for i, cs := range clients {
		// resourceVersion=<last write> with NotOlderThan: served from the
		// watch cache once it caught up with that write.
		l, err := cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{ResourceVersion: last, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range l.Items {
			if strings.HasPrefix(c.Name, "cm") {
				got = append(got, c.Name+"@"+c.ResourceVersion)
			}
		}
		slices.Sort(got)
		if i == 0 {
			want = got
			if len(want) != 30 {
				t.Fatalf("server 0 lists %d ConfigMaps, want 30", len(want))
			}
			continue
		}
		if !slices.Equal(got, want) {
			t.Fatalf("server %d's watch cache differs:\n got %v\nwant %v", i, got, want)
		}
	}

	// A server that shuts down leaves the endpoints (without waiting for
	// its Lease to expire).
	srvs[2].Stop()
	testutil.Eventually(t, 10*time.Second, func() error {
		ips, err := endpointIPs(ctx, clients[0])
		if err != nil {
			return err
		}
		if strings.Join(ips, ",") != "127.0.0.2,127.0.0.3" {
			return fmt.Errorf("kubernetes endpoints %v after 127.0.0.4 stopped", ips)
		}
		return nil
	})
	leases, err := clients[0].CoordinationV1().Leases("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "apiserver.kubernetes.io/identity=kube-apiserver"})
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Items) != 2 {
		t.Errorf("%d apiserver leases after one server left, want 2", len(leases.Items))
	}
}
