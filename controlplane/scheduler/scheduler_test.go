package scheduler

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fakeCluster is a fake clientset whose pods/binding sets spec.nodeName, as
// the API server does; failBinds makes the next bindings fail.
type fakeCluster struct {
	cs        *fake.Clientset
	failBinds atomic.Int32
	binds     atomic.Int32
}

func newFakeCluster(t *testing.T) *fakeCluster {
	f := &fakeCluster{cs: fake.NewClientset()}
	podsGVR := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	f.cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		if f.failBinds.Load() > 0 {
			f.failBinds.Add(-1)
			return true, nil, errors.New("injected binding failure")
		}
		b := ca.GetObject().(*v1.Binding)
		obj, err := f.cs.Tracker().Get(podsGVR, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*v1.Pod).DeepCopy()
		if pod.Spec.NodeName != "" {
			return true, nil, errors.New("pod is already assigned")
		}
		pod.Spec.NodeName = b.Target.Name
		f.binds.Add(1)
		return true, b, f.cs.Tracker().Update(podsGVR, pod, b.Namespace)
	})
	return f
}

func (f *fakeCluster) start(t *testing.T, opts Options) *Scheduler {
	t.Helper()
	watches := testutil.TrackWatches(f.cs)
	factory := informers.NewSharedInformerFactory(f.cs, 0)
	if opts.PodInitialBackoff == 0 {
		opts.PodInitialBackoff, opts.PodMaxBackoff = 50*time.Millisecond, 200*time.Millisecond
	}
	s, err := New(f.cs, factory, quietLog(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; factory.Shutdown() })
	watches.WaitOpen(t, 2, 10*time.Second) // pods, nodes
	return s
}

func (f *fakeCluster) create(t *testing.T, objs ...runtime.Object) {
	t.Helper()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *v1.Node:
			_, err = f.cs.CoreV1().Nodes().Create(context.Background(), o, metav1.CreateOptions{})
		case *v1.Pod:
			_, err = f.cs.CoreV1().Pods(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// eventually polls cond until it holds. The deadline only bounds a test
// that would otherwise hang: a machine under heavy load (CI beside other
// builds) takes seconds for what takes milliseconds here.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 45*time.Second, what, cond)
}

func (f *fakeCluster) pod(t *testing.T, name string) *v1.Pod {
	t.Helper()
	p, err := f.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSchedulesOnlyItsOwnPendingPods(t *testing.T) {
	f := newFakeCluster(t)
	reg := prometheus.NewRegistry()
	f.start(t, Options{Registerer: reg})
	f.create(t, newNode("n1"),
		newPod("mine"),
		newPod("unnamed", func(p *v1.Pod) { p.Spec.SchedulerName = "" }),
		newPod("theirs", func(p *v1.Pod) { p.Spec.SchedulerName = "other-scheduler" }),
	)
	// A pod of ours created after "theirs" is queued after it: once it is
	// bound, "theirs" has been seen and would have been bound before it.
	f.create(t, newPod("mine-after"))
	eventually(t, "own pods bound", func() bool {
		return f.pod(t, "mine").Spec.NodeName == "n1" && f.pod(t, "unnamed").Spec.NodeName == "n1" &&
			f.pod(t, "mine-after").Spec.NodeName == "n1"
	})
	if n := f.pod(t, "theirs").Spec.NodeName; n != "" {
		t.Fatalf("pod of another scheduler was bound to %s", n)
	}
	eventually(t, "scheduled attempts counted", func() bool {
		return counterValue(t, reg, "scheduler_schedule_attempts_total", resultScheduled) == 3
	})
}

// counterValue reads a labelled counter from reg.
func counterValue(t testing.TB, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

func TestUnschedulablePodGetsConditionAndEventThenFitsWhenANodeAppears(t *testing.T) {
	f := newFakeCluster(t)
	f.start(t, Options{})
	f.create(t, newNode("small", withAllocatable("1", "1Gi", "10")), newPod("big", requests("2", "1Gi")))
	eventually(t, "PodScheduled=False/Unschedulable", func() bool {
		for _, c := range f.pod(t, "big").Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable &&
				c.Message == "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod." {
				return true
			}
		}
		return false
	})
	eventually(t, "FailedScheduling event", func() bool {
		evs, _ := f.cs.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		for _, e := range evs.Items {
			if e.Reason == "FailedScheduling" && e.InvolvedObject.Name == "big" && strings.Contains(e.Message, "Insufficient cpu") {
				return true
			}
		}
		return false
	})
	f.create(t, newNode("large", withAllocatable("8", "8Gi", "10")))
	eventually(t, "pod bound to the new node", func() bool { return f.pod(t, "big").Spec.NodeName == "large" })
}

func TestAssumedPodsNeverDoubleBookANode(t *testing.T) {
	f := newFakeCluster(t)
	// Only one of three 1-CPU pods fits the single 1.5-CPU node, even though
	// they arrive together, long before any watch event reports a binding.
	f.create(t, newNode("n", withAllocatable("1500m", "8Gi", "10")))
	for _, name := range []string{"a", "b", "c"} {
		f.create(t, newPod(name, requests("1", "1Gi")))
	}
	f.start(t, Options{})
	// Every pod has had its decision once the other two are reported
	// unschedulable; only then is the count of bindings final.
	eventually(t, "one pod bound, two unschedulable", func() bool {
		unschedulable := 0
		for _, name := range []string{"a", "b", "c"} {
			for _, c := range f.pod(t, name).Status.Conditions {
				if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
					unschedulable++
				}
			}
		}
		return f.binds.Load() >= 1 && unschedulable == 2
	})
	if n := f.binds.Load(); n != 1 {
		t.Fatalf("%d pods bound to a node that fits one", n)
	}
}

func TestFailedBindingIsForgottenAndRetried(t *testing.T) {
	f := newFakeCluster(t)
	f.failBinds.Store(1)
	// The node fits exactly one pod: if the failed assumption were kept, the
	// retry would find the node full.
	f.create(t, newNode("n", withAllocatable("1", "8Gi", "10")), newPod("p", requests("1", "1Gi")))
	f.start(t, Options{})
	eventually(t, "pod bound after a failed binding", func() bool { return f.pod(t, "p").Spec.NodeName == "n" })
}

func TestDeletedBoundPodFreesItsNode(t *testing.T) {
	f := newFakeCluster(t)
	f.create(t, newNode("n", withAllocatable("1", "8Gi", "10")), newPod("first", requests("1", "1Gi")))
	f.start(t, Options{})
	eventually(t, "first bound", func() bool { return f.pod(t, "first").Spec.NodeName == "n" })
	f.create(t, newPod("second", requests("1", "1Gi")))
	eventually(t, "second unschedulable", func() bool { return len(f.pod(t, "second").Status.Conditions) > 0 })
	if err := f.cs.CoreV1().Pods("default").Delete(context.Background(), "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "second bound once first is gone", func() bool { return f.pod(t, "second").Spec.NodeName == "n" })
}

func TestNewRejectsBadBackoff(t *testing.T) {
	_, err := New(fake.NewClientset(), informers.NewSharedInformerFactory(fake.NewClientset(), 0), quietLog(),
		Options{PodInitialBackoff: 10 * time.Second, PodMaxBackoff: time.Second})
	if err == nil {
		t.Fatal("New accepted a max back-off shorter than the initial one")
	}
}

func TestGatedPodWaitsUntilItsGatesAreRemoved(t *testing.T) {
	f := newFakeCluster(t)
	f.create(t, newNode("n"))
	f.start(t, Options{})
	f.create(t, newPod("gated", func(p *v1.Pod) { p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "example.com/quota"}} }))
	// An ungated pod created after it is bound only after the scheduler has
	// seen the gated one.
	f.create(t, newPod("ungated"))
	eventually(t, "the later ungated pod bound", func() bool { return f.pod(t, "ungated").Spec.NodeName == "n" })
	if p := f.pod(t, "gated"); p.Spec.NodeName != "" {
		t.Fatalf("gated pod was bound to %s", p.Spec.NodeName)
	}
	eventually(t, "PodScheduled=False/SchedulingGated", func() bool {
		return hasCondition(f.pod(t, "gated"), v1.PodReasonSchedulingGated, "Scheduling is blocked due to non-empty scheduling gates")
	})
	p := f.pod(t, "gated")
	p.Spec.SchedulingGates = nil
	if _, err := f.cs.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod bound once its gates are gone", func() bool { return f.pod(t, "gated").Spec.NodeName == "n" })
}
