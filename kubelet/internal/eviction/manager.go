// Package eviction is the kubelet's eviction manager, upstream's
// (k8s.io/kubernetes/pkg/kubelet/eviction) carried over: it observes the
// node's signals (memory.available, nodefs/imagefs available and inodesFree,
// pid.available) from a stats summary, compares them with the hard and soft
// thresholds of --eviction-hard/--eviction-soft, reports the node conditions
// (MemoryPressure, DiskPressure, PIDPressure) with the pressure transition
// period, admits or refuses new pods under pressure, and, when a threshold
// is crossed (a soft one for its grace period), first reclaims node-level
// resources for disk (dead containers, unused images) and then evicts one
// pod per pass, ranked as upstream ranks them.
//
// Upstream's package cannot be imported here (it pulls in cAdvisor and the
// CRI API), so its logic is ported (thresholds.go, helpers.go keep its
// function names); its types (k8s.io/kubernetes/pkg/kubelet/eviction/api)
// are used as they are. It is not the code that reads the signals or kills
// pods: the kubelet passes those in (SummaryProvider, KillPodFunc).
package eviction

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	v1qos "k8s.io/kubernetes/pkg/apis/core/v1/helper/qos"
	evictionapi "k8s.io/kubernetes/pkg/kubelet/eviction/api"
)

// Upstream's Event reason when a threshold is met and reclaim begins.
const EventEvictionThresholdMet = "EvictionThresholdMet"

// SummaryProvider is the signal source: the node's (and pods') stats.
type SummaryProvider interface {
	Summary(ctx context.Context) (*statsapi.Summary, error)
}

// ImageGC deletes every unused image (node-level reclaim for disk).
type ImageGC interface {
	DeleteUnusedImages(ctx context.Context) error
}

// ContainerGC deletes dead containers (node-level reclaim for disk).
type ContainerGC interface {
	DeleteAllUnusedContainers(ctx context.Context) error
}

// KillPodFunc stops pod within gracePeriodSeconds and fails it with reason
// Evicted, message and condition (DisruptionTarget); it returns once the
// kill has been handed to the pod's worker.
type KillPodFunc func(pod *v1.Pod, gracePeriodSeconds int64, message string, condition *v1.PodCondition) error

// Config is what the manager enforces.
type Config struct {
	// Thresholds from ParseThresholdConfig.
	Thresholds []evictionapi.Threshold
	// PressureTransitionPeriod is how long a condition stays after its
	// signal clears (--eviction-pressure-transition-period, 5 m).
	PressureTransitionPeriod time.Duration
	// MaxPodGracePeriodSeconds bounds the grace of a soft eviction
	// (--eviction-max-pod-grace-period; 0 as upstream's default).
	MaxPodGracePeriodSeconds int64
	// DedicatedImageFs: the images live on a filesystem other than the
	// kubelet's root dir (then nodefs pressure reclaims nothing at node
	// level, as upstream).
	DedicatedImageFs bool
}

// Deps are the manager's edges.
type Deps struct {
	Summary     SummaryProvider
	ImageGC     ImageGC
	ContainerGC ContainerGC
	Kill        KillPodFunc
	Recorder    record.EventRecorder
	NodeRef     *v1.ObjectReference
	Log         *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Evictions counts evictions by signal (kubelet_evictions); StatsAge
	// observes, at each pass that ranks pods, how old the met signals are
	// (kubelet_eviction_stats_age_seconds).
	Evictions *prometheus.CounterVec
	StatsAge  *prometheus.HistogramVec
}

// NewEvictionsCounter is upstream's kubelet_evictions counter.
func NewEvictionsCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "kubelet", Name: "evictions",
		Help: "Cumulative number of pod evictions by eviction signal",
	}, []string{"eviction_signal"})
}

// NewStatsAgeHistogram is upstream's kubelet_eviction_stats_age_seconds.
func NewStatsAgeHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: "kubelet", Name: "eviction_stats_age_seconds",
		Help:    "Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
		Buckets: prometheus.DefBuckets,
	}, []string{"eviction_signal"})
}

// Manager evaluates thresholds and evicts.
type Manager struct {
	cfg Config
	d   Deps

	mu                           sync.RWMutex
	nodeConditions               []v1.NodeConditionType
	nodeConditionsLastObservedAt nodeConditionsObservedAt
	thresholdsFirstObservedAt    thresholdsObservedAt
	thresholdsMet                []evictionapi.Threshold
	lastObservations             signalObservations
	synced                       bool
}

// NewManager returns a manager; Synchronize or Run drive it.
func NewManager(cfg Config, d Deps) *Manager {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, d: d,
		nodeConditionsLastObservedAt: nodeConditionsObservedAt{},
		thresholdsFirstObservedAt:    thresholdsObservedAt{}}
}

// Thresholds are the configured thresholds.
func (m *Manager) Thresholds() []evictionapi.Threshold { return m.cfg.Thresholds }

// IsUnderMemoryPressure reports the MemoryPressure condition.
func (m *Manager) IsUnderMemoryPressure() bool { return m.has(v1.NodeMemoryPressure) }

// IsUnderDiskPressure reports the DiskPressure condition.
func (m *Manager) IsUnderDiskPressure() bool { return m.has(v1.NodeDiskPressure) }

// IsUnderPIDPressure reports the PIDPressure condition.
func (m *Manager) IsUnderPIDPressure() bool { return m.has(v1.NodePIDPressure) }

// Synced reports whether a pass has observed the signals yet.
func (m *Manager) Synced() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.synced
}

func (m *Manager) has(c v1.NodeConditionType) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return hasNodeCondition(m.nodeConditions, c)
}

// Admit is upstream's eviction admit handler: with no pressure every pod is
// admitted, and critical pods always; under memory pressure alone, pods
// other than BestEffort (and BestEffort pods tolerating the memory-pressure
// taint); under any other pressure none. A refusal is reason Evicted,
// message "The node had condition: [<conditions>]. ".
func (m *Manager) Admit(pod *v1.Pod) (ok bool, reason, message string) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if len(m.nodeConditions) == 0 || IsCriticalPod(pod) {
		return true, "", ""
	}
	if hasNodeCondition(m.nodeConditions, v1.NodeMemoryPressure) && len(m.nodeConditions) == 1 {
		if v1qos.GetPodQOS(pod) != v1.PodQOSBestEffort {
			return true, "", ""
		}
		if corev1helpers.TolerationsTolerateTaint(klog.Background(), pod.Spec.Tolerations, &v1.Taint{
			Key: v1.TaintNodeMemoryPressure, Effect: v1.TaintEffectNoSchedule}, false) {
			return true, "", ""
		}
	}
	return false, Reason, fmt.Sprintf(nodeConditionMessageFmt, m.nodeConditions)
}

// Run synchronizes every interval until ctx ends; after an eviction it
// waits (at most 30 s) for the pod to be cleaned up before the next pass,
// as upstream.
func (m *Manager) Run(ctx context.Context, interval time.Duration, activePods func() []*v1.Pod, cleanedUp func(*v1.Pod) bool) {
	for ctx.Err() == nil {
		evicted, err := m.Synchronize(ctx, activePods())
		if err != nil {
			m.d.Log.Warn("eviction manager: synchronize", "err", err)
		}
		if len(evicted) > 0 {
			m.waitForCleanup(ctx, evicted, cleanedUp)
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
}

func (m *Manager) waitForCleanup(ctx context.Context, pods []*v1.Pod, cleanedUp func(*v1.Pod) bool) {
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timeout.C:
			m.d.Log.Info("eviction manager: timed out waiting for pods to be cleaned up")
			return
		case <-tick.C:
			done := true
			for _, p := range pods {
				if !cleanedUp(p) {
					done = false
					break
				}
			}
			if done {
				return
			}
		}
	}
}

// Synchronize is one pass of upstream's control loop: observe, update the
// conditions, and when a threshold is met past its grace period, reclaim
// at node level or evict one pod. It returns the pods it evicted.
func (m *Manager) Synchronize(ctx context.Context, activePods []*v1.Pod) ([]*v1.Pod, error) {
	thresholds := m.cfg.Thresholds
	if len(thresholds) == 0 {
		m.mu.Lock()
		m.synced = true
		m.mu.Unlock()
		return nil, nil
	}
	summary, err := m.d.Summary.Summary(ctx)
	if err != nil {
		return nil, fmt.Errorf("eviction manager: summary stats: %w", err)
	}
	observations, stats := makeSignalObservations(summary)

	thresholds = thresholdsMet(thresholds, observations, false)
	m.mu.RLock()
	prevMet := m.thresholdsMet
	prevFirst := m.thresholdsFirstObservedAt
	prevCondAt := m.nodeConditionsLastObservedAt
	lastObservations := m.lastObservations
	m.mu.RUnlock()
	if len(prevMet) > 0 {
		thresholds = mergeThresholds(thresholds, thresholdsMet(prevMet, observations, true))
	}
	now := m.d.Now()
	firstObservedAt := thresholdsFirstObservedAt(thresholds, prevFirst, now)
	conds := nodeConditions(thresholds)
	condsLastObservedAt := nodeConditionsLastObservedAt(conds, prevCondAt, now)
	conds = nodeConditionsObservedSince(condsLastObservedAt, m.cfg.PressureTransitionPeriod, now)
	thresholds = thresholdsMetGracePeriod(firstObservedAt, now)

	m.mu.Lock()
	m.nodeConditions = conds
	m.thresholdsFirstObservedAt = firstObservedAt
	m.nodeConditionsLastObservedAt = condsLastObservedAt
	m.thresholdsMet = thresholds
	m.synced = true
	thresholds = thresholdsUpdatedStats(thresholds, observations, lastObservations)
	m.lastObservations = observations
	m.mu.Unlock()

	if len(thresholds) == 0 {
		return nil, nil
	}
	sort.Stable(byEvictionPriority(thresholds))
	thresholdToReclaim, resourceToReclaim, found := getReclaimableThreshold(thresholds)
	if !found {
		return nil, nil
	}
	m.d.Log.Info("eviction manager: attempting to reclaim", "resource", resourceToReclaim, "threshold", FormatThreshold(thresholdToReclaim))
	if m.d.Recorder != nil && m.d.NodeRef != nil {
		m.d.Recorder.Eventf(m.d.NodeRef, v1.EventTypeWarning, EventEvictionThresholdMet, "Attempting to reclaim %s", resourceToReclaim)
	}
	if m.reclaimNodeLevelResources(ctx, thresholdToReclaim.Signal) {
		m.d.Log.Info("eviction manager: able to reduce resource pressure without evicting pods", "resource", resourceToReclaim)
		return nil, nil
	}
	rank, ok := signalToRankFunc[thresholdToReclaim.Signal]
	if !ok {
		return nil, nil
	}
	if len(activePods) == 0 {
		m.d.Log.Warn("eviction manager: eviction thresholds have been met, but no pods are active to evict")
		return nil, nil
	}
	pods := append([]*v1.Pod(nil), activePods...)
	rank(pods, stats)
	if m.d.StatsAge != nil {
		for _, t := range thresholds {
			if at := observations[t.Signal].time; !at.IsZero() {
				m.d.StatsAge.WithLabelValues(string(t.Signal)).Observe(m.d.Now().Sub(at.Time).Seconds())
			}
		}
	}
	for _, pod := range pods {
		if IsCriticalPod(pod) {
			m.d.Log.Warn("eviction manager: cannot evict a critical pod", "pod", pod.Namespace+"/"+pod.Name)
			continue
		}
		grace := int64(1) // upstream's immediateEvictionGracePeriodSeconds
		if !isHardEvictionThreshold(thresholdToReclaim) {
			grace = m.cfg.MaxPodGracePeriodSeconds
			if pod.Spec.TerminationGracePeriodSeconds != nil {
				grace = min(m.cfg.MaxPodGracePeriodSeconds, *pod.Spec.TerminationGracePeriodSeconds)
			}
		}
		message, annotations := evictionMessage(resourceToReclaim, pod, stats, thresholds, observations)
		cond := &v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue,
			Reason: v1.PodReasonTerminationByKubelet, Message: message, ObservedGeneration: pod.Generation}
		if m.d.Recorder != nil {
			m.d.Recorder.AnnotatedEventf(pod, annotations, v1.EventTypeWarning, Reason, "%s", message)
		}
		if err := m.d.Kill(pod, grace, message, cond); err != nil {
			m.d.Log.Error("eviction manager: pod failed to evict", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		} else {
			m.d.Log.Info("eviction manager: pod is evicted", "pod", pod.Namespace+"/"+pod.Name, "message", message)
		}
		if m.d.Evictions != nil {
			m.d.Evictions.WithLabelValues(string(thresholdToReclaim.Signal)).Inc()
		}
		return []*v1.Pod{pod}, nil
	}
	m.d.Log.Warn("eviction manager: unable to evict any pods from the node")
	return nil, nil
}

// reclaimNodeLevelResources runs the signal's node-level reclaim (dead
// containers, then unused images, for disk signals) and reports whether
// every threshold is now clear by its minimum reclaim.
func (m *Manager) reclaimNodeLevelResources(ctx context.Context, signal evictionapi.Signal) bool {
	var funcs []func(context.Context) error
	switch signal {
	case evictionapi.SignalNodeFsAvailable, evictionapi.SignalNodeFsInodesFree:
		if !m.cfg.DedicatedImageFs {
			funcs = m.diskReclaimFuncs()
		}
	case evictionapi.SignalImageFsAvailable, evictionapi.SignalImageFsInodesFree:
		funcs = m.diskReclaimFuncs()
	}
	if len(funcs) == 0 {
		return false
	}
	for _, f := range funcs {
		if err := f(ctx); err != nil {
			m.d.Log.Info("eviction manager: unexpected error when attempting to reduce resource pressure", "signal", signal, "err", err)
		}
	}
	summary, err := m.d.Summary.Summary(ctx)
	if err != nil {
		return false
	}
	observations, _ := makeSignalObservations(summary)
	return len(thresholdsMet(m.cfg.Thresholds, observations, true)) == 0
}

func (m *Manager) diskReclaimFuncs() []func(context.Context) error {
	var out []func(context.Context) error
	if m.d.ContainerGC != nil {
		out = append(out, m.d.ContainerGC.DeleteAllUnusedContainers)
	}
	if m.d.ImageGC != nil {
		out = append(out, m.d.ImageGC.DeleteUnusedImages)
	}
	return out
}
