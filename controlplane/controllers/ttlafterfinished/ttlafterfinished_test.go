package ttlafterfinished

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
)

func finished(name string, ttl *int32, ago time.Duration) *batchv1.Job {
	at := metav1.NewTime(time.Now().Add(-ago))
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: "uid-" + "name"},
		Spec:       batchv1.JobSpec{TTLSecondsAfterFinished: ttl},
		Status: batchv1.JobStatus{CompletionTime: &at, Conditions: []batchv1.JobCondition{
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: at}}},
	}
}

func i32(v int32) *int32 { return &v }

func TestDeletesFinishedJobsOnceTheirTTLExpires(t *testing.T) {
	cs := ctrltest.NewClient(
		finished("expired", i32(10), time.Minute),
		finished("soon", i32(1), 0),
		finished("keep", i32(3600), 0),
		finished("no-ttl", nil, time.Hour),
	)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t))
	ctx := ctrltest.Start(t, cs, f)
	go c.Run(ctx, 2)
	gone := func(name string) error {
		_, err := cs.BatchV1().Jobs("default").Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return errNotGone(name)
	}
	ctrltest.Eventually(t, 45*time.Second, func() error { return gone("expired") })
	ctrltest.Eventually(t, 45*time.Second, func() error { return gone("soon") }) // woken up when its TTL ran out
	for _, name := range []string{"keep", "no-ttl"} {
		if gone(name) == nil {
			t.Fatalf("%s deleted", name)
		}
	}
}

type errNotGone string

func (e errNotGone) Error() string { return string(e) + " still exists" }
