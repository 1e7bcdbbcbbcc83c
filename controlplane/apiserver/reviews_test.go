package apiserver_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
