package nodeipam

import (
	"context"
	"fmt"
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

func TestRealAPIServerNodeCIDRsSurviveAControllerRestart(t *testing.T) {
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	run := func() context.CancelFunc {
		f := informers.NewSharedInformerFactory(cs, 0)
		c := New(cs, f, slog.New(slog.DiscardHandler), Options{ClusterCIDR: "10.244.0.0/16", NodeCIDRMaskSize: 24})
		cctx, cancel := context.WithCancel(ctx)
		f.Start(cctx.Done())
		done := make(chan struct{})
		go func() { c.Run(cctx, 2); close(done) }()
		stop := func() { cancel(); <-done; f.Shutdown() }
		t.Cleanup(stop)
		return stop
	}
	create := func(names ...string) {
		for _, n := range names {
			if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	all := func() map[string]string {
		l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, n := range l.Items {
			m[n.Name] = n.Spec.PodCIDR
		}
		return m
	}
	waitAll := func(n int) map[string]string {
		t.Helper()
		var m map[string]string
		testutil.Eventually(t, 30*time.Second, func() error {
			m = all()
			ok := len(m) == n
			for _, c := range m {
				ok = ok && c != ""
			}
			if !ok {
				return fmt.Errorf("nodes without podCIDR: %v", m)
			}
			return nil
		})
		return m
	}

	stop := run()
	create("a", "b", "c")
	first := waitAll(3)
	stop() // a new leader takes over

	run()
	for i := range 5 {
		create(fmt.Sprintf("late-%d", i))
	}
	got := waitAll(8)
	seen := map[string]string{}
	for n, c := range got {
		if o, dup := seen[c]; dup {
			t.Fatalf("%s given to %s and %s after a restart", c, o, n)
		}
		seen[c] = n
		if old, ok := first[n]; ok && old != c {
			t.Fatalf("node %s changed CIDR %s -> %s", n, old, c)
		}
	}
	// After a node is deleted, a new node gets its CIDR or a free one, never
	// one in use (whether the delete was seen yet or not).
	freed := got["b"]
	if err := cs.CoreV1().Nodes().Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, c := range got {
		used[c] = true
	}
	create("after-delete")
	m := waitAll(8)
	if c := m["after-delete"]; used[c] && c != freed {
		t.Fatalf("new node got %s, in use by another node", c)
	}
}
