package nodelifecycle

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

// A simulated kubelet: a Node whose status says Ready and a Lease in
// kube-node-lease that the test renews.
func simulateNode(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](1), RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if _, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func renewLease(cs kubernetes.Interface, name string) error {
	ctx := context.Background()
	l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	_, err = cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, l, metav1.UpdateOptions{})
	return err
}

func TestRealAPIServerNodeFailureEvictsPodsAndRecoveryRemovesTaints(t *testing.T) {
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	simulateNode(t, cs, "healthy")
	simulateNode(t, cs, "failing")

	mkPod := func(name, node string, tols ...corev1.Toleration) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: node, Tolerations: tols, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		p, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The kubelet reports it running and ready.
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	unreachableFor := func(secs int64) corev1.Toleration {
		return corev1.Toleration{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &secs}
	}
	mkPod("at-once", "failing", unreachableFor(0))
	mkPod("after-2s", "failing", unreachableFor(2))
	mkPod("defaults", "failing") // admission adds the 300 s tolerations
	mkPod("bystander", "healthy", unreachableFor(0))

	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler), Options{
		NodeMonitorGracePeriod: 1500 * time.Millisecond, NodeMonitorPeriod: 200 * time.Millisecond, NodeStartupGracePeriod: 1500 * time.Millisecond,
	})
	cctx, cancel := context.WithCancel(ctx)
	f.Start(cctx.Done())
	done := make(chan struct{})
	go func() { c.Run(cctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })

	// "healthy" renews its Lease, "failing" has stopped.
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
				_ = renewLease(cs, "healthy")
			}
		}
	}()
	defer func() { close(stop); <-stopped }()

	node := func(name string) *corev1.Node {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// evicted: deleted, or (the node's kubelet being gone) terminating.
	evicted := func(name string) bool {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		return p.DeletionTimestamp != nil
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		testutil.WaitFor(t, 30*time.Second, what, cond)
	}

	wait("failing node Ready=Unknown", func() bool { return readyStatus(node("failing")) == corev1.ConditionUnknown })
	wait("unreachable taints", func() bool {
		return slices.Equal(taintKeys(node("failing")), []string{"node.kubernetes.io/unreachable:NoExecute", "node.kubernetes.io/unreachable:NoSchedule"})
	})
	wait("pod tolerating 0 s evicted", func() bool { return evicted("at-once") })
	if evicted("after-2s") {
		t.Fatal("pod tolerating 2 s was evicted at once")
	}
	wait("pod tolerating 2 s evicted", func() bool { return evicted("after-2s") })
	if evicted("defaults") || evicted("bystander") {
		t.Fatal("evicted a pod within its 300 s default toleration, or one on the healthy node")
	}
	ready := func(name string) corev1.ConditionStatus {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status
			}
		}
		return ""
	}
	wait("pod kept on the failing node marked not ready", func() bool { return ready("defaults") == corev1.ConditionFalse })
	if ready("bystander") != corev1.ConditionTrue {
		t.Fatal("pod on the healthy node marked not ready")
	}
	if n := node("healthy"); readyStatus(n) != corev1.ConditionTrue || len(n.Spec.Taints) != 0 {
		t.Fatalf("healthy node: ready %s, taints %v", readyStatus(n), taintKeys(n))
	}

	// The kubelet comes back: it posts Ready=True and renews its Lease.
	n := node("failing")
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
		}
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := renewLease(cs, "failing"); err != nil {
		t.Fatal(err)
	}
	wait("taints removed after recovery", func() bool { return len(node("failing").Spec.Taints) == 0 })
}

// TaintNodesByCondition: the kubelet's pressure conditions become NoSchedule
// taints while True and go once False; the Ready taints, a user's taint and
// the pods on the node are left alone.
func TestRealAPIServerPressureConditionsTaintNodeNoSchedule(t *testing.T) {
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	simulateNode(t, cs, "pressured")
	n, err := cs.CoreV1().Nodes().Get(ctx, "pressured", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = []corev1.Taint{{Key: "example.com/mine", Value: "x", Effect: corev1.TaintEffectNoSchedule}}
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "resident", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "pressured", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler), Options{NodeMonitorPeriod: 200 * time.Millisecond})
	cctx, cancel := context.WithCancel(ctx)
	f.Start(cctx.Done())
	done := make(chan struct{})
	go func() { c.Run(cctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })

	// The kubelet posts its conditions (and so its heartbeat).
	post := func(mem, disk, pid corev1.ConditionStatus) {
		t.Helper()
		n, err := cs.CoreV1().Nodes().Get(ctx, "pressured", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now},
			{Type: corev1.NodeMemoryPressure, Status: mem, LastHeartbeatTime: now, LastTransitionTime: now},
			{Type: corev1.NodeDiskPressure, Status: disk, LastHeartbeatTime: now, LastTransitionTime: now},
			{Type: corev1.NodePIDPressure, Status: pid, LastHeartbeatTime: now, LastTransitionTime: now},
		}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := renewLease(cs, "pressured"); err != nil {
			t.Fatal(err)
		}
	}
	taints := func() []string {
		n, err := cs.CoreV1().Nodes().Get(ctx, "pressured", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return taintKeys(n)
	}
	wait := func(what string, want ...string) {
		t.Helper()
		testutil.WaitFor(t, 30*time.Second, what, func() bool { return slices.Equal(taints(), want) })
	}

	post(corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionFalse)
	wait("memory and disk pressure taints", "example.com/mine:NoSchedule",
		"node.kubernetes.io/disk-pressure:NoSchedule", "node.kubernetes.io/memory-pressure:NoSchedule")
	post(corev1.ConditionFalse, corev1.ConditionTrue, corev1.ConditionTrue)
	wait("memory-pressure gone, pid-pressure added", "example.com/mine:NoSchedule",
		"node.kubernetes.io/disk-pressure:NoSchedule", "node.kubernetes.io/pid-pressure:NoSchedule")
	post(corev1.ConditionFalse, corev1.ConditionFalse, corev1.ConditionFalse)
	wait("pressure taints removed", "example.com/mine:NoSchedule")
	// NoSchedule taints never evict: the pod is still there.
	got, err := cs.CoreV1().Pods("default").Get(ctx, "resident", metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp != nil {
		t.Fatalf("the pod on the pressured node was evicted: %v %v", err, got.DeletionTimestamp)
	}
}
