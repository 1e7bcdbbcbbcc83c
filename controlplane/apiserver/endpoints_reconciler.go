package apiserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The lease endpoint reconciler, as kube-apiserver's default
// (--endpoint-reconciler-type=lease): every API server keeps a Lease of its
// own in kube-system, renewed every endpointReconcileInterval and valid for
// endpointLeaseTTL, and rewrites the default/kubernetes Endpoints and
// EndpointSlice to list every API server whose Lease is current, sorted.
// A server that shuts down deletes its Lease and reconciles once more, so
// clients stop being sent to it at once; one that is killed drops out when
// its Lease expires.
//
// Upstream keeps these leases as TTL keys under /registry/masterleases/ and
// the APIServerIdentity Leases (kube-system/apiserver-<hash>, label
// apiserver.kubernetes.io/identity=kube-apiserver) apart; Waggle uses the
// identity Leases for both, with the endpoint in an annotation, so `kubectl
// -n kube-system get leases -l apiserver.kubernetes.io/identity` shows which
// servers are live.
const (
	endpointReconcileInterval = 5 * time.Second
	endpointLeaseTTL          = 15 * time.Second
	identityLabel             = "apiserver.kubernetes.io/identity"
	endpointAnnotation        = "waggle.io/apiserver-endpoint"
)

// identityLeaseName is this server's Lease: apiserver-<hash of its endpoint>.
func (s *Server) identityLeaseName() string {
	sum := sha256.Sum256([]byte(s.endpoint()))
	return "apiserver-" + hex.EncodeToString(sum[:])[:16]
}

// endpoint is the IP:port other servers and pods reach this one at.
func (s *Server) endpoint() string {
	return net.JoinHostPort(s.endpointIP(), strconv.Itoa(s.ln.Addr().(*net.TCPAddr).Port))
}

func (s *Server) endpointReconcileLoop(ctx context.Context) {
	t := time.NewTicker(endpointReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.reconcileEndpoints(ctx, false); err != nil && ctx.Err() == nil {
			s.log.Warn("kubernetes endpoints reconcile failed", "err", err)
		}
	}
}

// reconcileEndpoints renews (or, leaving, deletes) this server's Lease and
// writes the kubernetes Endpoints and EndpointSlice from the live Leases.
func (s *Server) reconcileEndpoints(ctx context.Context, leaving bool) error {
	leases := s.registries["leases"]
	name := s.identityLeaseName()
	now := metav1.NewMicroTime(time.Now())
	if leaving {
		if _, _, err := leases.deleteObject(ctx, metav1.NamespaceSystem, name, &metav1.DeleteOptions{}, writeOpts{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete lease %s: %w", name, err)
		}
	} else {
		secs := int32(endpointLeaseTTL / time.Second)
		holder := s.endpoint()
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceSystem,
				Labels:      map[string]string{identityLabel: "kube-apiserver"},
				Annotations: map[string]string{endpointAnnotation: holder}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &now},
		}
		if err := s.upsert(ctx, "leases", l, func(cur runtime.Object) bool {
			c := cur.(*coordinationv1.Lease)
			c.Spec = l.Spec
			c.Labels, c.Annotations = l.Labels, l.Annotations
			return true
		}); err != nil {
			return err
		}
	}
	// Read etcd, not the cache: another server's fresh Lease counts now.
	res, err := leases.list(ctx, metav1.NamespaceSystem, &metav1.ListOptions{LabelSelector: identityLabel + "=kube-apiserver"})
	if err != nil {
		return fmt.Errorf("list apiserver leases: %w", err)
	}
	var ips []string
	port := int32(s.ln.Addr().(*net.TCPAddr).Port)
	for _, o := range res.items {
		l, ok := o.Obj.(*coordinationv1.Lease)
		if !ok || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || (leaving && l.Name == name) {
			continue
		}
		if time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
			continue
		}
		host, p, err := net.SplitHostPort(l.Annotations[endpointAnnotation])
		if err != nil || net.ParseIP(host) == nil || net.ParseIP(host).To4() == nil {
			continue
		}
		if pn, _ := strconv.Atoi(p); int32(pn) != port {
			// As upstream: every server of a cluster serves one port.
			s.log.Warn("apiserver lease with another port is left out of the kubernetes endpoints", "lease", l.Name, "endpoint", l.Annotations[endpointAnnotation])
			continue
		}
		ips = append(ips, host)
	}
	slices.Sort(ips)
	ips = slices.Compact(ips)
	return s.writeKubernetesEndpoints(ctx, ips, port)
}

func (s *Server) writeKubernetesEndpoints(ctx context.Context, ips []string, port int32) error {
	var addrs []corev1.EndpointAddress
	var eps []discoveryv1.Endpoint
	ready := true
	for _, ip := range ips {
		addrs = append(addrs, corev1.EndpointAddress{IP: ip})
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	var subsets []corev1.EndpointSubset
	if len(addrs) > 0 {
		subsets = []corev1.EndpointSubset{{Addresses: addrs, Ports: []corev1.EndpointPort{{Name: "https", Port: port, Protocol: corev1.ProtocolTCP}}}}
	}
	ep := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelSkipMirror: "true"}},
		Subsets: subsets,
	}
	if err := s.upsert(ctx, "endpoints", ep, func(cur runtime.Object) bool {
		c := cur.(*corev1.Endpoints)
		if apiequality.Semantic.DeepEqual(c.Subsets, ep.Subsets) {
			return false
		}
		c.Subsets = ep.Subsets
		return true
	}); err != nil {
		return err
	}
	proto := corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "kube-apiserver"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: &port, Protocol: &proto}},
	}
	return s.upsert(ctx, "endpointslices", slice, func(cur runtime.Object) bool {
		c := cur.(*discoveryv1.EndpointSlice)
		if apiequality.Semantic.DeepEqual(c.Endpoints, slice.Endpoints) && apiequality.Semantic.DeepEqual(c.Ports, slice.Ports) {
			return false
		}
		c.Endpoints, c.Ports = slice.Endpoints, slice.Ports
		return true
	})
}
