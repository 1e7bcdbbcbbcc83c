package eviction

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	evictionapi "k8s.io/kubernetes/pkg/kubelet/eviction/api"
)

func TestParseThresholdConfigAcceptsUpstreamSyntax(t *testing.T) {
	th, err := ParseThresholdConfig(DefaultEvictionHard,
		map[string]string{"memory.available": "1.5Gi", "nodefs.available": "20%"},
		map[string]string{"memory.available": "1m30s", "nodefs.available": "2m"},
		map[string]string{"memory.available": "0", "nodefs.available": "500Mi", "imagefs.available": "2%"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]evictionapi.Threshold{}
	for _, x := range th {
		key := string(x.Signal)
		if x.GracePeriod > 0 {
			key += "/soft"
		}
		got[key] = x
	}
	if len(th) != 7 {
		t.Fatalf("want 5 hard + 2 soft thresholds, got %d: %+v", len(th), th)
	}
	if q := got["memory.available"].Value.Quantity; q == nil || q.Cmp(resource.MustParse("100Mi")) != 0 {
		t.Errorf("memory.available hard = %v", q)
	}
	if p := got["nodefs.inodesFree"].Value.Percentage; p != 0.05 {
		t.Errorf("nodefs.inodesFree = %v, want 0.05", p)
	}
	if g := got["memory.available/soft"].GracePeriod; g != 90*time.Second {
		t.Errorf("soft memory grace = %v", g)
	}
	if mr := got["imagefs.available"].MinReclaim; mr == nil || mr.Percentage != 0.02 {
		t.Errorf("imagefs min reclaim = %+v", mr)
	}
	if FormatThreshold(got["memory.available"]) != "memory.available<100Mi" {
		t.Errorf("FormatThreshold = %q", FormatThreshold(got["memory.available"]))
	}
	// 0% and 100% drop the threshold, as upstream.
	th, err = ParseThresholdConfig(map[string]string{"memory.available": "0%", "nodefs.available": "100%"}, nil, nil, nil)
	if err != nil || len(th) != 0 {
		t.Errorf("0%%/100%%: %v %+v", err, th)
	}
}

func TestParseThresholdConfigRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		hard, soft, grace, mini map[string]string
		want                    string
	}{
		{name: "unknown signal", hard: map[string]string{"memory.free": "1Gi"}, want: "unsupported eviction signal memory.free"},
		{name: "negative quantity", hard: map[string]string{"memory.available": "-1Gi"}, want: "must be positive"},
		{name: "zero quantity", hard: map[string]string{"memory.available": "0"}, want: "must be positive"},
		{name: "bad quantity", hard: map[string]string{"memory.available": "lots"}, want: "--eviction-hard"},
		{name: "over 100%", hard: map[string]string{"nodefs.available": "101%"}, want: "must be <= 100%"},
		{name: "negative %", hard: map[string]string{"nodefs.available": "-5%"}, want: "must be >= 0%"},
		{name: "bad %", hard: map[string]string{"nodefs.available": "ten%"}, want: "percentage"},
		{name: "NaN %", hard: map[string]string{"nodefs.available": "NaN%"}, want: "is not a number"},
		{name: "Inf %", hard: map[string]string{"nodefs.available": "Inf%"}, want: "is not a number"},
		{name: "soft without grace", soft: map[string]string{"memory.available": "1Gi"}, want: "grace period must be specified"},
		{name: "bad grace", soft: map[string]string{"memory.available": "1Gi"}, grace: map[string]string{"memory.available": "soon"}, want: "--eviction-soft-grace-period"},
		{name: "negative grace", soft: map[string]string{"memory.available": "1Gi"}, grace: map[string]string{"memory.available": "-1s"}, want: "must be a positive value"},
		{name: "grace of unknown signal", grace: map[string]string{"swap.available": "1s"}, want: "unsupported eviction signal"},
		{name: "negative min reclaim", mini: map[string]string{"memory.available": "-1Mi"}, want: "negative eviction minimum reclaim"},
		{name: "zero % min reclaim", mini: map[string]string{"memory.available": "0%"}, want: "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseThresholdConfig(tc.hard, tc.soft, tc.grace, tc.mini)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func u64(v uint64) *uint64 { return &v }

// fakeSummary is the test's signal source.
type fakeSummary struct{ s *statsapi.Summary }

func (f *fakeSummary) Summary(context.Context) (*statsapi.Summary, error) {
	s := *f.s
	mem := *f.s.Node.Memory
	mem.Time = metav1.Now()
	s.Node.Memory = &mem
	return &s, nil
}

func nodeMem(availMi uint64) *statsapi.Summary {
	return &statsapi.Summary{Node: statsapi.NodeStats{Memory: &statsapi.MemoryStats{
		AvailableBytes: u64(availMi << 20), WorkingSetBytes: u64((4096 - availMi) << 20)}}}
}

func pod(name string, prio int32, memRequest string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
		Spec: v1.PodSpec{Priority: &prio, Containers: []v1.Container{{Name: "c"}}}}
	if memRequest != "" {
		q := resource.MustParse(memRequest)
		p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: q}
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: q}
	}
	return p
}

func podMem(name string, mi uint64) statsapi.PodStats {
	ws := u64(mi << 20)
	return statsapi.PodStats{PodRef: statsapi.PodReference{Name: name, Namespace: "default", UID: name},
		Memory:     &statsapi.MemoryStats{WorkingSetBytes: ws},
		Containers: []statsapi.ContainerStats{{Name: "c", Memory: &statsapi.MemoryStats{WorkingSetBytes: ws}}}}
}

func TestRankMemoryPressureUpstreamOrder(t *testing.T) {
	// Over requests first; among those lower priority; then usage above requests.
	pods := []*v1.Pod{
		pod("guaranteed-under", 0, "500Mi"),   // 100Mi of 500Mi: under requests
		pod("besteffort-small", 0, ""),        // 50Mi over 0
		pod("besteffort-big", 0, ""),          // 300Mi over 0
		pod("high-prio-besteffort", 1000, ""), // 900Mi over 0, but higher priority
		pod("burst-over", 0, "100Mi"),         // 350Mi, 250Mi above its request
	}
	sum := &statsapi.Summary{Pods: []statsapi.PodStats{
		podMem("guaranteed-under", 100), podMem("besteffort-small", 50), podMem("besteffort-big", 300),
		podMem("high-prio-besteffort", 900), podMem("burst-over", 350),
	}}
	_, stats := makeSignalObservations(sum)
	rankMemoryPressure(pods, stats)
	var got []string
	for _, p := range pods {
		got = append(got, p.Name)
	}
	want := []string{"besteffort-big", "burst-over", "besteffort-small", "high-prio-besteffort", "guaranteed-under"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("rank = %v, want %v", got, want)
	}
}

func TestRankPIDPressurePriorityThenProcesses(t *testing.T) {
	procs := func(name string, n uint64) statsapi.PodStats {
		return statsapi.PodStats{PodRef: statsapi.PodReference{UID: name}, ProcessStats: &statsapi.ProcessStats{ProcessCount: u64(n)}}
	}
	pods := []*v1.Pod{pod("few", 0, ""), pod("many-high", 10, ""), pod("many", 0, "")}
	_, stats := makeSignalObservations(&statsapi.Summary{Pods: []statsapi.PodStats{procs("few", 2), procs("many-high", 500), procs("many", 100)}})
	rankPIDPressure(pods, stats)
	if pods[0].Name != "many" || pods[1].Name != "few" || pods[2].Name != "many-high" {
		t.Fatalf("rank = %s %s %s", pods[0].Name, pods[1].Name, pods[2].Name)
	}
}

func TestRankDiskPressureUsageAboveRequests(t *testing.T) {
	fsUse := func(name string, rootMi, logMi uint64) statsapi.PodStats {
		return statsapi.PodStats{PodRef: statsapi.PodReference{UID: name}, Containers: []statsapi.ContainerStats{{Name: "c",
			Rootfs: &statsapi.FsStats{UsedBytes: u64(rootMi << 20)}, Logs: &statsapi.FsStats{UsedBytes: u64(logMi << 20)}}}}
	}
	withDisk := pod("requests-1Gi", 0, "")
	withDisk.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("1Gi")}
	pods := []*v1.Pod{withDisk, pod("small", 0, ""), pod("big", 0, "")}
	_, stats := makeSignalObservations(&statsapi.Summary{Pods: []statsapi.PodStats{fsUse("requests-1Gi", 600, 10), fsUse("small", 5, 1), fsUse("big", 200, 50)}})
	signalToRankFunc[evictionapi.SignalNodeFsAvailable](pods, stats)
	if pods[0].Name != "big" || pods[1].Name != "small" || pods[2].Name != "requests-1Gi" {
		t.Fatalf("rank = %s %s %s", pods[0].Name, pods[1].Name, pods[2].Name)
	}
}

type killed struct {
	pod     *v1.Pod
	grace   int64
	message string
}

func newTestManager(t *testing.T, hard, soft, grace map[string]string, src *fakeSummary, now *time.Time) (*Manager, *[]killed) {
	t.Helper()
	th, err := ParseThresholdConfig(hard, soft, grace, nil)
	if err != nil {
		t.Fatal(err)
	}
	var kills []killed
	m := NewManager(Config{Thresholds: th, PressureTransitionPeriod: 5 * time.Minute}, Deps{
		Summary: src, Now: func() time.Time { return *now },
		Kill: func(p *v1.Pod, g int64, msg string, _ *v1.PodCondition) error {
			kills = append(kills, killed{p, g, msg})
			return nil
		},
	})
	return m, &kills
}

func TestPressureConditionHoldsForTransitionPeriod(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	src := &fakeSummary{nodeMem(60)}
	m, kills := newTestManager(t, map[string]string{"memory.available": "100Mi"}, nil, nil, src, &now)
	best := pod("be", 0, "")
	guaranteed := pod("g", 0, "1Gi")
	src.s.Pods = []statsapi.PodStats{podMem("be", 200), podMem("g", 100)}
	if _, err := m.Synchronize(context.Background(), []*v1.Pod{guaranteed, best}); err != nil {
		t.Fatal(err)
	}
	if !m.IsUnderMemoryPressure() || m.IsUnderDiskPressure() || m.IsUnderPIDPressure() {
		t.Fatal("want MemoryPressure only")
	}
	if len(*kills) != 1 || (*kills)[0].pod.Name != "be" || (*kills)[0].grace != 1 {
		t.Fatalf("kills = %+v, want the BestEffort pod with grace 1", *kills)
	}
	want := "The node was low on resource: memory. Threshold quantity: 100Mi, available: 60Mi. Container c was using 200Mi, request is 0, has larger consumption of memory. "
	if (*kills)[0].message != want {
		t.Errorf("message = %q\nwant      %q", (*kills)[0].message, want)
	}
	// Admission: BestEffort refused, Guaranteed admitted, critical admitted.
	if ok, reason, msg := m.Admit(pod("new-be", 0, "")); ok || reason != "Evicted" || msg != "The node had condition: [MemoryPressure]. " {
		t.Errorf("Admit(BestEffort) = %v %q %q", ok, reason, msg)
	}
	if ok, _, _ := m.Admit(pod("new-g", 0, "64Mi")); !ok {
		t.Error("Guaranteed pod refused under memory pressure")
	}
	crit := pod("crit", 2000000000, "")
	if ok, _, _ := m.Admit(crit); !ok {
		t.Error("critical pod refused")
	}

	// The signal clears: the condition stays for the transition period.
	src.s = nodeMem(2048)
	now = now.Add(4*time.Minute + 59*time.Second)
	m.Synchronize(context.Background(), nil)
	if !m.IsUnderMemoryPressure() {
		t.Fatal("condition dropped before the transition period")
	}
	now = now.Add(2 * time.Second)
	m.Synchronize(context.Background(), nil)
	if m.IsUnderMemoryPressure() {
		t.Fatal("condition kept after the transition period")
	}
	if ok, _, _ := m.Admit(pod("later-be", 0, "")); !ok {
		t.Error("BestEffort refused without pressure")
	}
}

func TestSoftThresholdWaitsForGracePeriod(t *testing.T) {
	now := time.Unix(2_000_000, 0)
	src := &fakeSummary{nodeMem(500)}
	src.s.Pods = []statsapi.PodStats{podMem("be", 300)}
	be := pod("be", 0, "")
	be.Spec.TerminationGracePeriodSeconds = new(int64)
	*be.Spec.TerminationGracePeriodSeconds = 30
	m, kills := newTestManager(t, map[string]string{}, map[string]string{"memory.available": "1Gi"},
		map[string]string{"memory.available": "1m"}, src, &now)
	m.cfg.MaxPodGracePeriodSeconds = 10
	m.Synchronize(context.Background(), []*v1.Pod{be})
	if !m.IsUnderMemoryPressure() {
		t.Fatal("a met soft threshold raises the condition at once")
	}
	if len(*kills) != 0 {
		t.Fatalf("evicted before the grace period: %+v", *kills)
	}
	now = now.Add(59 * time.Second)
	m.Synchronize(context.Background(), []*v1.Pod{be})
	if len(*kills) != 0 {
		t.Fatalf("evicted before the grace period: %+v", *kills)
	}
	now = now.Add(time.Second)
	m.Synchronize(context.Background(), []*v1.Pod{be})
	if len(*kills) != 1 || (*kills)[0].grace != 10 {
		t.Fatalf("kills = %+v, want one with grace min(max 10, pod's 30)", *kills)
	}
}

func TestDiskPressureRefusesEveryNonCriticalPod(t *testing.T) {
	now := time.Unix(3_000_000, 0)
	src := &fakeSummary{nodeMem(2048)}
	src.s.Node.Fs = &statsapi.FsStats{AvailableBytes: u64(5 << 30), CapacityBytes: u64(100 << 30), InodesFree: u64(1e6), Inodes: u64(2e6)}
	m, _ := newTestManager(t, DefaultEvictionHard, nil, nil, src, &now)
	m.Synchronize(context.Background(), nil)
	if !m.IsUnderDiskPressure() || m.IsUnderMemoryPressure() {
		t.Fatal("want DiskPressure only (nodefs 5% < 10%)")
	}
	if ok, reason, msg := m.Admit(pod("g", 0, "64Mi")); ok || reason != Reason || msg != "The node had condition: [DiskPressure]. " {
		t.Errorf("Admit(Guaranteed) under disk pressure = %v %q %q", ok, reason, msg)
	}
	static := pod("static", 0, "")
	static.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
	if ok, _, _ := m.Admit(static); !ok {
		t.Error("static (critical) pod refused")
	}
}

func TestCriticalPodsAreNotEvicted(t *testing.T) {
	now := time.Unix(4_000_000, 0)
	src := &fakeSummary{nodeMem(10)}
	static := pod("static", 0, "")
	static.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
	src.s.Pods = []statsapi.PodStats{podMem("static", 900)}
	m, kills := newTestManager(t, map[string]string{"memory.available": "100Mi"}, nil, nil, src, &now)
	m.Synchronize(context.Background(), []*v1.Pod{static})
	if len(*kills) != 0 {
		t.Fatalf("a static pod was evicted: %+v", *kills)
	}
}
