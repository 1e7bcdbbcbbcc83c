package serviceaccount

import (
	"context"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

func start(t *testing.T, objs ...*corev1.Namespace) *fake.Clientset {
	t.Helper()
	cs := fake.NewClientset()
	for _, ns := range objs {
		if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitWatches := watchesStarted(cs)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })
	waitWatches(t, 2) // namespaces, serviceaccounts
	return cs
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func hasSA(cs *fake.Clientset, ns string) bool {
	_, err := cs.CoreV1().ServiceAccounts(ns).Get(context.Background(), "default", metav1.GetOptions{})
	return err == nil
}

func TestDefaultServiceAccountInEveryNamespaceRecreatedIfDeleted(t *testing.T) {
	existing := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "existing"}}
	cs := start(t, existing)
	waitFor(t, "default SA in a namespace that existed at start", func() bool { return hasSA(cs, "existing") })

	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "default SA in a new namespace", func() bool { return hasSA(cs, "new") })

	if err := cs.CoreV1().ServiceAccounts("new").Delete(context.Background(), "default", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "default SA re-created after deletion", func() bool { return hasSA(cs, "new") })
}

func TestTerminatingNamespaceGetsNoServiceAccount(t *testing.T) {
	cs := start(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "going"}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "staying"}})
	waitFor(t, "default SA in the active namespace", func() bool { return hasSA(cs, "staying") })
	time.Sleep(200 * time.Millisecond)
	if hasSA(cs, "going") {
		t.Fatal("created a service account in a terminating namespace")
	}
}

// watchesStarted counts the watches informers open on cs: the fake
// clientset drops objects created between an informer's list and its watch,
// so tests create objects only once every watch is open.
func watchesStarted(cs *fake.Clientset) func(t *testing.T, n int32) {
	var opened atomic.Int32
	cs.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
		opened.Add(1)
		return false, nil, nil
	})
	return func(t *testing.T, n int32) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); opened.Load() < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("informer watches did not start")
			}
		}
		time.Sleep(50 * time.Millisecond) // the default reactor opens it just after
	}
}
