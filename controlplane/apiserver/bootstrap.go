package apiserver

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// bootstrap creates what exists from the first start: the four initial
// namespaces, kube-public/cluster-info, the default ServiceCIDR, and the default/kubernetes Service
// (the range's first ClusterIP, port 443) with its Endpoints and
// EndpointSlice listing every live API server (see reconcileEndpoints),
// refreshed at every start.
func (s *Server) bootstrap(ctx context.Context) error {
	if err := s.bootstrapPriorityClasses(ctx); err != nil {
		return err
	}
	nsReg := s.registries["namespaces"]
	for _, name := range initialNamespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if _, err := nsReg.create(ctx, "", ns, writeOpts{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("apiserver: create namespace %s: %w", name, err)
		}
	}
	if err := s.bootstrapClusterInfo(ctx); err != nil {
		return err
	}
	if err := s.bootstrapServiceCIDR(ctx); err != nil {
		return err
	}
	port := int32(s.ln.Addr().(*net.TCPAddr).Port)
	labels := map[string]string{"component": "apiserver", "provider": "kubernetes"}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default", Labels: labels},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: s.ipAlloc.value(1),
			Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(port)}},
		},
	}
	if err := s.upsert(ctx, "services", svc, func(cur runtime.Object) bool {
		c := cur.(*corev1.Service)
		if apiequality.Semantic.DeepEqual(c.Spec.Ports, svc.Spec.Ports) {
			return false
		}
		c.Spec.Ports = svc.Spec.Ports
		return true
	}); err != nil {
		return err
	}
	return s.reconcileEndpoints(ctx, false)
}

// upsert creates obj in its namespace, or updates the existing one with
// change (which reports whether it changed anything).
func (s *Server) upsert(ctx context.Context, resource string, obj runtime.Object, change func(cur runtime.Object) bool) error {
	reg := s.registries[resource]
	m := objectMeta(obj)
	_, err := reg.get(ctx, m.GetNamespace(), m.GetName(), "")
	if apierrors.IsNotFound(err) {
		_, err = reg.create(ctx, m.GetNamespace(), obj.DeepCopyObject(), writeOpts{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("apiserver: create %s %s/%s: %w", resource, m.GetNamespace(), m.GetName(), err)
		}
		if err == nil {
			return nil
		}
	}
	_, err = reg.guaranteedUpdate(ctx, m.GetNamespace(), m.GetName(), "", writeOpts{}, func(cur runtime.Object) (runtime.Object, error) {
		if !change(cur) {
			return nil, nil
		}
		objectMeta(cur).SetResourceVersion("")
		return cur, nil
	})
	if err != nil {
		return fmt.Errorf("apiserver: update %s %s/%s: %w", resource, m.GetNamespace(), m.GetName(), err)
	}
	return nil
}

// endpointIP is the address pods reach this server at: the advertise
// address, else the first global unicast IPv4 of the host, else loopback.
func (s *Server) endpointIP() string {
	if a, err := netip.ParseAddr(s.cfg.AdvertiseAddress); err == nil && a.Is4() {
		return a.String()
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip4 := n.IP.To4(); ip4 != nil && n.IP.IsGlobalUnicast() {
				return ip4.String()
			}
		}
	}
	return "127.0.0.1"
}
