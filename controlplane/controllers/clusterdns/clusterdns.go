// Package clusterdns is the controller that publishes the cluster DNS
// Service: kube-system/kube-dns at the configured ClusterIP (10.96.0.10 in
// the default range), without a selector, with internalTrafficPolicy Local,
// and one EndpointSlice listing every node's DNS server (the node's
// InternalIP at the server's port, ready while the Node is Ready). The
// servers themselves run in each node's proxy (package clusterdns at the
// repository root); the dataplane sends each pod's queries to its own node.
//
// It is not the DNS server and not the endpointslice controller (which
// leaves selector-less Services and slices it does not manage alone).
package clusterdns

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// Name is the controller's name in --controllers.
const Name = "clusterdns"

// The published objects.
const (
	Namespace   = "kube-system"
	ServiceName = "kube-dns"
	SliceName   = "kube-dns-nodes"
	ManagedBy   = "clusterdns.waggle.io"
	// DefaultPort is where each node's server listens.
	DefaultPort = 10053
)

// Options configure the controller.
type Options struct {
	// ClusterIP of the kube-dns Service.
	ClusterIP string
	// Port the node servers listen on (default 10053).
	Port int32
	// Resync is how often the objects are checked without an event
	// (default 30 s), repairing edits by hand.
	Resync time.Duration
}

// Controller keeps the Service and its EndpointSlice.
type Controller struct {
	client kubernetes.Interface
	nodes  corelisters.NodeLister
	synced []cache.InformerSynced
	opts   Options
	log    *slog.Logger
	kick   chan struct{}
}

// New builds the controller on factory's Node informer.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	if opts.Port == 0 {
		opts.Port = DefaultPort
	}
	if opts.Resync <= 0 {
		opts.Resync = 30 * time.Second
	}
	inf := factory.Core().V1().Nodes()
	c := &Controller{client: client, nodes: inf.Lister(), synced: []cache.InformerSynced{inf.Informer().HasSynced},
		opts: opts, log: log.With("controller", Name), kick: make(chan struct{}, 1)}
	kick := func(any) { c.poke() }
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: kick, DeleteFunc: kick,
		UpdateFunc: func(old, cur any) {
			o, n := old.(*v1.Node), cur.(*v1.Node)
			if nodeReady(o) != nodeReady(n) || internalIP(o) != internalIP(n) {
				c.poke()
			}
		}})
	return c
}

func (c *Controller) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run syncs on every change until ctx ends; workers is ignored (one key).
func (c *Controller) Run(ctx context.Context, _ int) {
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	t := time.NewTicker(c.opts.Resync)
	defer t.Stop()
	for {
		if err := c.Sync(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("sync kube-dns", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-t.C:
		}
	}
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func internalIP(n *v1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == v1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

func (c *Controller) service() *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: ServiceName, Labels: map[string]string{
			"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "Waggle-DNS"}},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: c.opts.ClusterIP, ClusterIPs: []string{c.opts.ClusterIP},
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyLocal),
			Ports: []v1.ServicePort{
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(c.opts.Port)},
				{Name: "dns-tcp", Protocol: v1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(c.opts.Port)},
			},
		},
	}
}

// Sync makes the Service and the EndpointSlice what the nodes say.
func (c *Controller) Sync(ctx context.Context) error {
	want := c.service()
	svc, err := c.client.CoreV1().Services(Namespace).Get(ctx, ServiceName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if svc, err = c.client.CoreV1().Services(Namespace).Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create service %s/%s: %w", Namespace, ServiceName, err)
		}
		c.log.Info("created the cluster DNS Service", "clusterIP", c.opts.ClusterIP)
	case err != nil:
		return err
	case svc.Spec.ClusterIP != c.opts.ClusterIP:
		c.log.Warn("kube-dns has another ClusterIP than pods are told to use; delete it to have it re-created",
			"have", svc.Spec.ClusterIP, "want", c.opts.ClusterIP)
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	var eps []discoveryv1.Endpoint
	for _, n := range nodes {
		ip := internalIP(n)
		if ip == "" {
			continue
		}
		ready := nodeReady(n)
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(n.Name),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready), Terminating: ptr.To(false)}})
	}
	ports := []discoveryv1.EndpointPort{
		{Name: ptr.To("dns"), Protocol: ptr.To(v1.ProtocolUDP), Port: ptr.To(c.opts.Port)},
		{Name: ptr.To("dns-tcp"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(c.opts.Port)},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: SliceName,
			Labels: map[string]string{discoveryv1.LabelServiceName: ServiceName, discoveryv1.LabelManagedBy: ManagedBy},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps, Ports: ports,
	}
	cur, err := c.client.DiscoveryV1().EndpointSlices(Namespace).Get(ctx, SliceName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.client.DiscoveryV1().EndpointSlices(Namespace).Create(ctx, slice, metav1.CreateOptions{})
		return err
	case err != nil:
		return err
	}
	if reflect.DeepEqual(cur.Endpoints, slice.Endpoints) && reflect.DeepEqual(cur.Ports, slice.Ports) &&
		reflect.DeepEqual(cur.Labels, slice.Labels) && reflect.DeepEqual(cur.OwnerReferences, slice.OwnerReferences) {
		return nil
	}
	slice.ResourceVersion = cur.ResourceVersion
	_, err = c.client.DiscoveryV1().EndpointSlices(Namespace).Update(ctx, slice, metav1.UpdateOptions{})
	return err
}
