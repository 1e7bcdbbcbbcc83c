// Package cronjob is the CronJob controller: it creates a Job from a
// CronJob's jobTemplate at each time of its cron schedule, as Kubernetes'
// (the "v2" controller) does — standard five-field schedules and the
// @hourly-style descriptors (github.com/robfig/cron/v3, as upstream),
// spec.timeZone (IANA names), concurrencyPolicy Allow/Forbid/Replace,
// startingDeadlineSeconds and missed runs (only the most recent missed time
// runs; more than 100 missed times are reported), suspend, Jobs named
// <cronjob>-<scheduled time in minutes since the epoch> with the
// batch.kubernetes.io/cronjob-scheduled-timestamp annotation, status.active,
// lastScheduleTime and lastSuccessfulTime, and successful/failed history
// limits.
//
// It requeues each CronJob for its next scheduled time; it does not run
// Jobs (the job controller does).
package cronjob

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
	"github.com/waggle-io/waggle/controlplane/controllers/job"
)

// Name is the controller's name (queue and metrics label, --controllers).
const Name = "cronjob"

// tooManyMissed is where upstream starts warning about missed start times.
const tooManyMissed = 100

// Controller creates Jobs for CronJobs.
type Controller struct {
	client   kubernetes.Interface
	log      *slog.Logger
	queue    workqueue.TypedRateLimitingInterface[string]
	cronJobs batchlisters.CronJobLister
	jobs     batchlisters.JobLister
	synced   []cache.InformerSynced
	now      func() time.Time
	rec      record.EventRecorder
	stopRec  func()
}

// Options tune the controller (none yet; kept for symmetry with the other
// controllers and for tests).
type Options struct {
	// Now replaces the clock (tests).
	Now func() time.Time
}

// New wires the controller to the factory's CronJob and Job informers.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	cjInf := factory.Batch().V1().CronJobs()
	jobInf := factory.Batch().V1().Jobs()
	c := &Controller{
		client: client, log: log.With("controller", Name),
		queue:    ctrlutil.NewQueue(Name),
		cronJobs: cjInf.Lister(), jobs: jobInf.Lister(),
		synced: []cache.InformerSynced{cjInf.Informer().HasSynced, jobInf.Informer().HasSynced},
		now:    time.Now,
	}
	if opts.Now != nil {
		c.now = opts.Now
	}
	c.rec, c.stopRec = ctrlutil.NewRecorder(client, "cronjob-controller")
	cjInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, cur any) { c.enqueue(cur) },
	})
	byOwner := func(obj any) {
		j, ok := ctrlutil.Unwrap(obj).(*batchv1.Job)
		if !ok {
			return
		}
		if ref := metav1.GetControllerOf(j); ref != nil && ref.Kind == "CronJob" {
			c.queue.Add(j.Namespace + "/" + ref.Name)
		}
	}
	jobInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    byOwner,
		UpdateFunc: func(_, cur any) { byOwner(cur) },
		DeleteFunc: byOwner,
	})
	return c
}

func (c *Controller) enqueue(obj any) {
	if k := ctrlutil.KeyFunc(obj); k != "" {
		c.queue.Add(k)
	}
}

// Run runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.stopRec()
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced...)
}

// Schedule parses a CronJob's schedule in its time zone.
func Schedule(cj *batchv1.CronJob) (cron.Schedule, *time.Location, error) {
	loc := time.Local
	if tz := cj.Spec.TimeZone; tz != nil {
		l, err := time.LoadLocation(*tz)
		if err != nil {
			return nil, nil, fmt.Errorf("unknown time zone %q: %w", *tz, err)
		}
		loc = l
	}
	s, err := cron.ParseStandard(cj.Spec.Schedule)
	if err != nil {
		return nil, nil, fmt.Errorf("unparseable schedule %q: %w", cj.Spec.Schedule, err)
	}
	return s, loc, nil
}

// MostRecent returns the latest scheduled time in (earliest, now] and how
// many there were (0: none is due), and the next one after now.
func MostRecent(s cron.Schedule, earliest, now time.Time) (last time.Time, missed int, next time.Time) {
	t := s.Next(earliest)
	for !t.IsZero() && !t.After(now) && missed < 1_000_000 {
		last = t
		missed++
		t = s.Next(t)
	}
	if missed == 1_000_000 { // an absurd backlog: skip to now
		last, t = now, s.Next(now)
	}
	return last, missed, t
}

// JobName is the name upstream gives the Job of a scheduled time.
func JobName(cj *batchv1.CronJob, scheduled time.Time) string {
	return fmt.Sprintf("%s-%d", cj.Name, scheduled.Unix()/60)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	cached, err := c.cronJobs.CronJobs(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	cj := cached.DeepCopy()
	all, err := c.jobs.Jobs(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	var owned []*batchv1.Job
	for _, j := range all {
		if ref := metav1.GetControllerOf(j); ref != nil && ref.UID == cj.UID {
			owned = append(owned, j)
		}
	}
	requeue, syncErr := c.syncCronJob(ctx, cj, owned)
	var cleanErr error
	if cj.DeletionTimestamp == nil {
		cleanErr = c.cleanupHistory(ctx, cj, owned)
	}
	if !apiequality.Semantic.DeepEqual(cached.Status, cj.Status) {
		if _, err := c.client.BatchV1().CronJobs(ns).UpdateStatus(ctx, cj, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return errors.Join(syncErr, cleanErr, fmt.Errorf("update status of cronjob %s: %w", key, err))
		}
	}
	if requeue > 0 {
		c.queue.AddAfter(key, requeue)
	}
	return errors.Join(syncErr, cleanErr)
}

// syncCronJob updates cj.Status in place and maybe creates a Job; it
// returns when to look again.
func (c *Controller) syncCronJob(ctx context.Context, cj *batchv1.CronJob, owned []*batchv1.Job) (time.Duration, error) {
	now := c.now()
	// status.active: drop finished or vanished Jobs, add running owned ones.
	byUID := map[string]*batchv1.Job{}
	for _, j := range owned {
		byUID[string(j.UID)] = j
	}
	var active []corev1.ObjectReference
	inActive := map[string]bool{}
	for _, ref := range cj.Status.Active {
		j := byUID[string(ref.UID)]
		if j == nil {
			// Gone. Upstream checks the API server before believing the
			// cache; a Job just created may not be in it yet.
			fresh, err := c.client.BatchV1().Jobs(cj.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err == nil && fresh.UID == ref.UID && !job.IsFinished(fresh) {
				active = append(active, ref)
				inActive[string(ref.UID)] = true
				continue
			}
			if err != nil && !apierrors.IsNotFound(err) {
				return 0, err
			}
			c.rec.Eventf(cj, corev1.EventTypeNormal, "MissingJob", "Active job went missing: %v", ref.Name)
			continue
		}
		if t, done := job.FinishedCondition(j); done {
			c.rec.Eventf(cj, corev1.EventTypeNormal, "SawCompletedJob", "Saw completed job: %s, condition: %v", j.Name, t)
			if t == batchv1.JobComplete && j.Status.CompletionTime != nil &&
				(cj.Status.LastSuccessfulTime == nil || cj.Status.LastSuccessfulTime.Before(j.Status.CompletionTime)) {
				cj.Status.LastSuccessfulTime = j.Status.CompletionTime.DeepCopy()
			}
			continue
		}
		active = append(active, ref)
		inActive[string(ref.UID)] = true
	}
	for _, j := range owned {
		if !inActive[string(j.UID)] && !job.IsFinished(j) && j.DeletionTimestamp == nil {
			active = append(active, jobRef(j))
			inActive[string(j.UID)] = true
		}
		if t, done := job.FinishedCondition(j); done && t == batchv1.JobComplete && j.Status.CompletionTime != nil &&
			(cj.Status.LastSuccessfulTime == nil || cj.Status.LastSuccessfulTime.Before(j.Status.CompletionTime)) {
			cj.Status.LastSuccessfulTime = j.Status.CompletionTime.DeepCopy()
		}
	}
	cj.Status.Active = active

	if cj.DeletionTimestamp != nil {
		return 0, nil
	}
	sched, loc, err := Schedule(cj)
	if err != nil {
		reason := "UnparseableSchedule"
		if cj.Spec.TimeZone != nil {
			if _, lerr := time.LoadLocation(*cj.Spec.TimeZone); lerr != nil {
				reason = "UnknownTimeZone"
			}
		}
		c.rec.Eventf(cj, corev1.EventTypeWarning, reason, "%v", err)
		return 0, nil // a spec change requeues it
	}
	if cj.Spec.Suspend != nil && *cj.Spec.Suspend {
		return 0, nil
	}
	earliest := cj.CreationTimestamp.Time
	if cj.Status.LastScheduleTime != nil {
		earliest = cj.Status.LastScheduleTime.Time
	}
	if sds := cj.Spec.StartingDeadlineSeconds; sds != nil {
		if w := now.Add(-time.Duration(*sds) * time.Second); w.After(earliest) {
			earliest = w
		}
	}
	scheduled, missed, next := MostRecent(sched, earliest.In(loc), now.In(loc))
	wait := next.Sub(now) + 100*time.Millisecond
	if missed == 0 {
		return wait, nil
	}
	if missed > tooManyMissed {
		c.rec.Eventf(cj, corev1.EventTypeWarning, "TooManyMissedTimes",
			"too many missed start times: %d. Set or decrease .spec.startingDeadlineSeconds or check clock skew", missed)
	}
	if sds := cj.Spec.StartingDeadlineSeconds; sds != nil && scheduled.Add(time.Duration(*sds)*time.Second).Before(now) {
		c.rec.Eventf(cj, corev1.EventTypeWarning, "MissSchedule", "Missed scheduled time to start a job: %s", scheduled.UTC().Format(time.RFC1123Z))
		return wait, nil
	}
	jobName := JobName(cj, scheduled)
	for _, j := range owned {
		if j.Name == jobName { // this time already ran
			if cj.Status.LastScheduleTime == nil || cj.Status.LastScheduleTime.Time.Before(scheduled) {
				t := metav1.NewTime(scheduled)
				cj.Status.LastScheduleTime = &t
			}
			return wait, nil
		}
	}
	switch cj.Spec.ConcurrencyPolicy {
	case batchv1.ForbidConcurrent:
		if len(cj.Status.Active) > 0 {
			c.rec.Eventf(cj, corev1.EventTypeNormal, "JobAlreadyActive", "Not starting job because prior execution is running and concurrency policy is Forbid")
			return wait, nil
		}
	case batchv1.ReplaceConcurrent:
		for _, ref := range cj.Status.Active {
			if err := c.deleteJob(ctx, cj, ref.Name, ref.UID); err != nil {
				return 0, err
			}
		}
		cj.Status.Active = nil
	}
	j := newJob(cj, jobName, scheduled)
	created, err := c.client.BatchV1().Jobs(cj.Namespace).Create(ctx, j, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		existing, gerr := c.client.BatchV1().Jobs(cj.Namespace).Get(ctx, jobName, metav1.GetOptions{})
		if gerr != nil {
			return 0, gerr
		}
		if ref := metav1.GetControllerOf(existing); ref == nil || ref.UID != cj.UID {
			c.rec.Eventf(cj, corev1.EventTypeWarning, "FailedCreate", "Error creating job: %v", err)
			return wait, nil
		}
		created = existing
	case err != nil:
		c.rec.Eventf(cj, corev1.EventTypeWarning, "FailedCreate", "Error creating job: %v", err)
		return 0, fmt.Errorf("create job for cronjob %s/%s: %w", cj.Namespace, cj.Name, err)
	default:
		c.rec.Eventf(cj, corev1.EventTypeNormal, "SuccessfulCreate", "Created job %v", created.Name)
	}
	if !job.IsFinished(created) {
		cj.Status.Active = append(cj.Status.Active, jobRef(created))
	}
	t := metav1.NewTime(scheduled)
	cj.Status.LastScheduleTime = &t
	return wait, nil
}

func jobRef(j *batchv1.Job) corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "Job", APIVersion: "batch/v1", Namespace: j.Namespace, Name: j.Name,
		UID: j.UID, ResourceVersion: j.ResourceVersion}
}

// newJob is the Job of one scheduled time: the template's labels,
// annotations and spec, the scheduled-timestamp annotation, and the
// CronJob as controller.
func newJob(cj *batchv1.CronJob, name string, scheduled time.Time) *batchv1.Job {
	t := cj.Spec.JobTemplate
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: cj.Namespace,
			Labels:          copyMap(t.Labels),
			Annotations:     copyMap(t.Annotations),
			OwnerReferences: []metav1.OwnerReference{ctrlutil.NewControllerRef(cj, "batch/v1", "CronJob")},
		},
		Spec: *t.Spec.DeepCopy(),
	}
	if j.Annotations == nil {
		j.Annotations = map[string]string{}
	}
	j.Annotations[batchv1.CronJobScheduledTimestampAnnotation] = scheduled.Format(time.RFC3339)
	return j
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (c *Controller) deleteJob(ctx context.Context, cj *batchv1.CronJob, name string, uid any) error {
	bg := metav1.DeletePropagationBackground
	err := c.client.BatchV1().Jobs(cj.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		c.rec.Eventf(cj, corev1.EventTypeWarning, "FailedDelete", "Deleted job: %v", err)
		return fmt.Errorf("delete job %s/%s: %w", cj.Namespace, name, err)
	}
	c.rec.Eventf(cj, corev1.EventTypeNormal, "SuccessfulDelete", "Deleted job %v", name)
	return nil
}

// cleanupHistory deletes the oldest finished Jobs beyond the history limits
// (3 successful, 1 failed by default).
func (c *Controller) cleanupHistory(ctx context.Context, cj *batchv1.CronJob, owned []*batchv1.Job) error {
	succLimit, failLimit := int32(3), int32(1)
	if cj.Spec.SuccessfulJobsHistoryLimit != nil {
		succLimit = *cj.Spec.SuccessfulJobsHistoryLimit
	}
	if cj.Spec.FailedJobsHistoryLimit != nil {
		failLimit = *cj.Spec.FailedJobsHistoryLimit
	}
	var succ, fail []*batchv1.Job
	for _, j := range owned {
		if j.DeletionTimestamp != nil {
			continue
		}
		switch t, _ := job.FinishedCondition(j); t {
		case batchv1.JobComplete:
			succ = append(succ, j)
		case batchv1.JobFailed:
			fail = append(fail, j)
		}
	}
	var errs []error
	for _, group := range []struct {
		jobs  []*batchv1.Job
		limit int32
	}{{succ, succLimit}, {fail, failLimit}} {
		if int32(len(group.jobs)) <= group.limit {
			continue
		}
		sort.Slice(group.jobs, func(a, b int) bool { return startTime(group.jobs[a]).Before(startTime(group.jobs[b])) })
		for _, j := range group.jobs[:len(group.jobs)-int(group.limit)] {
			if err := c.deleteJob(ctx, cj, j.Name, j.UID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func startTime(j *batchv1.Job) time.Time {
	if j.Status.StartTime != nil {
		return j.Status.StartTime.Time
	}
	return j.CreationTimestamp.Time
}
