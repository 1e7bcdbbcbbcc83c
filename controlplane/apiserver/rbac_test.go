package apiserver_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func clientFor(t *testing.T, s *apiservertest.Server, user string, groups ...string) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(s.UserConfig(t, user, groups...))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// eventuallyAllowed polls (the RBAC index follows the watch cache, so a
// new binding is effective within milliseconds) until fn stops being
// forbidden, failing after a second.
func within(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, d, func() error {
		if !cond() {
			return fmt.Errorf("%s: not yet", what)
		}
		return nil
	})
}

func TestRBACDefaultsDenyAndBindingsGrantExactlyTheirRules(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ConfigMaps("team").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	alice := clientFor(t, s, "alice")

	// No binding: discovery works (system:discovery), resources do not.
	if _, err := alice.Discovery().ServerGroups(); err != nil {
		t.Fatalf("discovery for an authenticated user: %v", err)
	}
	if _, err := alice.CoreV1().ConfigMaps("team").Get(ctx, "cfg", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("get without a binding: %v, want 403", err)
	}
	if _, err := alice.CoreV1().ConfigMaps("team").Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"k": "evil"}}, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("update without a binding: %v, want 403", err)
	}

	// A Role granting exactly get on configmaps, bound in "team".
	if _, err := admin.RbacV1().Roles("team").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "cm-get"},
		Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings("team").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-cm-get"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "cm-get"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	within(t, "binding effective", time.Second, func() bool {
		_, err := alice.CoreV1().ConfigMaps("team").Get(ctx, "cfg", metav1.GetOptions{})
		return err == nil
	})
	if _, err := alice.CoreV1().ConfigMaps("team").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list with only get: %v, want 403", err)
	}
	if _, err := alice.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("get in another namespace: %v, want 403", err)
	}
	if err := alice.CoreV1().ConfigMaps("team").Delete(ctx, "cfg", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("delete with only get: %v, want 403", err)
	}
	if _, err := alice.CoreV1().Secrets("team").Get(ctx, "cfg", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("get secret with only configmaps: %v, want 403", err)
	}
	if cm, err := admin.CoreV1().ConfigMaps("team").Get(ctx, "cfg", metav1.GetOptions{}); err != nil || cm.Data["k"] != "v" {
		t.Errorf("configmap changed by refused requests: %v %v", cm.Data, err)
	}

	// Escalation: alice may not grant what she does not hold, nor bind a role
	// beyond her rules.
	bob := clientFor(t, s, "bob")
	_ = bob
	aliceRBAC := rbacv1.PolicyRule{Verbs: []string{"create"}, APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles", "rolebindings"}}
	if _, err := admin.RbacV1().Roles("team").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "rbac-writer"}, Rules: []rbacv1.PolicyRule{aliceRBAC}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings("team").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-rbac"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "rbac-writer"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	within(t, "rbac binding effective", time.Second, func() bool {
		_, err := alice.RbacV1().Roles("team").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "held"},
			Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}}}}, metav1.CreateOptions{DryRun: []string{"All"}})
		return err == nil
	})
	_, err := alice.RbacV1().Roles("team").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "wider"},
		Rules: []rbacv1.PolicyRule{{Verbs: []string{"get", "delete"}, APIGroups: []string{""}, Resources: []string{"configmaps"}}}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("creating a role with unheld rules: %v, want 403", err)
	}
	_, err = alice.RbacV1().RoleBindings("team").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-admin"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("binding cluster-admin without holding it: %v, want 403", err)
	}
	for _, name := range []string{"wider"} {
		if _, err := admin.RbacV1().Roles("team").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("refused role %s stored: %v", name, err)
		}
	}
	if _, err := admin.RbacV1().RoleBindings("team").Get(ctx, "alice-admin", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("refused binding stored: %v", err)
	}
	// Binding a role she holds is fine (the rules are hers).
	if _, err := alice.RbacV1().RoleBindings("team").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bob-cm-get"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "cm-get"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "bob"}}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("binding a held role: %v", err)
	}

	// Revocation takes effect within a second.
	if err := admin.RbacV1().RoleBindings("team").Delete(ctx, "alice-cm-get", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	within(t, "revocation effective", time.Second, func() bool {
		_, err := alice.CoreV1().ConfigMaps("team").Get(ctx, "cfg", metav1.GetOptions{})
		return apierrors.IsForbidden(err)
	})
}

func TestDefaultPolicyIsReconciledWithoutClobberingUserChanges(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	for _, name := range []string{"cluster-admin", "admin", "edit", "view", "system:basic-user", "system:discovery", "system:public-info-viewer",
		"system:node", "system:kube-scheduler", "system:kube-controller-manager", "system:node-proxier", "system:controller:deployment-controller"} {
		if _, err := admin.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("clusterrole %s: %v", name, err)
		}
	}
	// A user adds a rule to view and a subject to system:discovery, and
	// protects edit from updates after emptying it.
	view, err := admin.RbacV1().ClusterRoles().Get(ctx, "system:basic-user", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	extra := rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}}
	view.Rules = append(view.Rules, extra)
	if _, err := admin.RbacV1().ClusterRoles().Update(ctx, view, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pub, err := admin.RbacV1().ClusterRoles().Get(ctx, "system:public-info-viewer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pub.Annotations["rbac.authorization.kubernetes.io/autoupdate"] = "false"
	pub.Rules = nil
	if _, err := admin.RbacV1().ClusterRoles().Update(ctx, pub, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := admin.RbacV1().ClusterRoles().Delete(ctx, "system:node-proxier", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s2 := apiservertest.Start(t, apiservertest.Options{DataDir: s.DataDir})
	admin = kubernetes.NewForConfigOrDie(s2.Config)
	got, err := admin.RbacV1().ClusterRoles().Get(ctx, "system:basic-user", metav1.GetOptions{})
	if err != nil || len(got.Rules) != len(view.Rules) {
		t.Errorf("user's added rule lost: %v %v", got.Rules, err)
	}
	if got, err := admin.RbacV1().ClusterRoles().Get(ctx, "system:public-info-viewer", metav1.GetOptions{}); err != nil || len(got.Rules) != 0 {
		t.Errorf("autoupdate=false role was reconciled: %v %v", got.Rules, err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Get(ctx, "system:node-proxier", metav1.GetOptions{}); err != nil {
		t.Errorf("deleted default role not re-created: %v", err)
	}
}

func TestAnonymousAuthRunsAsSystemAnonymous(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) { c.AnonymousAuth = true }})
	anon := rest.AnonymousClientConfig(s.Config)
	hc, err := rest.HTTPClientFor(anon)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		code int
	}{{"/api/v1/namespaces/default/secrets", 403}, {"/api", 403}, {"/version", 200}, {"/healthz", 200}} {
		resp, err := hc.Get(anon.Host + c.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("anonymous GET %s: %d %s, want %d", c.path, resp.StatusCode, body, c.code)
		}
		if c.code == 403 && !strings.Contains(string(body), `User \"system:anonymous\" cannot`) {
			t.Errorf("anonymous GET %s: %s", c.path, body)
		}
	}
	// A wrong credential is still a 401, not anonymous.
	bad := rest.AnonymousClientConfig(s.Config)
	bad.BearerToken = "nope"
	hc2, _ := rest.HTTPClientFor(bad)
	resp, err := hc2.Get(bad.Host + "/api")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("wrong token: %d, want 401", resp.StatusCode)
	}
}
