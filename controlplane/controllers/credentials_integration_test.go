package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// TestControllersRunAsTheirOwnServiceAccounts: with
// --use-service-account-credentials each controller acts as its kube-system
// ServiceAccount and holds only its system:controller:* role. A Deployment
// rolls out as usual (deployment-controller creates the ReplicaSet,
// replicaset-controller the pods); with replicaset-controller's binding
// removed, a scale-up is refused to exactly that ServiceAccount (the
// FailedCreate event names it) while the Deployment side still works, and
// restoring the binding lets the pods come.
func TestControllersRunAsTheirOwnServiceAccounts(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 2, nil)
	c.startManager("cm-sa", func(cfg *Config) { cfg.UseServiceAccountCredentials = true })

	c.kubectlOK("create", "deployment", "web", "--image=nginx:1", "--replicas=1")
	c.kubectlOK("rollout", "status", "deployment/web", "--timeout=60s")
	for _, sa := range []string{"deployment-controller", "replicaset-controller", "endpointslice-controller", "generic-garbage-collector"} {
		if _, err := c.cs.CoreV1().ServiceAccounts(ServiceAccountNamespace).Get(ctx, sa, metav1.GetOptions{}); err != nil {
			t.Errorf("ServiceAccount %s/%s: %v", ServiceAccountNamespace, sa, err)
		}
	}

	binding, err := c.cs.RbacV1().ClusterRoleBindings().Get(ctx, "system:controller:replicaset-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The ServiceAccount keeps the right to record events (so the refusal
	// is seen) and loses everything else of its role.
	if _, err := c.cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test:events"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test:events"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "test:events"},
		Subjects: binding.Subjects}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.cs.RbacV1().ClusterRoleBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.kubectlOK("scale", "deployment/web", "--replicas=3")
	who := "system:serviceaccount:kube-system:replicaset-controller"
	eventually(t, 60*time.Second, func() error {
		evs, err := c.cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("reason", "FailedCreate").String()})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, who) && strings.Contains(e.Message, "forbidden") {
				return nil
			}
		}
		pods, _ := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		return fmt.Errorf("no FailedCreate event naming %s (%d FailedCreate events, %d pods)", who, len(evs.Items), len(pods.Items))
	})
	rs, err := c.cs.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(rs.Items) != 1 || *rs.Items[0].Spec.Replicas != 3 {
		t.Fatalf("the deployment-controller should still have scaled its ReplicaSet to 3: %v %+v", err, rs)
	}
	if pods, _ := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); len(pods.Items) != 1 {
		t.Fatalf("%d pods while the replicaset-controller may not create any, want 1", len(pods.Items))
	}

	binding.ResourceVersion = ""
	if _, err := c.cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, func() error {
		pods, err := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if n := len(pods.Items); n != 3 {
			return fmt.Errorf("%d pods, want 3", n)
		}
		return nil
	})
}
