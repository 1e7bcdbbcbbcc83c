package kubelet

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

func initCond(p *v1.Pod) v1.PodCondition {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodInitialized {
			return c
		}
	}
	return v1.PodCondition{}
}

// The statuses the InitContainer conformance specs check: a finished init
// container is Ready, and Initialized says which ones are not done yet.
func TestInitContainerStatusesAsUpstream(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("inits", func(p *v1.Pod) {
		p.Spec.InitContainers = []v1.Container{{Name: "one", Image: "img"}, {Name: "two", Image: "img"}}
	}))
	p := h.waitPod("inits", "init one running", func(p *v1.Pod) bool {
		return len(p.Status.InitContainerStatuses) == 2 && p.Status.InitContainerStatuses[0].State.Running != nil
	})
	if c := initCond(p); c.Status != v1.ConditionFalse || c.Reason != "ContainersNotInitialized" || c.Message != "containers with incomplete status: [one two]" {
		t.Errorf("Initialized = %+v", c)
	}
	if w := p.Status.InitContainerStatuses[1].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("init two = %+v, want waiting PodInitializing", p.Status.InitContainerStatuses[1].State)
	}
	h.rt.Exit(h.current("inits", "one").ID, 0, "Completed")
	p = h.waitPod("inits", "init two running", func(p *v1.Pod) bool { return p.Status.InitContainerStatuses[1].State.Running != nil })
	if c := initCond(p); c.Message != "containers with incomplete status: [two]" {
		t.Errorf("Initialized = %+v", c)
	}
	if s := p.Status.InitContainerStatuses[0]; !s.Ready || s.State.Terminated == nil {
		t.Errorf("finished init one = %+v, want terminated and ready", s)
	}
	h.rt.Exit(h.current("inits", "two").ID, 0, "Completed")
	p = h.waitPod("inits", "running", running)
	for _, s := range p.Status.InitContainerStatuses {
		if !s.Ready || s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			t.Errorf("init status %+v, want terminated 0 and ready", s)
		}
	}
	if c := initCond(p); c.Status != v1.ConditionTrue || c.Message != "" {
		t.Errorf("Initialized = %+v", c)
	}
}

// A failing init container of a restarting pod is retried; app containers
// wait, PodInitializing, never started.
func TestFailingInitContainerRetriesAndHoldsApps(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("initretry", func(p *v1.Pod) {
		p.Spec.InitContainers = []v1.Container{{Name: "one", Image: "img"}, {Name: "two", Image: "img"}}
	}))
	for attempt := int32(0); attempt < 2; attempt++ {
		h.waitPod("initretry", "init one running", func(p *v1.Pod) bool {
			return len(p.Status.InitContainerStatuses) == 2 && p.Status.InitContainerStatuses[0].State.Running != nil &&
				p.Status.InitContainerStatuses[0].RestartCount == attempt
		})
		h.rt.Exit(h.current("initretry", "one").ID, 1, "Error")
	}
	p := h.waitPod("initretry", "init one failed twice", func(p *v1.Pod) bool {
		s := p.Status.InitContainerStatuses[0]
		return s.RestartCount >= 1 && s.LastTerminationState.Terminated != nil && s.LastTerminationState.Terminated.ExitCode == 1 &&
			(s.State.Waiting != nil || s.State.Terminated != nil)
	})
	if p.Status.Phase != v1.PodPending {
		t.Errorf("phase %s, want Pending", p.Status.Phase)
	}
	if c := initCond(p); c.Message != "containers with incomplete status: [one two]" {
		t.Errorf("Initialized = %+v", c)
	}
	if w := p.Status.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("app = %+v", p.Status.ContainerStatuses[0].State)
	}
	for _, c := range h.containersOf("initretry") {
		if c.Name != "one" {
			t.Errorf("container %s started while init one fails", c.Name)
		}
	}
}

// Sidecars (restartable init containers): the next init container waits for
// the sidecar's startup probe; the sidecar runs beside the app, is restarted
// even in a Never pod, counts for readiness, and is stopped once the app
// completes (the pod then succeeds) — after the app's preStop hook, with
// its own preStop hook.
func TestSidecarLifecycle(t *testing.T) {
	h := newHarness(t, nil)
	var started atomic.Bool
	var mu sync.Mutex
	var order []string
	h.rt.ExecFunc = func(c runtime.Container, cmd []string) int {
		switch cmd[0] {
		case "startup":
			if started.Load() {
				return 0
			}
			return 1
		case "prestop":
			mu.Lock()
			order = append(order, c.Name)
			mu.Unlock()
		}
		return 0
	}
	preStop := &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"prestop"}}}}
	h.create(echoPod("side", func(p *v1.Pod) {
		p.Spec.RestartPolicy = v1.RestartPolicyNever
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5)
		p.Spec.InitContainers = []v1.Container{
			{Name: "proxy", Image: "img", RestartPolicy: ptr.To(v1.ContainerRestartPolicyAlways), Lifecycle: preStop,
				StartupProbe: &v1.Probe{PeriodSeconds: 1, FailureThreshold: 100,
					ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"startup"}}}}},
			{Name: "setup", Image: "img"},
		}
		p.Spec.Containers[0].Lifecycle = preStop
	}))
	p := h.waitPod("side", "sidecar running, not started", func(p *v1.Pod) bool {
		return len(p.Status.InitContainerStatuses) == 2 && p.Status.InitContainerStatuses[0].State.Running != nil
	})
	h.syncedAgain(5)
	for _, c := range h.containersOf("side") {
		if c.Name != "proxy" {
			t.Fatalf("%s started before the sidecar's startup probe passed", c.Name)
		}
	}
	if s := p.Status.InitContainerStatuses[0]; s.Started == nil || *s.Started || s.Ready {
		t.Errorf("unstarted sidecar status %+v", s)
	}
	started.Store(true)
	h.waitPod("side", "setup running", func(p *v1.Pod) bool { return p.Status.InitContainerStatuses[1].State.Running != nil })
	h.rt.Exit(h.current("side", "setup").ID, 0, "Completed")
	p = h.waitPod("side", "running and ready", running)
	if s := p.Status.InitContainerStatuses[0]; s.State.Running == nil || !s.Ready || !*s.Started {
		t.Errorf("sidecar status %+v, want running, started, ready", s)
	}
	if c := initCond(p); c.Status != v1.ConditionTrue {
		t.Errorf("Initialized = %+v", c)
	}

	// Restarted although the pod's policy is Never.
	h.rt.Exit(h.current("side", "proxy").ID, 1, "Error")
	h.waitPod("side", "sidecar restarted", func(p *v1.Pod) bool {
		s := p.Status.InitContainerStatuses[0]
		return s.RestartCount == 1 && s.State.Running != nil && p.Status.Phase == v1.PodRunning
	})
	if n := len(byName(h.containersOf("side"))["setup"]); n != 1 {
		t.Errorf("setup ran %d times", n)
	}

	// The app completes: the sidecar is stopped, the pod succeeds.
	h.rt.Exit(h.current("side", "echo").ID, 0, "Completed")
	p = h.waitPod("side", "succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if s := h.current("side", "proxy"); s.State != runtime.StateExited {
		t.Errorf("sidecar %s after the pod completed", s.State)
	}
	mu.Lock()
	if got := strings.Join(order, ","); got != "proxy" {
		t.Errorf("preStop hooks ran for %q, want the sidecar's only (the app had exited)", got)
	}
	mu.Unlock()
}

// On deletion the app containers stop first (their preStop hooks can still
// use the sidecars), then the sidecars in reverse order.
func TestDeletionStopsSidecarsLastInReverseOrder(t *testing.T) {
	h := newHarness(t, nil)
	var mu sync.Mutex
	var order []string
	h.rt.ExecFunc = func(c runtime.Container, cmd []string) int {
		if cmd[0] == "prestop" {
			mu.Lock()
			order = append(order, c.Name)
			mu.Unlock()
		}
		return 0
	}
	preStop := &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"prestop"}}}}
	always := ptr.To(v1.ContainerRestartPolicyAlways)
	h.create(echoPod("sides", func(p *v1.Pod) {
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5)
		p.Spec.InitContainers = []v1.Container{
			{Name: "first", Image: "img", RestartPolicy: always, Lifecycle: preStop},
			{Name: "second", Image: "img", RestartPolicy: always, Lifecycle: preStop},
		}
		p.Spec.Containers[0].Lifecycle = preStop
	}))
	h.waitPod("sides", "running", running)
	if err := h.cs.CoreV1().Pods("default").Delete(context.Background(), "sides", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "all stopped", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 3, strings.Join(order, ",")
	})
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order, ","); got != "echo,second,first" {
		t.Errorf("stop order %s, want echo,second,first", got)
	}
}

// spec.activeDeadlineSeconds, also when set on a running pod: the pod's
// containers are stopped and it fails with reason DeadlineExceeded.
func TestActiveDeadlineFailsPod(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("deadline", nil))
	p := h.waitPod("deadline", "running", running)
	p.Spec.ActiveDeadlineSeconds = ptr.To[int64](1)
	if _, err := h.cs.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = h.waitPod("deadline", "failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if p.Status.Reason != "DeadlineExceeded" || !strings.Contains(p.Status.Message, "deadline") {
		t.Errorf("reason %q message %q", p.Status.Reason, p.Status.Message)
	}
	if c := h.current("deadline", "echo"); c.State != runtime.StateExited {
		t.Errorf("container %s after the deadline", c.State)
	}
	// Events reach the API through the recorder's goroutine, after or
	// before the status: wait for it.
	waitFor(t, 10*time.Second, "a DeadlineExceeded event", func() (bool, string) {
		return len(h.events("deadline", EventDeadlineExceeded)) > 0, ""
	})
}

// Ephemeral containers added to a running pod start once, are reported in
// ephemeralContainerStatuses and are never restarted.
func TestEphemeralContainerRunsOnce(t *testing.T) {
	h := newHarness(t, nil)
	h.create(echoPod("debugme", nil))
	p := h.waitPod("debugme", "running", running)
	p.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{
		Name: "debugger", Image: "img", Stdin: true, TTY: true}}}
	if _, err := h.cs.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = h.waitPod("debugme", "ephemeral running", func(p *v1.Pod) bool {
		return len(p.Status.EphemeralContainerStatuses) == 1 && p.Status.EphemeralContainerStatuses[0].State.Running != nil
	})
	if !running(p) {
		t.Errorf("pod not running and ready beside its ephemeral container: %+v", p.Status)
	}
	h.rt.Exit(h.current("debugme", "debugger").ID, 0, "Completed")
	h.waitPod("debugme", "ephemeral terminated", func(p *v1.Pod) bool {
		return p.Status.EphemeralContainerStatuses[0].State.Terminated != nil
	})
	h.syncedAgain(5)
	if n := len(byName(h.containersOf("debugme"))["debugger"]); n != 1 {
		t.Errorf("ephemeral container ran %d times", n)
	}
	if p := h.pod("debugme"); !running(p) {
		t.Errorf("pod after its ephemeral container exited: %+v", p.Status)
	}
}

// gRPC probes go to the pod's gRPC health service: SERVING passes,
// NOT_SERVING and a closed port fail.
func TestGRPCProbe(t *testing.T) {
	h := newHarness(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(l)
	defer srv.Stop()
	pod := echoPod("grpc", func(p *v1.Pod) { p.Spec.HostNetwork = true })
	port := int32(l.Addr().(*net.TCPAddr).Port)
	probe := func(port int32, service string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return h.k.grpcProbe(ctx, pod, &v1.GRPCAction{Port: port, Service: &service})
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	if err := probe(port, ""); err != nil {
		t.Errorf("SERVING: %v", err)
	}
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_NOT_SERVING)
	if err := probe(port, "db"); err == nil {
		t.Error("NOT_SERVING passed")
	}
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	cport := int32(closed.Addr().(*net.TCPAddr).Port)
	closed.Close()
	if err := probe(cport, ""); err == nil {
		t.Error("a closed port passed")
	}
}

// HTTP hooks and probes send the path's query as a query (the lifecycle
// hook specs call /echo?msg=poststart) and say who asks.
func TestHTTPActionKeepsQueryAndSaysWho(t *testing.T) {
	h := newHarness(t, nil)
	got := make(chan *http.Request, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r }))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	pod := echoPod("hooked", func(p *v1.Pod) { p.Spec.HostNetwork = true })
	hook := &v1.LifecycleHandler{HTTPGet: &v1.HTTPGetAction{Path: "/echo?msg=poststart", Port: intstr.FromInt(port)}}
	if err := h.k.runHandler(context.Background(), pod, runtime.Container{}, &pod.Spec.Containers[0], hook); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.URL.Path != "/echo" || r.URL.Query().Get("msg") != "poststart" {
		t.Errorf("hook requested %s", r.URL)
	}
	if ua := r.Header.Get("User-Agent"); !strings.HasPrefix(ua, "kube-lifecycle/") {
		t.Errorf("hook User-Agent %q", ua)
	}
	probe := &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: hook.HTTPGet}}
	if err := h.k.probe(context.Background(), pod, &pod.Spec.Containers[0], runtime.Container{}, probe); err != nil {
		t.Fatal(err)
	}
	if r := <-got; !strings.HasPrefix(r.Header.Get("User-Agent"), "kube-probe/") || r.URL.RawQuery != "msg=poststart" {
		t.Errorf("probe requested %s as %q", r.URL, r.Header.Get("User-Agent"))
	}
}
