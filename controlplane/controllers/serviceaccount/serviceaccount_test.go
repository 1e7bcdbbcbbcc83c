package serviceaccount

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

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
	watches := testutil.TrackWatches(cs)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })
	watches.WaitOpen(t, 2, 10*time.Second) // namespaces, serviceaccounts
	return cs
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, what, cond)
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
	// A namespace created after start is handled after the two listed at
	// start: once it has its account, "going" has been handled too.
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "later"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "default SA in the active namespaces", func() bool { return hasSA(cs, "staying") && hasSA(cs, "later") })
	if hasSA(cs, "going") {
		t.Fatal("created a service account in a terminating namespace")
	}
}
