package dataplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func hcService(port int32) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort: port, ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
			Ports: []v1.ServicePort{{Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}}}}
}

func hcSlice(readyHere bool) *discoveryv1.EndpointSlice {
	here, there := "node-a", "node-b"
	ready := readyHere
	yes := true
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.0.5"}, NodeName: &here, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
			{Addresses: []string{"10.244.1.5"}, NodeName: &there, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
		},
	}
}

type hcAnswer struct {
	Service struct {
		Namespace, Name string
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func probe(t *testing.T, port int) (int, string, hcAnswer, error) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", port))
	if err != nil {
		return 0, "", hcAnswer{}, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var a hcAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
	return resp.StatusCode, resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), a, nil
}

// The healthCheckNodePort answers as kube-proxy's (upstream's own server):
// 200 with the local endpoint count while this node has a ready endpoint,
// 503 without, and nothing once the Service is gone.
func TestHealthCheckNodePortServesLocalEndpoints(t *testing.T) {
	const port = 27101
	tr := NewTracker("node-a", false)
	var healthy atomic.Bool
	healthy.Store(true)
	h := newServiceHealth("node-a", healthy.Load)
	defer h.close()
	svc := hcService(port)
	tr.Service(svc, false)
	tr.EndpointSlice(hcSlice(true), false)
	ref := ServiceRef{"default", "web"}
	h.update(tr, []ServiceRef{ref})
	code, weight, a, err := probe(t, port)
	if err != nil || code != http.StatusOK || weight != "1" || a.LocalEndpoints != 1 || !a.ServiceProxyHealthy ||
		a.Service.Namespace != "default" || a.Service.Name != "web" {
		t.Fatalf("ready local endpoint: %d weight %q %+v %v", code, weight, a, err)
	}
	tr.EndpointSlice(hcSlice(false), false)
	h.update(tr, []ServiceRef{ref})
	if code, _, a, err := probe(t, port); err != nil || code != http.StatusServiceUnavailable || a.LocalEndpoints != 0 {
		t.Fatalf("no ready local endpoint: %d %+v %v", code, a, err)
	}
	tr.EndpointSlice(hcSlice(true), false)
	h.update(tr, []ServiceRef{ref})
	healthy.Store(false)
	if code, _, a, err := probe(t, port); err != nil || code != http.StatusServiceUnavailable || a.ServiceProxyHealthy {
		t.Fatalf("unhealthy proxy: %d %+v %v", code, a, err)
	}
	healthy.Store(true)
	// Cluster policy: no health check port.
	svc = svc.DeepCopy()
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	tr.Service(svc, false)
	h.update(tr, []ServiceRef{ref})
	if _, _, _, err := probe(t, port); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("after the policy became Cluster: %v, want connection refused", err)
	}
}
