package nodelifecycle

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func TestEvictionDelay(t *testing.T) {
	now := time.Unix(10000, 0)
	added := metav1.NewTime(now.Add(-10 * time.Second))
	unreachable := corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: &added}
	notReady := corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute, TimeAdded: &added}
	tol := func(key string, secs *int64) corev1.Toleration {
		return corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: secs}
	}
	tests := []struct {
		name   string
		taints []corev1.Taint
		tols   []corev1.Toleration
		evict  bool
		delay  time.Duration
	}{
		{"no taints: stays", nil, nil, false, 0},
		{"untolerated taint: now", []corev1.Taint{unreachable}, nil, true, 0},
		{"tolerated forever: stays", []corev1.Taint{unreachable}, []corev1.Toleration{tol(corev1.TaintNodeUnreachable, nil)}, false, 0},
		{"tolerated 300 s, tainted 10 s ago: 290 s", []corev1.Taint{unreachable}, []corev1.Toleration{tol(corev1.TaintNodeUnreachable, ptr.To[int64](300))}, true, 290 * time.Second},
		{"tolerated 5 s, tainted 10 s ago: now", []corev1.Taint{unreachable}, []corev1.Toleration{tol(corev1.TaintNodeUnreachable, ptr.To[int64](5))}, true, 0},
		{"one of two taints untolerated: now", []corev1.Taint{unreachable, notReady}, []corev1.Toleration{tol(corev1.TaintNodeUnreachable, nil)}, true, 0},
		{"shortest toleration wins", []corev1.Taint{unreachable, notReady},
			[]corev1.Toleration{tol(corev1.TaintNodeUnreachable, ptr.To[int64](100)), tol(corev1.TaintNodeNotReady, ptr.To[int64](30))}, true, 20 * time.Second},
		{"NoSchedule toleration does not tolerate NoExecute", []corev1.Taint{unreachable},
			[]corev1.Toleration{{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}, true, 0},
		{"wildcard toleration tolerates everything", []corev1.Taint{unreachable, notReady}, []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{Tolerations: tt.tols}}
			d, evict := evictionDelay(pod, tt.taints, now)
			if evict != tt.evict || d != tt.delay {
				t.Fatalf("evictionDelay = %v, %v; want %v, %v", d, evict, tt.delay, tt.evict)
			}
		})
	}
}

type cluster struct {
	cs *fake.Clientset
}

func startCluster(t *testing.T) cluster {
	t.Helper()
	cs := fake.NewClientset()
	watches := testutil.TrackWatches(cs)
	f := informers.NewSharedInformerFactory(cs, 0)
	// Renewals come every 100 ms: a grace of 1.5 s leaves a healthy node
	// Ready even when the race detector and a loaded machine delay a
	// renewal by a second (400 ms was missed under go test -race).
	c := New(cs, f, slog.New(slog.DiscardHandler), Options{
		NodeMonitorGracePeriod: 1500 * time.Millisecond, NodeMonitorPeriod: 100 * time.Millisecond, NodeStartupGracePeriod: 1500 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })
	watches.WaitOpen(t, 3, 10*time.Second) // nodes, leases, pods
	return cluster{cs}
}

func (c cluster) createNode(t *testing.T, name string, ready corev1.ConditionStatus) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: ready, LastHeartbeatTime: metav1.Now(), Reason: "KubeletReady"},
	}}}
	if _, err := c.cs.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if _, err := c.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (c cluster) renew(t *testing.T, name string) {
	t.Helper()
	l, err := c.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if _, err := c.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (c cluster) node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := c.cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (c cluster) createPod(t *testing.T, name, node string, tols ...corev1.Toleration) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:   corev1.PodSpec{NodeName: node, Tolerations: tols},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	if _, err := c.cs.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (c cluster) podExists(t *testing.T, name string) bool {
	t.Helper()
	_, err := c.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, what, cond)
}

func taintKeys(n *corev1.Node) []string {
	var out []string
	for _, t := range n.Spec.Taints {
		out = append(out, t.Key+":"+string(t.Effect))
	}
	slices.Sort(out)
	return out
}

func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	if r := readyCondition(n); r != nil {
		return r.Status
	}
	return ""
}

func TestSilentNodeBecomesUnknownTaintedAndItsPodsEvicted(t *testing.T) {
	c := startCluster(t)
	c.createNode(t, "alive", corev1.ConditionTrue)
	c.createNode(t, "dying", corev1.ConditionTrue)
	unreachable := func(secs *int64) corev1.Toleration {
		return corev1.Toleration{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: secs}
	}
	c.createPod(t, "intolerant", "dying")
	c.createPod(t, "patient", "dying", unreachable(ptr.To[int64](1)))
	c.createPod(t, "forever", "dying", unreachable(nil))
	c.createPod(t, "elsewhere", "alive")

	// "alive" keeps renewing its Lease; "dying" never does.
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				c.renew(t, "alive")
			}
		}
	}()
	defer func() { close(stop); <-renewed }()

	waitFor(t, "dying marked Unknown", func() bool { return readyStatus(c.node(t, "dying")) == corev1.ConditionUnknown })
	waitFor(t, "unreachable taints", func() bool {
		return slices.Equal(taintKeys(c.node(t, "dying")), []string{"node.kubernetes.io/unreachable:NoExecute", "node.kubernetes.io/unreachable:NoSchedule"})
	})
	waitFor(t, "intolerant pod evicted", func() bool { return !c.podExists(t, "intolerant") })
	if !c.podExists(t, "patient") {
		t.Fatal("pod tolerating 1 s was evicted at once")
	}
	waitFor(t, "patient pod evicted after its tolerationSeconds", func() bool { return !c.podExists(t, "patient") })
	if !c.podExists(t, "forever") || !c.podExists(t, "elsewhere") {
		t.Fatal("evicted a pod tolerating the taint forever, or one on a healthy node")
	}
	waitFor(t, "pod on the silent node marked not ready", func() bool { return podReady(t, c, "forever") == corev1.ConditionFalse })
	if podReady(t, c, "elsewhere") != corev1.ConditionTrue {
		t.Fatal("pod on a healthy node marked not ready")
	}
	if n := c.node(t, "alive"); readyStatus(n) != corev1.ConditionTrue || len(n.Spec.Taints) != 0 {
		t.Fatalf("renewing node changed: ready %s taints %v", readyStatus(n), taintKeys(n))
	}

	// The kubelet comes back and posts Ready=True: the taints go.
	n := c.node(t, "dying")
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status = corev1.ConditionTrue
			n.Status.Conditions[i].LastHeartbeatTime = metav1.Now()
		}
	}
	if _, err := c.cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.renew(t, "dying")
	waitFor(t, "taints removed after the node came back", func() bool { return len(c.node(t, "dying").Spec.Taints) == 0 })
}

func TestKubeletReportingNotReadyGetsNotReadyTaints(t *testing.T) {
	c := startCluster(t)
	c.createNode(t, "sick", corev1.ConditionFalse)
	waitFor(t, "not-ready taints", func() bool {
		return slices.Equal(taintKeys(c.node(t, "sick")), []string{"node.kubernetes.io/not-ready:NoExecute", "node.kubernetes.io/not-ready:NoSchedule"})
	})
	if readyStatus(c.node(t, "sick")) != corev1.ConditionFalse {
		t.Fatal("a node reporting recently was marked Unknown")
	}
}

func TestNodeThatNeverReportedIsMarkedUnknownAfterStartupGrace(t *testing.T) {
	c := startCluster(t)
	if _, err := c.cs.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "mute"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Ready=Unknown added", func() bool {
		r := readyCondition(c.node(t, "mute"))
		return r != nil && r.Status == corev1.ConditionUnknown && r.Reason == "NodeStatusNeverUpdated"
	})
}

func podReady(t *testing.T, c cluster, name string) corev1.ConditionStatus {
	t.Helper()
	p, err := c.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status
		}
	}
	return ""
}
