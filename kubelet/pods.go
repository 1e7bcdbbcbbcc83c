package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

	"github.com/waggle-io/waggle/kubelet/network"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// Annotations of static and mirror pods, as Kubernetes spells them.
const (
	AnnotationConfigMirror = "kubernetes.io/config.mirror"
	AnnotationConfigSource = "kubernetes.io/config.source"
	AnnotationConfigHash   = "kubernetes.io/config.hash"
)

func isMirror(p *v1.Pod) bool { _, ok := p.Annotations[AnnotationConfigMirror]; return ok }

// podFromAPI receives an added or updated pod bound to this node.
func (k *Kubelet) podFromAPI(p *v1.Pod) {
	if isMirror(p) {
		if k.static != nil {
			k.static.mirrorSeen(p)
		}
		return
	}
	k.upsertWorker(p, false)
}

// podGoneFromAPI receives a pod deleted from the API (or unbound).
func (k *Kubelet) podGoneFromAPI(p *v1.Pod) {
	if isMirror(p) {
		if k.static != nil {
			k.static.mirrorGone(p)
		}
		return
	}
	k.mu.Lock()
	w := k.workers[p.UID]
	k.mu.Unlock()
	if w != nil {
		w.markGone()
	}
}

func (k *Kubelet) upsertWorker(p *v1.Pod, static bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if w, ok := k.workers[p.UID]; ok {
		w.update(p)
		return
	}
	if k.ctx == nil || k.ctx.Err() != nil {
		return
	}
	w := &podWorker{k: k, uid: p.UID, pod: p.DeepCopy(), static: static,
		kick: make(chan struct{}, 1), done: make(chan struct{}),
		waiting: map[string]waitReason{}, pending: map[string]runtime.Container{}, pendingAt: map[string]time.Time{}, removed: map[string]bool{}, resized: map[string]string{}}
	if !static {
		w.rejected = k.admitLocked(p)
	}
	k.workers[p.UID] = w
	go w.run(k.ctx)
}

func (k *Kubelet) removeWorker(w *podWorker) {
	k.mu.Lock()
	if k.workers[w.uid] == w {
		delete(k.workers, w.uid)
	}
	k.mu.Unlock()
	pod, _ := w.snapshot()
	k.forgetPodCertificates(pod)
}

// worker returns the worker of a pod by namespace and name.
func (k *Kubelet) workerByName(ns, name string) *podWorker {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, w := range k.workers {
		w.mu.Lock()
		match := w.pod.Namespace == ns && w.pod.Name == name
		w.mu.Unlock()
		if match {
			return w
		}
	}
	return nil
}

type waitReason struct{ reason, message string }

// podWorker drives one pod towards its spec.
type podWorker struct {
	k      *Kubelet
	uid    types.UID
	static bool
	// rejected: admission refused the pod (admitLocked); it never starts,
	// its status says why ("Pod was rejected: " and the message, the Event
	// the message alone, as upstream's rejectPod). Set before the worker runs.
	rejected *waitReason
	kick     chan struct{}
	done     chan struct{}

	mu   sync.Mutex
	pod  *v1.Pod
	gone bool

	// Owned by the run goroutine.
	sb      *sandboxState
	waiting map[string]waitReason
	pending map[string]runtime.Container // started, not yet relisted
	// pendingAt is when each pending entry was made: a listing that
	// began before it cannot show it (containers).
	pendingAt map[string]time.Time
	removed   map[string]bool   // removed, maybe still relisted
	resized   map[string]string // resized in place: new record, maybe not yet relisted
	// resizePending and resizeError are the pod's resize conditions
	// (resize.go); nil when there is none.
	resizePending, resizeError *resizeCondition
	lastStatus                 *v1.PodStatus
	// stored is the pod as the API returned it for the last status
	// write, what the next status write goes over (or the pod as the
	// watch delivered it, if later); with it nil, the pod as delivered,
	// unless storedUnknown (a write failed): then the pod is read first.
	stored        *v1.Pod
	storedUnknown bool
	terminal      bool
	// deadlineExceeded: spec.activeDeadlineSeconds ran out (the pod
	// fails with reason DeadlineExceeded); deadlineAt is the deadline a
	// wake-up is set for.
	deadlineExceeded bool
	deadlineAt       time.Time
	// evict is an eviction the eviction manager asked for (evictPod; set
	// from its goroutine); evicted is it once the worker took it: the pod
	// is stopped within its grace and fails with reason Evicted.
	evict     atomic.Pointer[evictRequest]
	evicted   *evictRequest
	firstSync time.Time
	// pulling is the time spent pulling images, which
	// kubelet_pod_start_sli_duration_seconds leaves out.
	pulling   time.Duration
	reported  bool
	volumesAt time.Time
	// statusReset asks the run goroutine to rewrite the status.
	statusReset atomic.Bool
	// ips are the pod's addresses, readable from any goroutine.
	ips atomic.Pointer[[]string]
	// teardownErr is why the pod's network could not be torn down (its
	// address then stays reserved); nil once it was.
	teardownErr atomic.Pointer[string]
}

func (w *podWorker) update(p *v1.Pod) {
	w.mu.Lock()
	w.pod = p.DeepCopy()
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) markGone() {
	w.mu.Lock()
	w.gone = true
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *podWorker) snapshot() (*v1.Pod, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod.DeepCopy(), w.gone
}

func (w *podWorker) run(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(w.k.cfg.SyncFrequency)
	defer t.Stop()
	for {
		done, err := w.sync(ctx)
		w.k.metrics.syncs.Inc()
		if err != nil && ctx.Err() == nil {
			w.k.metrics.syncErrors.Inc()
			pod, _ := w.snapshot()
			w.k.log.Warn("sync pod", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		}
		if done {
			w.k.removeWorker(w)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-t.C:
		}
	}
}

// containers returns the pod's containers: the last relist, plus what this
// worker started since, minus what it removed.
func (w *podWorker) containers() []runtime.Container {
	w.k.mu.Lock()
	listed := append([]runtime.Container(nil), w.k.snapshot[w.uid]...)
	listedAt := w.k.snapshotAt
	w.k.mu.Unlock()
	seen := map[string]bool{}
	out := listed[:0]
	for _, c := range listed {
		seen[c.ID] = true
		if w.removed[c.ID] {
			continue
		}
		p, ok := w.pending[c.ID]
		switch {
		case ok && listedAt.Before(w.pendingAt[c.ID]):
			// Listed before our start (or stop) returned: under load a
			// container's task can take seconds to appear, and such a
			// listing shows it created, without a task or even exited
			// (ContainerCannotRun) while it was starting; taking that
			// for its state would start it twice.
			c = p
		case ok && p.State == runtime.StateExited && c.State == runtime.StateRunning:
			c = p // stopped by us, not yet relisted as exited
		case ok && c.State == runtime.StateRunning && c.StartedAt.IsZero():
			// Relisted between its start and the runtime's record of the
			// start time: keep ours rather than report (and write) a zero
			// startedAt, then the real one.
			c.StartedAt = p.StartedAt
		default:
			delete(w.pending, c.ID)
			delete(w.pendingAt, c.ID)
		}
		if r, ok := w.resized[c.ID]; ok {
			if c.ResourcesRecord == r {
				delete(w.resized, c.ID)
			} else {
				c.ResourcesRecord = r // resized by us, not yet relisted
			}
		}
		out = append(out, c)
	}
	for id := range w.removed {
		if !seen[id] {
			delete(w.removed, id)
		}
	}
	for id := range w.resized {
		if !seen[id] {
			delete(w.resized, id)
		}
	}
	for id, c := range w.pending {
		if !seen[id] {
			out = append(out, c)
		}
	}
	return out
}

// byName groups containers by name, newest attempt first.
func byName(cs []runtime.Container) map[string][]runtime.Container {
	m := map[string][]runtime.Container{}
	for _, c := range cs {
		m[c.Name] = append(m[c.Name], c)
	}
	for _, l := range m {
		sort.Slice(l, func(i, j int) bool {
			if l[i].Attempt != l[j].Attempt {
				return l[i].Attempt > l[j].Attempt
			}
			return l[i].CreatedAt.After(l[j].CreatedAt)
		})
	}
	return m
}

func gracePeriod(p *v1.Pod) time.Duration {
	if p.DeletionGracePeriodSeconds != nil {
		return time.Duration(*p.DeletionGracePeriodSeconds) * time.Second
	}
	if p.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

func isTerminalPhase(p v1.PodPhase) bool { return p == v1.PodSucceeded || p == v1.PodFailed }

// sync does one round of work for the pod; done means the worker ends.
func (w *podWorker) sync(ctx context.Context) (done bool, err error) {
	k := w.k
	pod, gone := w.snapshot()
	if w.firstSync.IsZero() {
		w.firstSync = time.Now()
	}
	if p := k.runtimeErr.Load(); p != nil && *p != nil {
		// Without a fresh relist the worker could start duplicates.
		return false, fmt.Errorf("runtime unavailable: %w", *p)
	}
	ctrs := w.containers()
	if w.statusReset.Swap(false) {
		w.lastStatus, w.stored, w.storedUnknown = nil, nil, true
	}

	if gone || pod.DeletionTimestamp != nil {
		if err := w.terminate(ctx, pod, ctrs, gracePeriod(pod)); err != nil {
			return false, err
		}
		final := w.computeStatus(pod, w.containers(), true)
		if err := w.cleanup(ctx, pod); err != nil {
			if errors.Is(err, network.ErrNetNSBusy) {
				// The pod stays Terminating, its address reserved, and says why.
				w.teardownFailed(pod, err)
				w.writeStatus(ctx, pod, w.computeStatus(pod, w.containers(), true))
			}
			return false, err
		}
		if !gone && !w.static {
			// Final status, then the kubelet's delete that removes the pod
			// from the API, as Kubernetes' status manager does.
			w.writeStatus(ctx, pod, final)
			err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
				GracePeriodSeconds: new(int64),
				Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
			})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return false, fmt.Errorf("final delete: %w", err)
			}
		}
		k.log.Info("pod terminated", "pod", pod.Namespace+"/"+pod.Name)
		return true, nil
	}

	if w.rejected != nil {
		// Failed at admission, as upstream's rejectPod: written once.
		if w.lastStatus != nil {
			return false, nil
		}
		k.event(pod, v1.EventTypeWarning, w.rejected.reason, "%s", w.rejected.message)
		w.terminal = true
		return false, w.writeStatus(ctx, pod, v1.PodStatus{Phase: v1.PodFailed, Reason: w.rejected.reason,
			Message: "Pod was rejected: " + w.rejected.message, QOSClass: qosClass(pod)})
	}
	if w.sb == nil {
		if sb, err := k.loadSandbox(pod.UID); err == nil {
			w.sb = sb
		}
	}
	if e := w.evict.Load(); e != nil && w.evicted == nil && !w.terminal {
		w.evicted, w.terminal = e, true
	}
	if !w.terminal && w.pastDeadline(pod) {
		w.deadlineExceeded, w.terminal = true, true
		k.event(pod, v1.EventTypeNormal, EventDeadlineExceeded, "Pod was active on the node longer than the specified deadline")
	}
	// A pod the API already reports terminal is never started again (a
	// restarted kubelet must not rerun a completed pod).
	if (isTerminalPhase(pod.Status.Phase) && !w.static) || w.terminal {
		w.terminal = true
		grace := gracePeriod(pod)
		if w.evicted != nil {
			grace = w.evicted.grace
		}
		if err := w.terminate(ctx, pod, ctrs, grace); err != nil {
			return false, err
		}
		w.tearDownNetwork(ctx, pod)
		if w.lastStatus == nil && isTerminalPhase(pod.Status.Phase) {
			return false, nil
		}
		st := w.computeStatus(pod, w.containers(), false)
		return false, w.writeStatus(ctx, pod, st)
	}

	if err := w.ensureSandbox(ctx, pod); err != nil {
		w.k.event(pod, v1.EventTypeWarning, EventFailedCreatePodSandBox, "Failed to create pod sandbox: %v", err)
		w.setAllWaiting(pod, "ContainerCreating", err.Error())
		w.writeStatus(ctx, pod, w.computeStatus(pod, ctrs, false))
		return false, err
	}
	if err := w.ensureVolumes(ctx, pod); err != nil {
		w.k.event(pod, v1.EventTypeWarning, EventFailedMount, "MountVolume.SetUp failed: %v", err)
		w.setAllWaiting(pod, "ContainerCreating", err.Error())
		w.writeStatus(ctx, pod, w.computeStatus(pod, ctrs, false))
		return false, err
	}
	syncErr := w.syncContainers(ctx, pod, ctrs)
	ctrs = w.containers()
	for _, c := range ctrs {
		if c.State == runtime.StateUnknown {
			// The runtime cannot tell right now (e.g. containerd just
			// restarted): keep the last status rather than guess.
			return false, syncErr
		}
	}
	st := w.computeStatus(pod, ctrs, false)
	if isTerminalPhase(st.Phase) {
		// Done: what still runs (sidecars) is stopped before the network goes.
		w.terminal = true
		if err := w.terminate(ctx, pod, ctrs, gracePeriod(pod)); err != nil {
			syncErr = errors.Join(syncErr, err)
		}
		st = w.computeStatus(pod, w.containers(), false)
		w.tearDownNetwork(ctx, pod)
	}
	if !w.reported && st.Phase == v1.PodRunning {
		w.reported = true
		k.metrics.startupSecs.Observe(time.Since(w.firstSync).Seconds())
		if !pod.CreationTimestamp.IsZero() {
			k.metrics.ops.startSLI.Observe((time.Since(pod.CreationTimestamp.Time) - w.pulling).Seconds())
		}
	}
	if err := w.writeStatus(ctx, pod, st); err != nil {
		return false, errors.Join(syncErr, err)
	}
	return false, syncErr
}

func (w *podWorker) setAllWaiting(pod *v1.Pod, reason, msg string) {
	for _, c := range append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		w.waiting[c.Name] = waitReason{reason, msg}
	}
}

// ensureSandbox gives the pod its cgroup path and network (once).
func (w *podWorker) ensureSandbox(ctx context.Context, pod *v1.Pod) error {
	k := w.k
	if w.sb != nil && !w.sb.Torn {
		if w.ips.Load() == nil {
			ips := w.sb.IPs
			w.ips.Store(&ips)
		}
		return nil
	}
	sb := &sandboxState{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name,
		Cgroup: podCgroup(k.cfg.CgroupRoot, pod.UID), StartTime: time.Now().UTC()}
	if pod.Status.StartTime != nil {
		sb.StartTime = pod.Status.StartTime.Time
	}
	if !pod.Spec.HostNetwork {
		t0 := time.Now()
		net, err := k.net.SetUp(ctx, network.Pod{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name})
		k.metrics.ops.networkOps.WithLabelValues("set_up_pod").Observe(time.Since(t0).Seconds())
		k.log.Debug("pod network set up", "pod", pod.Namespace+"/"+pod.Name, "took", time.Since(t0).Round(time.Millisecond))
		if err != nil {
			return fmt.Errorf("set up pod network: %w", err)
		}
		sb.Sandbox = net
	}
	if err := k.rt.SetPodCgroup(ctx, sb.Cgroup, podResources(pod)); err != nil {
		k.net.TearDown(ctx, network.Pod{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}, sb.Sandbox)
		return fmt.Errorf("pod cgroup: %w", err)
	}
	if err := k.saveSandbox(sb); err != nil {
		k.net.TearDown(ctx, network.Pod{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}, sb.Sandbox)
		return fmt.Errorf("save sandbox: %w", err)
	}
	w.sb = sb
	ips := sb.IPs
	w.ips.Store(&ips)
	return nil
}

func (w *podWorker) tearDownNetwork(ctx context.Context, pod *v1.Pod) {
	if w.sb == nil || w.sb.Torn {
		return
	}
	t0 := time.Now()
	err := w.k.net.TearDown(ctx, network.Pod{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}, w.sb.Sandbox)
	w.k.metrics.ops.networkOps.WithLabelValues("tear_down_pod").Observe(time.Since(t0).Seconds())
	if err != nil {
		w.k.log.Warn("tear down pod network", "pod", pod.Name, "err", err)
		w.teardownFailed(pod, err)
		return
	}
	w.teardownErr.Store(nil)
	w.sb.Torn = true
	w.k.saveSandbox(w.sb)
}

// terminate stops every running container of the pod within grace,
// running preStop hooks first: the app and ephemeral containers together,
// then the sidecars (restartable init containers) one by one in reverse
// order, as upstream, so an app's preStop hook can still use them.
func (w *podWorker) terminate(ctx context.Context, pod *v1.Pod, ctrs []runtime.Container, grace time.Duration) error {
	specs := map[string]*v1.Container{}
	sidecarOrder := map[string]int{}
	for i := range pod.Spec.Containers {
		specs[pod.Spec.Containers[i].Name] = &pod.Spec.Containers[i]
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		specs[c.Name] = c
		if podutil.IsRestartableInitContainer(c) {
			sidecarOrder[c.Name] = i + 1
		}
	}
	deadline := time.Now().Add(grace)
	var first []runtime.Container
	var sidecars []runtime.Container
	for _, c := range ctrs {
		if c.State != runtime.StateRunning && c.State != runtime.StateCreated {
			continue
		}
		if sidecarOrder[c.Name] > 0 {
			sidecars = append(sidecars, c)
		} else {
			first = append(first, c)
		}
	}
	sort.Slice(sidecars, func(i, j int) bool { return sidecarOrder[sidecars[i].Name] > sidecarOrder[sidecars[j].Name] })
	errs := w.stopAll(ctx, pod, first, specs, grace, deadline)
	for _, c := range sidecars {
		errs = append(errs, w.stopAll(ctx, pod, []runtime.Container{c}, specs, grace, deadline)...)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if len(ctrs) > 0 {
		w.k.relist(ctx)
	}
	return nil
}

// stopAll stops ctrs in parallel, each after its preStop hook, by deadline.
func (w *podWorker) stopAll(ctx context.Context, pod *v1.Pod, ctrs []runtime.Container, specs map[string]*v1.Container, grace time.Duration, deadline time.Time) []error {
	k := w.k
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, c := range ctrs {
		k.containerEvent(pod, c.Name, v1.EventTypeNormal, EventKilling, "Stopping container %s", c.Name)
		wg.Add(1)
		go func(c runtime.Container) {
			defer wg.Done()
			if s := specs[c.Name]; s != nil && s.Lifecycle != nil && s.Lifecycle.PreStop != nil && grace > 0 {
				hctx, cancel := context.WithDeadline(ctx, deadline)
				if err := k.runHandler(hctx, pod, c, s, s.Lifecycle.PreStop); err != nil {
					k.log.Info("preStop hook failed", "pod", pod.Name, "container", c.Name, "err", err)
				}
				cancel()
			}
			left := time.Until(deadline)
			if left < 0 || grace == 0 {
				left = 0
			} else if left < 2*time.Second {
				left = 2 * time.Second // Kubernetes' minimum after a hook
			}
			if err := k.rt.StopContainer(ctx, c.ID, left); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			k.probes.stopContainer(c.ID)
			// Seen as exited until the next relist says so.
			exited := c
			exited.State, exited.ExitCode, exited.Reason, exited.FinishedAt = runtime.StateExited, 137, "Error", time.Now()
			mu.Lock()
			w.pending[c.ID] = exited
			w.pendingAt[c.ID] = time.Now()
			mu.Unlock()
		}(c)
	}
	wg.Wait()
	return errs
}

// pastDeadline reports whether the pod's activeDeadlineSeconds ran out
// (counted from its start on this node); if not, it sets a wake-up for
// when it does.
func (w *podWorker) pastDeadline(pod *v1.Pod) bool {
	if pod.Spec.ActiveDeadlineSeconds == nil {
		return false
	}
	var start time.Time
	switch {
	case w.sb != nil:
		start = w.sb.StartTime
	case pod.Status.StartTime != nil:
		start = pod.Status.StartTime.Time
	default:
		return false
	}
	at := start.Add(time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second)
	if !time.Now().Before(at) {
		return true
	}
	if !at.Equal(w.deadlineAt) {
		w.deadlineAt = at
		time.AfterFunc(time.Until(at)+10*time.Millisecond, w.poke)
	}
	return false
}

// cleanup removes everything of a pod that is gone: containers, network,
// cgroup, volumes and state.
func (w *podWorker) cleanup(ctx context.Context, pod *v1.Pod) error {
	k := w.k
	var errs []error
	for _, c := range w.containers() {
		if err := k.rt.RemoveContainer(ctx, c.ID); err != nil {
			errs = append(errs, err)
		}
		w.removed[c.ID] = true
	}
	if err := k.cleanupSandbox(ctx, pod.UID, network.Pod{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}); err != nil {
		errs = append(errs, err)
	}
	k.probes.stopPod(pod.UID)
	for _, c := range append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		k.backoff.Reset(backoffKey(pod.UID, c.Name))
	}
	return errors.Join(errs...)
}

// cleanupSandbox tears down a pod's network and removes its cgroup and dir.
func (k *Kubelet) cleanupSandbox(ctx context.Context, uid types.UID, p network.Pod) error {
	sb, err := k.loadSandbox(uid)
	if err == nil {
		if !sb.Torn {
			if err := k.net.TearDown(ctx, network.Pod{UID: string(uid), Namespace: sb.Namespace, Name: sb.Name}, sb.Sandbox); err != nil {
				return fmt.Errorf("tear down network of pod %s: %w", uid, err)
			}
		}
		if err := k.rt.RemovePodCgroup(ctx, sb.Cgroup); err != nil {
			k.log.Warn("remove pod cgroup", "pod", uid, "err", err)
		}
	} else if !os.IsNotExist(err) {
		k.log.Warn("unreadable sandbox state; removing it", "pod", uid, "err", err)
	}
	// Image volumes (their snapshots and lease too), then tmpfs volumes:
	// RemoveAll would empty them, then fail on their mount points.
	if err := k.rt.UnmountImages(ctx, string(uid)); err != nil {
		return fmt.Errorf("release image volumes of pod %s: %w", uid, err)
	}
	if err := unmountUnder(k.podDir(uid)); err != nil {
		return fmt.Errorf("remove pod dir: %w", err)
	}
	if err := os.RemoveAll(k.podDir(uid)); err != nil {
		return fmt.Errorf("remove pod dir: %w", err)
	}
	k.tokens.DeleteServiceAccountToken(uid)
	k.claimPaths.Range(func(key, _ any) bool {
		if strings.HasPrefix(key.(string), string(uid)+"/") {
			k.claimPaths.Delete(key)
		}
		return true
	})
	return nil
}

func backoffKey(uid types.UID, name string) string { return string(uid) + "/" + name }

func shouldRestart(policy v1.RestartPolicy, code int32) bool {
	switch policy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		return code != 0
	}
	return true
}

// syncContainers runs init containers in order, then the app containers,
// restarting per policy with back-off, then any ephemeral containers.
// A sidecar (an init container with restartPolicy Always) is started in its
// turn, the next init container waits until it has started (its startup
// probe passed), and it keeps running and restarting whatever the pod's
// policy, until the pod ends.
func (w *podWorker) syncContainers(ctx context.Context, pod *v1.Pod, ctrs []runtime.Container) error {
	k := w.k
	named := byName(ctrs)
	// Drop all but the two newest of each name (current and previous).
	for _, l := range named {
		for _, old := range l[min(2, len(l)):] {
			if old.State != runtime.StateRunning {
				if err := k.rt.RemoveContainer(ctx, old.ID); err == nil {
					w.removed[old.ID] = true
				}
			}
		}
	}
	// Once an app container started, initialization is over for good: init
	// containers never run again, sidecars no longer hold anything up.
	initialized := regularStarted(pod, named)
	var errs []error
	// A resize of running sidecars and app containers (resize.go).
	resizeNow := w.admitResize(pod, named)
	if resizeNow {
		// The pod cgroup holds both the old and the new settings while the
		// containers move; it gets the new ones once they have.
		from := podResources(runningPod(pod, named))
		if err := k.rt.SetPodCgroup(ctx, w.sb.Cgroup, loosest(from, podResources(pod))); err != nil {
			errs = append(errs, fmt.Errorf("pod cgroup: %w", err))
			resizeNow = false
		}
		defer func() {
			if err := k.rt.SetPodCgroup(ctx, w.sb.Cgroup, podResources(runningPod(pod, byName(w.containers())))); err != nil {
				k.log.Warn("pod cgroup after resize", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			}
		}()
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		l := named[c.Name]
		if podutil.IsRestartableInitContainer(c) {
			var err error
			ready := false
			switch {
			case len(l) == 0:
				err = w.start(ctx, pod, c, 0, true)
			case l[0].State == runtime.StateRunning && resizeNow && needsResize(l[0], c):
				// Resized now; a restart for it is checked at the next sync.
				_, err = w.resize(ctx, pod, c, l[0])
			case l[0].State == runtime.StateRunning:
				k.probes.ensure(pod, c, l[0])
				err = w.restartIfUnhealthy(ctx, pod, c, l[0])
				ready = err == nil && k.probes.started(l[0].ID) && k.probes.mustRestart(l[0].ID) == ""
			case l[0].State == runtime.StateExited:
				err = w.restart(ctx, pod, c, l[0], true)
			}
			if err != nil {
				errs = append(errs, err)
			}
			if !initialized && !ready {
				return errors.Join(errs...) // the next waits for this one to start
			}
			continue
		}
		if initialized {
			continue
		}
		if len(l) == 0 {
			return errors.Join(append(errs, w.start(ctx, pod, c, 0, true))...)
		}
		cur := l[0]
		switch cur.State {
		case runtime.StateRunning, runtime.StateCreated, runtime.StateUnknown:
			return errors.Join(errs...) // wait for it
		}
		if cur.State == runtime.StateExited && cur.ExitCode == 0 {
			continue
		}
		if pod.Spec.RestartPolicy == v1.RestartPolicyNever {
			return errors.Join(errs...) // pod fails (computeStatus)
		}
		return errors.Join(append(errs, w.restart(ctx, pod, c, cur, true))...)
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		l := named[c.Name]
		if len(l) == 0 {
			if err := w.start(ctx, pod, c, 0, false); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		cur := l[0]
		if cur.State == runtime.StateRunning && cur.Image != c.Image {
			// The running container's image was changed in the spec: stop
			// it and start the new image whatever the restart policy, as
			// upstream ("definition changed"). An exited one restarts, with
			// the new image, only as its policy says.
			k.log.Info("container definition changed, will be restarted", "pod", pod.Name, "container", c.Name, "image", c.Image)
			if err := w.terminate(ctx, pod, []runtime.Container{cur}, gracePeriod(pod)); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := w.start(ctx, pod, c, cur.Attempt+1, false); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if resizeNow && cur.State == runtime.StateRunning && needsResize(cur, c) {
			restarted, err := w.resize(ctx, pod, c, cur)
			if err != nil {
				errs = append(errs, err)
			}
			if restarted {
				continue
			}
		}
		switch cur.State {
		case runtime.StateRunning:
			k.probes.ensure(pod, c, cur)
			if err := w.restartIfUnhealthy(ctx, pod, c, cur); err != nil {
				errs = append(errs, err)
			}
			continue
		case runtime.StateCreated, runtime.StateUnknown:
			continue // wait for the runtime to say more
		}
		if !shouldRestart(pod.Spec.RestartPolicy, cur.ExitCode) && cur.State == runtime.StateExited {
			continue
		}
		k.log.Debug("container exited; restarting", "pod", pod.Name, "container", c.Name, "exit", cur.ExitCode, "attempt", cur.Attempt)
		if err := w.restart(ctx, pod, c, cur, false); err != nil {
			errs = append(errs, err)
		}
	}
	// Ephemeral containers run once, are never restarted, never probed.
	for i := range pod.Spec.EphemeralContainers {
		c := v1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		if len(named[c.Name]) > 0 {
			continue
		}
		c.Lifecycle, c.LivenessProbe, c.ReadinessProbe, c.StartupProbe = nil, nil, nil, nil
		if err := w.start(ctx, pod, &c, 0, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// restartIfUnhealthy stops a running container its liveness or startup
// probe failed; the next sync restarts it per policy.
func (w *podWorker) restartIfUnhealthy(ctx context.Context, pod *v1.Pod, c *v1.Container, cur runtime.Container) error {
	why := w.k.probes.mustRestart(cur.ID)
	if why == "" {
		return nil
	}
	w.k.log.Info("restarting container", "pod", pod.Name, "container", c.Name, "why", why)
	return w.terminate(ctx, pod, []runtime.Container{cur}, gracePeriod(pod))
}

// restart starts the next attempt of an exited container unless it is in
// back-off (CrashLoopBackOff).
func (w *podWorker) restart(ctx context.Context, pod *v1.Pod, c *v1.Container, cur runtime.Container, init bool) error {
	k := w.k
	key := backoffKey(pod.UID, c.Name)
	finished := cur.FinishedAt
	if finished.IsZero() {
		finished = time.Now()
	}
	if k.backoff.IsInBackOffSince(key, finished) {
		d := k.backoff.Get(key)
		if w.waiting[c.Name].reason != "CrashLoopBackOff" {
			k.containerEvent(pod, c.Name, v1.EventTypeWarning, EventBackOff, "Back-off restarting failed container %s in pod %s", c.Name, podRef(pod))
		}
		w.waiting[c.Name] = waitReason{"CrashLoopBackOff", fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", d, c.Name, pod.Name, pod.Namespace, pod.UID)}
		// Come back when the back-off ends.
		time.AfterFunc(time.Until(finished.Add(d))+10*time.Millisecond, w.poke)
		return nil
	}
	k.backoff.Next(key, time.Now())
	return w.start(ctx, pod, c, cur.Attempt+1, init)
}

func pullPolicy(c *v1.Container) runtime.PullPolicy { return pullPolicyOf(c.ImagePullPolicy, c.Image) }

// pullPolicyOf is the runtime's policy for a container's imagePullPolicy
// or an image volume's pullPolicy.
func pullPolicyOf(p v1.PullPolicy, image string) runtime.PullPolicy {
	switch p {
	case v1.PullAlways:
		return runtime.PullAlways
	case v1.PullNever:
		return runtime.PullNever
	case v1.PullIfNotPresent:
		return runtime.PullIfNotPresent
	}
	// Kubernetes' default: Always for :latest or untagged, else IfNotPresent.
	if n, err := runtime.NormalizeImage(image); err == nil && strings.HasSuffix(n, ":latest") {
		return runtime.PullAlways
	}
	return runtime.PullIfNotPresent
}

// eventFunc records an Event about the object a pull is for: a container,
// or the pod (an image volume's pull, as upstream's).
type eventFunc func(eventType, reason, format string, args ...any)

// pullImage makes image present according to policy, as upstream's image
// puller: the events (Pulled "already present", or Pulling, Pulled,
// Failed), and after a failure a back-off under key. It returns the image's
// ID; "" means the container must not start now, wait being the waiting
// reason to show instead of prev (nil: leave it) and err the failure (nil
// while in back-off).
func (w *podWorker) pullImage(ctx context.Context, image string, policy runtime.PullPolicy, key string, prev waitReason, emit eventFunc) (string, *waitReason, error) {
	k := w.k
	t0 := time.Now()
	if k.backoff.IsInBackOffSinceUpdate(key, t0) {
		if prev.reason != "ErrImagePull" && prev.reason != "ImagePullBackOff" {
			return "", nil, nil
		}
		if prev.reason == "ErrImagePull" {
			emit(v1.EventTypeNormal, EventBackOff, "Back-off pulling image %q", image)
		}
		return "", &waitReason{"ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q", image)}, nil
	}
	// Present already (and not to be pulled again)? Otherwise say we pull.
	imageID, err := "", error(nil)
	if policy != runtime.PullAlways {
		if imageID, err = k.rt.EnsureImage(ctx, image, runtime.PullNever); err == nil {
			emit(v1.EventTypeNormal, EventPulled, "Container image %q already present on machine", image)
		}
	}
	if imageID == "" && (policy != runtime.PullNever || err == nil) {
		emit(v1.EventTypeNormal, EventPulling, "Pulling image %q", image)
		tPull := time.Now()
		imageID, err = k.rt.EnsureImage(ctx, image, policy)
		w.pulling += time.Since(tPull)
		if err == nil {
			emit(v1.EventTypeNormal, EventPulled, "Successfully pulled image %q in %v", image, time.Since(t0).Round(time.Millisecond))
		}
	}
	if err != nil {
		emit(v1.EventTypeWarning, EventFailed, "Failed to pull image %q: %v", image, err)
		reason := "ErrImagePull"
		if errors.Is(err, runtime.ErrImageNotFound) {
			reason = "ErrImageNeverPull"
		}
		k.backoff.Next(key, time.Now())
		time.AfterFunc(k.backoff.Get(key)+10*time.Millisecond, w.poke)
		return "", &waitReason{reason, err.Error()}, err
	}
	k.backoff.Reset(key)
	return imageID, nil, nil
}

// start starts one attempt of a container.
func (w *podWorker) start(ctx context.Context, pod *v1.Pod, c *v1.Container, attempt int, init bool) error {
	k := w.k
	t0 := time.Now()
	// A cap on starts in flight, when configured (Config.ParallelStarts).
	if k.startSlots != nil {
		select {
		case k.startSlots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-k.startSlots }()
		k.metrics.ops.startWait.Observe(time.Since(t0).Seconds())
	}
	// Image volumes first, then the container's image, as upstream.
	imageVols, wait, err := w.imageVolumes(ctx, pod, c)
	if imageVols == nil {
		if wait != nil {
			w.waiting[c.Name] = *wait
		}
		return err
	}
	containerEvent := func(eventType, reason, format string, args ...any) {
		k.containerEvent(pod, c.Name, eventType, reason, format, args...)
	}
	pullKey := "pull/" + backoffKey(pod.UID, c.Name)
	imageID, wait, err := w.pullImage(ctx, c.Image, pullPolicy(c), pullKey, w.waiting[c.Name], containerEvent)
	if imageID == "" {
		if wait != nil {
			w.waiting[c.Name] = *wait
		}
		return err
	}
	tImage := time.Since(t0)
	env, err := k.makeEnv(ctx, pod, c, w.sb)
	if err != nil {
		k.containerEvent(pod, c.Name, v1.EventTypeWarning, EventFailed, "Error: %v", err)
		w.waiting[c.Name] = waitReason{"CreateContainerConfigError", err.Error()}
		return err
	}
	mounts, err := k.makeMounts(pod, c, env, imageVols)
	if err != nil {
		k.containerEvent(pod, c.Name, v1.EventTypeWarning, EventFailed, "Error: %v", err)
		w.waiting[c.Name] = waitReason{"CreateContainerConfigError", err.Error()}
		return err
	}
	netFiles, err := k.writePodNetworkFiles(pod, c, w.sb.IPs)
	if err != nil {
		w.waiting[c.Name] = waitReason{"CreateContainerConfigError", err.Error()}
		return err
	}
	for _, f := range netFiles {
		mounts = append(mounts, runtime.Mount{HostPath: f.host, ContainerPath: f.container})
	}
	logPath := filepath.Join(k.podDir(pod.UID), "logs", c.Name, strconv.Itoa(attempt)+".log")
	if c.TerminationMessagePath != "" {
		m, err := prepareTerminationLog(logPath, c.TerminationMessagePath)
		if err != nil {
			w.waiting[c.Name] = waitReason{"CreateContainerConfigError", err.Error()}
			return err
		}
		mounts = append(mounts, m)
	}
	netns := w.sb.NetNS
	if pod.Spec.HostNetwork {
		netns = k.hostNetNS
	}
	cfg := runtime.ContainerConfig{
		PodUID: string(pod.UID), PodNamespace: pod.Namespace, PodName: pod.Name,
		Name: c.Name, Attempt: attempt, Init: init, Image: c.Image,
		Command: c.Command, Args: c.Args, Env: env, WorkingDir: c.WorkingDir, Mounts: mounts,
		NetNSPath: netns, Hostname: podHostname(pod), CgroupParent: w.sb.Cgroup,
		LogPath: logPath,
		Stdin:   c.Stdin, StdinOnce: c.StdinOnce,
		Security: containerSecurity(pod, c),
	}
	applyResources(&cfg, c.Resources)
	cfg.ResourcesRecord = resourcesRecord(c.Resources)
	id, err := k.rt.StartContainer(ctx, cfg)
	if err != nil {
		k.containerEvent(pod, c.Name, v1.EventTypeWarning, EventFailed, "Error: %v", err)
		w.waiting[c.Name] = waitReason{"RunContainerError", err.Error()}
		return err
	}
	k.containerEvent(pod, c.Name, v1.EventTypeNormal, EventCreated, "Created container: %s", c.Name)
	k.containerEvent(pod, c.Name, v1.EventTypeNormal, EventStarted, "Started container %s", c.Name)
	delete(w.waiting, c.Name)
	k.metrics.podStarts.Inc()
	k.log.Debug("started container", "pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "attempt", attempt,
		"image", tImage.Round(time.Millisecond), "total", time.Since(t0).Round(time.Millisecond), "sinceFirstSync", time.Since(w.firstSync).Round(time.Millisecond))
	now := time.Now()
	rc := runtime.Container{ID: id, PodUID: cfg.PodUID, PodName: pod.Name, PodNamespace: pod.Namespace,
		Name: c.Name, Attempt: attempt, Init: init, Image: c.Image, ImageID: imageID,
		State: runtime.StateRunning, CreatedAt: now, StartedAt: now, LogPath: cfg.LogPath}
	w.pending[id] = rc
	w.pendingAt[id] = now
	k.kickRelist()
	if c.Lifecycle != nil && c.Lifecycle.PostStart != nil {
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := k.runHandler(hctx, pod, rc, c, c.Lifecycle.PostStart)
		cancel()
		if err != nil {
			k.log.Info("postStart hook failed; killing container", "pod", pod.Name, "container", c.Name, "err", err)
			k.rt.StopContainer(ctx, id, 0)
		}
	}
	if !init || podutil.IsRestartableInitContainer(c) {
		k.probes.ensure(pod, c, rc)
	}
	return nil
}

func podHostname(p *v1.Pod) string {
	h := p.Name
	if p.Spec.Hostname != "" {
		h = p.Spec.Hostname
	}
	if len(h) > 63 {
		h = h[:63]
	}
	return h
}

// resetStatus forgets the last written status, so the next sync writes it.
func (w *podWorker) resetStatus() {
	w.statusReset.Store(true)
	w.poke()
}

func podRef(p *v1.Pod) string { return p.Name + "_" + p.Namespace + "(" + string(p.UID) + ")" }

// teardownFailed surfaces a network teardown that failed: an Event, and
// the pod's status message (kept until a teardown succeeds).
func (w *podWorker) teardownFailed(pod *v1.Pod, err error) {
	msg := err.Error()
	if prev := w.teardownErr.Load(); prev == nil || *prev != msg {
		w.k.event(pod, v1.EventTypeWarning, EventFailedKillPod, "error killing pod: failed to tear down the pod network: %v", err)
	}
	w.teardownErr.Store(&msg)
}
