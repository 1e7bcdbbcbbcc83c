package kubelet

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

type countGets struct {
	rt   http.RoundTripper
	gets atomic.Int32
}

func (c *countGets) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/pods/") {
		c.gets.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// TestStatusWriteReadsOnlyWhenOthersWrote, against a real API server: the
// kubelet writes a pod's status over the version its last write returned
// (or the pod as delivered), without reading the pod; a condition another
// writer added since makes that a conflict, and the kubelet then reads the
// pod and keeps the condition; a replaced pod's status is never written.
func TestStatusWriteReadsOnlyWhenOthersWrote(t *testing.T) {
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	counter := &countGets{}
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.rt = rt; return counter }
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pods := cs.CoreV1().Pods("default")
	pod, err := pods.Create(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "example.com/i"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := &podWorker{k: &Kubelet{client: cs}, uid: pod.UID}
	status := func(phase v1.PodPhase, restarts int32) v1.PodStatus {
		return v1.PodStatus{Phase: phase, QOSClass: v1.PodQOSBestEffort,
			Conditions:        []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionFalse, Reason: "ContainersNotReady"}},
			ContainerStatuses: []v1.ContainerStatus{{Name: "c", Image: "example.com/i", RestartCount: restarts}}}
	}
	stored := func() *v1.Pod {
		p, err := pods.Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	for i, phase := range []v1.PodPhase{v1.PodPending, v1.PodRunning} {
		if err := w.updateStatus(ctx, pod, status(phase, int32(i))); err != nil {
			t.Fatal(err)
		}
	}
	if n := counter.gets.Load(); n != 0 {
		t.Errorf("the kubelet read the pod %d times to write statuses nobody else wrote", n)
	}
	if p := stored(); p.Status.Phase != v1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 1 {
		t.Errorf("stored status %+v", p.Status)
	}

	p := stored()
	p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: "example.com/late", Status: v1.ConditionTrue})
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	counter.gets.Store(0)
	// The kubelet's watch has not delivered the other write yet: its
	// view is its own last write.
	if err := w.updateStatus(ctx, pod, status(v1.PodRunning, 2)); err != nil {
		t.Fatal(err)
	}
	p = stored()
	if p.Status.ContainerStatuses[0].RestartCount != 2 {
		t.Errorf("status not written: %+v", p.Status)
	}
	found := false
	for _, c := range p.Status.Conditions {
		found = found || c.Type == "example.com/late"
	}
	if !found {
		t.Errorf("a condition another writer added was lost: %+v", p.Status.Conditions)
	}
	if n := counter.gets.Load(); n != 2 { // the kubelet's, after the conflict, and this test's
		t.Errorf("%d reads, want the kubelet's one after the conflict and this test's", n)
	}

	if err := pods.Delete(ctx, "p", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "example.com/i"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.updateStatus(ctx, pod, status(v1.PodFailed, 3)); err == nil || !strings.Contains(err.Error(), "replaced") {
		t.Errorf("status of a replaced pod: err = %v", err)
	}
	if p := stored(); p.Status.Phase == v1.PodFailed {
		t.Errorf("the replacement got the old pod's status: %+v", p.Status)
	}
}
