// Package ttlafterfinished is the TTL-after-finished controller: it deletes
// a Job spec.ttlSecondsAfterFinished seconds after it finished (its
// completionTime, or its Complete/Failed condition's lastTransitionTime),
// as Kubernetes' does — waking up exactly when the TTL expires, re-reading
// the Job from the API server before deleting (the TTL may have been
// changed), deleting with foreground propagation and a resourceVersion
// precondition so a Job changed meanwhile is looked at again instead.
//
// It only deletes finished Jobs; it does not run or count them.
package ttlafterfinished

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name (queue and metrics label, --controllers).
const Name = "ttl-after-finished"

// Controller deletes finished Jobs whose TTL expired.
type Controller struct {
	client kubernetes.Interface
	log    *slog.Logger
	queue  workqueue.TypedRateLimitingInterface[string]
	jobs   batchlisters.JobLister
	synced cache.InformerSynced
	now    func() time.Time
}

// New wires the controller to the factory's Job informer.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger) *Controller {
	inf := factory.Batch().V1().Jobs()
	c := &Controller{client: client, log: log.With("controller", Name), queue: ctrlutil.NewQueue(Name),
		jobs: inf.Lister(), synced: inf.Informer().HasSynced, now: time.Now}
	add := func(obj any) {
		if j, ok := obj.(*batchv1.Job); ok && j.DeletionTimestamp == nil && needsCleanup(j) {
			c.queue.Add(ctrlutil.KeyFunc(j))
		}
	}
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, cur any) { add(cur) }})
	return c
}

// Run runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced)
}

func needsCleanup(j *batchv1.Job) bool {
	_, ok := finishedAt(j)
	return j.Spec.TTLSecondsAfterFinished != nil && ok
}

// finishedAt is when the Job finished.
func finishedAt(j *batchv1.Job) (time.Time, bool) {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			if c.Type == batchv1.JobComplete && j.Status.CompletionTime != nil {
				return j.Status.CompletionTime.Time, true
			}
			return c.LastTransitionTime.Time, true
		}
	}
	return time.Time{}, false
}

// expiresIn returns how long until the Job's TTL expires (≤ 0: expired) and
// whether it has one at all.
func (c *Controller) expiresIn(j *batchv1.Job) (time.Duration, bool) {
	if j.DeletionTimestamp != nil || !needsCleanup(j) {
		return 0, false
	}
	at, _ := finishedAt(j)
	return at.Add(time.Duration(*j.Spec.TTLSecondsAfterFinished) * time.Second).Sub(c.now()), true
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	j, err := c.jobs.Jobs(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	left, ok := c.expiresIn(j)
	if !ok {
		return nil
	}
	if left > 0 {
		c.queue.AddAfter(key, left)
		return nil
	}
	// The cache may be stale (the TTL raised, the Job restarted): decide on
	// the API server's copy.
	fresh, err := c.client.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if left, ok = c.expiresIn(fresh); !ok {
		return nil
	}
	if left > 0 {
		c.queue.AddAfter(key, left)
		return nil
	}
	fg := metav1.DeletePropagationForeground
	err = c.client.BatchV1().Jobs(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &fg,
		Preconditions: &metav1.Preconditions{UID: &fresh.UID, ResourceVersion: &fresh.ResourceVersion}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete expired job %s: %w", key, err)
	}
	c.log.Info("deleted finished job whose TTL expired", "job", key)
	return nil
}
