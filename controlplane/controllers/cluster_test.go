package controllers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/leaderelect"
	"github.com/waggle-io/waggle/internal/testutil"
)

// childEnv, when set, makes the test binary run a controller-manager instead
// of the tests (see TestMain): a separate process the failover test can kill.
const childEnv = "WAGGLE_TEST_CHILD_CONTROLLER_MANAGER"

func TestMain(m *testing.M) {
	if id := os.Getenv(childEnv); id != "" {
		os.Exit(runChild(id))
	}
	os.Exit(m.Run())
}

// runChild runs a controller-manager with the fast test lease, against the
// kubeconfig in $KUBECONFIG, until SIGTERM (or SIGKILL).
func runChild(identity string) int {
	cfg := DefaultConfig()
	cfg.Kubeconfig = os.Getenv("KUBECONFIG")
	cfg.SecureServing.SecurePort = 0
	cfg.LeaderElection = fastLease(identity)
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("manager", identity)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startChild starts a controller-manager process (this test binary in
// child mode) and returns it; the test's cleanup kills it.
func (c *cluster) startChild(identity string) *exec.Cmd {
	c.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+identity, "KUBECONFIG="+c.kubeconfig)
	if os.Getenv("WAGGLE_TEST_CONTROLLER_LOG") != "" {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// cluster is a real API server (embedded etcd, HTTPS) with simulated nodes,
// for the controller-manager's integration tests.
type cluster struct {
	t          testing.TB
	rc         *rest.Config
	cs         kubernetes.Interface
	kubeconfig string
	kubectl    string
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	testutil.Privileged(t)
	rc, dir, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{t: t, rc: rc, cs: cs, kubeconfig: filepath.Join(dir, "admin.kubeconfig")}
}

func testLogger(t testing.TB, name string) *slog.Logger {
	if os.Getenv("WAGGLE_TEST_CONTROLLER_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("manager", name)
	}
	return slog.New(slog.DiscardHandler)
}

// fastLease is leader election shortened for the failover test.
func fastLease(identity string) leaderelect.Config {
	return leaderelect.Config{Enabled: true, LeaseName: "kube-controller-manager", LeaseNamespace: "kube-system",
		Identity: identity, LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond}
}

// defaultLease is the production lease timing: on a loaded machine (a
// -race run) a 2 s renew deadline can pass, and a manager that loses its
// lease exits, as kube-controller-manager does.
func defaultLease(identity string) leaderelect.Config {
	cfg := DefaultConfig().LeaderElection
	cfg.Identity = identity
	return cfg
}

type manager struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
	cut    *cutTransport
}

// cutTransport fails every request while cut: a partitioned or paused
// process, whose lease renewals and writes no longer reach the API server.
type cutTransport struct {
	rt  http.RoundTripper
	cut atomic.Bool
}

func (c *cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("test: network cut")
	}
	return c.rt.RoundTrip(r)
}

// startManager runs a controller-manager against the cluster until the test
// ends (or stop is called).
func (c *cluster) startManager(identity string, mod func(*Config)) *manager {
	c.t.Helper()
	cfg := DefaultConfig()
	cut := &cutTransport{}
	rc := rest.CopyConfig(c.rc)
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { cut.rt = rt; return cut }
	cfg.RestConfig = rc
	cfg.SecureServing.SecurePort = 0
	cfg.LeaderElection = defaultLease(identity)
	cfg.Log = testLogger(c.t, identity)
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &manager{cancel: cancel, done: make(chan error, 1), cut: cut}
	go func() { m.done <- Run(ctx, cfg) }()
	c.t.Cleanup(func() { _ = m.stop() })
	return m
}

// stop cancels the manager and returns what Run returned.
func (m *manager) stop() error {
	m.once.Do(func() {
		m.cancel()
		select {
		case m.err = <-m.done:
		case <-time.After(20 * time.Second):
			m.err = errors.New("controller-manager did not stop within 20s")
		}
	})
	return m.err
}

// run runs kubectl against the cluster and returns its combined output.
func (c *cluster) run(args ...string) (string, error) {
	if c.kubectl == "" {
		c.kubectl = testutil.RequiresBinary(c.t, "kubectl")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *cluster) kubectlOK(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	for i := 0; err != nil && i < 5 && strings.Contains(out, "storage unavailable"); i++ {
		// The API server's watch cache lagging behind etcd is its
		// business; retry as a user would.
		c.t.Logf("kubectl %s: %s (retrying)", strings.Join(args, " "), strings.TrimSpace(out))
		time.Sleep(time.Second) // back-off between a user's retries
		out, err = c.run(args...)
	}
	if err != nil {
		c.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// kubelets simulates nodes: it binds every pending pod to a node, gives it
// an IP, marks it Running and (if ready says so) Ready, and finalizes pods
// being deleted, as kubelets would.
type kubelets struct {
	c     *cluster
	nodes []string
	mu    sync.Mutex
	ready func(*corev1.Pod) bool
	next  int
	ips   int
}

func (c *cluster) startKubelets(ctx context.Context, nodes int, ready func(*corev1.Pod) bool) *kubelets {
	c.t.Helper()
	k := &kubelets{c: c, ready: ready}
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("node-%d", i)
		k.nodes = append(k.nodes, name)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			corev1.LabelHostname: name, corev1.LabelTopologyZone: fmt.Sprintf("zone-%d", i%2)}}}
		if _, err := c.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			c.t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactory(c.cs, 0)
	inf := f.Core().V1().Pods().Informer()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { go k.handle(ctx, obj.(*corev1.Pod)) },
		UpdateFunc: func(_, cur any) { go k.handle(ctx, cur.(*corev1.Pod)) },
	})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	c.t.Cleanup(func() { cancel(); f.Shutdown() })
	return k
}

func (k *kubelets) setReady(f func(*corev1.Pod) bool) {
	k.mu.Lock()
	k.ready = f
	k.mu.Unlock()
}

func (k *kubelets) handle(ctx context.Context, pod *corev1.Pod) {
	api := k.c.cs.CoreV1().Pods(pod.Namespace)
	if pod.DeletionTimestamp != nil {
		zero := int64(0)
		_ = api.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		return
	}
	k.mu.Lock()
	ready := k.ready == nil || k.ready(pod)
	node := k.nodes[k.next%len(k.nodes)]
	k.next++
	k.ips++
	ip := fmt.Sprintf("10.244.%d.%d", k.ips/250, k.ips%250+1)
	k.mu.Unlock()
	if pod.Spec.NodeName == "" {
		if target := targetNode(pod); target != "" {
			node = target
		}
		err := api.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
			Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{})
		if err != nil {
			return // the next event retries
		}
		return
	}
	cur := podReady(pod)
	if pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" && cur == ready {
		return
	}
	p := pod.DeepCopy()
	p.Status.Phase = corev1.PodRunning
	if p.Status.PodIP == "" {
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	if p.Status.StartTime == nil {
		// As a kubelet: the pod's start, which the HPA's CPU
		// initialization period counts from.
		now := metav1.Now()
		p.Status.StartTime = &now
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	now := metav1.Now()
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: st, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: st, LastTransitionTime: now},
	}
	_, _ = api.UpdateStatus(ctx, p, metav1.UpdateOptions{})
}

func targetNode(p *corev1.Pod) string {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// eventually polls cond until it returns nil, or fails the test after
// timeout with cond's last error.
func eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	testutil.Eventually(t, timeout, cond)
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

var errNotYet = errors.New("not yet")

func uidPtr(u types.UID) *types.UID { return &u }
