package kubelet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

	"github.com/waggle-io/waggle/kubelet/internal/eviction"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

func ctrState(c runtime.Container) v1.ContainerState {
	switch c.State {
	case runtime.StateRunning:
		return v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.NewTime(c.StartedAt)}}
	case runtime.StateCreated:
		return v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	case runtime.StateExited:
		return v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
			ExitCode: c.ExitCode, Reason: c.Reason, StartedAt: metav1.NewTime(c.StartedAt),
			FinishedAt: metav1.NewTime(c.FinishedAt), ContainerID: "containerd://" + c.ID,
		}}
	}
	return v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
		ExitCode: 128, Reason: "ContainerCannotRun", Message: "container was created but never started",
		ContainerID: "containerd://" + c.ID,
	}}
}

// containerStatuses builds the statuses of specs from the runtime's view.
// init says they are init containers: one that exited 0 is Ready (it did
// its work), a restartable one (sidecar) is ready as an app container is.
func (w *podWorker) containerStatuses(pod *v1.Pod, specs []v1.Container, named map[string][]runtime.Container, init, deleting bool, waitDefault string) []v1.ContainerStatus {
	out := make([]v1.ContainerStatus, 0, len(specs))
	for _, s := range specs {
		cs := v1.ContainerStatus{Name: s.Name, Image: s.Image, ImageID: "", Started: new(bool), AllocatedResources: s.Resources.Requests}
		sidecar := init && podutil.IsRestartableInitContainer(&s)
		l := named[s.Name]
		if len(l) > 0 {
			cur := l[0]
			cs.ContainerID = "containerd://" + cur.ID
			cs.RestartCount = int32(cur.Attempt)
			cs.ImageID = cur.ImageID
			cs.State = ctrState(cur)
			withTerminationMessage(&cs.State, cur, &s)
			if len(l) > 1 {
				cs.LastTerminationState = ctrState(l[1])
				withTerminationMessage(&cs.LastTerminationState, l[1], &s)
			}
			if cur.State == runtime.StateRunning {
				// The resources it runs with; their requests are what the
				// kubelet allocated to it (in-place resize, resize.go).
				have := runningResources(cur, &s)
				cs.Resources, cs.AllocatedResources = &have, have.Requests
			}
			if cur.State == runtime.StateRunning {
				started := w.k.probes.started(cur.ID)
				cs.Started = &started
				cs.Ready = (!init || sidecar) && started && w.k.probes.ready(cur.ID) && !deleting
			}
			if cur.State == runtime.StateExited {
				if init && !sidecar && cur.ExitCode == 0 {
					cs.Ready = true
				}
				if wr, ok := w.waiting[s.Name]; ok && wr.reason == "CrashLoopBackOff" {
					cs.LastTerminationState = cs.State
					cs.State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: wr.reason, Message: wr.message}}
				}
			}
		} else {
			reason, msg := waitDefault, ""
			if wr, ok := w.waiting[s.Name]; ok {
				reason, msg = wr.reason, wr.message
			}
			cs.State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reason, Message: msg}}
		}
		out = append(out, cs)
	}
	return out
}

// regularStarted reports whether any app container of the pod was ever
// started: initialization is then over for good (upstream's
// HasAnyRegularContainerStarted), and init containers never run again.
func regularStarted(pod *v1.Pod, named map[string][]runtime.Container) bool {
	for _, c := range pod.Spec.Containers {
		if len(named[c.Name]) > 0 {
			return true
		}
	}
	return false
}

// incompleteInit lists the init containers that have not done their part:
// an init container that has not exited 0, a sidecar that is not running
// and started. failed says one exited non-zero in a pod that never
// restarts (the pod fails).
func (w *podWorker) incompleteInit(pod *v1.Pod, named map[string][]runtime.Container) (incomplete []string, failed bool) {
	for i := range pod.Spec.InitContainers {
		s := &pod.Spec.InitContainers[i]
		l := named[s.Name]
		if podutil.IsRestartableInitContainer(s) {
			if len(l) == 0 || l[0].State != runtime.StateRunning || !w.k.probes.started(l[0].ID) {
				incomplete = append(incomplete, s.Name)
			}
			continue
		}
		if len(l) == 0 || l[0].State != runtime.StateExited || l[0].ExitCode != 0 {
			incomplete = append(incomplete, s.Name)
		}
		if len(l) > 0 && l[0].State == runtime.StateExited && l[0].ExitCode != 0 && pod.Spec.RestartPolicy == v1.RestartPolicyNever {
			failed = true
		}
	}
	return incomplete, failed
}

// computeStatus derives the pod's status from its containers.
func (w *podWorker) computeStatus(pod *v1.Pod, ctrs []runtime.Container, deleting bool) v1.PodStatus {
	named := byName(ctrs)
	st := v1.PodStatus{QOSClass: qosClass(pod)}
	st.HostIP = w.k.nodeIP
	for _, ip := range w.k.nodeIPs {
		st.HostIPs = append(st.HostIPs, v1.HostIP{IP: ip})
	}
	if w.sb != nil {
		t := metav1.NewTime(w.sb.StartTime)
		st.StartTime = &t
		ips := w.sb.IPs
		if pod.Spec.HostNetwork {
			ips = w.k.nodeIPs
		}
		if len(ips) > 0 {
			st.PodIP = ips[0]
			for _, ip := range ips {
				st.PodIPs = append(st.PodIPs, v1.PodIP{IP: ip})
			}
		}
	} else if pod.Status.StartTime != nil {
		st.StartTime = pod.Status.StartTime
		st.PodIP, st.PodIPs = pod.Status.PodIP, pod.Status.PodIPs
	}

	// Init containers.
	incomplete, initFailed := w.incompleteInit(pod, named)
	initDone := regularStarted(pod, named) || len(incomplete) == 0
	st.InitContainerStatuses = w.containerStatuses(pod, pod.Spec.InitContainers, named, true, deleting, "PodInitializing")
	appWait := "ContainerCreating"
	if !initDone {
		appWait = "PodInitializing"
	}
	st.ContainerStatuses = w.containerStatuses(pod, pod.Spec.Containers, named, false, deleting, appWait)
	if len(st.InitContainerStatuses) == 0 {
		st.InitContainerStatuses = nil
	}
	if len(pod.Spec.EphemeralContainers) > 0 {
		ephemeral := make([]v1.Container, 0, len(pod.Spec.EphemeralContainers))
		for _, ec := range pod.Spec.EphemeralContainers {
			ephemeral = append(ephemeral, v1.Container(ec.EphemeralContainerCommon))
		}
		st.EphemeralContainerStatuses = w.containerStatuses(pod, ephemeral, named, false, deleting, "ContainerCreating")
		for i := range st.EphemeralContainerStatuses {
			st.EphemeralContainerStatuses[i].Ready = false // never probed, never ready
		}
	}

	// Phase.
	running, exited, succeeded, willRestart := 0, 0, 0, 0
	for _, s := range pod.Spec.Containers {
		l := named[s.Name]
		if len(l) == 0 {
			continue
		}
		switch c := l[0]; c.State {
		case runtime.StateRunning, runtime.StateCreated, runtime.StateUnknown:
			running++
		case runtime.StateExited:
			exited++
			if c.ExitCode == 0 {
				succeeded++
			}
			if shouldRestart(pod.Spec.RestartPolicy, c.ExitCode) {
				willRestart++
			}
		}
	}
	n := len(pod.Spec.Containers)
	switch {
	case w.evicted != nil:
		st.Phase = v1.PodFailed
		st.Reason, st.Message = eviction.Reason, w.evicted.message
	case w.deadlineExceeded:
		st.Phase = v1.PodFailed
		st.Reason, st.Message = "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
	case initFailed:
		st.Phase = v1.PodFailed
	case !initDone:
		st.Phase = v1.PodPending
	case exited == n && n > 0 && willRestart == 0:
		if succeeded == n {
			st.Phase = v1.PodSucceeded
		} else {
			st.Phase = v1.PodFailed
		}
	case running > 0 || willRestart > 0:
		st.Phase = v1.PodRunning
	default:
		st.Phase = v1.PodPending
	}
	if deleting && st.Phase == v1.PodRunning {
		st.Phase = v1.PodSucceeded
		if succeeded != n {
			st.Phase = v1.PodFailed
		}
	}

	// Conditions.
	allReady := n > 0
	var unready []string
	for i, cs := range st.InitContainerStatuses {
		if podutil.IsRestartableInitContainer(&pod.Spec.InitContainers[i]) && !cs.Ready {
			allReady = false
			unready = append(unready, cs.Name)
		}
	}
	for _, cs := range st.ContainerStatuses {
		if !cs.Ready {
			allReady = false
			unready = append(unready, cs.Name)
		}
	}
	cond := func(t v1.PodConditionType, ok bool, reason string) v1.PodCondition {
		c := v1.PodCondition{Type: t, Status: v1.ConditionFalse, Reason: reason}
		if ok {
			c.Status, c.Reason = v1.ConditionTrue, ""
		}
		return c
	}
	notReadyReason := "ContainersNotReady"
	if isTerminalPhase(st.Phase) {
		notReadyReason = "PodCompleted"
	}
	st.Conditions = []v1.PodCondition{
		cond(v1.PodInitialized, initDone, "ContainersNotInitialized"),
		cond(v1.PodReady, allReady, notReadyReason),
		cond(v1.ContainersReady, allReady, notReadyReason),
		cond(v1.PodScheduled, true, ""),
	}
	if st.Phase == v1.PodSucceeded {
		st.Conditions[0].Status, st.Conditions[0].Reason = v1.ConditionTrue, "PodCompleted"
	} else if !initDone {
		// Upstream's GeneratePodInitializedCondition message.
		st.Conditions[0].Message = fmt.Sprintf("containers with incomplete status: %s", incomplete)
	}
	if !allReady && !isTerminalPhase(st.Phase) && len(unready) > 0 {
		// Upstream's GenerateContainersReadyCondition message.
		msg := fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
		st.Conditions[1].Message, st.Conditions[2].Message = msg, msg
	}
	// PodReadyToStartContainers (upstream's, on since 1.29): the sandbox
	// is up with its network, so containers can start.
	st.Conditions = append([]v1.PodCondition{
		cond(v1.PodReadyToStartContainers, w.sb != nil && !w.sb.Torn && !deleting, ""),
	}, st.Conditions...)
	if w.evicted != nil {
		// Upstream's DisruptionTarget condition of a kubelet eviction.
		st.Conditions = append(st.Conditions, w.evicted.condition)
	}
	for _, c := range w.resizeConditions() {
		st.Conditions = append(st.Conditions, v1.PodCondition{Type: c.typ, Status: v1.ConditionTrue, Reason: c.reason, Message: c.message})
	}
	// PodObservedGenerationTracking (GA upstream): the generation of the
	// spec this status describes, on the status and on each condition the
	// kubelet owns.
	st.ObservedGeneration = pod.Generation
	for i := range st.Conditions {
		st.Conditions[i].ObservedGeneration = pod.Generation
	}
	if msg := w.teardownErr.Load(); msg != nil {
		st.Reason, st.Message = "NetworkTeardownFailed", *msg
	}
	return st
}

// ownedConditions are the condition types the kubelet writes; others are
// kept as other writers left them.
var ownedConditions = map[v1.PodConditionType]bool{
	v1.PodReadyToStartContainers: true, v1.PodInitialized: true, v1.PodReady: true, v1.ContainersReady: true, v1.PodScheduled: true,
	v1.PodResizePending: true, v1.PodResizeInProgress: true,
}

// mergeStatus puts the kubelet's status into cur, keeping other writers'
// conditions and the transition times of unchanged conditions.
func mergeStatus(cur *v1.PodStatus, st v1.PodStatus, now metav1.Time) {
	old := map[v1.PodConditionType]v1.PodCondition{}
	mine := map[v1.PodConditionType]bool{}
	for _, c := range st.Conditions {
		mine[c.Type] = true
	}
	var others []v1.PodCondition
	for _, c := range cur.Conditions {
		old[c.Type] = c
		// A condition the kubelet shares with others (DisruptionTarget, as
		// upstream's PodConditionSharedByKubelet) is its own once it writes it.
		if !ownedConditions[c.Type] && !mine[c.Type] {
			others = append(others, c)
		}
	}
	conds := make([]v1.PodCondition, 0, len(st.Conditions)+len(others))
	for _, c := range st.Conditions {
		c.LastTransitionTime = now
		if o, ok := old[c.Type]; ok && o.Status == c.Status {
			c.LastTransitionTime = o.LastTransitionTime
		}
		conds = append(conds, c)
	}
	conds = append(conds, others...)
	nominated := cur.NominatedNodeName
	resize := cur.Resize
	*cur = st
	cur.Conditions = conds
	cur.NominatedNodeName = nominated
	cur.Resize = resize
}

// normalizeStatus truncates st's times to what the API stores (RFC 3339,
// whole seconds), as upstream's status manager does before comparing: a
// status that differs from the last written one only below a second (the
// start time the kubelet noted against the one the runtime recorded) is
// the same status to the API, and is not written again.
func normalizeStatus(st *v1.PodStatus) {
	t := func(t *metav1.Time) {
		if t != nil {
			*t = t.Rfc3339Copy()
		}
	}
	t(st.StartTime)
	for i := range st.Conditions {
		t(&st.Conditions[i].LastProbeTime)
		t(&st.Conditions[i].LastTransitionTime)
	}
	state := func(s *v1.ContainerState) {
		if s.Running != nil {
			t(&s.Running.StartedAt)
		}
		if s.Terminated != nil {
			t(&s.Terminated.StartedAt)
			t(&s.Terminated.FinishedAt)
		}
	}
	for _, l := range [][]v1.ContainerStatus{st.InitContainerStatuses, st.ContainerStatuses, st.EphemeralContainerStatuses} {
		for i := range l {
			state(&l[i].State)
			state(&l[i].LastTerminationState)
		}
	}
}

// writeStatus writes st through pods/status when it changed since the last
// write. For a static pod it goes to the mirror pod.
//
// A regular pod's status is written over the pod as the kubelet last knew
// it stored (what the API returned for its last status write, or the pod
// as its watch delivered it when that is later), with that version's
// resourceVersion: one request, no read first. Another writer's write
// since (a condition of its own, say) makes it a 409; then, as when the
// kubelet's view may be stale after a failed write, it reads the pod and
// writes its status over what it read, keeping other writers' conditions
// (mergeStatus). The pod's UID is checked either way (a replaced pod's
// status is never written).
//
// Upstream's status manager reads the pod, then sends a strategic merge
// patch of its status: two requests. A patch without the read was measured
// (perf, the burst of BenchmarkPodStartupVsContainerd): computing it
// (CreateTwoWayMergePatch) and applying it on the server (strategic merge
// over maps, a JSON decode) cost as much CPU as the read and the update
// together, while this update without a read costs half of them.
func (w *podWorker) writeStatus(ctx context.Context, pod *v1.Pod, st v1.PodStatus) error {
	normalizeStatus(&st)
	if w.lastStatus != nil && apiequality.Semantic.DeepEqual(*w.lastStatus, st) {
		return nil
	}
	t0 := time.Now()
	defer func() { w.k.metrics.ops.statusSync.Observe(time.Since(t0).Seconds()) }()
	var err error
	if w.static {
		err = w.updateMirrorStatus(ctx, pod, st)
	} else {
		err = w.updateStatus(ctx, pod, st)
	}
	if apierrors.IsNotFound(err) {
		// Deleted meanwhile (or a mirror not made yet): nothing to write.
		return nil
	}
	if err != nil {
		return fmt.Errorf("write status of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	stc := st
	w.lastStatus = &stc
	return nil
}

// updateStatus writes pod's status st (see writeStatus).
func (w *podWorker) updateStatus(ctx context.Context, pod *v1.Pod, st v1.PodStatus) error {
	pods := w.k.client.CoreV1().Pods(pod.Namespace)
	var base *v1.Pod
	switch {
	case w.stored != nil && !newerVersion(pod.ResourceVersion, w.stored.ResourceVersion):
		base = w.stored
	case !w.storedUnknown:
		// Nothing written yet, or the watch delivered a later version
		// (another writer's) than the one the last write returned.
		base = pod
	}
	w.stored, w.storedUnknown = nil, true // until a write returns what is stored
	if base != nil && base.UID == pod.UID && base.ResourceVersion != "" {
		obj := base.DeepCopy()
		mergeStatus(&obj.Status, st, metav1.NewTime(time.Now()))
		out, err := pods.UpdateStatus(ctx, obj, metav1.UpdateOptions{})
		if err == nil {
			w.stored, w.storedUnknown = out, false
			return nil
		}
		if !apierrors.IsConflict(err) {
			return err
		}
		// Written by another since, or replaced: read it.
	}
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return fmt.Errorf("pod %s/%s was replaced (uid %s, want %s)", pod.Namespace, pod.Name, cur.UID, pod.UID)
		}
		mergeStatus(&cur.Status, st, metav1.NewTime(time.Now()))
		out, err := pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		w.stored, w.storedUnknown = out, false
		return nil
	})
}

// newerVersion: resourceVersion a is later than b. Waggle's versions are
// etcd revisions; one that is not a number is never newer.
func newerVersion(a, b string) bool {
	x, err1 := strconv.ParseInt(a, 10, 64)
	y, err2 := strconv.ParseInt(b, 10, 64)
	return err1 == nil && err2 == nil && x > y
}

// updateMirrorStatus writes a static pod's status to its mirror pod, read
// first to check that the mirror is the one of this static pod.
func (w *podWorker) updateMirrorStatus(ctx context.Context, pod *v1.Pod, st v1.PodStatus) error {
	pods := w.k.client.CoreV1().Pods(pod.Namespace)
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !isMirror(cur) || cur.Annotations[AnnotationConfigMirror] != pod.Annotations[AnnotationConfigHash] {
			return fmt.Errorf("mirror pod %s/%s is not ours", pod.Namespace, pod.Name)
		}
		mergeStatus(&cur.Status, st, metav1.NewTime(time.Now()))
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// qosClass computes the pod's QoS class as Kubernetes defines it.
func qosClass(pod *v1.Pod) v1.PodQOSClass {
	requests, limits := v1.ResourceList{}, v1.ResourceList{}
	guaranteed := true
	all := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range all {
		for _, r := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
			req, hasReq := c.Resources.Requests[r]
			lim, hasLim := c.Resources.Limits[r]
			if hasReq && !req.IsZero() {
				add(requests, r, req)
			}
			if hasLim && !lim.IsZero() {
				add(limits, r, lim)
			}
			if !hasLim || (hasReq && req.Cmp(lim) != 0) {
				guaranteed = false
			}
		}
	}
	if len(requests) == 0 && len(limits) == 0 {
		return v1.PodQOSBestEffort
	}
	if guaranteed {
		return v1.PodQOSGuaranteed
	}
	return v1.PodQOSBurstable
}

func add(l v1.ResourceList, r v1.ResourceName, q resource.Quantity) {
	cur := l[r]
	cur.Add(q)
	l[r] = cur
}
