package scheduler

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/leaderelect"
	"github.com/waggle-io/waggle/internal/secureserving"
	"github.com/waggle-io/waggle/internal/testutil"
)

// realCluster is a real API server (embedded etcd, HTTPS) with a scheduler
// running against it; nodes are simulated as Node objects.
type realCluster struct {
	cs kubernetes.Interface
	s  *Scheduler
}

func startReal(t *testing.T) realCluster {
	t.Helper()
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(cs, 0)
	s, err := New(cs, factory, quietLog(), Options{PodInitialBackoff: 100 * time.Millisecond, PodMaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; factory.Shutdown() })
	return realCluster{cs, s}
}

func (c realCluster) create(t *testing.T, objs ...any) {
	t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *v1.Node:
			_, err = c.cs.CoreV1().Nodes().Create(ctx, o, metav1.CreateOptions{})
			if err == nil {
				// Allocatable is status: written through the status subresource.
				var cur *v1.Node
				if cur, err = c.cs.CoreV1().Nodes().Get(ctx, o.Name, metav1.GetOptions{}); err == nil {
					cur.Status = o.Status
					_, err = c.cs.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
				}
			}
		case *v1.Pod:
			o = o.DeepCopy()
			o.UID = ""
			_, err = c.cs.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
}

// clean deletes every node and pod so the next case starts from nothing.
func (c realCluster) clean(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	zero := int64(0)
	pods, _ := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		_ = c.cs.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	nodes, _ := c.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	for _, n := range nodes.Items {
		_ = c.cs.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
	}
	eventually(t, "cluster emptied", func() bool {
		p, _ := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		n, _ := c.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return len(p.Items) == 0 && len(n.Items) == 0
	})
	c.waitNodes(t, 0)
}

// waitNodes waits until the scheduler's cache holds n nodes: its node and
// pod watches are separate streams, so a pod may otherwise be decided
// before a node created just earlier is known (as in Kubernetes).
func (c realCluster) waitNodes(t *testing.T, n int) {
	t.Helper()
	eventually(t, "scheduler sees the nodes", func() bool { return c.s.cache.NodeCount() == n })
}

func (c realCluster) get(t *testing.T, name string) *v1.Pod {
	t.Helper()
	p, err := c.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func unschedulableMessage(p *v1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

func TestRealAPIServerSchedulingDecisions(t *testing.T) {
	c := startReal(t)
	big := func(name string) *v1.Pod { return newPod(name, requests("3", "1Gi")) }
	tests := []struct {
		name     string
		nodes    []*v1.Node
		existing []*v1.Pod // bound before the pod under test
		pod      *v1.Pod
		want     string // node, or "unschedulable: <reason>"
	}{
		// Filters.
		{"NodeUnschedulable: cordoned node skipped", []*v1.Node{newNode("a", cordoned()), newNode("b")}, nil, newPod("p"), "b"},
		{"TaintToleration: tainted node skipped", []*v1.Node{newNode("a", withTaint("dedicated", "db", v1.TaintEffectNoSchedule)), newNode("b")}, nil, newPod("p"), "b"},
		{"TaintToleration: tolerating pod fits the tainted node",
			[]*v1.Node{newNode("a", withTaint("dedicated", "db", v1.TaintEffectNoSchedule))}, nil,
			newPod("p", toleration("dedicated", "db", v1.TaintEffectNoSchedule)), "a"},
		{"NodeAffinity: nodeSelector", []*v1.Node{newNode("a", withLabels("disk", "hdd")), newNode("b", withLabels("disk", "ssd"))}, nil,
			newPod("p", nodeSelector("disk", "ssd")), "b"},
		{"NodeAffinity: required NotIn", []*v1.Node{newNode("a", withLabels("zone", "z1")), newNode("b", withLabels("zone", "z2"))}, nil,
			newPod("p", requiredAffinity("zone", v1.NodeSelectorOpNotIn, "z2")), "a"},
		{"NodePorts: used host port", []*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{newPod("web", hostPortOpt(8080, ""), nodeSelector("kubernetes.io/hostname", "a"))},
			newPod("p", hostPortOpt(8080, "")), "b"},
		{"NodeResourcesFit: counts bound pods", []*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{big("x")}, // lands on a or b; p must go to the other
			big("p"), "other-than-x"},
		{"NodeResourcesFit: nowhere", []*v1.Node{newNode("a", withAllocatable("1", "1Gi", "10"))}, nil,
			newPod("p", requests("2", "1Gi")), "unschedulable: 0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."},
		{"NodeName: a pod naming its node is not scheduled", []*v1.Node{newNode("a"), newNode("b")}, nil,
			newPod("p", onNode("a")), "a"},
		// Scores.
		{"least allocated", []*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{newPod("x", requests("2", "4Gi"), nodeSelector("kubernetes.io/hostname", "a"))},
			newPod("p", requests("100m", "100Mi")), "b"},
		{"preferred node affinity", []*v1.Node{newNode("a"), newNode("b", withLabels("disk", "ssd"))}, nil,
			newPod("p", preferredAffinity(50, "disk", "ssd")), "b"},
		{"PreferNoSchedule taint avoided", []*v1.Node{newNode("a", withTaint("spot", "true", v1.TaintEffectPreferNoSchedule)), newNode("b")}, nil,
			newPod("p"), "b"},
		{"owner's pods spread", []*v1.Node{newNode("a"), newNode("b")},
			[]*v1.Pod{
				newPod("mine-1", ownedBy("rs-1"), requests("100m", "100Mi"), nodeSelector("kubernetes.io/hostname", "a")),
				newPod("theirs", ownedBy("rs-2"), requests("400m", "400Mi"), nodeSelector("kubernetes.io/hostname", "b")),
			},
			newPod("mine-2", ownedBy("rs-1"), requests("100m", "100Mi")), "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer c.clean(t)
			c.create(t, anySlice(tt.nodes)...)
			c.waitNodes(t, len(tt.nodes))
			for _, p := range tt.existing {
				c.create(t, p)
				eventually(t, "existing pod bound", func() bool { return c.get(t, p.Name).Spec.NodeName != "" })
			}
			c.create(t, tt.pod)
			switch {
			case strings.HasPrefix(tt.want, "unschedulable: "):
				want := strings.TrimPrefix(tt.want, "unschedulable: ")
				eventually(t, "PodScheduled=False "+want, func() bool { return unschedulableMessage(c.get(t, tt.pod.Name)) == want })
			case tt.want == "other-than-x":
				eventually(t, "bound", func() bool { return c.get(t, tt.pod.Name).Spec.NodeName != "" })
				if got, x := c.get(t, tt.pod.Name).Spec.NodeName, c.get(t, "x").Spec.NodeName; got == x {
					t.Fatalf("both 3-CPU pods on %s (4 CPUs)", got)
				}
			default:
				eventually(t, "bound", func() bool { return c.get(t, tt.pod.Name).Spec.NodeName != "" })
				if got := c.get(t, tt.pod.Name).Spec.NodeName; got != tt.want {
					t.Fatalf("bound to %s, want %s", got, tt.want)
				}
			}
		})
	}
}

func anySlice[T any](in []T) []any {
	out := make([]any, len(in))
	for i := range in {
		out[i] = in[i]
	}
	return out
}

func TestRealAPIServerUnschedulableThenScheduledWhenANodeAppears(t *testing.T) {
	c := startReal(t)
	c.create(t, newNode("gpu-less"), newPod("trainer", nodeSelector("gpu", "true")))
	eventually(t, "Unschedulable condition", func() bool {
		return unschedulableMessage(c.get(t, "trainer")) == "0/1 nodes are available: 1 "+reasonAffinity+". preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
	})
	eventually(t, "FailedScheduling event", func() bool {
		evs, err := c.cs.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "FailedScheduling" && e.InvolvedObject.Name == "trainer" && e.Type == v1.EventTypeWarning {
				return true
			}
		}
		return false
	})
	c.create(t, newNode("gpu-1", withLabels("gpu", "true")))
	eventually(t, "bound to the new node", func() bool { return c.get(t, "trainer").Spec.NodeName == "gpu-1" })
	p := c.get(t, "trainer")
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodScheduled && cond.Status != v1.ConditionTrue {
			t.Fatalf("PodScheduled = %s after binding", cond.Status)
		}
	}
	eventually(t, "Scheduled event", func() bool {
		evs, _ := c.cs.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		for _, e := range evs.Items {
			if e.Reason == "Scheduled" && e.InvolvedObject.Name == "trainer" && strings.Contains(e.Message, "gpu-1") {
				return true
			}
		}
		return false
	})
}

func TestRealAPIServerFillsNodesWithoutOverbooking(t *testing.T) {
	c := startReal(t)
	// 3 nodes × 4 CPUs, 15 pods of 1 CPU: exactly 12 fit, never 5 on a node.
	for i := range 3 {
		c.create(t, newNode(fmt.Sprintf("n%d", i)))
	}
	for i := range 15 {
		c.create(t, newPod(fmt.Sprintf("p%02d", i), requests("1", "100Mi")))
	}
	perNode := map[string]int{}
	eventually(t, "12 pods bound, 3 unschedulable", func() bool {
		pods, err := c.cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		clear(perNode)
		unsched := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				perNode[p.Spec.NodeName]++
			} else if unschedulableMessage(&p) != "" {
				unsched++
			}
		}
		return perNode["n0"]+perNode["n1"]+perNode["n2"] == 12 && unsched == 3
	})
	for n, k := range perNode {
		if k != 4 {
			t.Fatalf("node %s got %d pods of 1 CPU (allocatable 4): %v", n, k, perNode)
		}
	}
	// Binding a bound pod again is refused by the API server: a second
	// scheduler with a stale view cannot double-book.
	err := c.cs.CoreV1().Pods("default").Bind(context.Background(), &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: "p00"}, Target: v1.ObjectReference{Kind: "Node", Name: "n0"},
	}, metav1.CreateOptions{})
	if !apierrors.IsConflict(err) {
		t.Fatalf("second binding: %v, want Conflict", err)
	}
}

func TestRealAPIServerSchedulerFailover(t *testing.T) {
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	c := realCluster{cs: cs}
	cfg := func(id string) Config {
		return Config{
			RestConfig: rc, Log: quietLog(),
			PodInitialBackoff: 100 * time.Millisecond, PodMaxBackoff: time.Second,
			LeaderElection: leaderelect.Config{Enabled: true, LeaseName: "kube-scheduler", LeaseNamespace: "kube-system", Identity: id,
				LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond},
		}
	}
	start := func(id string) (context.CancelFunc, chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, cfg(id)) }()
		t.Cleanup(func() { cancel(); <-done })
		return cancel, done
	}
	holder := func() string {
		l, err := cs.CoordinationV1().Leases("kube-system").Get(context.Background(), "kube-scheduler", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}

	c.create(t, newNode("n1"))
	cancelA, doneA := start("sched-a")
	eventually(t, "sched-a leads", func() bool { return holder() == "sched-a" })
	_, _ = start("sched-b")
	c.create(t, newPod("before"))
	eventually(t, "pod scheduled by the leader", func() bool { return c.get(t, "before").Spec.NodeName == "n1" })

	cancelA()
	if err := <-doneA; err != nil {
		t.Fatalf("sched-a's Run = %v", err)
	}
	doneA <- nil // for the cleanup
	c.create(t, newPod("after"))
	eventually(t, "sched-b leads", func() bool { return holder() == "sched-b" })
	eventually(t, "pod scheduled by the new leader", func() bool { return c.get(t, "after").Spec.NodeName == "n1" })
}

// TestRealAPIServerDaemonServesAuthenticatedHTTPS runs the daemon as
// `waggle scheduler` does, with its own kubeconfig (system:kube-scheduler),
// and checks its port as kube-scheduler's behaves: HTTPS with a
// self-signed certificate, the health paths open to anyone, /metrics
// only to identities that RBAC lets get the nonResourceURL, judged by the
// API server through TokenReview and SubjectAccessReview (which the
// scheduler's bootstrap role lets it create).
func TestRealAPIServerDaemonServesAuthenticatedHTTPS(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Kubeconfig: filepath.Join(srv.DataDir, "scheduler.kubeconfig"), LogLevel: "error",
			SecureServing:  secureserving.Options{Listener: ln, AlwaysAllowPaths: []string{"/healthz", "/readyz", "/livez"}},
			LeaderElection: leaderelect.Config{Enabled: false}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	client := func(mod func(*tls.Config)) *http.Client {
		c := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // a self-signed component port, as upstream's probes
		if mod != nil {
			mod(c)
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
	}
	get := func(c *http.Client, path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	anon := client(nil)
	eventually(t, "/readyz ok to anonymous over HTTPS", func() bool { code, _ := get(anon, "/readyz", ""); return code == http.StatusOK })
	for _, p := range []string{"/healthz", "/livez"} {
		if code, body := get(anon, p, ""); code != http.StatusOK || body != "ok" {
			t.Fatalf("%s = %d %q", p, code, body)
		}
	}
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP /healthz = %d, want the TLS server's 400", resp.StatusCode)
		}
	}
	// The serving certificate is the generated one, for localhost.
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // inspecting it
	if err != nil {
		t.Fatal(err)
	}
	leaf := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	if err := leaf.VerifyHostname("localhost"); err != nil {
		t.Fatalf("serving certificate: %v", err)
	}

	// Anonymous is authenticated as system:anonymous and forbidden (403);
	// a token the API server does not accept is 401, as upstream.
	if code, body := get(anon, "/metrics", ""); code != http.StatusForbidden || !strings.Contains(body, `User \"system:anonymous\" cannot get path \"/metrics\"`) {
		t.Fatalf("anonymous /metrics = %d %s", code, body)
	}
	if code, body := get(anon, "/metrics", "not-a-token"); code != http.StatusUnauthorized {
		t.Fatalf("bad token /metrics = %d %s", code, body)
	}

	admin, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := realCluster{cs: admin}
	bg := context.Background()
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sp-metrics-reader", Namespace: "default"}}
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(bg, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(bg, sa.Name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := tr.Status.Token
	// A client certificate of the cluster CA (the client-ca-file of
	// kube-system/extension-apiserver-authentication) is a user too.
	uc := srv.UserConfig(t, "sp-cert-user")
	cert, err := tls.X509KeyPair(uc.CertData, uc.KeyData)
	if err != nil {
		t.Fatal(err)
	}
	certClient := client(func(c *tls.Config) { c.Certificates = []tls.Certificate{cert} })
	if code, body := get(anon, "/metrics", token); code != http.StatusForbidden || !strings.Contains(body, "system:serviceaccount:default:sp-metrics-reader") {
		t.Fatalf("ungranted ServiceAccount /metrics = %d %s", code, body)
	}
	// The client CA is loaded from the ConfigMap asynchronously after the
	// server starts: until then a certificate reads as anonymous.
	testutil.Eventually(t, 10*time.Second, func() error {
		if code, body := get(certClient, "/metrics", ""); code != http.StatusForbidden || !strings.Contains(body, "sp-cert-user") {
			return fmt.Errorf("ungranted client certificate /metrics = %d %s", code, body)
		}
		return nil
	})

	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "sp-metrics-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	if _, err := admin.RbacV1().ClusterRoles().Create(bg, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "sp-metrics-reader"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: sa.Name},
			{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "sp-cert-user"}}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(bg, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The delegating authorizer caches a denial for 10 s.
	eventually(t, "granted ServiceAccount reads /metrics", func() bool { code, _ := get(anon, "/metrics", token); return code == http.StatusOK })
	eventually(t, "granted client certificate reads /metrics", func() bool { code, _ := get(certClient, "/metrics", ""); return code == http.StatusOK })

	c.create(t, newNode("n1"), newPod("p"))
	eventually(t, "pod bound by the daemon", func() bool { return c.get(t, "p").Spec.NodeName == "n1" })
	eventually(t, "metrics", func() bool {
		_, body := get(anon, "/metrics", token)
		return strings.Contains(body, `scheduler_schedule_attempts_total{result="scheduled"} 1`) &&
			strings.Contains(body, `scheduler_pending_pods{queue="unschedulable"} 0`) &&
			strings.Contains(body, "scheduler_scheduling_attempt_duration_seconds_bucket")
	})
}

func TestRealAPIServerTwoSchedulersSideBySide(t *testing.T) {
	c := startReal(t) // default-scheduler
	factory := informers.NewSharedInformerFactory(c.cs, 0)
	second, err := New(c.cs, factory, quietLog(), Options{SchedulerName: "batch-scheduler"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { second.Run(ctx); close(done) }()
	stopSecond := func() { cancel(); <-done; factory.Shutdown() }
	t.Cleanup(stopSecond)

	c.create(t, newNode("n1"))
	batch := func(p *v1.Pod) { p.Spec.SchedulerName = "batch-scheduler" }
	nobody := func(p *v1.Pod) { p.Spec.SchedulerName = "absent-scheduler" }
	c.create(t, newPod("web"), newPod("job", batch), newPod("orphan", nobody))
	eventually(t, "each scheduler binds its own pod", func() bool {
		return c.get(t, "web").Spec.NodeName == "n1" && c.get(t, "job").Spec.NodeName == "n1"
	})
	stopSecond()
	c.create(t, newPod("job-2", batch))
	// The default scheduler sees job-2 before web-2, created after it: once
	// web-2 is bound, job-2 would have been too.
	c.create(t, newPod("web-2"))
	eventually(t, "default-scheduler binds a pod created after job-2", func() bool { return c.get(t, "web-2").Spec.NodeName == "n1" })
	if n := c.get(t, "job-2").Spec.NodeName; n != "" {
		t.Fatalf("default-scheduler bound a batch-scheduler pod to %s", n)
	}
	if n := c.get(t, "orphan").Spec.NodeName; n != "" {
		t.Fatalf("a pod naming no running scheduler was bound to %s", n)
	}
}
