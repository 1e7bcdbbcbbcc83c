package dataplane

import (
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/proxy/healthcheck"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
)

// serviceHealth serves each LoadBalancer Service's healthCheckNodePort
// (externalTrafficPolicy: Local) with upstream kube-proxy's own server
// (k8s.io/kubernetes/pkg/proxy/healthcheck): 200 and the local endpoint
// count as JSON while this node has a ready endpoint and the proxy is
// healthy, else 503 — what external load balancers probe to send traffic
// only to nodes with local endpoints.
type serviceHealth struct {
	srv   healthcheck.ServiceHealthServer
	ports map[types.NamespacedName]uint16
	eps   map[types.NamespacedName]int
}

// proxyHealth adapts the proxy's own health to upstream's checker.
type proxyHealth func() bool

func (h proxyHealth) Health() healthcheck.ProxyHealth {
	now := time.Now()
	return healthcheck.ProxyHealth{Healthy: h(), CurrentTime: now, LastUpdated: now}
}

func newServiceHealth(nodeName string, healthy func() bool) *serviceHealth {
	return &serviceHealth{
		srv: healthcheck.NewServiceHealthServer(nodeName, nil, proxyutil.NewNodePortAddresses(v1.IPv4Protocol, nil),
			proxyHealth(healthy), v1.IPv4Protocol),
		ports: map[types.NamespacedName]uint16{},
		eps:   map[types.NamespacedName]int{},
	}
}

// update re-reads the health-check ports and local endpoint counts of refs
// and hands upstream's server the new sets when they changed.
func (h *serviceHealth) update(t *Tracker, refs []ServiceRef) {
	portsChanged, epsChanged := false, false
	for _, r := range refs {
		nsn := types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
		port, local := t.HealthCheckNodePort(r)
		if port == 0 {
			if _, ok := h.ports[nsn]; ok {
				delete(h.ports, nsn)
				delete(h.eps, nsn)
				portsChanged, epsChanged = true, true
			}
			continue
		}
		if h.ports[nsn] != port {
			h.ports[nsn] = port
			portsChanged = true
		}
		if old, ok := h.eps[nsn]; !ok || old != local {
			h.eps[nsn] = local
			epsChanged = true
		}
	}
	if portsChanged {
		_ = h.srv.SyncServices(h.ports) // listen failures are logged by upstream's server
	}
	if portsChanged || epsChanged {
		_ = h.srv.SyncEndpoints(h.eps)
	}
}

// close stops every health-check server.
func (h *serviceHealth) close() {
	_ = h.srv.SyncServices(map[types.NamespacedName]uint16{})
}
