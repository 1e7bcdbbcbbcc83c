package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/kubelet/network"
	"github.com/waggle-io/waggle/kubelet/runtime"
	"github.com/waggle-io/waggle/kubelet/runtime/runtimetest"
)

const node = "n1"

type harness struct {
	t   *testing.T
	k   *Kubelet
	cs  *fake.Clientset
	rt  *runtimetest.Fake
	net *network.Hollow
	// netMgr, when set, is the network the kubelet gets instead of net.
	netMgr network.Manager
	cancel context.CancelFunc
	done   chan error
	cfg    Config
}

func newHarness(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	return newHarnessWithNet(t, mutate, nil)
}

// newHarnessWithNet starts a harness whose kubelet's network is wrap(net)
// (nil: net itself).
func newHarnessWithNet(t *testing.T, mutate func(*Config), wrap func(*network.Hollow) network.Manager) *harness {
	t.Helper()
	h := &harness{t: t, cs: fake.NewSimpleClientset(), rt: runtimetest.NewFake(), net: network.NewHollow(netipPrefix("10.9.0.0/24"))}
	if wrap != nil {
		h.netMgr = wrap(h.net)
	}
	h.cfg = Config{NodeName: node, RootDir: t.TempDir(), Port: 0, Address: "127.0.0.1", DisableRouteController: true,
		SyncFrequency: 50 * time.Millisecond, BackoffBase: 300 * time.Millisecond, BackoffMax: 2 * time.Second,
		NodeLabels: map[string]string{"tier": "test"}, RegisterWithTaints: []string{"dedicated=x:NoSchedule"}}
	if mutate != nil {
		mutate(&h.cfg)
	}
	h.start()
	return h
}

func (h *harness) start() {
	h.t.Helper()
	var nm network.Manager = h.net
	if h.netMgr != nil {
		nm = h.netMgr
	}
	k, err := New(h.cfg, Deps{Client: h.cs, Runtime: h.rt, Network: nm})
	if err != nil {
		h.t.Fatal(err)
	}
	h.k = k
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- k.Run(ctx) }()
	h.t.Cleanup(h.stop)
	waitFor(h.t, 5*time.Second, "node registered", func() (bool, string) {
		_, err := h.cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		return err == nil && k.sourcesReady.Load(), fmt.Sprint(err)
	})
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("kubelet Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		h.t.Error("kubelet did not stop")
	}
	h.cancel = nil
}

// syncedAgain waits until the pod workers have synced n more times than
// now: the marker that the kubelet looked at every pod again, which a
// negative check ("nothing restarted") waits for first.
func (h *harness) syncedAgain(n int) {
	h.t.Helper()
	from := promtest.ToFloat64(h.k.metrics.syncs)
	waitFor(h.t, 30*time.Second, fmt.Sprintf("%d more pod syncs", n), func() (bool, string) {
		got := promtest.ToFloat64(h.k.metrics.syncs) - from
		return got >= float64(n), fmt.Sprintf("%v syncs", got)
	})
}

func waitFor(t *testing.T, d time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	testutil.Eventually(t, d, func() error {
		if ok, msg := f(); !ok {
			return fmt.Errorf("waiting for %s: %s", what, msg)
		}
		return nil
	})
}

func echoPod(name string, mutate func(*v1.Pod)) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Labels: map[string]string{"app": name}},
		Spec: v1.PodSpec{NodeName: node, RestartPolicy: v1.RestartPolicyAlways, Containers: []v1.Container{{
			Name: "echo", Image: "waggle.local/waggle-echo:dev", ImagePullPolicy: v1.PullIfNotPresent,
		}}},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func (h *harness) create(p *v1.Pod) {
	h.t.Helper()
	if _, err := h.cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) pod(name string) *v1.Pod {
	p, err := h.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return &v1.Pod{}
	}
	return p
}

func (h *harness) waitPod(name, what string, f func(*v1.Pod) bool) *v1.Pod {
	h.t.Helper()
	var p *v1.Pod
	waitFor(h.t, 10*time.Second, name+" "+what, func() (bool, string) {
		p = h.pod(name)
		return f(p), fmt.Sprintf("phase=%s conditions=%v containers=%+v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	})
	return p
}

func cond(p *v1.Pod, t v1.PodConditionType) v1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

func running(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodRunning && cond(p, v1.PodReady) == v1.ConditionTrue
}

func (h *harness) containersOf(name string) []runtime.Container {
	list, _ := h.rt.ListContainers(context.Background())
	var out []runtime.Container
	for _, c := range list {
		if c.PodName == name {
			out = append(out, c)
		}
	}
	return out
}

func (h *harness) current(name, container string) runtime.Container {
	h.t.Helper()
	l := byName(h.containersOf(name))[container]
	if len(l) == 0 {
		h.t.Fatalf("no container %s in pod %s", container, name)
	}
	return l[0]
}

func netipPrefix(s string) (p netipPrefixT) { return mustPrefix(s) }

func TestNodeRegistersWithLabelsTaintsCapacityAndLease(t *testing.T) {
	h := newHarness(t, nil)
	n, err := h.cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "tier": "test"} {
		if n.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], want)
		}
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "dedicated" || n.Spec.Taints[0].Effect != v1.TaintEffectNoSchedule {
		t.Errorf("taints = %v", n.Spec.Taints)
	}
	for _, r := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourcePods, v1.ResourceEphemeralStorage} {
		q, ok := n.Status.Capacity[r]
		if !ok || q.IsZero() {
			t.Errorf("capacity %s = %v", r, q.String())
		}
		if _, ok := n.Status.Allocatable[r]; !ok {
			t.Errorf("allocatable has no %s", r)
		}
	}
	if q := n.Status.Capacity[v1.ResourcePods]; q.Value() != 110 {
		t.Errorf("pods capacity = %s", q.String())
	}
	if cond := n.Status.Conditions; len(cond) < 4 {
		t.Errorf("conditions = %v", cond)
	}
	var ready bool
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
			ready = true
		}
	}
	if !ready {
		t.Errorf("node not Ready: %v", n.Status.Conditions)
	}
	if n.Status.NodeInfo.ContainerRuntimeVersion != "fake://0.0.0" || n.Status.NodeInfo.KernelVersion == "" {
		t.Errorf("node info = %+v", n.Status.NodeInfo)
	}
	if n.Status.DaemonEndpoints.KubeletEndpoint.Port == 0 {
		t.Error("kubelet endpoint port not set")
	}
	var l *coordinationv1.Lease
	waitFor(t, 5*time.Second, "lease", func() (bool, string) {
		l, err = h.cs.CoordinationV1().Leases("kube-node-lease").Get(context.Background(), node, metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	if *l.Spec.HolderIdentity != node || *l.Spec.LeaseDurationSeconds != 40 || l.Spec.RenewTime == nil {
		t.Errorf("lease spec = %+v", l.Spec)
	}
}

func TestPodRunsAndReportsStatus(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("web", nil))
	p := h.waitPod("web", "running and ready", running)
	if p.Status.PodIP == "" || !strings.HasPrefix(p.Status.PodIP, "10.9.0.") || len(p.Status.PodIPs) != 1 {
		t.Errorf("pod IPs = %q %v", p.Status.PodIP, p.Status.PodIPs)
	}
	if p.Status.HostIP == "" || p.Status.StartTime == nil {
		t.Errorf("hostIP %q startTime %v", p.Status.HostIP, p.Status.StartTime)
	}
	cs := p.Status.ContainerStatuses
	if len(cs) != 1 || cs[0].State.Running == nil || !cs[0].Ready || cs[0].RestartCount != 0 || !strings.HasPrefix(cs[0].ContainerID, "containerd://") {
		t.Errorf("container statuses = %+v", cs)
	}
	for _, c := range []v1.PodConditionType{v1.PodScheduled, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		if cond(p, c) != v1.ConditionTrue {
			t.Errorf("condition %s = %q", c, cond(p, c))
		}
	}
	if p.Status.QOSClass != v1.PodQOSBestEffort {
		t.Errorf("qos = %s", p.Status.QOSClass)
	}
}

func TestRestartPolicies(t *testing.T) {
	for _, tc := range []struct {
		name      string
		policy    v1.RestartPolicy
		exit      int32
		wantPhase v1.PodPhase
		restarts  bool
	}{
		{"Always restarts a clean exit", v1.RestartPolicyAlways, 0, v1.PodRunning, true},
		{"Always restarts a failure", v1.RestartPolicyAlways, 1, v1.PodRunning, true},
		{"OnFailure restarts a failure", v1.RestartPolicyOnFailure, 2, v1.PodRunning, true},
		{"OnFailure completes on success", v1.RestartPolicyOnFailure, 0, v1.PodSucceeded, false},
		{"Never fails on failure", v1.RestartPolicyNever, 3, v1.PodFailed, false},
		{"Never succeeds on success", v1.RestartPolicyNever, 0, v1.PodSucceeded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.create(echoPod("p", func(p *v1.Pod) { p.Spec.RestartPolicy = tc.policy }))
			h.waitPod("p", "running", running)
			first := h.current("p", "echo")
			h.rt.Exit(first.ID, tc.exit, "Error")
			if tc.restarts {
				p := h.waitPod("p", "restarted", func(p *v1.Pod) bool {
					return running(p) && p.Status.ContainerStatuses[0].RestartCount == 1
				})
				last := p.Status.ContainerStatuses[0].LastTerminationState.Terminated
				if last == nil || last.ExitCode != tc.exit {
					t.Errorf("lastState = %+v, want exit %d", p.Status.ContainerStatuses[0].LastTerminationState, tc.exit)
				}
				return
			}
			p := h.waitPod("p", "phase "+string(tc.wantPhase), func(p *v1.Pod) bool { return p.Status.Phase == tc.wantPhase })
			if term := p.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != tc.exit {
				t.Errorf("state = %+v", p.Status.ContainerStatuses[0].State)
			}
			if cond(p, v1.PodReady) != v1.ConditionFalse {
				t.Errorf("terminal pod is Ready")
			}
			h.syncedAgain(3) // the worker saw the exited container again, and again
			if n := len(h.containersOf("p")); n != 1 {
				t.Errorf("%d containers, want 1 (no restart)", n)
			}
			if h.net.InUse() != 0 {
				t.Errorf("terminal pod keeps %d addresses", h.net.InUse())
			}
		})
	}
}

func TestCrashLoopBackOff(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.BackoffBase = 2 * time.Second; c.BackoffMax = 10 * time.Second })
	h.create(echoPod("crash", nil))
	h.waitPod("crash", "running", running)
	h.rt.Exit(h.current("crash", "echo").ID, 1, "Error")
	h.waitPod("crash", "first restart (immediate)", func(p *v1.Pod) bool { return p.Status.ContainerStatuses[0].RestartCount == 1 && running(p) })
	h.rt.Exit(h.current("crash", "echo").ID, 1, "Error")
	p := h.waitPod("crash", "CrashLoopBackOff", func(p *v1.Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "CrashLoopBackOff"
	})
	if cond(p, v1.PodReady) != v1.ConditionFalse {
		t.Error("pod in CrashLoopBackOff is Ready")
	}
	if lt := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; lt == nil || lt.ExitCode != 1 {
		t.Errorf("lastState = %+v", p.Status.ContainerStatuses[0].LastTerminationState)
	}
	h.waitPod("crash", "restart after back-off", func(p *v1.Pod) bool { return p.Status.ContainerStatuses[0].RestartCount == 2 && running(p) })
}

func TestInitContainersRunInOrder(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("init", func(p *v1.Pod) {
		p.Spec.InitContainers = []v1.Container{{Name: "one", Image: "img"}, {Name: "two", Image: "img"}}
	}))
	p := h.waitPod("init", "init one running", func(p *v1.Pod) bool {
		return len(p.Status.InitContainerStatuses) == 2 && p.Status.InitContainerStatuses[0].State.Running != nil
	})
	if p.Status.Phase != v1.PodPending || cond(p, v1.PodInitialized) != v1.ConditionFalse {
		t.Errorf("phase %s initialized %s", p.Status.Phase, cond(p, v1.PodInitialized))
	}
	if w := p.Status.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("app container state = %+v", p.Status.ContainerStatuses[0].State)
	}
	if len(h.containersOf("init")) != 1 {
		t.Fatalf("containers = %+v, want only init one", h.containersOf("init"))
	}
	h.rt.Exit(h.current("init", "one").ID, 0, "Completed")
	h.waitPod("init", "init two running", func(p *v1.Pod) bool { return p.Status.InitContainerStatuses[1].State.Running != nil })
	h.rt.Exit(h.current("init", "two").ID, 0, "Completed")
	p = h.waitPod("init", "running", running)
	if cond(p, v1.PodInitialized) != v1.ConditionTrue {
		t.Error("not Initialized")
	}
}

func TestFailedInitContainerWithNeverFailsPod(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("initfail", func(p *v1.Pod) {
		p.Spec.RestartPolicy = v1.RestartPolicyNever
		p.Spec.InitContainers = []v1.Container{{Name: "one", Image: "img"}}
	}))
	h.waitPod("initfail", "init running", func(p *v1.Pod) bool {
		return len(p.Status.InitContainerStatuses) == 1 && p.Status.InitContainerStatuses[0].State.Running != nil
	})
	h.rt.Exit(h.current("initfail", "one").ID, 7, "Error")
	h.waitPod("initfail", "failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	for _, c := range h.containersOf("initfail") {
		if c.Name == "echo" {
			t.Error("app container started after a failed init container")
		}
	}
}

func TestDeletionStopsContainersReleasesIPAndRemovesPod(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("gone", nil))
	h.waitPod("gone", "running", running)
	if h.net.InUse() != 1 {
		t.Fatalf("addresses in use = %d", h.net.InUse())
	}
	p := h.pod("gone")
	now := metav1.Now()
	p.DeletionTimestamp = &now
	grace := int64(1)
	p.DeletionGracePeriodSeconds = &grace
	if _, err := h.cs.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "pod removed from the API", func() (bool, string) {
		_, err := h.cs.CoreV1().Pods("default").Get(context.Background(), "gone", metav1.GetOptions{})
		return err != nil, "still there"
	})
	waitFor(t, 5*time.Second, "containers removed", func() (bool, string) {
		return len(h.containersOf("gone")) == 0 && h.net.InUse() == 0, fmt.Sprintf("%d containers, %d IPs", len(h.containersOf("gone")), h.net.InUse())
	})
	if _, err := os.Stat(filepath.Join(h.cfg.RootDir, "pods", "uid-gone")); !os.IsNotExist(err) {
		t.Errorf("pod dir left behind: %v", err)
	}
}

func TestRestartedKubeletAdoptsContainers(t *testing.T) {
	h := newHarness(t, nil)
	for i := 0; i < 3; i++ {
		h.create(echoPod(fmt.Sprintf("a%d", i), nil))
	}
	for i := 0; i < 3; i++ {
		h.waitPod(fmt.Sprintf("a%d", i), "running", running)
	}
	before, _ := h.rt.ListContainers(context.Background())
	for round := 0; round < 3; round++ {
		h.stop()
		h.start()
		h.syncedAgain(2 * 3) // the new kubelet's workers are syncing (6 syncs over the 3 pods)
	}
	after, _ := h.rt.ListContainers(context.Background())
	if len(after) != len(before) {
		t.Fatalf("containers %d -> %d across restarts", len(before), len(after))
	}
	for i := range before {
		if before[i].ID != after[i].ID || after[i].State != runtime.StateRunning {
			t.Errorf("container %d changed: %+v -> %+v", i, before[i], after[i])
		}
	}
	for i := 0; i < 3; i++ {
		p := h.waitPod(fmt.Sprintf("a%d", i), "running", running)
		if p.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("restart count %d", p.Status.ContainerStatuses[0].RestartCount)
		}
	}
	if h.net.InUse() != 3 {
		t.Errorf("addresses in use = %d, want 3", h.net.InUse())
	}
}

func TestOrphansAreCleanedUp(t *testing.T) {
	h := newHarness(t, nil)
	id, _ := h.rt.StartContainer(context.Background(), runtime.ContainerConfig{PodUID: "ghost", PodName: "ghost", PodNamespace: "default", Name: "c", Image: "i"})
	waitFor(t, 5*time.Second, "orphan removed", func() (bool, string) {
		return len(h.containersOf("ghost")) == 0, id
	})
}

func TestStatusKeepsOtherWritersConditions(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("gated", func(p *v1.Pod) {
		p.Status.Conditions = []v1.PodCondition{{Type: "example.com/gate", Status: v1.ConditionTrue}}
	}))
	p := h.waitPod("gated", "running", running)
	if cond(p, "example.com/gate") != v1.ConditionTrue {
		t.Errorf("foreign condition lost: %v", p.Status.Conditions)
	}
}

func TestImageNeverPullMissingImageWaits(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("noimg", func(p *v1.Pod) {
		p.Spec.Containers[0].Image = "absent:v1"
		p.Spec.Containers[0].ImagePullPolicy = v1.PullNever
	}))
	p := h.waitPod("noimg", "ErrImageNeverPull", func(p *v1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "ErrImageNeverPull"
	})
	if p.Status.Phase != v1.PodPending {
		t.Errorf("phase = %s", p.Status.Phase)
	}
}

func TestMissingConfigMapIsCreateContainerConfigError(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("cfg", func(p *v1.Pod) {
		p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "X", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{
			LocalObjectReference: v1.LocalObjectReference{Name: "missing"}, Key: "k"}}}}
	}))
	h.waitPod("cfg", "CreateContainerConfigError", func(p *v1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError"
	})
	// Creating the ConfigMap lets the pod start.
	h.cs.CoreV1().ConfigMaps("default").Create(context.Background(), &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "missing", Namespace: "default"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	h.waitPod("cfg", "running", running)
}

func TestStaticPodWithMirror(t *testing.T) {
	dir := t.TempDir()
	manifest := `apiVersion: v1
kind: Pod
metadata:
  name: static-web
spec:
  containers:
  - name: echo
    image: waggle.local/waggle-echo:dev
`
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) { c.PodManifestPath = dir })
	name := "static-web-" + node
	p := h.waitPod(name, "mirror running", running)
	if p.Annotations[AnnotationConfigMirror] == "" || p.Spec.NodeName != node {
		t.Errorf("mirror annotations %v nodeName %q", p.Annotations, p.Spec.NodeName)
	}
	first := h.current(name, "echo")
	// Deleting the mirror does not stop the static pod; the mirror returns.
	if err := h.cs.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// (The fake clientset assigns no UIDs: a re-created mirror shows as a pod
	// of that name whose status the kubelet wrote again.)
	h.waitPod(name, "mirror re-created and running", func(p *v1.Pod) bool { return p.Name == name && running(p) })
	if cur := h.current(name, "echo"); cur.ID != first.ID || cur.State != runtime.StateRunning {
		t.Errorf("static pod's container changed: %s -> %s (%s)", first.ID, cur.ID, cur.State)
	}
	// Removing the manifest stops the pod and its mirror.
	os.Remove(filepath.Join(dir, "web.yaml"))
	waitFor(t, 15*time.Second, "static pod stopped", func() (bool, string) {
		_, err := h.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		return len(h.containersOf(name)) == 0 && err != nil, "still there"
	})
}

// TestOrphanedMirrorPodIsDeleted: a manifest removed while the kubelet is
// down leaves a mirror pod behind; the restarted kubelet deletes it, as
// upstream's pod cleanup does, and keeps the mirror of a static pod that is
// still there.
func TestOrphanedMirrorPodIsDeleted(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"keep", "gone"} {
		m := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + n + "\nspec:\n  containers:\n  - name: echo\n    image: waggle.local/waggle-echo:dev\n"
		if err := os.WriteFile(filepath.Join(dir, n+".yaml"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := newHarness(t, func(c *Config) { c.PodManifestPath = dir })
	keep, gone := "keep-"+node, "gone-"+node
	h.waitPod(keep, "mirror running", running)
	h.waitPod(gone, "mirror running", running)
	h.stop()
	if err := os.Remove(filepath.Join(dir, "gone.yaml")); err != nil {
		t.Fatal(err)
	}
	h.start()
	waitFor(t, 15*time.Second, "orphaned mirror deleted", func() (bool, string) {
		_, err := h.cs.CoreV1().Pods("default").Get(context.Background(), gone, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if _, err := h.cs.CoreV1().Pods("default").Get(context.Background(), keep, metav1.GetOptions{}); err != nil {
		t.Errorf("the mirror of a present static pod: %v", err)
	}
}

// TestReadinessProbeGatesReady runs a readiness probe through the runtime's
// exec: while the probe command fails the pod is Running but not Ready, and it
// turns Ready once the command succeeds.
func TestReadinessProbeGatesReady(t *testing.T) {
	var exitCode, probed atomic.Int32
	exitCode.Store(1)
	h := newHarness(t, nil)
	h.rt.ExecFunc = func(_ runtime.Container, cmd []string) int {
		if len(cmd) == 1 && cmd[0] == "ready-check" {
			probed.Add(1)
		}
		return int(exitCode.Load())
	}
	h.create(echoPod("probed", func(p *v1.Pod) {
		p.Spec.Containers[0].ReadinessProbe = &v1.Probe{PeriodSeconds: 1, ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"ready-check"}}}}
	}))
	// The marker: the kubelet has written a Running status and the probe
	// has failed at least twice; only then does "not Ready" mean anything
	// (without a working probe the pod is Ready as soon as it runs).
	h.waitPod("probed", "running with failed probes", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && probed.Load() >= 2
	})
	if p := h.pod("probed"); cond(p, v1.PodReady) == v1.ConditionTrue || cond(p, v1.ContainersReady) == v1.ConditionTrue {
		t.Fatalf("pod Ready while its readiness probe fails: %+v", p.Status.Conditions)
	}
	exitCode.Store(0)
	h.waitPod("probed", "ready once the probe passes", running)
}

// TestHollowModePassesProbesWithoutRunningThem: a hollow node's containers
// run nothing, so its prober passes every probe without calling the runtime.
func TestHollowModePassesProbesWithoutRunningThem(t *testing.T) {
	k, err := New(Config{NodeName: node, Runtime: RuntimeHollow, RootDir: t.TempDir()}, Deps{Client: fake.NewSimpleClientset()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := k.prober.(hollowProber); !ok {
		t.Fatalf("hollow mode prober is %T", k.prober)
	}
	k2, err := New(Config{NodeName: node, RootDir: t.TempDir()}, Deps{Client: fake.NewSimpleClientset()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := k2.prober.(actionProber); !ok {
		t.Fatalf("containerd mode prober is %T", k2.prober)
	}
	p := &v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(1)}}}
	if err := k.probe(context.Background(), &v1.Pod{}, &v1.Container{}, runtime.Container{}, p); err != nil {
		t.Errorf("hollow probe failed: %v", err)
	}
}

func TestResourcesMapToCgroupSettings(t *testing.T) {
	var cfg runtime.ContainerConfig
	applyResources(&cfg, v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m")},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("64Mi")},
	})
	if cfg.CPUShares != 256 || cfg.CPUQuota != 50000 || cfg.CPUPeriod != 100000 || cfg.MemoryLimit != 64<<20 {
		t.Errorf("cfg = shares %d quota %d period %d mem %d", cfg.CPUShares, cfg.CPUQuota, cfg.CPUPeriod, cfg.MemoryLimit)
	}
	// No CPU asked for: the minimum shares, as upstream, no quota.
	var none runtime.ContainerConfig
	applyResources(&none, v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("32Mi")}})
	if none.CPUShares != 2 || none.CPUQuota != 0 || none.MemoryLimit != 0 {
		t.Errorf("memory request only: shares %d quota %d mem %d, want 2 0 0", none.CPUShares, none.CPUQuota, none.MemoryLimit)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{NodeName: "n", Kubeconfig: "k"}, true},
		{"no node", Config{Kubeconfig: "k"}, false},
		{"no kubeconfig", Config{NodeName: "n"}, false},
		{"bad runtime", Config{NodeName: "n", Kubeconfig: "k", Runtime: "docker"}, false},
		{"bad pod cidr", Config{NodeName: "n", Kubeconfig: "k", PodCIDR: "10.0.0.0"}, false},
		{"bad node ip", Config{NodeName: "n", Kubeconfig: "k", NodeIP: "x"}, false},
		{"bad taint", Config{NodeName: "n", Kubeconfig: "k", RegisterWithTaints: []string{"a=b:Sometimes"}}, false},
		{"bad port", Config{NodeName: "n", Kubeconfig: "k", Port: 70000}, false},
		{"eviction thresholds", Config{NodeName: "n", Kubeconfig: "k", EvictionHard: map[string]string{"memory.available": "1Gi"},
			EvictionSoft: map[string]string{"nodefs.available": "20%"}, EvictionSoftGracePeriod: map[string]string{"nodefs.available": "1m"}}, true},
		{"no hard thresholds", Config{NodeName: "n", Kubeconfig: "k", EvictionHard: map[string]string{}}, true},
		{"bad eviction signal", Config{NodeName: "n", Kubeconfig: "k", EvictionHard: map[string]string{"swap.available": "1Gi"}}, false},
		{"soft without grace", Config{NodeName: "n", Kubeconfig: "k", EvictionSoft: map[string]string{"memory.available": "1Gi"}}, false},
		{"image gc low above high", Config{NodeName: "n", Kubeconfig: "k", ImageGCHighThresholdPercent: 50, ImageGCLowThresholdPercent: 60}, false},
		{"image gc high over 100", Config{NodeName: "n", Kubeconfig: "k", ImageGCHighThresholdPercent: 101}, false},
		{"start cap", Config{NodeName: "n", Kubeconfig: "k", ParallelStarts: 8}, true},
		{"negative start cap", Config{NodeName: "n", Kubeconfig: "k", ParallelStarts: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.WithDefaults().Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("err %v is not ErrInvalidConfig", err)
			}
		})
	}
}

func TestConfigDefaultsAreUpstreamEvictionDefaults(t *testing.T) {
	c := Config{NodeName: "n", Kubeconfig: "k"}.WithDefaults()
	want := map[string]string{"memory.available": "100Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%",
		"imagefs.available": "15%", "imagefs.inodesFree": "5%"}
	if !reflect.DeepEqual(c.EvictionHard, want) {
		t.Errorf("EvictionHard = %v", c.EvictionHard)
	}
	if c.EvictionPressureTransitionPeriod != 5*time.Minute || c.ImageGCHighThresholdPercent != 85 || c.ImageGCLowThresholdPercent != 80 ||
		c.ImageMinimumGCAge != 2*time.Minute || c.EvictionMonitoringInterval != 10*time.Second {
		t.Errorf("defaults: transition %s, image GC %d/%d age %s, interval %s", c.EvictionPressureTransitionPeriod,
			c.ImageGCHighThresholdPercent, c.ImageGCLowThresholdPercent, c.ImageMinimumGCAge, c.EvictionMonitoringInterval)
	}
}

func TestCNIConfigWrittenFromNodePodCIDR(t *testing.T) {
	confDir := filepath.Join(t.TempDir(), "net.d")
	cs := fake.NewSimpleClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: v1.NodeSpec{PodCIDR: "10.44.3.0/24"}})
	cfg := Config{NodeName: node, RootDir: t.TempDir(), Address: "127.0.0.1", Port: 0, CNIConfDir: confDir,
		DisableRouteController: true, SyncFrequency: 50 * time.Millisecond}
	k, err := New(cfg, Deps{Client: cs, Runtime: runtimetest.NewFake()}) // the kubelet's own CNI manager
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 10*time.Second, "conflist written", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(confDir, "10-waggle.conflist"))
		return err == nil && strings.Contains(string(b), "10.44.3.0/24"), fmt.Sprint(err)
	})
	// The IPAM store is this node's own, under its root dir: another
	// cluster or lab node on the machine never shares its allocations.
	b, _ := os.ReadFile(filepath.Join(confDir, "10-waggle.conflist"))
	if want := fmt.Sprintf("%q", filepath.Join(cfg.RootDir, "ipam")); !strings.Contains(string(b), `"dataDir":`+want) && !strings.Contains(string(b), `"dataDir": `+want) {
		t.Errorf("conflist does not keep IPAM under the node's root dir %s:\n%s", cfg.RootDir, b)
	}
	// The node reports Ready once the network has a config.
	k.updateNodeStatus(ctx)
	n, _ := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady && c.Status != v1.ConditionTrue {
			t.Errorf("node not Ready with a CNI config: %+v", c)
		}
	}
}

// busyNet is a network whose namespaces cannot be removed while busy is set.
type busyNet struct {
	*network.Hollow
	busy atomic.Bool
}

func (b *busyNet) TearDown(ctx context.Context, p network.Pod, sb network.Sandbox) error {
	if b.busy.Load() {
		return fmt.Errorf("pod %s/%s: %w: device or resource busy (its address stays reserved)", p.Namespace, p.Name, network.ErrNetNSBusy)
	}
	return b.Hollow.TearDown(ctx, p, sb)
}

// events lists the Events recorded about name with reason.
func (h *harness) events(name, reason string) []v1.Event {
	list, _ := h.cs.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	var out []v1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// TestBusyNetNSKeepsPodTerminatingAndItsAddress is the kubelet half of the
// netns-busy regression: the pod stays in the API (Terminating) with the
// reason in its status and a FailedKillPod Event, its address is not
// released, and once the namespace can go the pod is removed.
func TestBusyNetNSKeepsPodTerminatingAndItsAddress(t *testing.T) {
	var bn *busyNet
	h := newHarnessWithNet(t, nil, func(n *network.Hollow) network.Manager { bn = &busyNet{Hollow: n}; return bn })
	h.create(echoPod("stuck", nil))
	h.waitPod("stuck", "running", running)
	bn.busy.Store(true)
	p := h.pod("stuck")
	now := metav1.Now()
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, ptr.To[int64](0)
	if _, err := h.cs.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = h.waitPod("stuck", "teardown failure in the status", func(p *v1.Pod) bool { return p.Status.Reason == "NetworkTeardownFailed" })
	if !strings.Contains(p.Status.Message, "cannot be removed") {
		t.Errorf("status message %q", p.Status.Message)
	}
	waitFor(t, 10*time.Second, "FailedKillPod event", func() (bool, string) {
		return len(h.events("stuck", EventFailedKillPod)) > 0, "none yet"
	})
	if h.net.InUse() != 1 {
		t.Errorf("address released while the namespace is busy: %d in use", h.net.InUse())
	}
	bn.busy.Store(false)
	waitFor(t, 30*time.Second, "pod removed once the namespace is free", func() (bool, string) {
		_, err := h.cs.CoreV1().Pods("default").Get(context.Background(), "stuck", metav1.GetOptions{})
		return err != nil && h.net.InUse() == 0, fmt.Sprintf("%d in use", h.net.InUse())
	})
}

// TestCrashLoopEventsAreAggregated: a crash-looping container's repeated
// Started and BackOff events are one Event each with a growing count, not
// one per restart.
func TestCrashLoopEventsAreAggregated(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.BackoffBase = 200 * time.Millisecond; c.BackoffMax = 400 * time.Millisecond })
	h.create(echoPod("loop", nil))
	h.waitPod("loop", "running", running)
	for i := 1; i <= 4; i++ {
		h.rt.Exit(h.current("loop", "echo").ID, 1, "Error")
		h.waitPod("loop", fmt.Sprintf("restart %d", i), func(p *v1.Pod) bool { return p.Status.ContainerStatuses[0].RestartCount == int32(i) && running(p) })
	}
	waitFor(t, 10*time.Second, "Started counted 5 times in one Event", func() (bool, string) {
		ev := h.events("loop", EventStarted)
		return len(ev) == 1 && ev[0].Count >= 5, fmt.Sprintf("%d Started events %v", len(ev), ev)
	})
	if ev := h.events("loop", EventBackOff); len(ev) > 1 {
		t.Errorf("%d BackOff events, want them aggregated into one", len(ev))
	}
	if ev := h.events("loop", EventCreated); len(ev) != 1 || ev[0].InvolvedObject.FieldPath != "spec.containers{echo}" {
		t.Errorf("Created events %+v", ev)
	}
}

// TestResourceFieldRefAsUpstream: a limit the container leaves unset reads
// as the node's allocatable amount, and values round up to whole divisors.
func TestResourceFieldRefAsUpstream(t *testing.T) {
	k, err := New(Config{NodeName: node, RootDir: t.TempDir()}, Deps{Client: fake.NewSimpleClientset(), Runtime: runtimetest.NewFake()})
	if err != nil {
		t.Fatal(err)
	}
	k.nodeObj = &v1.Node{Status: v1.NodeStatus{Allocatable: v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("8Gi"), v1.ResourceEphemeralStorage: resource.MustParse("10Gi")}}}
	c := &v1.Container{Resources: v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m"), v1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")},
	}}
	for _, tc := range []struct {
		res, divisor, want string
	}{
		{"limits.cpu", "", "4"}, // unset: node allocatable
		{"limits.cpu", "1m", "4000"},
		{"requests.cpu", "", "1"}, // 250m rounds up to 1 core
		{"requests.cpu", "1m", "250"},
		{"limits.memory", "1Mi", "64"},
		{"requests.memory", "", "33554432"},
		{"limits.ephemeral-storage", "1Gi", "10"}, // unset: node allocatable
	} {
		ref := &v1.ResourceFieldSelector{Resource: tc.res}
		if tc.divisor != "" {
			ref.Divisor = resource.MustParse(tc.divisor)
		}
		got, err := k.resourceValue(c, ref)
		if err != nil || got != tc.want {
			t.Errorf("%s / %q = %q, %v; want %q", tc.res, tc.divisor, got, err, tc.want)
		}
	}
	if _, err := k.resourceValue(c, &v1.ResourceFieldSelector{Resource: "limits.gpu"}); err == nil {
		t.Error("an unsupported resource gave no error")
	}
}

// TestImageChangeRestartsAndStatusObservesGeneration: a new image in the
// spec replaces the running container whatever the restart policy (as
// upstream's "definition changed"), and the status says which generation
// of the spec it describes, on the status and on each kubelet condition.
func TestImageChangeRestartsAndStatusObservesGeneration(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("p", func(p *v1.Pod) { p.Generation = 1; p.Spec.RestartPolicy = v1.RestartPolicyNever }))
	p := h.waitPod("p", "running at generation 1", func(p *v1.Pod) bool { return running(p) && p.Status.ObservedGeneration == 1 })
	if cond(p, v1.PodReadyToStartContainers) != v1.ConditionTrue {
		t.Errorf("PodReadyToStartContainers = %q", cond(p, v1.PodReadyToStartContainers))
	}
	first := h.current("p", "echo")

	p.Spec.Containers[0].Image = "waggle.local/waggle-echo:v2"
	p.Generation = 2
	if _, err := h.cs.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = h.waitPod("p", "running v2 at generation 2", func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return running(p) && p.Status.ObservedGeneration == 2 && len(cs) == 1 && cs[0].Image == "waggle.local/waggle-echo:v2"
	})
	if cs := p.Status.ContainerStatuses[0]; cs.RestartCount != 1 || cs.LastTerminationState.Terminated == nil || cs.ContainerID == "containerd://"+first.ID {
		t.Errorf("after the image change: %+v", cs)
	}
	for _, c := range p.Status.Conditions {
		if c.ObservedGeneration != 2 {
			t.Errorf("condition %s observedGeneration %d, want 2", c.Type, c.ObservedGeneration)
		}
	}
}

// TestHostPortConflictIsRejectedAtAdmission: a pod bound to the node whose
// host port an active pod holds fails at once with upstream's reason and
// message and never starts; another address or protocol is no conflict.
func TestHostPortConflictIsRejectedAtAdmission(t *testing.T) {
	h := newHarness(t, nil)
	withPort := func(ip string, proto v1.Protocol) func(*v1.Pod) {
		return func(p *v1.Pod) {
			p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 8080, HostPort: 18080, HostIP: ip, Protocol: proto}}
		}
	}
	h.create(echoPod("first", withPort("", v1.ProtocolTCP)))
	h.waitPod("first", "running", running)
	h.create(echoPod("udp", withPort("10.0.0.1", v1.ProtocolUDP)))
	h.create(echoPod("second", withPort("10.0.0.1", v1.ProtocolTCP)))
	p := h.waitPod("second", "rejected", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if p.Status.Reason != "NodePorts" || p.Status.Message != "Pod was rejected: node(s) didn't have free ports for the requested pod ports" {
		t.Errorf("rejection: reason %q message %q", p.Status.Reason, p.Status.Message)
	}
	h.waitPod("udp", "running (UDP is another port)", running)
	if n := len(h.containersOf("second")); n != 0 {
		t.Errorf("the rejected pod has %d containers", n)
	}
	if len(h.events("second", "NodePorts")) == 0 {
		t.Errorf("no NodePorts event for the rejected pod")
	}
}

func imageVolumePod(name, image string) *v1.Pod {
	return echoPod(name, func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{{Name: "vol", VolumeSource: v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: image, PullPolicy: v1.PullAlways}}}}
		p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "vol", MountPath: "/volume"}}
	})
}

func TestImageVolumeIsPulledMountedReadOnlyAndReleased(t *testing.T) {
	h := newHarness(t, nil)
	h.create(imageVolumePod("iv", "example.com/kitten:1.8"))
	h.waitPod("iv", "running", running)
	mounts := h.rt.ImageMounts("uid-iv")
	if len(mounts) != 1 {
		t.Fatalf("image mounts of the pod: %v", mounts)
	}
	cfg, _ := h.rt.Config(h.current("iv", "echo").ID)
	var got *runtime.Mount
	for i, m := range cfg.Mounts {
		if m.ContainerPath == "/volume" {
			got = &cfg.Mounts[i]
		}
	}
	if got == nil || !got.ReadOnly || mounts[got.HostPath] != "example.com/kitten:1.8" ||
		!strings.HasPrefix(got.HostPath, filepath.Join(h.cfg.RootDir, "pods", "uid-iv", "image-volumes", "vol")+"/") {
		t.Fatalf("container mount %+v, image mounts %v", got, mounts)
	}
	// The volume's pull is the pod's (as upstream), its policy Always.
	waitFor(t, 5*time.Second, "Pulling event on the pod", func() (bool, string) {
		for _, e := range h.events("iv", EventPulling) {
			if e.InvolvedObject.FieldPath == "" && strings.Contains(e.Message, "example.com/kitten:1.8") {
				return true, ""
			}
		}
		return false, fmt.Sprint(h.events("iv", EventPulling))
	})

	p := h.pod("iv")
	now := metav1.Now()
	p.DeletionTimestamp = &now
	p.DeletionGracePeriodSeconds = ptr.To(int64(1))
	if _, err := h.cs.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "image volume released", func() (bool, string) {
		_, err := h.cs.CoreV1().Pods("default").Get(context.Background(), "iv", metav1.GetOptions{})
		return err != nil && len(h.rt.ImageMounts("uid-iv")) == 0, fmt.Sprint(h.rt.ImageMounts("uid-iv"))
	})
}

func TestImageVolumePullFailureIsErrImagePullThenBackOff(t *testing.T) {
	h := newHarness(t, nil)
	h.create(imageVolumePod("ivbad", "example.com/notfound:1"))
	waiting := func(reason string) func(*v1.Pod) bool {
		return func(p *v1.Pod) bool {
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
				p.Status.ContainerStatuses[0].State.Waiting.Reason == reason
		}
	}
	// ErrImagePull turns into ImagePullBackOff at the next sync.
	h.waitPod("ivbad", "ImagePullBackOff", waiting("ImagePullBackOff"))
	if len(h.containersOf("ivbad")) != 0 || len(h.rt.ImageMounts("uid-ivbad")) != 0 {
		t.Errorf("started without its image volume: %v", h.containersOf("ivbad"))
	}
	var onPod, onContainer bool
	for _, e := range h.events("ivbad", EventFailed) {
		onPod = onPod || e.InvolvedObject.FieldPath == "" && strings.HasPrefix(e.Message, "Failed to pull image \"example.com/notfound:1\"")
		onContainer = onContainer || e.InvolvedObject.FieldPath == "spec.containers{echo}" && strings.HasPrefix(e.Message, "Error: ")
	}
	if !onPod || !onContainer {
		t.Errorf("Failed events %+v", h.events("ivbad", EventFailed))
	}
}

// TestOrphanedImageVolumesAreReleased: an image volume a stopped kubelet
// left behind, its pod dir gone, is released by the next kubelet.
func TestOrphanedImageVolumesAreReleased(t *testing.T) {
	h := newHarness(t, nil)
	h.stop()
	if err := h.rt.MountImage(context.Background(), "ghost", "i", "/nonexistent/ghost/vol"); err != nil {
		t.Fatal(err)
	}
	h.start()
	waitFor(t, 5*time.Second, "orphaned image volume released", func() (bool, string) {
		uids, _ := h.rt.ImageMountPods(context.Background())
		return len(uids) == 0, fmt.Sprint(uids)
	})
}
