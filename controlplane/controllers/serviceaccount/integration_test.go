package serviceaccount

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

func TestRealAPIServerDefaultServiceAccount(t *testing.T) {
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler), Options{})
	cctx, cancel := context.WithCancel(ctx)
	f.Start(cctx.Done())
	done := make(chan struct{})
	go func() { c.Run(cctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })

	has := func(ns string) bool {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		testutil.WaitFor(t, 30*time.Second, what, cond)
	}
	for _, ns := range []string{"default", "kube-system"} {
		wait("default SA in "+ns, func() bool { return has(ns) })
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("default SA in a new namespace", func() bool { return has("apps") })
	if err := cs.CoreV1().ServiceAccounts("apps").Delete(ctx, "default", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("default SA re-created", func() bool { return has("apps") })
}
