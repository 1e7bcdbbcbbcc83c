package lab

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/kubelet/images"
)

// nodeWatch records, through one survivor-seeded client, every node whose
// Ready condition leaves True and every renewal of every node's Lease.
type nodeWatch struct {
	stop chan struct{}

	mu       sync.Mutex
	notReady map[string]bool
	renewals map[string][]time.Time
}

func watchNodes(cs kubernetes.Interface) *nodeWatch {
	w := &nodeWatch{stop: make(chan struct{}), notReady: map[string]bool{}, renewals: map[string][]time.Time{}}
	f := informers.NewSharedInformerFactory(cs, 0)
	nodes := f.Core().V1().Nodes().Informer()
	_, _ = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.node,
		UpdateFunc: func(_, o any) { w.node(o) },
	})
	leases := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(corev1.NamespaceNodeLease)).Coordination().V1().Leases().Informer()
	_, _ = leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.lease,
		UpdateFunc: func(_, o any) { w.lease(o) },
	})
	f.Start(w.stop)
	go leases.Run(w.stop)
	cache.WaitForCacheSync(w.stop, nodes.HasSynced, leases.HasSynced)
	return w
}

func (w *nodeWatch) node(o any) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			w.mu.Lock()
			w.notReady[n.Name] = true
			w.mu.Unlock()
		}
	}
}

func (w *nodeWatch) lease(o any) {
	l, ok := o.(*coordinationv1.Lease)
	if !ok || l.Spec.RenewTime == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.renewals[l.Name]
	if t := l.Spec.RenewTime.Time; len(r) == 0 || t.After(r[len(r)-1]) {
		w.renewals[l.Name] = append(r, t)
	}
}

// results fills NotReady, LeaseRenewed (fault → the slowest node's first
// renewal after it) and LeaseGap.
func (w *nodeWatch) results(res *HAResult, fault time.Time, nodes []NodeState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	res.NotReady = len(w.notReady)
	for _, n := range nodes {
		r := w.renewals[n.Name]
		renewed := time.Duration(-1)
		for i, t := range r {
			if i > 0 && t.Sub(r[i-1]) > res.LeaseGap {
				res.LeaseGap = t.Sub(r[i-1])
			}
			if renewed < 0 && t.After(fault) {
				renewed = t.Sub(fault)
			}
		}
		if renewed < 0 {
			// Not renewed since the fault: that is the figure to see.
			renewed = time.Since(fault)
		}
		if renewed > res.LeaseRenewed {
			res.LeaseRenewed = renewed
		}
	}
}

// agentConns counts the established connections from the lab's nodes (their
// kubelets, proxies and DNS servers run in the node's namespace) to each API
// server address.
func agentConns(st *State, port int) map[string]int {
	conns := map[string]int{}
	for _, n := range st.Nodes {
		b, err := exec.Command("ip", "netns", "exec", n.NetNS, "ss", "-Htn", "state", "established",
			"( dport = :"+strconv.Itoa(port)+" )").Output()
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 4 {
				continue
			}
			if ap, err := netip.ParseAddrPort(f[len(f)-1]); err == nil {
				conns[ap.Addr().String()]++
			}
		}
	}
	return conns
}

// apiPort is the port of the API server a kubeconfig names.
func apiPort(kubeconfig string) (int, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return 0, err
	}
	u, err := url.Parse(rc.Host)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Port())
}

// proxyServices reads a node proxy's waggle_proxy_services_programmed.
func proxyServices(ctx context.Context, addr string) (float64, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+net.JoinHostPort(addr, "10256")+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "waggle_proxy_services_programmed "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("proxy at %s: no waggle_proxy_services_programmed", addr)
}

// probeService is a selector-less ClusterIP Service with one endpoint, which
// every node's proxy programs once it sees both.
func createProbeService(ctx context.Context, cs kubernetes.Interface, ns string) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ha-probe"}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "ha-probe-1", Labels: map[string]string{discoveryv1.LabelServiceName: "ha-probe"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"203.0.113.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	return retryWrite(ctx, func(ctx context.Context) error {
		if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
}

// retryWrite retries a write through the failover client until it is
// applied or 45 s pass (a write during a fault may time out).
func retryWrite(ctx context.Context, write func(context.Context) error) error {
	deadline := time.Now().Add(45 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := write(cctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leaseHolder is the holder identity of a kube-system Lease.
func leaseHolder(ctx context.Context, cs kubernetes.Interface, name string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	l, err := cs.CoordinationV1().Leases(metav1.NamespaceSystem).Get(cctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return ptr.Deref(l.Spec.HolderIdentity, ""), nil
}

// serverOf is the server whose components hold a Lease: their identity is
// "<server name>_<uuid>".
func serverOf(servers []*haServer, holder string) *haServer {
	for _, s := range servers {
		if strings.HasPrefix(holder, s.n.Name+"_") {
			return s
		}
	}
	return nil
}

// probeReplicaSet has no replicas until the fault scales it.
func probeReplicaSet() *appsv1.ReplicaSet {
	labels := map[string]string{"app": "ha-probe"}
	return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "ha-probe"}, Spec: appsv1.ReplicaSetSpec{
		Replicas: ptr.To[int32](0),
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "echo", Image: images.EchoImage,
				ImagePullPolicy: corev1.PullNever}},
		}},
	}}
}
