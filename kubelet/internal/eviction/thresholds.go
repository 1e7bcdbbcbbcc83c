package eviction

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	evictionapi "k8s.io/kubernetes/pkg/kubelet/eviction/api"
)

// DefaultEvictionHard is upstream's --eviction-hard default on Linux
// (pkg/kubelet/eviction/defaults_linux.go).
var DefaultEvictionHard = map[string]string{
	"memory.available":   "100Mi",
	"nodefs.available":   "10%",
	"nodefs.inodesFree":  "5%",
	"imagefs.available":  "15%",
	"imagefs.inodesFree": "5%",
}

// Upstream's defaults of the other eviction and image GC settings
// (KubeletConfiguration v1beta1 defaults).
const (
	DefaultPressureTransitionPeriod = 5 * time.Minute
	DefaultImageGCHighThreshold     = 85
	DefaultImageGCLowThreshold      = 80
	DefaultImageMinimumGCAge        = 2 * time.Minute
	// DefaultMonitoringInterval is how often the manager looks, as
	// upstream's evictionMonitoringPeriod.
	DefaultMonitoringInterval = 10 * time.Second
)

const unsupportedEvictionSignal = "unsupported eviction signal %v"

// The resources upstream counts beside memory and ephemeral storage.
const (
	resourceInodes v1.ResourceName = "inodes"
	resourcePids   v1.ResourceName = "pids"
)

// signalToNodeCondition maps a signal to the node condition it raises;
// signalToResource to the resource it measures (upstream's tables, without
// the containerfs and allocatable signals, which Waggle does not observe).
var (
	signalToNodeCondition = map[evictionapi.Signal]v1.NodeConditionType{
		evictionapi.SignalMemoryAvailable:   v1.NodeMemoryPressure,
		evictionapi.SignalImageFsAvailable:  v1.NodeDiskPressure,
		evictionapi.SignalNodeFsAvailable:   v1.NodeDiskPressure,
		evictionapi.SignalImageFsInodesFree: v1.NodeDiskPressure,
		evictionapi.SignalNodeFsInodesFree:  v1.NodeDiskPressure,
		evictionapi.SignalPIDAvailable:      v1.NodePIDPressure,
	}
	signalToResource = map[evictionapi.Signal]v1.ResourceName{
		evictionapi.SignalMemoryAvailable:   v1.ResourceMemory,
		evictionapi.SignalImageFsAvailable:  v1.ResourceEphemeralStorage,
		evictionapi.SignalImageFsInodesFree: resourceInodes,
		evictionapi.SignalNodeFsAvailable:   v1.ResourceEphemeralStorage,
		evictionapi.SignalNodeFsInodesFree:  resourceInodes,
		evictionapi.SignalPIDAvailable:      resourcePids,
	}
)

func validSignal(signal evictionapi.Signal) bool {
	_, found := signalToResource[signal]
	return found
}

// ParseThresholdConfig parses the --eviction-hard, --eviction-soft,
// --eviction-soft-grace-period and --eviction-minimum-reclaim maps into
// thresholds, as upstream's function of the same name (without the
// allocatable enforcement key): every signal must be one upstream knows
// and Waggle observes, every soft threshold needs a grace period, a value is
// a positive quantity or a percentage (0% and 100% drop the threshold).
// The result is sorted by signal, hard before soft, so it is stable.
func ParseThresholdConfig(evictionHard, evictionSoft, evictionSoftGracePeriod, evictionMinimumReclaim map[string]string) ([]evictionapi.Threshold, error) {
	results := []evictionapi.Threshold{}
	hardThresholds, err := parseThresholdStatements(evictionHard)
	if err != nil {
		return nil, fmt.Errorf("--eviction-hard: %w", err)
	}
	results = append(results, hardThresholds...)
	softThresholds, err := parseThresholdStatements(evictionSoft)
	if err != nil {
		return nil, fmt.Errorf("--eviction-soft: %w", err)
	}
	gracePeriods, err := parseGracePeriods(evictionSoftGracePeriod)
	if err != nil {
		return nil, fmt.Errorf("--eviction-soft-grace-period: %w", err)
	}
	minReclaims, err := parseMinimumReclaims(evictionMinimumReclaim)
	if err != nil {
		return nil, fmt.Errorf("--eviction-minimum-reclaim: %w", err)
	}
	for i := range softThresholds {
		signal := softThresholds[i].Signal
		period, found := gracePeriods[signal]
		if !found {
			return nil, fmt.Errorf("grace period must be specified for the soft eviction threshold %v", signal)
		}
		softThresholds[i].GracePeriod = period
	}
	results = append(results, softThresholds...)
	for i := range results {
		if minReclaim, ok := minReclaims[results[i].Signal]; ok {
			results[i].MinReclaim = &minReclaim
		}
	}
	return results, nil
}

// parseThresholdStatements parses signal → value statements, sorted by
// signal (upstream ranges over the map).
func parseThresholdStatements(statements map[string]string) ([]evictionapi.Threshold, error) {
	if len(statements) == 0 {
		return nil, nil
	}
	signals := make([]string, 0, len(statements))
	for s := range statements {
		signals = append(signals, s)
	}
	sort.Strings(signals)
	results := []evictionapi.Threshold{}
	for _, signal := range signals {
		result, err := parseThresholdStatement(evictionapi.Signal(signal), statements[signal])
		if err != nil {
			return nil, err
		}
		if result != nil {
			results = append(results, *result)
		}
	}
	return results, nil
}

// parseThresholdStatement parses one threshold; nil means it is ignored.
func parseThresholdStatement(signal evictionapi.Signal, val string) (*evictionapi.Threshold, error) {
	if !validSignal(signal) {
		return nil, fmt.Errorf(unsupportedEvictionSignal, signal)
	}
	operator := evictionapi.OpForSignal[signal]
	if strings.HasSuffix(val, "%") {
		// ignore 0% and 100%
		if val == "0%" || val == "100%" {
			return nil, nil
		}
		percentage, err := parsePercentage(val)
		if err != nil {
			return nil, err
		}
		if percentage < 0 {
			return nil, fmt.Errorf("eviction percentage threshold %v must be >= 0%%: %s", signal, val)
		}
		if percentage > 1 {
			return nil, fmt.Errorf("eviction percentage threshold %v must be <= 100%%: %s", signal, val)
		}
		return &evictionapi.Threshold{Signal: signal, Operator: operator, Value: evictionapi.ThresholdValue{Percentage: percentage}}, nil
	}
	quantity, err := resource.ParseQuantity(val)
	if err != nil {
		return nil, fmt.Errorf("eviction threshold %v: %q: %w", signal, val, err)
	}
	if quantity.Sign() < 0 || quantity.IsZero() {
		return nil, fmt.Errorf("eviction threshold %v must be positive: %s", signal, &quantity)
	}
	return &evictionapi.Threshold{Signal: signal, Operator: operator, Value: evictionapi.ThresholdValue{Quantity: &quantity}}, nil
}

func parsePercentage(input string) (float32, error) {
	value, err := strconv.ParseFloat(strings.TrimRight(input, "%"), 32)
	if err != nil {
		return 0, fmt.Errorf("percentage %q: %w", input, err)
	}
	if math.IsNaN(value) || math.IsInf(value, 0) {
		// Stricter than upstream, whose parser lets "NaN%" through.
		return 0, fmt.Errorf("percentage %q is not a number", input)
	}
	return float32(value) / 100, nil
}

func parseGracePeriods(statements map[string]string) (map[evictionapi.Signal]time.Duration, error) {
	if len(statements) == 0 {
		return nil, nil
	}
	results := map[evictionapi.Signal]time.Duration{}
	for signal, val := range statements {
		signal := evictionapi.Signal(signal)
		if !validSignal(signal) {
			return nil, fmt.Errorf(unsupportedEvictionSignal, signal)
		}
		gracePeriod, err := time.ParseDuration(val)
		if err != nil {
			return nil, fmt.Errorf("grace period of %v: %w", signal, err)
		}
		if gracePeriod < 0 {
			return nil, fmt.Errorf("invalid eviction grace period specified: %v, must be a positive value", val)
		}
		results[signal] = gracePeriod
	}
	return results, nil
}

func parseMinimumReclaims(statements map[string]string) (map[evictionapi.Signal]evictionapi.ThresholdValue, error) {
	if len(statements) == 0 {
		return nil, nil
	}
	results := map[evictionapi.Signal]evictionapi.ThresholdValue{}
	for signal, val := range statements {
		signal := evictionapi.Signal(signal)
		if !validSignal(signal) {
			return nil, fmt.Errorf(unsupportedEvictionSignal, signal)
		}
		if strings.HasSuffix(val, "%") {
			percentage, err := parsePercentage(val)
			if err != nil {
				return nil, err
			}
			if percentage <= 0 {
				return nil, fmt.Errorf("eviction percentage minimum reclaim %v must be positive: %s", signal, val)
			}
			results[signal] = evictionapi.ThresholdValue{Percentage: percentage}
			continue
		}
		quantity, err := resource.ParseQuantity(val)
		if err != nil {
			return nil, fmt.Errorf("minimum reclaim of %v: %q: %w", signal, val, err)
		}
		if quantity.Sign() < 0 {
			return nil, fmt.Errorf("negative eviction minimum reclaim specified for %v", signal)
		}
		results[signal] = evictionapi.ThresholdValue{Quantity: &quantity}
	}
	return results, nil
}

// FormatThreshold is a threshold as the flags spell it ("memory.available<100Mi").
func FormatThreshold(t evictionapi.Threshold) string {
	v := ""
	if t.Value.Quantity != nil {
		v = t.Value.Quantity.String()
	} else {
		v = strconv.FormatFloat(float64(t.Value.Percentage)*100, 'f', -1, 32) + "%"
	}
	s := string(t.Signal) + "<" + v
	if t.GracePeriod > 0 {
		s += " (soft, " + t.GracePeriod.String() + ")"
	}
	return s
}
