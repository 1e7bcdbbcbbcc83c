package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	resourcehelper "k8s.io/component-helpers/resource"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

// In-place pod resize (KEP-1287, GA upstream), the kubelet's part: a
// running app or sidecar container (an init container with restartPolicy
// Always, which upstream resizes too) whose spec resources (changed through the
// pods/resize subresource) differ from the ones it runs with is resized
// when the node can hold the pod's new requests: its cgroups change in
// place (runc update), or it is restarted when its resizePolicy says
// RestartContainer for a resource that changed. The resources a container
// runs with are recorded with the container in the runtime
// (ContainerConfig.ResourcesRecord), so a restarted kubelet knows them;
// they are its status.resources, their requests its allocatedResources.
// A resize the node cannot hold waits with the pod condition
// PodResizePending (Deferred: other pods hold the room; Infeasible: the
// node is too small) and is retried at every sync; a resize the runtime
// failed to apply shows as PodResizeInProgress with reason Error.
//
// The pod cgroup (podResources) holds the loosest of the old and new
// settings while the containers move, then the new ones.
//
// Left out, as yet: resizing pod-level resources (spec.resources; alpha
// upstream, InPlacePodLevelResourcesVerticalScaling), and upstream's check that a memory limit is
// not cut below current usage (the kernel reclaims or the update fails,
// which is then reported as an Error).

// resourcesRecord is how a container's resources are recorded with it.
func resourcesRecord(r v1.ResourceRequirements) string {
	b, err := json.Marshal(v1.ResourceRequirements{Limits: r.Limits, Requests: r.Requests})
	if err != nil {
		return ""
	}
	return string(b)
}

// runningResources are the resources the container cur runs with: its
// record, or for a container started without one (by a kubelet from before
// records), its spec's.
func runningResources(cur runtime.Container, spec *v1.Container) v1.ResourceRequirements {
	if cur.ResourcesRecord != "" {
		var r v1.ResourceRequirements
		if err := json.Unmarshal([]byte(cur.ResourcesRecord), &r); err == nil {
			return r
		}
	}
	return v1.ResourceRequirements{Limits: spec.Resources.Limits, Requests: spec.Resources.Requests}
}

// needsResize reports whether the running container cur runs with other
// resources than its spec asks for.
func needsResize(cur runtime.Container, spec *v1.Container) bool {
	have := runningResources(cur, spec)
	return !apiequality.Semantic.DeepEqual(have.Requests, spec.Resources.Requests) ||
		!apiequality.Semantic.DeepEqual(have.Limits, spec.Resources.Limits)
}

// resizable lists the pod's containers a resize may change: its sidecars
// (restartable init containers) and its app containers.
func resizable(pod *v1.Pod) []*v1.Container {
	var out []*v1.Container
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; podutil.IsRestartableInitContainer(c) {
			out = append(out, c)
		}
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}

// runningPod is pod with its running sidecar and app containers' resources
// replaced by the ones they run with (what its pod cgroup must hold).
func runningPod(pod *v1.Pod, named map[string][]runtime.Container) *v1.Pod {
	p := pod.DeepCopy()
	for _, c := range resizable(p) {
		if l := named[c.Name]; len(l) > 0 && l[0].State == runtime.StateRunning {
			c.Resources = runningResources(l[0], c)
		}
	}
	return p
}

// resizeCondition is a resize's pod condition: PodResizePending or
// PodResizeInProgress, with its reason and message.
type resizeCondition struct {
	typ             v1.PodConditionType
	reason, message string
}

// admitResize decides whether the pod's pending resize (its running sidecar
// and app containers whose resources differ from their spec) can be
// actuated now:
// the node's allocatable must hold the pod's new requests beside every
// other active pod's. It records a refusal as w.resizePending (with an
// event when it is new) and returns whether any container is to be
// resized now.
func (w *podWorker) admitResize(pod *v1.Pod, named map[string][]runtime.Container) bool {
	pending := false
	for _, c := range resizable(pod) {
		if l := named[c.Name]; len(l) > 0 && l[0].State == runtime.StateRunning && needsResize(l[0], c) {
			pending = true
		}
	}
	if !pending {
		w.resizePending, w.resizeError = nil, nil
		return false
	}
	refusal := w.k.resizeFits(pod)
	if refusal == nil {
		w.resizePending = nil
		return true
	}
	if w.resizePending == nil || *w.resizePending != *refusal {
		typ := EventResizeDeferred
		if refusal.reason == v1.PodReasonInfeasible {
			typ = EventResizeInfeasible
		}
		w.k.event(pod, v1.EventTypeWarning, typ, "Pod resize %s: %s", strings.ToLower(refusal.reason), refusal.message)
	}
	w.resizePending = refusal
	return false
}

// resizeFits checks pod's requests (its spec's, as resized) against the
// node's allocatable CPU and memory: Infeasible when the pod alone does not
// fit, Deferred when it does not fit beside the other active pods; nil
// when it fits.
func (k *Kubelet) resizeFits(pod *v1.Pod) *resizeCondition {
	n := k.node()
	if n == nil || len(n.Status.Allocatable) == 0 {
		return nil // nothing to check against yet
	}
	want := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	others := v1.ResourceList{}
	k.mu.Lock()
	for _, o := range k.workers {
		if o.uid == pod.UID || o.rejected != nil {
			continue
		}
		o.mu.Lock()
		op, gone := o.pod, o.gone
		o.mu.Unlock()
		if gone || op == nil || isTerminalPhase(op.Status.Phase) {
			continue
		}
		for name, q := range resourcehelper.PodRequests(op, resourcehelper.PodResourcesOptions{}) {
			add(others, name, q)
		}
	}
	k.mu.Unlock()
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
		alloc, ok := n.Status.Allocatable[name]
		if !ok {
			continue
		}
		req := want[name]
		if req.Cmp(alloc) > 0 {
			return &resizeCondition{v1.PodResizePending, v1.PodReasonInfeasible,
				fmt.Sprintf("Node didn't have enough capacity: %s, requested: %s, capacity: %s", name, req.String(), alloc.String())}
		}
		used := others[name]
		total := used.DeepCopy()
		total.Add(req)
		if total.Cmp(alloc) > 0 {
			return &resizeCondition{v1.PodResizePending, v1.PodReasonDeferred,
				fmt.Sprintf("Node didn't have enough resource: %s, requested: %s, used: %s, capacity: %s", name, req.String(), used.String(), alloc.String())}
		}
	}
	return nil
}

// resize actuates an admitted resize of the running container cur: a
// restart when its resizePolicy asks for one for a resource that changed,
// else an in-place update of its cgroups. restarted says the container was
// stopped and its next attempt started.
func (w *podWorker) resize(ctx context.Context, pod *v1.Pod, c *v1.Container, cur runtime.Container) (restarted bool, err error) {
	k := w.k
	have := runningResources(cur, c)
	if restartOnResize(c, have) {
		k.log.Info("container resized, will be restarted (resizePolicy RestartContainer)", "pod", pod.Name, "container", c.Name)
		if err := w.terminate(ctx, pod, []runtime.Container{cur}, gracePeriod(pod)); err != nil {
			return false, err
		}
		return true, w.start(ctx, pod, c, cur.Attempt+1, false)
	}
	var cfg runtime.ContainerConfig
	applyResources(&cfg, c.Resources)
	record := resourcesRecord(c.Resources)
	if err := k.rt.UpdateResources(ctx, cur.ID, cfg.Resources, record); err != nil {
		w.resizeError = &resizeCondition{v1.PodResizeInProgress, "Error", err.Error()}
		k.containerEvent(pod, c.Name, v1.EventTypeWarning, EventResizeError, "Pod resize error: %v", err)
		return false, err
	}
	w.resizeError = nil
	w.resized[cur.ID] = record
	k.containerEvent(pod, c.Name, v1.EventTypeNormal, EventResizeCompleted, "Pod resize completed: container %s runs with %s", c.Name, record)
	return false, nil
}

// restartOnResize: a resource whose value changes has resizePolicy
// RestartContainer.
func restartOnResize(c *v1.Container, have v1.ResourceRequirements) bool {
	for _, p := range c.ResizePolicy {
		if p.RestartPolicy != v1.RestartContainer {
			continue
		}
		r := p.ResourceName
		if !quantityEqual(have.Requests, c.Resources.Requests, r) || !quantityEqual(have.Limits, c.Resources.Limits, r) {
			return true
		}
	}
	return false
}

func quantityEqual(a, b v1.ResourceList, name v1.ResourceName) bool {
	qa, oka := a[name]
	qb, okb := b[name]
	return oka == okb && qa.Cmp(qb) == 0
}

// resizeConditions are the pod's resize conditions now.
func (w *podWorker) resizeConditions() []resizeCondition {
	var out []resizeCondition
	if w.resizePending != nil {
		out = append(out, *w.resizePending)
	}
	if w.resizeError != nil {
		out = append(out, *w.resizeError)
	}
	return out
}
