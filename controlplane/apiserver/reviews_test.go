package apiserver_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestAccessReviewsAnswerFromTheAuthorizer(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	review := func(user, verb, resource string) *authorizationv1.SubjectAccessReview {
		t.Helper()
		r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: resource, Namespace: "default"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := review("system:kube-scheduler", "create", "bindings"); !r.Status.Allowed || !strings.Contains(r.Status.Reason, "system:kube-scheduler") {
		t.Errorf("scheduler may create bindings: %+v", r.Status)
	}
	if r := review("nobody", "get", "secrets"); r.Status.Allowed {
		t.Errorf("nobody may get secrets: %+v", r.Status)
	}
	_, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "x"}}, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Errorf("review without attributes: %v, want 422", err)
	}
	// A user without rights may not review others, but may review itself.
	alice := clientFor(t, s, "alice")
	if _, err := alice.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: "bob", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "pods"}}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice reviewing bob: %v, want 403", err)
	}
	self, err := alice.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Verb: "get", Path: "/version"}}}, metav1.CreateOptions{})
	if err != nil || !self.Status.Allowed {
		t.Errorf("alice may get /version: %+v %v", self, err)
	}

	// Through the real kubectl: auth can-i, can-i --list, whoami.
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed")
	}
	kc := filepath.Join(s.DataDir, "scheduler.kubeconfig")
	run := func(args ...string) (string, error) {
		cmd := exec.Command(kubectl, append([]string{"--kubeconfig", kc}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := run("auth", "can-i", "create", "pods", "--subresource=binding"); err != nil || out != "yes" {
		t.Errorf("scheduler can-i create pods --subresource=binding: %q %v", out, err)
	}
	if out, _ := run("auth", "can-i", "delete", "secrets"); out != "no" {
		t.Errorf("scheduler can-i delete secrets: %q", out)
	}
	if out, err := run("auth", "can-i", "--list"); err != nil || !strings.Contains(out, "bindings") {
		t.Errorf("can-i --list: %q %v", out, err)
	}
	if out, err := run("auth", "whoami"); err != nil || !strings.Contains(out, "system:kube-scheduler") {
		t.Errorf("whoami: %q %v", out, err)
	}

	// Impersonation: admin may (cluster-admin has impersonate on *), the
	// scheduler may not.
	kc = filepath.Join(s.DataDir, "admin.kubeconfig")
	if out, err := run("auth", "can-i", "create", "pods", "--subresource=binding", "--as", "system:kube-scheduler"); err != nil || out != "yes" {
		t.Errorf("admin --as scheduler can-i: %q %v", out, err)
	}
	if out, _ := run("auth", "can-i", "get", "secrets", "--as", "system:kube-scheduler"); out != "no" {
		t.Errorf("admin --as scheduler can-i get secrets: %q", out)
	}
	if out, err := run("auth", "whoami", "--as", "alice", "--as-group", "devs"); err != nil || !strings.Contains(out, "alice") || !strings.Contains(out, "devs") {
		t.Errorf("whoami --as alice: %q %v", out, err)
	}
	if out, err := run("get", "secrets", "--as", "alice"); err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("get secrets --as alice: %q %v, want forbidden", out, err)
	}
	kc = filepath.Join(s.DataDir, "scheduler.kubeconfig")
	if out, err := run("get", "pods", "--as", "admin", "--as-group", "system:masters"); err == nil || !strings.Contains(out, "Forbidden") {
		t.Errorf("scheduler impersonating admin: %q %v, want forbidden", out, err)
	}
	rc := s.UserConfig(t, "system:kube-scheduler")
	rc.Impersonate.UserName, rc.Impersonate.Groups = "admin", []string{"system:masters"}
	_, err = kubernetes.NewForConfigOrDie(rc).CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "cannot impersonate resource \"users\"") {
		t.Errorf("scheduler impersonating admin through client-go: %v, want 403", err)
	}
}

// TestImpersonateExtraAndGroupsAsUpstream: Impersonate-Extra-<key> values
// reach the impersonated user (SelfSubjectReview shows them) only for a
// caller allowed impersonate on userextras/<key> with that value; the
// system:authenticated group is added unless the groups asked for say
// otherwise, as kube-apiserver does.
func TestImpersonateExtraAndGroupsAsUpstream(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	as := func(caller string, extra map[string][]string, groups ...string) (*authenticationv1.SelfSubjectReview, error) {
		rc := s.UserConfig(t, caller)
		if caller == "admin" {
			rc = rest.CopyConfig(s.Config)
		}
		rc.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: groups, Extra: extra}
		return kubernetes.NewForConfigOrDie(rc).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	}
	// cluster-admin may impersonate anything; the key is sent %-encoded by
	// client-go and arrives decoded and lower-cased.
	r, err := as("admin", map[string][]string{"example.com/Scopes": {"read", "write"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Status.UserInfo.Extra["example.com/scopes"]; strings.Join(got, ",") != "read,write" {
		t.Errorf("impersonated extra = %v, want [read write] under example.com/scopes", r.Status.UserInfo.Extra)
	}
	if g := r.Status.UserInfo.Groups; len(g) != 1 || g[0] != "system:authenticated" {
		t.Errorf("impersonated groups = %v, want [system:authenticated]", g)
	}
	if r, err := as("admin", nil, "devs"); err != nil || strings.Join(r.Status.UserInfo.Groups, ",") != "devs,system:authenticated" {
		t.Errorf("impersonating alice in devs: %+v %v, want groups devs,system:authenticated", r, err)
	}
	// Asked for system:unauthenticated, alice is not made authenticated,
	// so system:basic-user's SelfSubjectReview is not hers.
	if _, err := as("admin", nil, "system:unauthenticated"); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `User "alice" cannot create`) {
		t.Errorf("impersonating alice in system:unauthenticated only: %v, want 403 (no system:authenticated)", err)
	}

	// carol may impersonate users and exactly one extra value.
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "impersonate-scopes-read"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"userextras/example.com/scopes"}, ResourceNames: []string{"read"}, Verbs: []string{"impersonate"}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "carol-impersonates"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "impersonate-scopes-read"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "carol"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	within(t, "carol impersonates alice with scopes=read", 5*time.Second, func() bool {
		r, err := as("carol", map[string][]string{"example.com/scopes": {"read"}})
		return err == nil && r.Status.UserInfo.Username == "alice"
	})
	_, err = as("carol", map[string][]string{"example.com/scopes": {"read", "write"}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `userextras/example.com/scopes`) {
		t.Errorf("carol impersonating scopes=write: %v, want 403 naming userextras/example.com/scopes", err)
	}
	_, err = as("carol", map[string][]string{"other": {"read"}})
	if !apierrors.IsForbidden(err) {
		t.Errorf("carol impersonating another extra key: %v, want 403", err)
	}
}
