package cronjob

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
)

var t0 = time.Date(2026, 3, 10, 12, 0, 30, 0, time.UTC)

func newCronJob(name string, mod func(*batchv1.CronJob)) *batchv1.CronJob {
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(t0.Add(-150 * time.Second))},
		Spec: batchv1.CronJobSpec{
			Schedule: "*/1 * * * *",
			JobTemplate: batchv1.JobTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}},
			},
		},
	}
	if mod != nil {
		mod(cj)
	}
	return cj
}

func start(t *testing.T, now time.Time, objs ...runtime.Object) *ctrltest.Client {
	t.Helper()
	cs := ctrltest.NewClient(objs...)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t), Options{Now: func() time.Time { return now }})
	ctx := ctrltest.Start(t, cs, f)
	go c.Run(ctx, 1)
	return cs
}

func jobNames(t *testing.T, cs *ctrltest.Client) []string {
	l, err := cs.BatchV1().Jobs("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, j := range l.Items {
		out = append(out, j.Name)
	}
	sort.Strings(out)
	return out
}

func TestMostRecentRunsOnlyTheLatestMissedTime(t *testing.T) {
	s, err := cron.ParseStandard("*/5 * * * *")
	if err != nil {
		t.Fatal(err)
	}
	last, missed, next := MostRecent(s, t0.Add(-time.Hour), t0)
	if want := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC); !last.Equal(want) || missed != 12 {
		t.Fatalf("last %v missed %d", last, missed)
	}
	if want := time.Date(2026, 3, 10, 12, 5, 0, 0, time.UTC); !next.Equal(want) {
		t.Fatalf("next %v", next)
	}
	if _, missed, _ := MostRecent(s, t0, t0.Add(time.Minute)); missed != 0 {
		t.Fatalf("nothing is due yet, got %d", missed)
	}
}

func TestScheduleHonoursTheTimeZone(t *testing.T) {
	cj := newCronJob("tz", func(cj *batchv1.CronJob) { cj.Spec.Schedule = "0 9 * * *"; cj.Spec.TimeZone = ptr("Asia/Tokyo") })
	s, loc, err := Schedule(cj)
	if err != nil {
		t.Fatal(err)
	}
	next := s.Next(t0.In(loc)) // 12:00:30 UTC is 21:00:30 in Tokyo
	if want := time.Date(2026, 3, 11, 0, 0, 0, 0, time.UTC); !next.Equal(want) {
		t.Fatalf("next %v, want %v", next.UTC(), want)
	}
	if _, _, err := Schedule(newCronJob("bad", func(cj *batchv1.CronJob) { cj.Spec.TimeZone = ptr("Mars/Olympus") })); err == nil {
		t.Fatal("unknown time zone accepted")
	}
}

func TestCreatesTheJobOfTheMostRecentScheduledTime(t *testing.T) {
	cs := start(t, t0, newCronJob("tick", nil))
	want := fmt.Sprintf("tick-%d", time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC).Unix()/60)
	ctrltest.Eventually(t, 45*time.Second, func() error {
		if n := jobNames(t, cs); len(n) != 1 || n[0] != want {
			return fmt.Errorf("jobs %v, want [%s] (only the latest of the missed times)", n, want)
		}
		cj, _ := cs.BatchV1().CronJobs("default").Get(context.Background(), "tick", metav1.GetOptions{})
		if len(cj.Status.Active) != 1 || cj.Status.LastScheduleTime == nil {
			return fmt.Errorf("status %+v", cj.Status)
		}
		return nil
	})
	j, _ := cs.BatchV1().Jobs("default").Get(context.Background(), want, metav1.GetOptions{})
	if j.Annotations[batchv1.CronJobScheduledTimestampAnnotation] != "2026-03-10T12:00:00Z" || j.Labels["app"] != "tick" ||
		metav1.GetControllerOf(j).Kind != "CronJob" {
		t.Fatalf("job meta %+v", j.ObjectMeta)
	}
}

func TestForbidSkipsWhileAJobRunsAndReplaceDeletesIt(t *testing.T) {
	old := func(cj *batchv1.CronJob) *batchv1.Job {
		j := newJob(cj, "prev", t0.Add(-time.Minute))
		j.UID = types.UID("uid-prev-" + cj.Name)
		return j
	}
	forbid := newCronJob("forbid", func(cj *batchv1.CronJob) {
		cj.Spec.ConcurrencyPolicy = batchv1.ForbidConcurrent
		last := metav1.NewTime(t0.Add(-90 * time.Second))
		cj.Status.LastScheduleTime = &last
	})
	replace := newCronJob("replace", func(cj *batchv1.CronJob) {
		cj.Spec.ConcurrencyPolicy = batchv1.ReplaceConcurrent
		last := metav1.NewTime(t0.Add(-90 * time.Second))
		cj.Status.LastScheduleTime = &last
	})
	pf, pr := old(forbid), old(replace)
	pr.Name = "prev-r"
	cs := start(t, t0, forbid, replace, pf, pr)
	ctrltest.Eventually(t, 45*time.Second, func() error {
		n := jobNames(t, cs)
		for _, name := range n {
			if name == "prev-r" {
				return fmt.Errorf("replaced job still there: %v", n)
			}
		}
		if len(n) != 2 { // prev (forbid) + replace's new one
			return fmt.Errorf("jobs %v", n)
		}
		return nil
	})
	if n := jobNames(t, cs); n[0] != "prev" || n[1] != JobName(replace, time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)) {
		t.Fatalf("jobs %v", n)
	}
}

func TestHistoryLimitsDeleteTheOldestFinishedJobs(t *testing.T) {
	cj := newCronJob("hist", func(cj *batchv1.CronJob) {
		cj.Spec.Suspend = ptr(true)
		cj.Spec.SuccessfulJobsHistoryLimit = ptr(int32(1))
	})
	var objs []runtime.Object
	objs = append(objs, cj)
	for i := 0; i < 3; i++ {
		j := newJob(cj, fmt.Sprintf("done-%d", i), t0)
		j.UID = types.UID(fmt.Sprintf("done-%d", i))
		st := metav1.NewTime(t0.Add(time.Duration(i) * time.Minute))
		j.Status.StartTime, j.Status.CompletionTime = &st, &st
		j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
		objs = append(objs, j)
	}
	cs := start(t, t0, objs...)
	ctrltest.Eventually(t, 45*time.Second, func() error {
		if n := jobNames(t, cs); len(n) != 1 || n[0] != "done-2" {
			return fmt.Errorf("jobs %v, want only the newest", n)
		}
		got, _ := cs.BatchV1().CronJobs("default").Get(context.Background(), "hist", metav1.GetOptions{})
		if got.Status.LastSuccessfulTime == nil || !got.Status.LastSuccessfulTime.Time.Equal(t0.Add(2*time.Minute)) {
			return fmt.Errorf("lastSuccessfulTime %v", got.Status.LastSuccessfulTime)
		}
		return nil
	})
}

func ptr[T any](v T) *T { return &v }
