package clusterroleaggregation

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

func TestAdminEditViewAggregateDefaultAndLabelledRoles(t *testing.T) {
	testutil.Privileged(t)
	rc, _, _ := apiservertest.StartTestServer(t)
	cs := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, slog.New(slog.DiscardHandler))
	cctx, cancel := context.WithCancel(ctx)
	f.Start(cctx.Done())
	done := make(chan struct{})
	go func() { c.Run(cctx, 1); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })

	has := func(role string, pred func(rbacv1.PolicyRule) bool) bool {
		r, err := cs.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(r.Rules, pred)
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		testutil.Eventually(t, 20*time.Second, func() error {
			if !cond() {
				return fmt.Errorf("waiting for %s", what)
			}
			return nil
		})
	}
	podsGet := func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.Resources, "pods") && slices.Contains(r.Verbs, "get")
	}
	for _, role := range []string{"admin", "edit", "view"} {
		wait(role+" aggregated", func() bool { return has(role, podsGet) })
	}
	widgets := func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "widgets") }
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "widget-viewer", Labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{"example.com"}, Resources: []string{"widgets"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("labelled role in view", func() bool { return has("view", widgets) })
	if err := cs.RbacV1().ClusterRoles().Delete(ctx, "widget-viewer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("deleted role's rules gone from view", func() bool { return !has("view", widgets) })
}
