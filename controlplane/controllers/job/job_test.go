package job

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
)

func newJob(name string, mod func(*batchv1.Job)) *batchv1.Job {
	uid := types.UID("uid-job-" + name)
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid},
		Spec: batchv1.JobSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.ControllerUidLabel: string(uid)}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{batchv1.ControllerUidLabel: string(uid)}},
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			},
		},
	}
	if mod != nil {
		mod(j)
	}
	return j
}

func i32(v int32) *int32 { return &v }

type env struct {
	t  *testing.T
	cs *ctrltest.Client
	c  *Controller
}

func start(t *testing.T, objs ...runtime.Object) *env {
	t.Helper()
	cs := ctrltest.NewClient(objs...)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t), Options{PodFailureBackoff: time.Millisecond, MaxPodFailureBackoff: time.Millisecond})
	ctx := ctrltest.Start(t, cs, f)
	go c.Run(ctx, 2)
	return &env{t: t, cs: cs, c: c}
}

func (e *env) pods() []corev1.Pod {
	l, err := e.cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	slices.SortFunc(l.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return l.Items
}

func (e *env) job(name string) *batchv1.Job {
	j, err := e.cs.BatchV1().Jobs("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return j
}

// finish ends a running pod (one that is still Pending/Running) with an
// exit code, as a kubelet would.
func (e *env) finish(p corev1.Pod, code int32) {
	e.t.Helper()
	pods := e.cs.CoreV1().Pods("default")
	ctrltest.Update(e.t, func() (*corev1.Pod, error) { return pods.Get(context.Background(), p.Name, metav1.GetOptions{}) },
		func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodSucceeded
			if code != 0 {
				p.Status.Phase = corev1.PodFailed
			}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{ExitCode: code, FinishedAt: metav1.Now()}}}}
		},
		func(p *corev1.Pod) (*corev1.Pod, error) {
			return pods.UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		})
}

// suspend sets the Job's spec.suspend.
func (e *env) suspend(name string, suspend bool) {
	e.t.Helper()
	jobs := e.cs.BatchV1().Jobs("default")
	ctrltest.Update(e.t, func() (*batchv1.Job, error) { return jobs.Get(context.Background(), name, metav1.GetOptions{}) },
		func(j *batchv1.Job) { j.Spec.Suspend = ptr(suspend) },
		func(j *batchv1.Job) (*batchv1.Job, error) {
			return jobs.Update(context.Background(), j, metav1.UpdateOptions{})
		})
}

func running(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Status.Phase == "" || p.Status.Phase == corev1.PodPending || p.Status.Phase == corev1.PodRunning {
			out = append(out, p)
		}
	}
	return out
}

// waitRunning waits for n running pods and returns them.
func (e *env) waitRunning(n int) []corev1.Pod {
	e.t.Helper()
	var out []corev1.Pod
	ctrltest.Eventually(e.t, 45*time.Second, func() error {
		out = running(e.pods())
		if len(out) != n {
			return fmt.Errorf("%d running pods, want %d", len(out), n)
		}
		return nil
	})
	return out
}

func (e *env) waitCondition(name string, t batchv1.JobConditionType, reason string) *batchv1.Job {
	e.t.Helper()
	var j *batchv1.Job
	ctrltest.Eventually(e.t, 45*time.Second, func() error {
		j = e.job(name)
		for _, c := range j.Status.Conditions {
			if c.Type == t && c.Status == corev1.ConditionTrue {
				if c.Reason != reason {
					return fmt.Errorf("condition %s has reason %q, want %q", t, c.Reason, reason)
				}
				return nil
			}
		}
		return fmt.Errorf("no %s condition yet: %+v", t, j.Status)
	})
	return j
}

func TestNonIndexedJobRunsParallelPodsToCompletionsWithFinalizers(t *testing.T) {
	e := start(t, newJob("pi", func(j *batchv1.Job) { j.Spec.Completions, j.Spec.Parallelism = i32(3), i32(2) }))
	pods := e.waitRunning(2)
	for _, p := range pods {
		if !slices.Contains(p.Finalizers, batchv1.JobTrackingFinalizer) {
			t.Fatalf("pod %s has no tracking finalizer: %v", p.Name, p.Finalizers)
		}
		if !strings.HasPrefix(p.Name, "pi-") || metav1.GetControllerOf(&p).Kind != "Job" {
			t.Fatalf("pod %s: want generateName pi- and a Job controllerRef", p.Name)
		}
		if p.Labels[batchv1.JobNameLabel] != "pi" {
			t.Fatalf("pod %s lacks the job-name label: %v", p.Name, p.Labels)
		}
	}
	e.finish(pods[0], 0)
	// The counted pod loses its finalizer; a third pod replaces it.
	ctrltest.Eventually(t, 45*time.Second, func() error {
		if j := e.job("pi"); j.Status.Succeeded != 1 {
			return fmt.Errorf("succeeded %d", j.Status.Succeeded)
		}
		for _, p := range e.pods() {
			if p.Name == pods[0].Name && slices.Contains(p.Finalizers, batchv1.JobTrackingFinalizer) {
				return fmt.Errorf("finalizer still on %s", p.Name)
			}
		}
		return nil
	})
	more := e.waitRunning(2)
	for _, p := range more {
		e.finish(p, 0)
	}
	j := e.waitCondition("pi", batchv1.JobComplete, batchv1.JobReasonCompletionsReached)
	if !conditionTrue(&j.Status, batchv1.JobSuccessCriteriaMet) || j.Status.CompletionTime == nil || j.Status.Succeeded != 3 || j.Status.Active != 0 {
		t.Fatalf("status %+v", j.Status)
	}
	if u := j.Status.UncountedTerminatedPods; u != nil && len(u.Succeeded)+len(u.Failed) > 0 {
		t.Fatalf("uncounted left: %+v", u)
	}
	if n := len(e.pods()); n != 3 {
		t.Fatalf("%d pods, want exactly 3 (no extra creations)", n)
	}
}

func TestFailingPodsExceedBackoffLimit(t *testing.T) {
	e := start(t, newJob("fail", func(j *batchv1.Job) { j.Spec.BackoffLimit = i32(1) }))
	e.finish(e.waitRunning(1)[0], 1)
	e.finish(e.waitRunning(1)[0], 1)
	j := e.waitCondition("fail", batchv1.JobFailed, batchv1.JobReasonBackoffLimitExceeded)
	if j.Status.Failed != 2 || !conditionTrue(&j.Status, batchv1.JobFailureTarget) {
		t.Fatalf("status %+v", j.Status)
	}
	if n := len(e.pods()); n != 2 {
		t.Fatalf("%d pods after the limit, want 2", n)
	}
}

func TestPodFailurePolicyFailJobAndIgnore(t *testing.T) {
	e := start(t, newJob("pfp", func(j *batchv1.Job) {
		j.Spec.BackoffLimit = i32(0)
		j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
			{Action: batchv1.PodFailurePolicyActionIgnore, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
				Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{3}}},
			{Action: batchv1.PodFailurePolicyActionFailJob, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
				Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}}},
		}}
	}))
	first := e.waitRunning(1)[0]
	e.finish(first, 3) // ignored: not counted, replaced despite backoffLimit 0
	var second corev1.Pod
	ctrltest.Eventually(t, 45*time.Second, func() error {
		r := running(e.pods())
		if len(r) != 1 || r[0].Name == first.Name {
			return fmt.Errorf("no replacement yet")
		}
		second = r[0]
		return nil
	})
	e.finish(second, 42)
	j := e.waitCondition("pfp", batchv1.JobFailed, batchv1.JobReasonPodFailurePolicy)
	want := fmt.Sprintf("Container c for pod default/%s failed with exit code 42 matching FailJob rule at index 1", second.Name)
	if c := condition(&j.Status, batchv1.JobFailed); c.Message != want {
		t.Fatalf("message %q, want %q", c.Message, want)
	}
	if j.Status.Failed != 1 {
		t.Fatalf("failed %d, want 1 (the ignored failure is not counted)", j.Status.Failed)
	}
}

func TestIndexedJobGivesEachIndexItsPodAndReportsCompletedIndexes(t *testing.T) {
	e := start(t, newJob("idx", func(j *batchv1.Job) {
		m := batchv1.IndexedCompletion
		j.Spec.CompletionMode, j.Spec.Completions, j.Spec.Parallelism = &m, i32(3), i32(3)
	}))
	pods := e.waitRunning(3)
	seen := map[string]bool{}
	for _, p := range pods {
		ix := p.Annotations[batchv1.JobCompletionIndexAnnotation]
		seen[ix] = true
		if !strings.HasPrefix(p.Name, "idx-"+ix+"-") || p.Spec.Hostname != "idx-"+ix || p.Labels[batchv1.JobCompletionIndexAnnotation] != ix {
			t.Fatalf("pod %s (index %s): name, hostname %q or label wrong", p.Name, ix, p.Spec.Hostname)
		}
		env := p.Spec.Containers[0].Env
		if len(env) != 1 || env[0].Name != "JOB_COMPLETION_INDEX" || env[0].ValueFrom == nil {
			t.Fatalf("pod %s env %+v", p.Name, env)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("indexes %v", seen)
	}
	for _, p := range pods {
		if ix := p.Annotations[batchv1.JobCompletionIndexAnnotation]; ix == "0" || ix == "2" {
			e.finish(p, 0)
		}
	}
	ctrltest.Eventually(t, 45*time.Second, func() error {
		if j := e.job("idx"); j.Status.CompletedIndexes != "0,2" || j.Status.Succeeded != 2 {
			return fmt.Errorf("completedIndexes %q succeeded %d", j.Status.CompletedIndexes, j.Status.Succeeded)
		}
		return nil
	})
	for _, p := range running(e.pods()) {
		e.finish(p, 0)
	}
	j := e.waitCondition("idx", batchv1.JobComplete, batchv1.JobReasonCompletionsReached)
	if j.Status.CompletedIndexes != "0-2" {
		t.Fatalf("completedIndexes %q", j.Status.CompletedIndexes)
	}
}

func TestBackoffLimitPerIndexFailsOnlyThatIndex(t *testing.T) {
	e := start(t, newJob("per", func(j *batchv1.Job) {
		m := batchv1.IndexedCompletion
		j.Spec.CompletionMode, j.Spec.Completions, j.Spec.Parallelism = &m, i32(2), i32(2)
		j.Spec.BackoffLimitPerIndex = i32(1)
	}))
	byIdx := func() map[string]corev1.Pod {
		m := map[string]corev1.Pod{}
		for _, p := range running(e.pods()) {
			m[p.Annotations[batchv1.JobCompletionIndexAnnotation]] = p
		}
		return m
	}
	e.waitRunning(2)
	e.finish(byIdx()["1"], 1)
	var retry corev1.Pod
	ctrltest.Eventually(t, 45*time.Second, func() error {
		p, ok := byIdx()["1"]
		if !ok || p.Annotations[batchv1.JobIndexFailureCountAnnotation] != "1" {
			return fmt.Errorf("index 1 not retried with failure count 1: %+v", p.Annotations)
		}
		retry = p
		return nil
	})
	e.finish(retry, 1)
	ctrltest.Eventually(t, 45*time.Second, func() error {
		if j := e.job("per"); j.Status.FailedIndexes == nil || *j.Status.FailedIndexes != "1" {
			return fmt.Errorf("failedIndexes %v", j.Status.FailedIndexes)
		}
		return nil
	})
	e.finish(byIdx()["0"], 0)
	j := e.waitCondition("per", batchv1.JobFailed, batchv1.JobReasonFailedIndexes)
	if j.Status.CompletedIndexes != "0" || j.Status.Failed != 2 {
		t.Fatalf("status %+v", j.Status)
	}
}

func TestSuccessPolicyCompletesTheJobAndDeletesTheRest(t *testing.T) {
	e := start(t, newJob("leader", func(j *batchv1.Job) {
		m := batchv1.IndexedCompletion
		j.Spec.CompletionMode, j.Spec.Completions, j.Spec.Parallelism = &m, i32(3), i32(3)
		j.Spec.SuccessPolicy = &batchv1.SuccessPolicy{Rules: []batchv1.SuccessPolicyRule{{SucceededIndexes: ptr("0")}}}
	}))
	for _, p := range e.waitRunning(3) {
		if p.Annotations[batchv1.JobCompletionIndexAnnotation] == "0" {
			e.finish(p, 0)
		}
	}
	j := e.waitCondition("leader", batchv1.JobComplete, batchv1.JobReasonSuccessPolicy)
	if c := condition(&j.Status, batchv1.JobSuccessCriteriaMet); c == nil || c.Message != "Matched rules at index 0" {
		t.Fatalf("SuccessCriteriaMet %+v", c)
	}
	if r := running(e.pods()); len(r) != 0 {
		t.Fatalf("%d pods left running", len(r))
	}
}

func TestActiveDeadlineFailsTheJob(t *testing.T) {
	e := start(t, newJob("slow", func(j *batchv1.Job) { j.Spec.ActiveDeadlineSeconds = ptr(int64(1)) }))
	e.waitRunning(1)
	j := e.waitCondition("slow", batchv1.JobFailed, batchv1.JobReasonDeadlineExceeded)
	if c := condition(&j.Status, batchv1.JobFailed); c.Message != "Job was active longer than specified deadline" {
		t.Fatalf("message %q", c.Message)
	}
}

func TestSuspendDeletesPodsAndResumeRestartsThem(t *testing.T) {
	e := start(t, newJob("sus", func(j *batchv1.Job) { j.Spec.Suspend = ptr(true); j.Spec.Parallelism = i32(2) }))
	j := e.waitCondition("sus", batchv1.JobSuspended, "JobSuspended")
	if n := len(e.pods()); n != 0 || j.Status.StartTime != nil {
		t.Fatalf("suspended job: %d pods, startTime %v", n, j.Status.StartTime)
	}
	e.suspend("sus", false)
	e.waitRunning(2)
	ctrltest.Eventually(t, 45*time.Second, func() error {
		j = e.job("sus")
		if c := condition(&j.Status, batchv1.JobSuspended); c == nil || c.Status != corev1.ConditionFalse || c.Reason != "JobResumed" || j.Status.StartTime == nil {
			return fmt.Errorf("status %+v", j.Status)
		}
		return nil
	})
	e.suspend("sus", true)
	e.waitRunning(0)
	e.waitCondition("sus", batchv1.JobSuspended, "JobSuspended")
}

func TestManagedByAnotherControllerIsLeftAlone(t *testing.T) {
	e := start(t, newJob("other", func(j *batchv1.Job) { j.Spec.ManagedBy = ptr("example.com/kueue") }), newJob("mine", nil))
	e.waitRunning(1) // "mine" got its pod: the controller has synced both
	for _, p := range e.pods() {
		if metav1.GetControllerOf(&p).Name == "other" {
			t.Fatalf("pod %s created for a Job managed by another controller", p.Name)
		}
	}
	if j := e.job("other"); len(j.Status.Conditions) != 0 || j.Status.StartTime != nil {
		t.Fatalf("status written: %+v", j.Status)
	}
}

func TestIndexSetFormatsAsUpstream(t *testing.T) {
	for in, want := range map[string]string{"": "", "0": "0", "0,1": "0-1", "3,1,2,7,5,6": "1-3,5-7", "0-2,4,9": "0-2,4"} {
		if got := parseIndexes(in, 8).String(); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}
