package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// exitLabel on a pod template tells the simulated kubelet how its container
// ends: "0" succeeds, anything else fails with that exit code; absent: the
// pod keeps running.
const exitLabel = "test.waggle.io/exit"

// deleteOnFinish makes the simulated kubelet delete a pod the moment it
// ends, as a pod GC or a user racing the Job controller would.
const deleteOnFinishLabel = "test.waggle.io/delete-on-finish"

// startBatchKubelet binds pods to node-0, runs them to the end their
// exitLabel names, and finalizes deleted pods.
func (c *cluster) startBatchKubelet(ctx context.Context) {
	c.t.Helper()
	if _, err := c.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-0"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactory(c.cs, 0)
	inf := f.Core().V1().Pods().Informer()
	var mu sync.Mutex
	busy := map[string]bool{}
	handle := func(obj any) {
		p := obj.(*corev1.Pod)
		key := p.Namespace + "/" + p.Name + "/" + p.ResourceVersion
		mu.Lock()
		if busy[key] {
			mu.Unlock()
			return
		}
		busy[key] = true
		mu.Unlock()
		go c.batchKubelet(ctx, p)
	}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: handle, UpdateFunc: func(_, cur any) { handle(cur) }})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	c.t.Cleanup(func() { cancel(); f.Shutdown() })
}

func (c *cluster) batchKubelet(ctx context.Context, p *corev1.Pod) {
	api := c.cs.CoreV1().Pods(p.Namespace)
	switch {
	case p.DeletionTimestamp != nil:
		zero := int64(0)
		_ = api.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
	case p.Spec.NodeName == "":
		_ = api.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.UID},
			Target: corev1.ObjectReference{Kind: "Node", Name: "node-0"}}, metav1.CreateOptions{})
	case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
		if p.Labels[deleteOnFinishLabel] == "true" {
			_ = api.Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
		}
	default:
		q := p.DeepCopy()
		code, ok := p.Labels[exitLabel]
		now := metav1.Now()
		if !ok {
			if q.Status.Phase == corev1.PodRunning {
				return
			}
			q.Status.Phase = corev1.PodRunning
			q.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
		} else {
			var n int32
			fmt.Sscan(code, &n)
			q.Status.Phase = corev1.PodSucceeded
			if n != 0 {
				q.Status.Phase = corev1.PodFailed
			}
			q.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: now}}
			q.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: p.Spec.Containers[0].Name, State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{ExitCode: n, StartedAt: now, FinishedAt: now}}}}
		}
		_, _ = api.UpdateStatus(ctx, q, metav1.UpdateOptions{})
	}
}

func requiresBatch(t *testing.T, c *cluster) {
	t.Helper()
	if _, err := c.cs.Discovery().ServerResourcesForGroupVersion("batch/v1"); err != nil {
		t.Skipf("the API server does not serve batch/v1 yet: %v", err)
	}
}

func batchJob(name string, labels map[string]string, mod func(*batchv1.Job)) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}
	if mod != nil {
		mod(j)
	}
	return j
}

func (c *cluster) waitJobCondition(ctx context.Context, name string, typ batchv1.JobConditionType) *batchv1.Job {
	c.t.Helper()
	var j *batchv1.Job
	eventually(c.t, 60*time.Second, func() error {
		var err error
		if j, err = c.cs.BatchV1().Jobs("default").Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		for _, cnd := range j.Status.Conditions {
			if cnd.Type == typ && cnd.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("job %s: no %s condition: %+v", name, typ, j.Status)
	})
	return j
}

func i32p(v int32) *int32 { return &v }

func TestJobsRunToCompletionCountExactlyAndFail(t *testing.T) {
	c := newCluster(t)
	requiresBatch(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startBatchKubelet(ctx)
	c.startManager("cm-0", func(cfg *Config) { cfg.JobPodFailureBackoff = 50 * time.Millisecond })

	// Pods that succeed and are deleted the moment they end: the finalizer
	// keeps each until it is counted, so exactly five succeed.
	ok := batchJob("ok", map[string]string{exitLabel: "0", deleteOnFinishLabel: "true"}, func(j *batchv1.Job) {
		j.Spec.Completions, j.Spec.Parallelism = i32p(5), i32p(2)
	})
	if _, err := c.cs.BatchV1().Jobs("default").Create(ctx, ok, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods that fail: backoffLimit 1 allows one retry.
	bad := batchJob("bad", map[string]string{exitLabel: "2"}, func(j *batchv1.Job) { j.Spec.BackoffLimit = i32p(1) })
	if _, err := c.cs.BatchV1().Jobs("default").Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.kubectlOK("wait", "--for=condition=complete", "--timeout=60s", "job/ok")
	j := c.waitJobCondition(ctx, "ok", batchv1.JobComplete)
	if j.Status.Succeeded != 5 || j.Status.Failed != 0 || j.Status.CompletionTime == nil {
		t.Fatalf("job ok: %+v", j.Status)
	}
	j = c.waitJobCondition(ctx, "bad", batchv1.JobFailed)
	if j.Status.Failed != 2 || j.Status.Succeeded != 0 {
		t.Fatalf("job bad: %+v", j.Status)
	}
	for _, cnd := range j.Status.Conditions {
		if cnd.Type == batchv1.JobFailed && (cnd.Reason != batchv1.JobReasonBackoffLimitExceeded || cnd.Message != "Job has reached the specified backoff limit") {
			t.Fatalf("Failed condition %+v", cnd)
		}
	}
	pods, err := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if slices.Contains(p.Finalizers, batchv1.JobTrackingFinalizer) {
			t.Errorf("pod %s keeps the tracking finalizer", p.Name)
		}
	}
	if out := c.kubectlOK("get", "events", "--field-selector", "involvedObject.name=bad"); !strings.Contains(out, "BackoffLimitExceeded") {
		t.Errorf("no BackoffLimitExceeded event:\n%s", out)
	}
}

func TestIndexedJobWithDeadlineAndTTL(t *testing.T) {
	c := newCluster(t)
	requiresBatch(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startBatchKubelet(ctx)
	c.startManager("cm-0", nil)

	idx := batchJob("idx", map[string]string{exitLabel: "0"}, func(j *batchv1.Job) {
		m := batchv1.IndexedCompletion
		j.Spec.CompletionMode, j.Spec.Completions, j.Spec.Parallelism = &m, i32p(3), i32p(3)
		j.Spec.TTLSecondsAfterFinished = i32p(0)
	})
	created, err := c.cs.BatchV1().Jobs("default").Create(ctx, idx, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Runs to completion with indexes 0-2, then its TTL of 0 deletes it and
	// (foreground) its pods.
	eventually(t, 60*time.Second, func() error {
		_, err := c.cs.BatchV1().Jobs("default").Get(ctx, "idx", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("job idx still there (err %v)", err)
		}
		pods, err := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == created.UID {
				return fmt.Errorf("pod %s of the deleted job remains", p.Name)
			}
		}
		return nil
	})

	// A Job whose pods never end fails after activeDeadlineSeconds; its pod
	// is deleted and counted.
	slow := batchJob("slow", nil, func(j *batchv1.Job) { j.Spec.ActiveDeadlineSeconds = func() *int64 { v := int64(2); return &v }() })
	if _, err := c.cs.BatchV1().Jobs("default").Create(ctx, slow, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	j := c.waitJobCondition(ctx, "slow", batchv1.JobFailed)
	for _, cnd := range j.Status.Conditions {
		if cnd.Type == batchv1.JobFailed && cnd.Reason != batchv1.JobReasonDeadlineExceeded {
			t.Fatalf("Failed condition %+v", cnd)
		}
	}
	if j.Status.Active != 0 || j.Status.Failed != 1 {
		t.Fatalf("job slow: %+v", j.Status)
	}
}

func TestCronJobStartsAJobAtTheNextMinute(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a minute boundary")
	}
	c := newCluster(t)
	requiresBatch(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startBatchKubelet(ctx)
	c.startManager("cm-0", nil)
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "tick", Namespace: "default"},
		Spec: batchv1.CronJobSpec{Schedule: "* * * * *", TimeZone: func() *string { s := "Etc/UTC"; return &s }(),
			ConcurrencyPolicy: batchv1.ForbidConcurrent,
			JobTemplate:       batchv1.JobTemplateSpec{Spec: batchJob("", map[string]string{exitLabel: "0"}, nil).Spec}}}
	if _, err := c.cs.BatchV1().CronJobs("default").Create(ctx, cj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, func() error {
		got, err := c.cs.BatchV1().CronJobs("default").Get(ctx, "tick", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.LastScheduleTime == nil || got.Status.LastSuccessfulTime == nil {
			return fmt.Errorf("status %+v", got.Status)
		}
		jobs, err := c.cs.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		want := fmt.Sprintf("tick-%d", got.Status.LastScheduleTime.Unix()/60)
		for _, j := range jobs.Items {
			if j.Name == want && j.Annotations[batchv1.CronJobScheduledTimestampAnnotation] != "" {
				return nil
			}
		}
		return fmt.Errorf("no job %s", want)
	})
}
