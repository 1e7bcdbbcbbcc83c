package dataplane_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/conformance"
	"github.com/waggle-io/waggle/dataplane/iptables"
	"github.com/waggle-io/waggle/internal/ops"
	"github.com/waggle-io/waggle/internal/testutil"
)

// TestProxyEndToEndWithIPTables runs the whole proxy against a real API
// server (real etcd) with the real iptables backend in a fresh network
// namespace, and checks that connections through the Service follow the
// EndpointSlices, that an SCTP port gets an Event, and that --cleanup
// removes everything.
func TestProxyEndToEndWithIPTables(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "iptables-restore")
	testutil.RequiresBinary(t, "nsenter")
	tp := conformance.NewTopology(t)
	nsPath := filepath.Join("/run/netns", tp.Node.Name)
	rc, _, _ := apiservertest.StartTestServer(t)
	client := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()

	mode := dataplane.Mode{
		Name: dataplane.ModeIPTables, AutoCandidate: true,
		Supported: iptables.Supported,
		New: func(mc dataplane.ModeConfig) (dataplane.Backend, error) {
			return iptables.New(iptables.Config{NetNSPath: nsPath, Log: mc.Log, Metrics: mc.Metrics})
		},
		Cleanup: func(ctx context.Context, mc dataplane.ModeConfig) error {
			b, err := iptables.New(iptables.Config{NetNSPath: nsPath, Log: mc.Log})
			if err != nil {
				return err
			}
			return b.Cleanup(ctx)
		},
	}

	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: conformance.NodeIP.String()}}}}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := client.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, Ports: []v1.ServicePort{
			{Name: "http", Port: 80, Protocol: v1.ProtocolTCP},
			{Name: "sig", Port: 9, Protocol: v1.ProtocolSCTP},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	var np uint16
	for _, p := range svc.Spec.Ports {
		if p.Name == "http" {
			np = uint16(p.NodePort)
		}
	}
	slice := func(eps ...netip.AddrPort) *discoveryv1.EndpointSlice {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		}
		for _, e := range eps {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.Addr().String()}, NodeName: ptr.To("node-a"),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		return es
	}
	es, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(conformance.Endpoints[:2]...), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	health := ops.NewHealth()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	cfg := dataplane.Config{
		Client: client, NodeName: "node-a", Mode: dataplane.ModeAuto, Modes: []dataplane.Mode{mode},
		SyncPeriod: time.Minute, MinSyncPeriod: 100 * time.Millisecond, Health: health,
		Log: slog.New(slog.DiscardHandler),
	}
	go func() { done <- dataplane.Run(runCtx, cfg) }()
	t.Cleanup(func() {
		stop()
		<-done
		cleanup := cfg
		cleanup.Cleanup = true
		dataplane.Run(context.Background(), cleanup)
	})

	// eventually waits until every connection to addr is answered by one
	// of want, and all of want answered.
	eventually := func(what string, addr netip.AddrPort, want []netip.AddrPort) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, func() error {
			seen := map[netip.AddrPort]bool{}
			for i := 0; i < 20*len(want) && len(seen) < len(want); i++ {
				got, err := tp.Connect(dataplane.TCP, addr)
				if err != nil || !slices.Contains(want, got) {
					return fmt.Errorf("%s: %s answered by %v (%v), want exactly %v", what, addr, got, err, want)
				}
				seen[got] = true
			}
			if len(seen) != len(want) {
				return fmt.Errorf("%s: %s answered by %v only, want %v", what, addr, seen, want)
			}
			return nil
		})
	}
	eventually("initial endpoints", vip, conformance.Endpoints[:2])
	eventually("node port", netip.AddrPortFrom(conformance.NodeIP, np), conformance.Endpoints[:2])

	es.Endpoints = slice(conformance.Endpoints[2]).Endpoints
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("after the EndpointSlice changed", vip, conformance.Endpoints[2:3])

	rec := httptest.NewRecorder()
	health.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("/readyz = %d: %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	health.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	// web and the API server's own default/kubernetes.
	for _, m := range []string{"waggle_proxy_services_programmed 2", "waggle_proxy_endpoint_change_to_programmed_seconds_count", `waggle_proxy_iptables_syncs_total{kind="full",result="ok"}`} {
		if !strings.Contains(rec.Body.String(), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	testutil.Eventually(t, 30*time.Second, func() error {
		// ResourceVersion 0: served from the watch cache, without waiting
		// for a consistent read.
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(evs.Items, func(e v1.Event) bool {
			return e.Reason == dataplane.ReasonUnsupportedProtocol && e.InvolvedObject.Name == "web"
		}) {
			return fmt.Errorf("no %s Event on the Service: %v", dataplane.ReasonUnsupportedProtocol, evs.Items)
		}
		return nil
	})

	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the deleted Service to be no longer served", func() bool {
		_, err := tp.Connect(dataplane.TCP, vip)
		return err != nil
	})

	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	done <- nil
	cleanup := cfg
	cleanup.Cleanup = true
	if err := dataplane.Run(ctx, cleanup); err != nil {
		t.Fatal(err)
	}
	out := tp.Node.Run(t, "iptables-save")
	if strings.Contains(out, "WAGGLE") {
		t.Errorf("--cleanup left rules:\n%s", out)
	}
}
