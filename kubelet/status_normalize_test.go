package kubelet

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNormalizeStatusComparesAtTheAPIsPrecision(t *testing.T) {
	base := time.Date(2026, 12, 6, 10, 0, 0, 100, time.UTC)
	status := func(started time.Time) v1.PodStatus {
		st := metav1.NewTime(started)
		return v1.PodStatus{Phase: v1.PodRunning, StartTime: &st,
			ContainerStatuses: []v1.ContainerStatus{{Name: "c",
				State:                v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}},
				LastTerminationState: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(started)}},
			}}}
	}
	a, b, c := status(base), status(base.Add(400*time.Millisecond)), status(base.Add(time.Second))
	for _, st := range []*v1.PodStatus{&a, &b, &c} {
		normalizeStatus(st)
	}
	if !apiequality.Semantic.DeepEqual(a, b) {
		t.Errorf("statuses 400 ms apart differ after normalizing: the API stores both as %s", a.StartTime.UTC().Format(time.RFC3339))
	}
	if apiequality.Semantic.DeepEqual(a, c) {
		t.Error("statuses a second apart are equal after normalizing")
	}
	if got := a.ContainerStatuses[0].LastTerminationState.Terminated.FinishedAt.Nanosecond(); got != 0 {
		t.Errorf("finishedAt keeps %d ns", got)
	}
}
