package eviction

import (
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	v1resource "k8s.io/kubernetes/pkg/api/v1/resource"
	"k8s.io/kubernetes/pkg/apis/scheduling"
	evictionapi "k8s.io/kubernetes/pkg/kubelet/eviction/api"
)

// Upstream's reason and message formats.
const (
	// Reason is the pod status reason (and Event reason) of an eviction
	// and of an admission refused under pressure.
	Reason                  = "Evicted"
	nodeLowMessageFmt       = "The node was low on resource: %v. "
	nodeConditionMessageFmt = "The node had condition: %v. "
	containerMessageFmt     = "Container %s was using %s, request is %s, has larger consumption of %v. "
	thresholdMetMessageFmt  = "Threshold quantity: %v, available: %v. "

	// Annotations of the Evicted Event, as upstream's.
	OffendingContainersKey      = "offending_containers"
	OffendingContainersUsageKey = "offending_containers_usage"
	StarvedResourceKey          = "starved_resource"
)

// signalObservation is one observed signal: what is available of what
// capacity, and when it was read.
type signalObservation struct {
	available *resource.Quantity
	capacity  *resource.Quantity
	time      metav1.Time
}

type signalObservations map[evictionapi.Signal]signalObservation

type thresholdsObservedAt map[evictionapi.Threshold]time.Time

type nodeConditionsObservedAt map[v1.NodeConditionType]time.Time

// statsFunc returns a pod's usage, if known.
type statsFunc func(pod *v1.Pod) (statsapi.PodStats, bool)

// rankFunc orders pods for eviction, first evicted first.
type rankFunc func(pods []*v1.Pod, stats statsFunc)

type cmpFunc func(p1, p2 *v1.Pod) int

// makeSignalObservations derives the signals from a stats summary, as
// upstream: memory.available from the node's available bytes and working
// set, nodefs and imagefs from their filesystems, pid.available from the
// rlimit figures.
func makeSignalObservations(summary *statsapi.Summary) (signalObservations, statsFunc) {
	result := signalObservations{}
	if memory := summary.Node.Memory; memory != nil && memory.AvailableBytes != nil && memory.WorkingSetBytes != nil {
		result[evictionapi.SignalMemoryAvailable] = signalObservation{
			available: resource.NewQuantity(int64(*memory.AvailableBytes), resource.BinarySI),                         //nolint:gosec // bytes fit
			capacity:  resource.NewQuantity(int64(*memory.AvailableBytes+*memory.WorkingSetBytes), resource.BinarySI), //nolint:gosec // bytes fit
			time:      memory.Time,
		}
	}
	fs := func(avail, inodesFree evictionapi.Signal, st *statsapi.FsStats) {
		if st == nil {
			return
		}
		if st.AvailableBytes != nil && st.CapacityBytes != nil {
			result[avail] = signalObservation{
				available: resource.NewQuantity(int64(*st.AvailableBytes), resource.BinarySI), //nolint:gosec // bytes fit
				capacity:  resource.NewQuantity(int64(*st.CapacityBytes), resource.BinarySI),  //nolint:gosec // bytes fit
				time:      st.Time,
			}
		}
		if st.InodesFree != nil && st.Inodes != nil {
			result[inodesFree] = signalObservation{
				available: resource.NewQuantity(int64(*st.InodesFree), resource.DecimalSI), //nolint:gosec // counts fit
				capacity:  resource.NewQuantity(int64(*st.Inodes), resource.DecimalSI),     //nolint:gosec // counts fit
				time:      st.Time,
			}
		}
	}
	fs(evictionapi.SignalNodeFsAvailable, evictionapi.SignalNodeFsInodesFree, summary.Node.Fs)
	if summary.Node.Runtime != nil {
		fs(evictionapi.SignalImageFsAvailable, evictionapi.SignalImageFsInodesFree, summary.Node.Runtime.ImageFs)
	}
	if rlimit := summary.Node.Rlimit; rlimit != nil && rlimit.NumOfRunningProcesses != nil && rlimit.MaxPID != nil {
		available := *rlimit.MaxPID - *rlimit.NumOfRunningProcesses
		result[evictionapi.SignalPIDAvailable] = signalObservation{
			available: resource.NewQuantity(available, resource.DecimalSI),
			capacity:  resource.NewQuantity(*rlimit.MaxPID, resource.DecimalSI),
			time:      rlimit.Time,
		}
	}
	byUID := map[string]statsapi.PodStats{}
	for i := range summary.Pods {
		byUID[summary.Pods[i].PodRef.UID] = summary.Pods[i]
	}
	return result, func(pod *v1.Pod) (statsapi.PodStats, bool) {
		st, ok := byUID[string(pod.UID)]
		return st, ok
	}
}

// thresholdsMet returns the thresholds met, whatever their grace period;
// with enforceMinReclaim, relative to the threshold plus its minimum reclaim.
func thresholdsMet(thresholds []evictionapi.Threshold, observations signalObservations, enforceMinReclaim bool) []evictionapi.Threshold {
	results := []evictionapi.Threshold{}
	for i := range thresholds {
		threshold := thresholds[i]
		observed, found := observations[threshold.Signal]
		if !found {
			continue
		}
		quantity := evictionapi.GetThresholdQuantity(threshold.Value, observed.capacity)
		if enforceMinReclaim && threshold.MinReclaim != nil {
			quantity.Add(*evictionapi.GetThresholdQuantity(*threshold.MinReclaim, observed.capacity))
		}
		if threshold.Operator == evictionapi.OpLessThan && quantity.Cmp(*observed.available) > 0 {
			results = append(results, threshold)
		}
	}
	return results
}

// thresholdsUpdatedStats keeps the thresholds whose signal was read anew
// since the last pass.
func thresholdsUpdatedStats(thresholds []evictionapi.Threshold, observations, lastObservations signalObservations) []evictionapi.Threshold {
	results := []evictionapi.Threshold{}
	for i := range thresholds {
		threshold := thresholds[i]
		observed, found := observations[threshold.Signal]
		if !found {
			continue
		}
		last, found := lastObservations[threshold.Signal]
		if !found || observed.time.IsZero() || observed.time.After(last.time.Time) {
			results = append(results, threshold)
		}
	}
	return results
}

func thresholdsFirstObservedAt(thresholds []evictionapi.Threshold, lastObservedAt thresholdsObservedAt, now time.Time) thresholdsObservedAt {
	results := thresholdsObservedAt{}
	for i := range thresholds {
		observedAt, found := lastObservedAt[thresholds[i]]
		if !found {
			observedAt = now
		}
		results[thresholds[i]] = observedAt
	}
	return results
}

func thresholdsMetGracePeriod(observedAt thresholdsObservedAt, now time.Time) []evictionapi.Threshold {
	results := []evictionapi.Threshold{}
	for threshold, at := range observedAt {
		if now.Sub(at) < threshold.GracePeriod {
			continue
		}
		results = append(results, threshold)
	}
	return results
}

func nodeConditions(thresholds []evictionapi.Threshold) []v1.NodeConditionType {
	results := []v1.NodeConditionType{}
	for _, threshold := range thresholds {
		if c, found := signalToNodeCondition[threshold.Signal]; found && !hasNodeCondition(results, c) {
			results = append(results, c)
		}
	}
	return results
}

func nodeConditionsLastObservedAt(conds []v1.NodeConditionType, lastObservedAt nodeConditionsObservedAt, now time.Time) nodeConditionsObservedAt {
	results := nodeConditionsObservedAt{}
	for i := range conds {
		results[conds[i]] = now
	}
	for key, value := range lastObservedAt {
		if _, found := results[key]; !found {
			results[key] = value
		}
	}
	return results
}

// nodeConditionsObservedSince returns the conditions observed within period:
// a condition stays for the transition period after its signal clears.
func nodeConditionsObservedSince(observedAt nodeConditionsObservedAt, period time.Duration, now time.Time) []v1.NodeConditionType {
	results := []v1.NodeConditionType{}
	for c, at := range observedAt {
		if now.Sub(at) < period {
			results = append(results, c)
		}
	}
	sort.Slice(results, func(i, j int) bool { return results[i] < results[j] })
	return results
}

func hasNodeCondition(inputs []v1.NodeConditionType, item v1.NodeConditionType) bool {
	for _, input := range inputs {
		if input == item {
			return true
		}
	}
	return false
}

func mergeThresholds(inputsA, inputsB []evictionapi.Threshold) []evictionapi.Threshold {
	results := inputsA
	for _, threshold := range inputsB {
		if !hasThreshold(results, threshold) {
			results = append(results, threshold)
		}
	}
	return results
}

func hasThreshold(inputs []evictionapi.Threshold, item evictionapi.Threshold) bool {
	for _, input := range inputs {
		if input.GracePeriod == item.GracePeriod && input.Operator == item.Operator && input.Signal == item.Signal && compareThresholdValue(input.Value, item.Value) {
			return true
		}
	}
	return false
}

func compareThresholdValue(a, b evictionapi.ThresholdValue) bool {
	if a.Quantity != nil {
		if b.Quantity == nil {
			return false
		}
		return a.Quantity.Cmp(*b.Quantity) == 0
	}
	if b.Quantity != nil {
		return false
	}
	return a.Percentage == b.Percentage
}

func isHardEvictionThreshold(threshold evictionapi.Threshold) bool { return threshold.GracePeriod == 0 }

// byEvictionPriority ranks memory before every other resource, and
// thresholds without a resource last.
type byEvictionPriority []evictionapi.Threshold

func (a byEvictionPriority) Len() int      { return len(a) }
func (a byEvictionPriority) Swap(i, j int) { a[i], a[j] = a[j], a[i] }
func (a byEvictionPriority) Less(i, j int) bool {
	_, jSignalHasResource := signalToResource[a[j].Signal]
	return a[i].Signal == evictionapi.SignalMemoryAvailable || !jSignalHasResource
}

func getReclaimableThreshold(thresholds []evictionapi.Threshold) (evictionapi.Threshold, v1.ResourceName, bool) {
	for _, t := range thresholds {
		if r, ok := signalToResource[t.Signal]; ok {
			return t, r, true
		}
	}
	return evictionapi.Threshold{}, "", false
}

// The pod ranking, upstream's: a multi-key sort whose last key decides.

type multiSorter struct {
	pods []*v1.Pod
	cmp  []cmpFunc
}

func orderedBy(cmp ...cmpFunc) *multiSorter { return &multiSorter{cmp: cmp} }

func (ms *multiSorter) Sort(pods []*v1.Pod) {
	ms.pods = pods
	sort.Sort(ms)
}

func (ms *multiSorter) Len() int      { return len(ms.pods) }
func (ms *multiSorter) Swap(i, j int) { ms.pods[i], ms.pods[j] = ms.pods[j], ms.pods[i] }
func (ms *multiSorter) Less(i, j int) bool {
	p1, p2 := ms.pods[i], ms.pods[j]
	var k int
	for k = 0; k < len(ms.cmp)-1; k++ {
		if r := ms.cmp[k](p1, p2); r < 0 {
			return true
		} else if r > 0 {
			return false
		}
	}
	return ms.cmp[k](p1, p2) < 0
}

// priority orders lower priority first.
func priority(p1, p2 *v1.Pod) int {
	priority1 := corev1helpers.PodPriority(p1)
	priority2 := corev1helpers.PodPriority(p2)
	switch {
	case priority1 == priority2:
		return 0
	case priority1 > priority2:
		return 1
	}
	return -1
}

// cmpBool places true before false.
func cmpBool(a, b bool) int {
	if a == b {
		return 0
	}
	if !b {
		return -1
	}
	return 1
}

func memoryUsage(memStats *statsapi.MemoryStats) *resource.Quantity {
	if memStats == nil || memStats.WorkingSetBytes == nil {
		return &resource.Quantity{Format: resource.BinarySI}
	}
	return resource.NewQuantity(int64(*memStats.WorkingSetBytes), resource.BinarySI) //nolint:gosec // bytes fit
}

func processUsage(processStats *statsapi.ProcessStats) uint64 {
	if processStats == nil || processStats.ProcessCount == nil {
		return 0
	}
	return *processStats.ProcessCount
}

// diskUsage is a pod's disk usage (bytes and inodes): its containers'
// writable layers and logs, the figures the summary has.
func diskUsage(podStats statsapi.PodStats) v1.ResourceList {
	disk := resource.Quantity{Format: resource.BinarySI}
	inodes := resource.Quantity{Format: resource.DecimalSI}
	add := func(fs *statsapi.FsStats) {
		if fs == nil {
			return
		}
		if fs.UsedBytes != nil {
			disk.Add(*resource.NewQuantity(int64(*fs.UsedBytes), resource.BinarySI)) //nolint:gosec // bytes fit
		}
		if fs.InodesUsed != nil {
			inodes.Add(*resource.NewQuantity(int64(*fs.InodesUsed), resource.DecimalSI)) //nolint:gosec // counts fit
		}
	}
	for _, c := range podStats.Containers {
		add(c.Rootfs)
		add(c.Logs)
	}
	for i := range podStats.VolumeStats {
		add(&podStats.VolumeStats[i].FsStats)
	}
	return v1.ResourceList{v1.ResourceEphemeralStorage: disk, resourceInodes: inodes}
}

func exceedMemoryRequests(stats statsFunc) cmpFunc {
	return func(p1, p2 *v1.Pod) int {
		p1Stats, p1Found := stats(p1)
		p2Stats, p2Found := stats(p2)
		if !p1Found || !p2Found {
			return cmpBool(!p1Found, !p2Found)
		}
		p1Memory := memoryUsage(p1Stats.Memory)
		p2Memory := memoryUsage(p2Stats.Memory)
		p1Exceeds := p1Memory.Cmp(v1resource.GetResourceRequestQuantity(p1, v1.ResourceMemory)) == 1
		p2Exceeds := p2Memory.Cmp(v1resource.GetResourceRequestQuantity(p2, v1.ResourceMemory)) == 1
		return cmpBool(p1Exceeds, p2Exceeds)
	}
}

func memory(stats statsFunc) cmpFunc {
	return func(p1, p2 *v1.Pod) int {
		p1Stats, p1Found := stats(p1)
		p2Stats, p2Found := stats(p2)
		if !p1Found || !p2Found {
			return cmpBool(!p1Found, !p2Found)
		}
		p1Memory := memoryUsage(p1Stats.Memory)
		p1Memory.Sub(v1resource.GetResourceRequestQuantity(p1, v1.ResourceMemory))
		p2Memory := memoryUsage(p2Stats.Memory)
		p2Memory.Sub(v1resource.GetResourceRequestQuantity(p2, v1.ResourceMemory))
		return p2Memory.Cmp(*p1Memory)
	}
}

func process(stats statsFunc) cmpFunc {
	return func(p1, p2 *v1.Pod) int {
		p1Stats, p1Found := stats(p1)
		p2Stats, p2Found := stats(p2)
		if !p1Found || !p2Found {
			return cmpBool(!p1Found, !p2Found)
		}
		p1Process := processUsage(p1Stats.ProcessStats)
		p2Process := processUsage(p2Stats.ProcessStats)
		switch {
		case p1Process == p2Process:
			return 0
		case p1Process > p2Process:
			return -1
		}
		return 1
	}
}

func exceedDiskRequests(stats statsFunc, diskResource v1.ResourceName) cmpFunc {
	return func(p1, p2 *v1.Pod) int {
		p1Stats, p1Found := stats(p1)
		p2Stats, p2Found := stats(p2)
		if !p1Found || !p2Found {
			return cmpBool(!p1Found, !p2Found)
		}
		p1Disk := diskUsage(p1Stats)[diskResource]
		p2Disk := diskUsage(p2Stats)[diskResource]
		p1Exceeds := p1Disk.Cmp(v1resource.GetResourceRequestQuantity(p1, diskResource)) == 1
		p2Exceeds := p2Disk.Cmp(v1resource.GetResourceRequestQuantity(p2, diskResource)) == 1
		return cmpBool(p1Exceeds, p2Exceeds)
	}
}

func disk(stats statsFunc, diskResource v1.ResourceName) cmpFunc {
	return func(p1, p2 *v1.Pod) int {
		p1Stats, p1Found := stats(p1)
		p2Stats, p2Found := stats(p2)
		if !p1Found || !p2Found {
			return cmpBool(!p1Found, !p2Found)
		}
		p1Disk := diskUsage(p1Stats)[diskResource]
		p2Disk := diskUsage(p2Stats)[diskResource]
		p1Disk.Sub(v1resource.GetResourceRequestQuantity(p1, v1.ResourceEphemeralStorage))
		p2Disk.Sub(v1resource.GetResourceRequestQuantity(p2, v1.ResourceEphemeralStorage))
		return p2Disk.Cmp(p1Disk)
	}
}

// rankMemoryPressure: pods whose usage exceeds their requests first, then
// lower priority, then usage above requests.
func rankMemoryPressure(pods []*v1.Pod, stats statsFunc) {
	orderedBy(exceedMemoryRequests(stats), priority, memory(stats)).Sort(pods)
}

// rankPIDPressure: lower priority first, then more processes.
func rankPIDPressure(pods []*v1.Pod, stats statsFunc) {
	orderedBy(priority, process(stats)).Sort(pods)
}

// rankDiskPressureFunc: pods whose disk usage exceeds their requests first,
// then lower priority, then usage above requests.
func rankDiskPressureFunc(diskResource v1.ResourceName) rankFunc {
	return func(pods []*v1.Pod, stats statsFunc) {
		orderedBy(exceedDiskRequests(stats, diskResource), priority, disk(stats, diskResource)).Sort(pods)
	}
}

// signalToRankFunc is upstream's table for a node whose images share the
// node's filesystem or not: every disk signal measures everything a pod
// writes (Waggle reports no per-filesystem split of a pod's usage).
var signalToRankFunc = map[evictionapi.Signal]rankFunc{
	evictionapi.SignalMemoryAvailable:   rankMemoryPressure,
	evictionapi.SignalPIDAvailable:      rankPIDPressure,
	evictionapi.SignalNodeFsAvailable:   rankDiskPressureFunc(v1.ResourceEphemeralStorage),
	evictionapi.SignalNodeFsInodesFree:  rankDiskPressureFunc(resourceInodes),
	evictionapi.SignalImageFsAvailable:  rankDiskPressureFunc(v1.ResourceEphemeralStorage),
	evictionapi.SignalImageFsInodesFree: rankDiskPressureFunc(resourceInodes),
}

// evictionMessage is upstream's message for evicting pod to reclaim
// resourceToReclaim, and the Event's annotations.
func evictionMessage(resourceToReclaim v1.ResourceName, pod *v1.Pod, stats statsFunc, thresholds []evictionapi.Threshold, observations signalObservations) (string, map[string]string) {
	annotations := map[string]string{}
	message := fmt.Sprintf(nodeLowMessageFmt, resourceToReclaim)
	quantity, available := getThresholdMetInfo(resourceToReclaim, thresholds, observations)
	if quantity != nil && available != nil {
		message += fmt.Sprintf(thresholdMetMessageFmt, quantity, available)
	}
	podStats, ok := stats(pod)
	if !ok {
		return message, annotations
	}
	var exceeded, usages []string
	containers := append(append([]v1.Container{}, pod.Spec.Containers...), pod.Spec.InitContainers...)
	for _, containerStats := range podStats.Containers {
		for _, container := range containers {
			if container.Name != containerStats.Name {
				continue
			}
			requests := container.Resources.Requests[resourceToReclaim]
			var usage *resource.Quantity
			switch resourceToReclaim {
			case v1.ResourceEphemeralStorage:
				if containerStats.Rootfs != nil && containerStats.Rootfs.UsedBytes != nil && containerStats.Logs != nil && containerStats.Logs.UsedBytes != nil {
					usage = resource.NewQuantity(int64(*containerStats.Rootfs.UsedBytes+*containerStats.Logs.UsedBytes), resource.BinarySI) //nolint:gosec // bytes fit
				}
			case v1.ResourceMemory:
				if containerStats.Memory != nil && containerStats.Memory.WorkingSetBytes != nil {
					usage = resource.NewQuantity(int64(*containerStats.Memory.WorkingSetBytes), resource.BinarySI) //nolint:gosec // bytes fit
				}
			}
			if usage != nil && usage.Cmp(requests) > 0 {
				message += fmt.Sprintf(containerMessageFmt, container.Name, usage.String(), requests.String(), resourceToReclaim)
				exceeded = append(exceeded, container.Name)
				usages = append(usages, usage.String())
			}
			break
		}
	}
	annotations[OffendingContainersKey] = strings.Join(exceeded, ",")
	annotations[OffendingContainersUsageKey] = strings.Join(usages, ",")
	annotations[StarvedResourceKey] = string(resourceToReclaim)
	return message, annotations
}

func getThresholdMetInfo(resourceToReclaim v1.ResourceName, thresholds []evictionapi.Threshold, observations signalObservations) (*resource.Quantity, *resource.Quantity) {
	for i := range thresholds {
		threshold := thresholds[i]
		if signalToResource[threshold.Signal] == resourceToReclaim {
			if observed, found := observations[threshold.Signal]; found {
				return evictionapi.GetThresholdQuantity(threshold.Value, observed.capacity), observed.available
			}
		}
	}
	return nil, nil
}

// Pod sources, as upstream's kubelet spells them (kubetypes).
const (
	configSourceAnnotation = "kubernetes.io/config.source"
	configMirrorAnnotation = "kubernetes.io/config.mirror"
	apiserverSource        = "api"
)

// IsCriticalPod is upstream's kubetypes.IsCriticalPod: a static pod, a
// mirror pod, or a pod of system-critical priority (≥ 2000000000). Such
// pods are admitted under pressure and never evicted.
func IsCriticalPod(pod *v1.Pod) bool {
	if src, ok := pod.Annotations[configSourceAnnotation]; ok && src != apiserverSource {
		return true
	}
	if _, ok := pod.Annotations[configMirrorAnnotation]; ok {
		return true
	}
	return pod.Spec.Priority != nil && *pod.Spec.Priority >= scheduling.SystemCriticalPriority
}
