package kubelet

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

func resources(req, lim map[v1.ResourceName]string) v1.ResourceRequirements {
	list := func(m map[v1.ResourceName]string) v1.ResourceList {
		if m == nil {
			return nil
		}
		l := v1.ResourceList{}
		for k, v := range m {
			l[k] = resource.MustParse(v)
		}
		return l
	}
	return v1.ResourceRequirements{Requests: list(req), Limits: list(lim)}
}

// resizeTo writes the pod's new container resources as the pods/resize
// subresource does: spec changed, generation up.
func (h *harness) resizeTo(name string, r v1.ResourceRequirements, policy ...v1.ContainerResizePolicy) {
	h.t.Helper()
	p := h.pod(name)
	p.Spec.Containers[0].Resources = r
	if policy != nil {
		p.Spec.Containers[0].ResizePolicy = policy
	}
	p.Generation++
	if _, err := h.cs.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// resizedTo: the pod's status says its container runs with r (status
// resources, allocatedResources), for the pod's current generation, with
// no resize condition left.
func resizedTo(r v1.ResourceRequirements) func(*v1.Pod) bool {
	return func(p *v1.Pod) bool {
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ObservedGeneration != p.Generation {
			return false
		}
		cs := p.Status.ContainerStatuses[0]
		return cs.Resources != nil && apiequality.Semantic.DeepEqual(*cs.Resources, r) &&
			apiequality.Semantic.DeepEqual(cs.AllocatedResources, r.Requests) &&
			cond(p, v1.PodResizePending) == "" && cond(p, v1.PodResizeInProgress) == ""
	}
}

// TestInPlaceResize: a running container's resources change in place
// (same container, new record in the runtime, status.resources and
// allocatedResources follow, events); a resource whose resizePolicy is
// RestartContainer restarts it; a resize the node cannot hold waits as
// PodResizePending — Infeasible beyond allocatable, Deferred while other
// pods hold the room, actuated once they are gone.
func TestInPlaceResize(t *testing.T) {
	h := newHarness(t, nil)
	orig := resources(map[v1.ResourceName]string{v1.ResourceCPU: "20m", v1.ResourceMemory: "35Mi"}, nil)
	h.create(echoPod("p", func(p *v1.Pod) { p.Generation = 1; p.Spec.Containers[0].Resources = orig }))
	p := h.waitPod("p", "running with its resources in the status", func(p *v1.Pod) bool { return running(p) && resizedTo(orig)(p) })
	first := h.current("p", "echo")
	if got, _ := h.rt.PodCgroup(podCgroup(h.k.cfg.CgroupRoot, p.UID)); got != (runtime.Resources{CPUShares: 20, CPUPeriod: 100000}) {
		t.Errorf("pod cgroup of a Burstable pod without limits: %+v", got)
	}

	// In place: CPU request up, a CPU limit added.
	up := resources(map[v1.ResourceName]string{v1.ResourceCPU: "25m", v1.ResourceMemory: "35Mi"}, map[v1.ResourceName]string{v1.ResourceCPU: "35m"})
	h.resizeTo("p", up)
	p = h.waitPod("p", "resized in place", resizedTo(up))
	if cs := p.Status.ContainerStatuses[0]; cs.RestartCount != 0 || cs.ContainerID != "containerd://"+first.ID {
		t.Errorf("an in-place resize restarted the container: %+v", cs)
	}
	if got := h.current("p", "echo").ResourcesRecord; got != resourcesRecord(up) {
		t.Errorf("runtime record %s, want %s", got, resourcesRecord(up))
	}
	if len(h.events("p", "ResizeCompleted")) == 0 {
		t.Error("no ResizeCompleted event")
	}
	// The pod cgroup follows: shares from the requests, the quota now that
	// every container declares a CPU limit, no memory limit (none declared).
	podCg := podCgroup(h.k.cfg.CgroupRoot, p.UID)
	if got, _ := h.rt.PodCgroup(podCg); got != (runtime.Resources{CPUShares: 25, CPUQuota: 3500, CPUPeriod: 100000}) {
		t.Errorf("pod cgroup after the resize: %+v", got)
	}

	// Memory with resizePolicy RestartContainer: the next attempt runs
	// with the new resources.
	restart := resources(map[v1.ResourceName]string{v1.ResourceCPU: "25m", v1.ResourceMemory: "40Mi"}, map[v1.ResourceName]string{v1.ResourceCPU: "35m"})
	h.resizeTo("p", restart, v1.ContainerResizePolicy{ResourceName: v1.ResourceMemory, RestartPolicy: v1.RestartContainer})
	p = h.waitPod("p", "restarted with the new memory", func(p *v1.Pod) bool { return running(p) && resizedTo(restart)(p) })
	if cs := p.Status.ContainerStatuses[0]; cs.RestartCount != 1 {
		t.Errorf("restartCount %d after a RestartContainer resize, want 1", cs.RestartCount)
	}

	// More CPU than the node has: Infeasible, the container keeps its own.
	node, err := h.cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alloc := node.Status.Allocatable[v1.ResourceCPU]
	huge := resources(map[v1.ResourceName]string{v1.ResourceCPU: "1000", v1.ResourceMemory: "40Mi"}, nil)
	h.resizeTo("p", huge)
	p = h.waitPod("p", "resize infeasible", func(p *v1.Pod) bool { return cond(p, v1.PodResizePending) == v1.ConditionTrue })
	if c := resizeCond(p, v1.PodResizePending); c.Reason != v1.PodReasonInfeasible {
		t.Errorf("PodResizePending %+v, want reason Infeasible", c)
	}
	if cs := p.Status.ContainerStatuses[0]; !apiequality.Semantic.DeepEqual(*cs.Resources, restart) {
		t.Errorf("an infeasible resize changed status.resources: %+v", cs.Resources)
	}
	if len(h.events("p", "ResizeInfeasible")) == 0 {
		t.Error("no ResizeInfeasible event")
	}

	// Fits the node, not beside another pod: Deferred until it is gone.
	hogCPU := alloc.DeepCopy()
	hogCPU.Sub(resource.MustParse("100m"))
	h.create(echoPod("hog", func(p *v1.Pod) {
		p.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: hogCPU}}
	}))
	h.waitPod("hog", "running", running)
	fits := resources(map[v1.ResourceName]string{v1.ResourceCPU: "500m", v1.ResourceMemory: "40Mi"}, nil)
	h.resizeTo("p", fits)
	p = h.waitPod("p", "resize deferred", func(p *v1.Pod) bool {
		return resizeCond(p, v1.PodResizePending).Reason == v1.PodReasonDeferred && p.Status.ObservedGeneration == p.Generation
	})
	if err := h.cs.CoreV1().Pods("default").Delete(context.Background(), "hog", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitPod("p", "resized once the other pod is gone", resizedTo(fits))
}

func resizeCond(p *v1.Pod, t v1.PodConditionType) v1.PodCondition {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return v1.PodCondition{}
}

// TestExtendedResourcesOfOthersSurviveStatusUpdates: an extended resource
// another writer put in the node's capacity stays there, and in
// allocatable, through the kubelet's status updates (upstream's e2e
// AddExtendedResource relies on it); the machine's own resources stay the
// kubelet's.
func TestExtendedResourcesOfOthersSurviveStatusUpdates(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.NodeStatusUpdateFrequency = 50 * time.Millisecond })
	// Written while the kubelet is stopped: the fake clientset has no
	// optimistic concurrency, so a status update in flight would silently
	// overwrite it (the real API server answers that with a conflict).
	h.stop()
	nodes := h.cs.CoreV1().Nodes()
	n, err := nodes.Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Capacity["example.com/dongle"] = resource.MustParse("4")
	n.Status.Capacity[v1.ResourcePods] = resource.MustParse("3")
	if _, err := nodes.UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.start()
	waitFor(t, 10*time.Second, "the kubelet's next status update", func() (bool, string) {
		n, _ := nodes.Get(context.Background(), node, metav1.GetOptions{})
		pods := n.Status.Capacity[v1.ResourcePods]
		return pods.Value() != 3, pods.String()
	})
	n, _ = nodes.Get(context.Background(), node, metav1.GetOptions{})
	for _, l := range []v1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
		if q := l["example.com/dongle"]; q.Value() != 4 {
			t.Errorf("example.com/dongle = %s after a status update, want 4 (capacity %v, allocatable %v)", q.String(), n.Status.Capacity, n.Status.Allocatable)
		}
	}
}

// TestInPlaceResizeOfASidecar: a sidecar (an init container with
// restartPolicy Always) is resized in place as an app container is: the
// same container runs with the new resources, its init container status
// says so, and the pod cgroup holds the sum with the app container's.
func TestInPlaceResizeOfASidecar(t *testing.T) {
	h := newHarness(t, nil)
	app := resources(map[v1.ResourceName]string{v1.ResourceCPU: "20m"}, nil)
	side := resources(map[v1.ResourceName]string{v1.ResourceCPU: "10m"}, nil)
	h.create(echoPod("s", func(p *v1.Pod) {
		p.Generation = 1
		p.Spec.Containers[0].Resources = app
		p.Spec.InitContainers = []v1.Container{{Name: "side", Image: "waggle.local/waggle-echo:dev",
			RestartPolicy: ptr.To(v1.ContainerRestartPolicyAlways), Resources: side}}
	}))
	sideRuns := func(r v1.ResourceRequirements) func(*v1.Pod) bool {
		return func(p *v1.Pod) bool {
			if !running(p) || len(p.Status.InitContainerStatuses) != 1 || p.Status.ObservedGeneration != p.Generation {
				return false
			}
			cs := p.Status.InitContainerStatuses[0]
			return cs.Resources != nil && apiequality.Semantic.DeepEqual(*cs.Resources, r) &&
				apiequality.Semantic.DeepEqual(cs.AllocatedResources, r.Requests) && cond(p, v1.PodResizeInProgress) == ""
		}
	}
	p := h.waitPod("s", "running with the sidecar's resources in its status", sideRuns(side))
	first := h.current("s", "side")

	bigger := resources(map[v1.ResourceName]string{v1.ResourceCPU: "30m"}, nil)
	p.Spec.InitContainers[0].Resources = bigger
	p.Generation++
	if _, err := h.cs.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = h.waitPod("s", "the sidecar resized in place", sideRuns(bigger))
	if cs := p.Status.InitContainerStatuses[0]; cs.RestartCount != 0 || cs.ContainerID != "containerd://"+first.ID {
		t.Errorf("an in-place resize restarted the sidecar: %+v", cs)
	}
	if got := h.current("s", "side").ResourcesRecord; got != resourcesRecord(bigger) {
		t.Errorf("runtime record %s, want %s", got, resourcesRecord(bigger))
	}
	if got, _ := h.rt.PodCgroup(podCgroup(h.k.cfg.CgroupRoot, p.UID)); got.CPUShares != 51 {
		t.Errorf("pod cgroup after the sidecar's resize: %+v, want the shares of 50m", got)
	}
}
