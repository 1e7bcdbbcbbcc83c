// Package job is the Job controller: it runs a Job's pods to completion as
// Kubernetes' does — NonIndexed and Indexed completion modes, parallelism,
// backoffLimit with exponential back-off between replacements,
// backoffLimitPerIndex and maxFailedIndexes, podFailurePolicy (FailJob,
// FailIndex, Ignore, Count), podReplacementPolicy, activeDeadlineSeconds,
// suspend and resume, successPolicy, and managedBy (Jobs managed by another
// controller are left alone).
//
// Pods are tracked exactly with the batch.kubernetes.io/job-tracking
// finalizer: a finished pod is first recorded in
// status.uncountedTerminatedPods, then its finalizer is removed, then it is
// moved to status.succeeded/failed, so a pod deleted (or garbage collected)
// the moment it ends is still counted, and never counted twice. The
// terminal conditions come in two steps as in Kubernetes 1.31+: FailureTarget
// or SuccessCriteriaMet as soon as the outcome is known (the remaining pods
// are deleted), then Failed or Complete once no pod of the Job is still
// running or terminating.
//
// It does not delete finished Jobs; the ttlafterfinished controller does.
package job

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
	"github.com/waggle-io/waggle/controlplane/controllers/replicaset"
)

// Name is the controller's name (queue and metrics label, --controllers).
const Name = "job"

// Upstream's pod failure back-off: 10 s, doubled per consecutive failure,
// at most 10 minutes.
const (
	DefaultPodFailureBackoff    = 10 * time.Second
	DefaultMaxPodFailureBackoff = 10 * time.Minute
)

// Options tune the controller.
type Options struct {
	// PodFailureBackoff is the delay before the replacement of the first
	// failed pod; it doubles per further consecutive failure up to
	// MaxPodFailureBackoff.
	PodFailureBackoff    time.Duration
	MaxPodFailureBackoff time.Duration
	// BurstReplicas caps the pods created in one sync (500).
	BurstReplicas int
}

// Controller reconciles Jobs with their pods.
type Controller struct {
	client  kubernetes.Interface
	log     *slog.Logger
	opts    Options
	queue   workqueue.TypedRateLimitingInterface[string]
	jobs    batchlisters.JobLister
	pods    corelisters.PodLister
	synced  []cache.InformerSynced
	exp     *ctrlutil.Expectations
	fin     *finalizerTracker
	written *statusTracker
	now     func() time.Time
	rec     record.EventRecorder
	stopRec func()
}

// New wires the controller to the factory's Job and Pod informers.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	if opts.PodFailureBackoff <= 0 {
		opts.PodFailureBackoff = DefaultPodFailureBackoff
	}
	if opts.MaxPodFailureBackoff <= 0 {
		opts.MaxPodFailureBackoff = DefaultMaxPodFailureBackoff
	}
	if opts.BurstReplicas <= 0 {
		opts.BurstReplicas = 500
	}
	jobInf := factory.Batch().V1().Jobs()
	podInf := factory.Core().V1().Pods()
	c := &Controller{
		client: client, log: log.With("controller", Name), opts: opts,
		queue: ctrlutil.NewQueue(Name),
		jobs:  jobInf.Lister(), pods: podInf.Lister(),
		synced: []cache.InformerSynced{jobInf.Informer().HasSynced, podInf.Informer().HasSynced},
		exp:    ctrlutil.NewExpectations(), fin: newFinalizerTracker(), written: newStatusTracker(), now: time.Now,
	}
	c.rec, c.stopRec = ctrlutil.NewRecorder(client, "job-controller")
	jobInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, cur any) { c.enqueue(cur) },
		DeleteFunc: func(obj any) {
			if k := ctrlutil.KeyFunc(obj); k != "" {
				c.exp.Forget(k)
				c.fin.forget(k)
				c.written.forget(k)
				c.queue.Add(k) // its pods' finalizers must go
			}
		},
	})
	podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			p := obj.(*corev1.Pod)
			if k := c.jobKeyOf(p); k != "" {
				c.exp.CreationObserved(k)
				c.queue.Add(k)
				return
			}
			c.enqueueMatching(p)
		},
		UpdateFunc: func(old, cur any) {
			op, np := old.(*corev1.Pod), cur.(*corev1.Pod)
			if ctrlutil.SameVersion(op, np) {
				return
			}
			k := c.jobKeyOf(np)
			if k != "" && !hasFinalizer(np) {
				c.fin.observed(k, np.UID)
			}
			if k != "" && np.DeletionTimestamp != nil && op.DeletionTimestamp == nil {
				c.exp.DeletionObserved(k, np.Namespace+"/"+np.Name)
			}
			if ok := c.jobKeyOf(op); ok != "" && ok != k {
				c.queue.Add(ok)
			}
			if k != "" {
				c.queue.Add(k)
			} else {
				c.enqueueMatching(np)
			}
		},
		DeleteFunc: func(obj any) {
			p, ok := ctrlutil.Unwrap(obj).(*corev1.Pod)
			if !ok {
				return
			}
			if k := c.jobKeyOf(p); k != "" {
				c.exp.DeletionObserved(k, p.Namespace+"/"+p.Name)
				c.fin.observed(k, p.UID)
				// The pod may have gone before it was counted: count it
				// now (it is in uncountedTerminatedPods or it never
				// finished; either way the Job must look again).
				c.queue.Add(k)
			}
		},
	})
	return c
}

// jobKeyOf returns the key of the Job named by the pod's controller
// reference (whether or not that Job still exists: a pod of a deleted Job
// still needs its finalizer removed).
func (c *Controller) jobKeyOf(p *corev1.Pod) string {
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != "Job" {
		return ""
	}
	return p.Namespace + "/" + ref.Name
}

func (c *Controller) enqueue(obj any) {
	if k := ctrlutil.KeyFunc(obj); k != "" {
		c.queue.Add(k)
	}
}

// enqueueMatching enqueues the Jobs whose selector matches an orphan pod.
func (c *Controller) enqueueMatching(p *corev1.Pod) {
	if p.DeletionTimestamp != nil {
		return
	}
	list, err := c.jobs.Jobs(p.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, j := range list {
		sel, err := selectorOf(j)
		if err == nil && !sel.Empty() && sel.Matches(labels.Set(p.Labels)) {
			c.queue.Add(p.Namespace + "/" + j.Name)
		}
	}
}

// Run runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.stopRec()
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced...)
}

// Queue exposes the work queue, for tests.
func (c *Controller) Queue() workqueue.TypedRateLimitingInterface[string] { return c.queue }

func hasFinalizer(p *corev1.Pod) bool {
	return slices.Contains(p.Finalizers, batchv1.JobTrackingFinalizer)
}

// selectorOf returns the Job's selector; a Job the API server gave no
// selector (manualSelector unset) selects by its controller-uid label.
func selectorOf(j *batchv1.Job) (labels.Selector, error) {
	if j.Spec.Selector == nil {
		return labels.SelectorFromSet(labels.Set{batchv1.ControllerUidLabel: string(j.UID)}), nil
	}
	return metav1.LabelSelectorAsSelector(j.Spec.Selector)
}

// IsFinished reports whether the Job has its Complete or Failed condition.
func IsFinished(j *batchv1.Job) bool {
	_, ok := FinishedCondition(j)
	return ok
}

// FinishedCondition returns the Job's terminal condition type.
func FinishedCondition(j *batchv1.Job) (batchv1.JobConditionType, bool) {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return c.Type, true
		}
	}
	return "", false
}

func condition(j *batchv1.JobStatus, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range j.Conditions {
		if j.Conditions[i].Type == t {
			return &j.Conditions[i]
		}
	}
	return nil
}

func conditionTrue(j *batchv1.JobStatus, t batchv1.JobConditionType) bool {
	c := condition(j, t)
	return c != nil && c.Status == corev1.ConditionTrue
}

// setCondition sets a condition, keeping lastTransitionTime when its status
// does not change; it reports whether anything changed.
func setCondition(st *batchv1.JobStatus, t batchv1.JobConditionType, status corev1.ConditionStatus, reason, msg string, now time.Time) bool {
	if c := condition(st, t); c != nil {
		if c.Status == status && c.Reason == reason && c.Message == msg {
			return false
		}
		if c.Status != status {
			c.LastTransitionTime = metav1.NewTime(now)
		}
		c.Status, c.Reason, c.Message, c.LastProbeTime = status, reason, msg, metav1.NewTime(now)
		return true
	}
	st.Conditions = append(st.Conditions, batchv1.JobCondition{Type: t, Status: status, Reason: reason, Message: msg,
		LastProbeTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)})
	return true
}

// spec is a Job's spec with the API server's defaults applied, for the
// fields the controller reads.
type spec struct {
	parallelism       int
	completions       *int
	indexed           bool
	backoffLimit      int
	perIndex          *int
	maxFailedIndexes  *int
	onlyReplaceFailed bool
}

func specOf(j *batchv1.Job) spec {
	s := spec{parallelism: 1, backoffLimit: 6}
	if j.Spec.Parallelism != nil {
		s.parallelism = int(*j.Spec.Parallelism)
	}
	if j.Spec.Completions != nil {
		n := int(*j.Spec.Completions)
		s.completions = &n
	} else if j.Spec.Parallelism == nil {
		n := 1
		s.completions = &n
	}
	s.indexed = j.Spec.CompletionMode != nil && *j.Spec.CompletionMode == batchv1.IndexedCompletion && s.completions != nil
	if j.Spec.BackoffLimit != nil {
		s.backoffLimit = int(*j.Spec.BackoffLimit)
	}
	if s.indexed && j.Spec.BackoffLimitPerIndex != nil {
		n := int(*j.Spec.BackoffLimitPerIndex)
		s.perIndex = &n
		if j.Spec.BackoffLimit == nil {
			s.backoffLimit = int(^uint32(0) >> 1)
		}
		if j.Spec.MaxFailedIndexes != nil {
			m := int(*j.Spec.MaxFailedIndexes)
			s.maxFailedIndexes = &m
		}
	}
	if j.Spec.PodReplacementPolicy != nil {
		s.onlyReplaceFailed = *j.Spec.PodReplacementPolicy == batchv1.Failed
	} else {
		s.onlyReplaceFailed = j.Spec.PodFailurePolicy != nil
	}
	return s
}

func isSuspended(j *batchv1.Job) bool { return j.Spec.Suspend != nil && *j.Spec.Suspend }

// isPodFailed is upstream's rule: a Failed pod, or — unless only failed pods
// are replaced — a pod being deleted before it succeeded (an orphan that
// never reaches Failed must still count).
func isPodFailed(p *corev1.Pod, s spec) bool {
	if p.Status.Phase == corev1.PodFailed {
		return true
	}
	if s.onlyReplaceFailed {
		return false
	}
	return p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodSucceeded
}

// outcome is a pending terminal condition (FailureTarget or
// SuccessCriteriaMet), the reason and message of which the final Failed or
// Complete condition repeats.
type outcome struct {
	success bool
	reason  string
	message string
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	cached, err := c.jobs.Jobs(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.exp.Forget(key)
		return c.releaseStrays(ctx, ns, name, "")
	}
	if err != nil {
		return err
	}
	if m := cached.Spec.ManagedBy; m != nil && *m != batchv1.JobControllerName {
		return nil // another controller's Job
	}
	if c.written.stale(key, cached) {
		// The cache has not shown this controller's last status write yet:
		// counting from it would miss pods already counted (their
		// finalizers gone) and create replacements for them. The Job's
		// update event brings it back (the timer, should that event
		// never come).
		c.queue.AddAfter(key, 2*time.Second)
		return nil
	}
	job := cached.DeepCopy()
	if err := c.releaseStrays(ctx, ns, name, job.UID); err != nil {
		return err
	}
	sel, err := selectorOf(job)
	if err != nil {
		c.log.Warn("invalid selector", "job", key, "err", err)
		return nil
	}
	all, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	cl := &ctrlutil.Claimer[*corev1.Pod]{
		Owner: job, APIVersion: "batch/v1", Kind: "Job", Selector: sel,
		CanAdopt: ctrlutil.RecheckOwner(job, func(ctx context.Context) (metav1.Object, error) {
			return c.client.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		}),
		Patch: func(ctx context.Context, name string, data []byte) error {
			_, err := c.client.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
			return err
		},
		Copy: func(p *corev1.Pod) *corev1.Pod { return p.DeepCopy() },
	}
	if IsFinished(job) {
		// Everything was counted before the terminal condition; a pod that
		// still carries the finalizer (created in a race) just loses it.
		var left []*corev1.Pod
		for _, p := range all {
			if ref := metav1.GetControllerOf(p); ref != nil && ref.UID == job.UID && hasFinalizer(p) {
				left = append(left, p)
			}
		}
		_, err := c.removeFinalizers(ctx, key, left)
		return err
	}
	pods, claimErr := cl.Claim(ctx, all)
	return errors.Join(claimErr, c.syncJob(ctx, key, job, pods))
}

func (c *Controller) syncJob(ctx context.Context, key string, job *batchv1.Job, pods []*corev1.Pod) error {
	now := c.now()
	s := specOf(job)
	st := job.Status.DeepCopy()
	satisfied := c.exp.Satisfied(key)

	if st.StartTime == nil && !isSuspended(job) {
		t := metav1.NewTime(now)
		st.StartTime = &t
	}
	if st.UncountedTerminatedPods == nil {
		st.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{}
	}
	unc := st.UncountedTerminatedPods
	uncSucc := setOf(unc.Succeeded)
	uncFail := setOf(unc.Failed)
	completions := 0
	if s.completions != nil {
		completions = *s.completions
	}
	completed := indexSet{}
	failedIdx := indexSet{}
	if s.indexed {
		completed = parseIndexes(st.CompletedIndexes, completions)
		if st.FailedIndexes != nil {
			failedIdx = parseIndexes(*st.FailedIndexes, completions)
		}
	}

	// Classify the pods.
	var active, terminating, toUnfinalize []*corev1.Pod
	var newFailed int
	var failJobMsg string
	ready := 0
	idxFailures := map[int]int{} // per index: failures counted so far
	idxIgnored := map[int]int{}  // per index: failures ignored by the policy
	present := map[types.UID]*corev1.Pod{}
	for _, p := range pods {
		present[p.UID] = p
		fin := hasFinalizer(p) && !c.fin.removed(key, p.UID)
		idx := -1
		if s.indexed {
			idx = podIndex(p)
			if cnt, ign := indexFailures(p); idx >= 0 {
				// A failed pod adds its own failure to the count it was
				// created with (ignored ones separately).
				if isPodFailed(p, s) {
					if a, _ := matchPodFailurePolicy(job.Spec.PodFailurePolicy, p); a != nil && *a == batchv1.PodFailurePolicyActionIgnore {
						ign++
					} else {
						cnt++
					}
				}
				idxFailures[idx] = max(idxFailures[idx], cnt)
				idxIgnored[idx] = max(idxIgnored[idx], ign)
			}
		}
		switch {
		case p.Status.Phase == corev1.PodSucceeded:
			if !fin {
				continue
			}
			if s.indexed {
				if idx >= 0 && idx < completions {
					completed[idx] = true
				}
			} else if !uncSucc[p.UID] && !uncFail[p.UID] {
				uncSucc[p.UID] = true
				unc.Succeeded = append(unc.Succeeded, p.UID)
			}
			toUnfinalize = append(toUnfinalize, p)
		case isPodFailed(p, s):
			if p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodFailed {
				terminating = append(terminating, p)
			}
			if !fin {
				continue
			}
			toUnfinalize = append(toUnfinalize, p)
			if uncFail[p.UID] || uncSucc[p.UID] {
				continue
			}
			action, msg := matchPodFailurePolicy(job.Spec.PodFailurePolicy, p)
			if action != nil && *action == batchv1.PodFailurePolicyActionIgnore {
				continue // not counted
			}
			if action != nil && *action == batchv1.PodFailurePolicyActionFailJob && failJobMsg == "" {
				failJobMsg = msg
			}
			uncFail[p.UID] = true
			unc.Failed = append(unc.Failed, p.UID)
			newFailed++
			if idx >= 0 && idx < completions && s.perIndex != nil {
				cnt, _ := indexFailures(p)
				if (action != nil && *action == batchv1.PodFailurePolicyActionFailIndex) || cnt+1 > *s.perIndex {
					failedIdx[idx] = true
				}
			}
		case p.DeletionTimestamp != nil:
			terminating = append(terminating, p)
		default:
			active = append(active, p)
			if ctrlutil.IsPodReady(p) {
				ready++
			}
		}
	}
	if s.indexed {
		for i := range completed {
			delete(failedIdx, i)
		}
	}

	succeeded := int(st.Succeeded) + len(uncSucc)
	if s.indexed {
		succeeded = len(completed)
	}
	failed := int(st.Failed) + len(uncFail)

	// Decide the outcome, in upstream's order.
	var out *outcome
	switch {
	case conditionTrue(st, batchv1.JobFailureTarget):
		cnd := condition(st, batchv1.JobFailureTarget)
		out = &outcome{reason: cnd.Reason, message: cnd.Message}
	case conditionTrue(st, batchv1.JobSuccessCriteriaMet):
		cnd := condition(st, batchv1.JobSuccessCriteriaMet)
		out = &outcome{success: true, reason: cnd.Reason, message: cnd.Message}
	case failJobMsg != "":
		out = &outcome{reason: batchv1.JobReasonPodFailurePolicy, message: failJobMsg}
	case failed > s.backoffLimit:
		out = &outcome{reason: batchv1.JobReasonBackoffLimitExceeded, message: "Job has reached the specified backoff limit"}
	case c.pastDeadline(job, st, now):
		out = &outcome{reason: batchv1.JobReasonDeadlineExceeded, message: "Job was active longer than specified deadline"}
	case s.maxFailedIndexes != nil && len(failedIdx) > *s.maxFailedIndexes:
		out = &outcome{reason: batchv1.JobReasonMaxFailedIndexesExceeded, message: "Job has exceeded the specified maximal number of failed indexes"}
	}
	if out == nil && s.indexed {
		if i := matchSuccessPolicy(job.Spec.SuccessPolicy, completions, completed); i >= 0 {
			out = &outcome{success: true, reason: batchv1.JobReasonSuccessPolicy, message: fmt.Sprintf("Matched rules at index %d", i)}
		}
	}
	if out == nil {
		done := false
		switch {
		case s.completions == nil:
			done = succeeded > 0 && len(active) == 0
		case s.indexed:
			done = len(completed) >= completions
		default:
			done = succeeded >= completions
		}
		if done {
			out = &outcome{success: true, reason: batchv1.JobReasonCompletionsReached, message: "Reached expected number of succeeded pods"}
		} else if s.perIndex != nil && len(failedIdx) > 0 && len(completed)+len(failedIdx) >= completions {
			out = &outcome{reason: batchv1.JobReasonFailedIndexes, message: "Job has failed indexes"}
		}
	}

	var manageErr error
	deleted := 0
	var requeue time.Duration
	switch {
	case out != nil:
		if out.success {
			setCondition(st, batchv1.JobSuccessCriteriaMet, corev1.ConditionTrue, out.reason, out.message, now)
		} else {
			setCondition(st, batchv1.JobFailureTarget, corev1.ConditionTrue, out.reason, out.message, now)
		}
		if len(active) > 0 {
			deleted, manageErr = c.deletePods(ctx, key, job, active)
		}
	case isSuspended(job):
		if len(active) > 0 && satisfied {
			deleted, manageErr = c.deletePods(ctx, key, job, active)
		}
		if setCondition(st, batchv1.JobSuspended, corev1.ConditionTrue, "JobSuspended", "Job suspended", now) {
			c.rec.Event(job, corev1.EventTypeNormal, "Suspended", "Job suspended")
		}
	default:
		if cnd := condition(st, batchv1.JobSuspended); cnd != nil && cnd.Status == corev1.ConditionTrue {
			setCondition(st, batchv1.JobSuspended, corev1.ConditionFalse, "JobResumed", "Job resumed", now)
			t := metav1.NewTime(now)
			st.StartTime = &t // activeDeadlineSeconds counts from the resume
			c.rec.Event(job, corev1.EventTypeNormal, "Resumed", "Job resumed")
		}
		if satisfied {
			if s.indexed {
				deleted, requeue, manageErr = c.manageIndexed(ctx, key, job, s, active, terminating, pods, completed, failedIdx, idxFailures, idxIgnored, now)
			} else {
				deleted, requeue, manageErr = c.manage(ctx, key, job, s, active, terminating, pods, succeeded, now)
			}
		}
	}

	st.Active = int32(len(active) - deleted)
	st.Ready = ptr(int32(ready))
	st.Terminating = ptr(int32(len(terminating) + deleted))
	if s.indexed {
		st.CompletedIndexes = completed.String()
		st.Succeeded = int32(len(completed))
		if s.perIndex != nil {
			st.FailedIndexes = ptr(failedIdx.String())
		}
	}

	// Step 1: record the newly finished pods before their finalizers go.
	if !apiequality.Semantic.DeepEqual(job.Status, *st) {
		var err error
		if job, err = c.writeStatus(ctx, job, st); err != nil {
			return errors.Join(manageErr, err)
		}
		st = job.Status.DeepCopy()
		if st.UncountedTerminatedPods == nil {
			st.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{}
		}
		unc = st.UncountedTerminatedPods
	}
	// Step 2: remove the finalizers, step 3: count what went.
	var unfinalized []types.UID
	for _, uid := range append(append([]types.UID(nil), unc.Succeeded...), unc.Failed...) {
		if p := present[uid]; p == nil || !hasFinalizer(p) || c.fin.removed(key, uid) {
			unfinalized = append(unfinalized, uid)
		}
	}
	gone, finErr := c.removeFinalizers(ctx, key, toUnfinalize)
	unfinalized = append(unfinalized, gone...)
	done := setOf(unfinalized)
	var keepS, keepF []types.UID
	for _, uid := range unc.Succeeded {
		if done[uid] {
			st.Succeeded++
		} else {
			keepS = append(keepS, uid)
		}
	}
	for _, uid := range unc.Failed {
		if done[uid] {
			st.Failed++
		} else {
			keepF = append(keepF, uid)
		}
	}
	unc.Succeeded, unc.Failed = keepS, keepF

	// Step 4: the terminal condition, once nothing of the Job runs.
	finished := false
	if out != nil && st.Active == 0 && *st.Terminating == 0 && len(keepS)+len(keepF) == 0 && finErr == nil && manageErr == nil {
		finished = true
		t := metav1.NewTime(now)
		if out.success {
			setCondition(st, batchv1.JobComplete, corev1.ConditionTrue, out.reason, out.message, now)
			st.CompletionTime = &t
		} else {
			setCondition(st, batchv1.JobFailed, corev1.ConditionTrue, out.reason, out.message, now)
		}
	}
	if !apiequality.Semantic.DeepEqual(job.Status, *st) {
		if _, err := c.writeStatus(ctx, job, st); err != nil {
			return errors.Join(manageErr, finErr, err)
		}
		if finished {
			if out.success {
				c.rec.Event(job, corev1.EventTypeNormal, "Completed", "Job completed")
			} else {
				c.rec.Event(job, corev1.EventTypeWarning, out.reason, out.message)
			}
		}
	}
	if out == nil && !isSuspended(job) {
		if d := c.deadlineLeft(job, st, now); d > 0 && (requeue == 0 || d < requeue) {
			requeue = d
		}
	}
	if requeue > 0 {
		c.queue.AddAfter(key, requeue)
	}
	return errors.Join(manageErr, finErr)
}

func (c *Controller) deadlineLeft(job *batchv1.Job, st *batchv1.JobStatus, now time.Time) time.Duration {
	if job.Spec.ActiveDeadlineSeconds == nil || st.StartTime == nil {
		return 0
	}
	return st.StartTime.Add(time.Duration(*job.Spec.ActiveDeadlineSeconds) * time.Second).Sub(now)
}

func (c *Controller) pastDeadline(job *batchv1.Job, st *batchv1.JobStatus, now time.Time) bool {
	if job.Spec.ActiveDeadlineSeconds == nil || st.StartTime == nil || isSuspended(job) {
		return false
	}
	return c.deadlineLeft(job, st, now) <= 0
}

// manage keeps a NonIndexed Job's active pods at what parallelism and the
// remaining completions ask for.
func (c *Controller) manage(ctx context.Context, key string, job *batchv1.Job, s spec, active, terminating, pods []*corev1.Pod, succeeded int, now time.Time) (int, time.Duration, error) {
	want := s.parallelism
	if s.completions == nil {
		if succeeded > 0 {
			want = len(active) // the work is done: no new pods, let the rest finish
		}
	} else {
		want = min(want, max(*s.completions-succeeded, 0))
	}
	if len(active) > want {
		victims := replicaset.PodsToDelete(active, len(active)-want)
		n, err := c.deletePods(ctx, key, job, victims)
		return n, 0, err
	}
	have := len(active)
	if s.onlyReplaceFailed {
		have += len(terminating)
	}
	diff := min(want-have, c.opts.BurstReplicas)
	if diff <= 0 {
		return 0, 0, nil
	}
	if wait := c.backoff(pods, now); wait > 0 {
		return 0, wait, nil
	}
	return 0, 0, c.createPods(ctx, key, job, diff, func(int) *corev1.Pod { return c.newPod(job, -1, 0, 0) })
}

// manageIndexed keeps one active pod per index that is neither completed
// nor failed, up to parallelism, deleting duplicates and pods of indexes
// that need none.
func (c *Controller) manageIndexed(ctx context.Context, key string, job *batchv1.Job, s spec, active, terminating, pods []*corev1.Pod,
	completed, failedIdx indexSet, idxFailures, idxIgnored map[int]int, now time.Time) (int, time.Duration, error) {
	completions := *s.completions
	var victims, keep []*corev1.Pod
	byIdx := map[int]*corev1.Pod{}
	for _, p := range active {
		i := podIndex(p)
		if i < 0 || i >= completions || completed[i] || failedIdx[i] {
			victims = append(victims, p)
			continue
		}
		if prev := byIdx[i]; prev != nil {
			// Keep the older one, as upstream keeps the first.
			if p.CreationTimestamp.Before(&prev.CreationTimestamp) {
				victims = append(victims, prev)
				byIdx[i] = p
				continue
			}
			victims = append(victims, p)
			continue
		}
		byIdx[i] = p
	}
	for _, p := range byIdx {
		keep = append(keep, p)
	}
	remaining := completions - len(completed) - len(failedIdx)
	want := min(s.parallelism, remaining)
	if extra := len(keep) - want; extra > 0 {
		victims = append(victims, replicaset.PodsToDelete(keep, extra)...)
	}
	if len(victims) > 0 {
		n, err := c.deletePods(ctx, key, job, victims)
		return n, 0, err
	}
	busy := map[int]bool{}
	for i := range byIdx {
		busy[i] = true
	}
	if s.onlyReplaceFailed {
		for _, p := range terminating {
			if i := podIndex(p); i >= 0 {
				busy[i] = true
			}
		}
	}
	slots := want - len(keep)
	if s.onlyReplaceFailed {
		slots -= len(terminating)
	}
	var todo []int
	var requeue time.Duration
	for i := 0; i < completions && len(todo) < min(slots, c.opts.BurstReplicas); i++ {
		if completed[i] || failedIdx[i] || busy[i] {
			continue
		}
		var ofIdx []*corev1.Pod
		for _, p := range pods {
			if podIndex(p) == i {
				ofIdx = append(ofIdx, p)
			}
		}
		if wait := c.backoff(ofIdx, now); wait > 0 {
			if requeue == 0 || wait < requeue {
				requeue = wait
			}
			continue
		}
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return 0, requeue, nil
	}
	var mu sync.Mutex
	next := 0
	err := c.createPods(ctx, key, job, len(todo), func(int) *corev1.Pod {
		mu.Lock()
		i := todo[next]
		next++
		mu.Unlock()
		return c.newPod(job, i, idxFailures[i], idxIgnored[i])
	})
	return 0, requeue, err
}

// backoff returns how long to wait before replacing failed pods among pods:
// base × 2^(n−1) after the n-th consecutive failure (failures since the
// newest success), measured from the newest failure, as upstream.
func (c *Controller) backoff(pods []*corev1.Pod, now time.Time) time.Duration {
	var lastSuccess, lastFailure time.Time
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded {
			if t := finishTime(p); t.After(lastSuccess) {
				lastSuccess = t
			}
		}
	}
	n := 0
	for _, p := range pods {
		if p.Status.Phase != corev1.PodFailed {
			continue
		}
		t := finishTime(p)
		if !t.After(lastSuccess) {
			continue
		}
		n++
		if t.After(lastFailure) {
			lastFailure = t
		}
	}
	if n == 0 {
		return 0
	}
	d := c.opts.PodFailureBackoff
	for i := 1; i < n && d < c.opts.MaxPodFailureBackoff; i++ {
		d *= 2
	}
	d = min(d, c.opts.MaxPodFailureBackoff)
	return lastFailure.Add(d).Sub(now)
}

// finishTime is when a pod ended: its containers' latest finishedAt, else
// its Ready condition's last transition, else its creation.
func finishTime(p *corev1.Pod) time.Time {
	var t time.Time
	for _, cs := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if cs.State.Terminated != nil && cs.State.Terminated.FinishedAt.After(t) {
			t = cs.State.Terminated.FinishedAt.Time
		}
	}
	if t.IsZero() {
		if rc := ctrlutil.PodReadyCondition(p); rc != nil {
			t = rc.LastTransitionTime.Time
		}
	}
	if t.IsZero() {
		t = p.CreationTimestamp.Time
	}
	return t
}

// newPod builds a pod for the Job (index ≥ 0 in Indexed mode).
func (c *Controller) newPod(job *batchv1.Job, index, failures, ignored int) *corev1.Pod {
	p := ctrlutil.PodFromTemplate(job, &job.Spec.Template, "batch/v1", "Job")
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	if job.Spec.ManualSelector == nil || !*job.Spec.ManualSelector {
		for _, k := range []string{batchv1.ControllerUidLabel, "controller-uid"} {
			if _, ok := p.Labels[k]; !ok {
				p.Labels[k] = string(job.UID)
			}
		}
		for _, k := range []string{batchv1.JobNameLabel, "job-name"} {
			if _, ok := p.Labels[k]; !ok {
				p.Labels[k] = job.Name
			}
		}
	}
	p.Finalizers = append(p.Finalizers, batchv1.JobTrackingFinalizer)
	if index >= 0 {
		idx := strconv.Itoa(index)
		p.GenerateName = fmt.Sprintf("%s-%d-", job.Name, index)
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[batchv1.JobCompletionIndexAnnotation] = idx
		p.Labels[batchv1.JobCompletionIndexAnnotation] = idx
		if job.Spec.BackoffLimitPerIndex != nil {
			p.Annotations[batchv1.JobIndexFailureCountAnnotation] = strconv.Itoa(failures)
			if ignored > 0 {
				p.Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation] = strconv.Itoa(ignored)
			}
		}
		if p.Spec.Hostname == "" {
			p.Spec.Hostname = fmt.Sprintf("%s-%d", job.Name, index)
		}
		env := corev1.EnvVar{Name: "JOB_COMPLETION_INDEX", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
			FieldPath: fmt.Sprintf("metadata.annotations['%s']", batchv1.JobCompletionIndexAnnotation)}}}
		for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
			for i := range list {
				if !slices.ContainsFunc(list[i].Env, func(e corev1.EnvVar) bool { return e.Name == env.Name }) {
					list[i].Env = append(list[i].Env, env)
				}
			}
		}
	}
	return p
}

func (c *Controller) createPods(ctx context.Context, key string, job *batchv1.Job, n int, build func(int) *corev1.Pod) error {
	c.exp.ExpectCreations(key, n)
	created, err := ctrlutil.SlowStartBatch(n, 1, func() error {
		created, err := c.client.CoreV1().Pods(job.Namespace).Create(ctx, build(0), metav1.CreateOptions{})
		if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return nil
		}
		if err != nil {
			c.rec.Eventf(job, corev1.EventTypeWarning, "FailedCreate", "Error creating: %v", err)
			return err
		}
		c.rec.Eventf(job, corev1.EventTypeNormal, "SuccessfulCreate", "Created pod: %v", created.Name)
		return nil
	})
	for i := created; i < n; i++ {
		c.exp.CreationObserved(key)
	}
	if err != nil {
		return fmt.Errorf("create pods for job %s: %w", key, err)
	}
	return nil
}

// deletePods deletes pods (the Job's finalizer keeps them until counted)
// and returns how many deletions were issued successfully.
func (c *Controller) deletePods(ctx context.Context, key string, job *batchv1.Job, pods []*corev1.Pod) (int, error) {
	keys := make([]string, len(pods))
	for i, p := range pods {
		keys[i] = p.Namespace + "/" + p.Name
	}
	c.exp.ExpectDeletions(key, keys)
	var mu sync.Mutex
	var errs []error
	n := 0
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				n++
				c.rec.Eventf(job, corev1.EventTypeNormal, "SuccessfulDelete", "Deleted pod: %v", p.Name)
			case apierrors.IsNotFound(err):
				c.exp.DeletionObserved(key, keys[i])
			default:
				c.exp.DeletionObserved(key, keys[i])
				c.rec.Eventf(job, corev1.EventTypeWarning, "FailedDelete", "Error deleting: %v", err)
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("delete pods of job %s: %w", key, err)
	}
	return n, nil
}

var removeFinalizerPatch = []byte(fmt.Sprintf(`{"metadata":{"$deleteFromPrimitiveList/finalizers":[%q]}}`, batchv1.JobTrackingFinalizer))

// removeFinalizers removes the tracking finalizer from pods and returns the
// UIDs it is now gone from (removed, or the pod is gone).
func (c *Controller) removeFinalizers(ctx context.Context, key string, pods []*corev1.Pod) ([]types.UID, error) {
	var mu sync.Mutex
	var done []types.UID
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for _, p := range pods {
		if !hasFinalizer(p) || c.fin.removed(key, p.UID) {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			_, err := c.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, removeFinalizerPatch, metav1.PatchOptions{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("remove finalizer of pod %s: %w", p.Name, err))
				return
			}
			c.fin.expect(key, p.UID)
			done = append(done, p.UID)
		}()
	}
	wg.Wait()
	return done, errors.Join(errs...)
}

// releaseStrays removes the tracking finalizer from pods whose controller
// reference names Job name but not the live Job (uid): the Job was deleted
// or replaced, and nobody else will count them.
func (c *Controller) releaseStrays(ctx context.Context, ns, name string, uid types.UID) error {
	all, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	var strays []*corev1.Pod
	for _, p := range all {
		ref := metav1.GetControllerOf(p)
		if ref != nil && ref.Kind == "Job" && ref.Name == name && ref.UID != uid && hasFinalizer(p) {
			strays = append(strays, p)
		}
	}
	_, err = c.removeFinalizers(ctx, "stray:"+ns+"/"+name, strays)
	return err
}

func (c *Controller) writeStatus(ctx context.Context, job *batchv1.Job, st *batchv1.JobStatus) (*batchv1.Job, error) {
	j := job.DeepCopy()
	j.Status = *st
	out, err := c.client.BatchV1().Jobs(j.Namespace).UpdateStatus(ctx, j, metav1.UpdateOptions{})
	if err != nil {
		return job, fmt.Errorf("update status of job %s/%s: %w", j.Namespace, j.Name, err)
	}
	c.written.wrote(j.Namespace+"/"+j.Name, out)
	return out, nil
}

// statusTracker remembers the resourceVersion of each Job status this
// controller wrote, so a sync does not act on an informer copy older than
// its own last write (as the EndpointSlice controller's tracker).
type statusTracker struct {
	mu sync.Mutex
	m  map[string]trackedWrite
}

type trackedWrite struct {
	rv uint64
	at time.Time
}

// statusTrackTimeout bounds the wait for the cache: a write the informer
// never shows (the Job was replaced) must not block its key for good.
const statusTrackTimeout = 30 * time.Second

func newStatusTracker() *statusTracker { return &statusTracker{m: map[string]trackedWrite{}} }

func rvOf(j *batchv1.Job) uint64 {
	v, _ := strconv.ParseUint(j.ResourceVersion, 10, 64)
	return v
}

func (t *statusTracker) wrote(key string, j *batchv1.Job) {
	if rv := rvOf(j); rv > 0 {
		t.mu.Lock()
		t.m[key] = trackedWrite{rv: rv, at: time.Now()}
		t.mu.Unlock()
	}
}

func (t *statusTracker) forget(key string) {
	t.mu.Lock()
	delete(t.m, key)
	t.mu.Unlock()
}

// stale reports whether cached is older than the last write of key.
func (t *statusTracker) stale(key string, cached *batchv1.Job) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.m[key]
	if !ok {
		return false
	}
	if rvOf(cached) >= w.rv || time.Since(w.at) > statusTrackTimeout {
		delete(t.m, key)
		return false
	}
	return true
}

func setOf(uids []types.UID) map[types.UID]bool {
	m := make(map[types.UID]bool, len(uids))
	for _, u := range uids {
		m[u] = true
	}
	return m
}

func ptr[T any](v T) *T { return &v }

// finalizerTracker remembers, per Job, the pods whose finalizer this
// controller removed but whose update its cache has not shown yet, so a
// sync on a stale cache does not count them again (upstream's
// finalizerExpectations).
type finalizerTracker struct {
	mu sync.Mutex
	m  map[string]map[types.UID]bool
}

func newFinalizerTracker() *finalizerTracker {
	return &finalizerTracker{m: map[string]map[types.UID]bool{}}
}

func (f *finalizerTracker) expect(key string, uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m[key] == nil {
		f.m[key] = map[types.UID]bool{}
	}
	f.m[key][uid] = true
}

func (f *finalizerTracker) observed(key string, uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m[key], uid)
	if len(f.m[key]) == 0 {
		delete(f.m, key)
	}
}

func (f *finalizerTracker) removed(key string, uid types.UID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[key][uid]
}

func (f *finalizerTracker) forget(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, key)
}
