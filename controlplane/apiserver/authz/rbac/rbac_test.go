package rbac

import (
	"context"
	"errors"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
)

func rule(verbs, groups, resources, names []string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: verbs, APIGroups: groups, Resources: resources, ResourceNames: names}
}

func s(v ...string) []string { return v }

func res(verb, group, resource, sub, ns, name string) authz.Attributes {
	return authz.Attributes{Verb: verb, APIGroup: group, Resource: resource, Subresource: sub, Namespace: ns, Name: name, ResourceRequest: true}
}

func TestRuleAllowsMatchesUpstreamSemantics(t *testing.T) {
	cases := []struct {
		name string
		rule rbacv1.PolicyRule
		a    authz.Attributes
		want bool
	}{
		{"exact", rule(s("get"), s(""), s("pods"), nil), res("get", "", "pods", "", "d", "p"), true},
		{"other verb", rule(s("get"), s(""), s("pods"), nil), res("list", "", "pods", "", "d", ""), false},
		{"other group", rule(s("get"), s("apps"), s("pods"), nil), res("get", "", "pods", "", "d", "p"), false},
		{"verb star", rule(s("*"), s(""), s("pods"), nil), res("delete", "", "pods", "", "d", "p"), true},
		{"group star", rule(s("get"), s("*"), s("deployments"), nil), res("get", "apps", "deployments", "", "d", "x"), true},
		{"resource star covers subresources", rule(s("get"), s(""), s("*"), nil), res("get", "", "pods", "log", "d", "p"), true},
		{"resource does not cover its subresource", rule(s("get"), s(""), s("pods"), nil), res("get", "", "pods", "log", "d", "p"), false},
		{"subresource exact", rule(s("get"), s(""), s("pods/log"), nil), res("get", "", "pods", "log", "d", "p"), true},
		{"subresource does not cover the resource", rule(s("get"), s(""), s("pods/log"), nil), res("get", "", "pods", "", "d", "p"), false},
		{"star subresource", rule(s("update"), s("apps"), s("*/scale"), nil), res("update", "apps", "deployments", "scale", "d", "x"), true},
		{"resource/star is not a wildcard", rule(s("get"), s(""), s("pods/*"), nil), res("get", "", "pods", "log", "d", "p"), false},
		{"resourceNames match", rule(s("get"), s(""), s("secrets"), s("a")), res("get", "", "secrets", "", "d", "a"), true},
		{"resourceNames miss", rule(s("get"), s(""), s("secrets"), s("a")), res("get", "", "secrets", "", "d", "b"), false},
		{"resourceNames refuse nameless list", rule(s("list"), s(""), s("secrets"), s("a")), res("list", "", "secrets", "", "d", ""), false},
		{"non-resource exact", rbacv1.PolicyRule{Verbs: s("get"), NonResourceURLs: s("/healthz")}, authz.Attributes{Verb: "get", Path: "/healthz"}, true},
		{"non-resource prefix star", rbacv1.PolicyRule{Verbs: s("get"), NonResourceURLs: s("/api/*")}, authz.Attributes{Verb: "get", Path: "/api/v1"}, true},
		{"non-resource no prefix", rbacv1.PolicyRule{Verbs: s("get"), NonResourceURLs: s("/api")}, authz.Attributes{Verb: "get", Path: "/api/v1"}, false},
		{"non-resource rule never allows resources", rbacv1.PolicyRule{Verbs: s("*"), NonResourceURLs: s("*")}, res("get", "", "pods", "", "d", "p"), false},
		{"resource rule never allows paths", rule(s("*"), s("*"), s("*"), nil), authz.Attributes{Verb: "get", Path: "/healthz"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := RuleAllows(c.a, &c.rule); got != c.want {
				t.Errorf("RuleAllows = %v, want %v", got, c.want)
			}
		})
	}
}

func crb(name, role string, subjects ...rbacv1.Subject) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, RoleRef: rbacv1.RoleRef{Kind: "ClusterRole", Name: role}, Subjects: subjects}
}

func rb(ns, name, kind, role string, subjects ...rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, RoleRef: rbacv1.RoleRef{Kind: kind, Name: role}, Subjects: subjects}
}

func user(n string) rbacv1.Subject  { return rbacv1.Subject{Kind: rbacv1.UserKind, Name: n} }
func group(n string) rbacv1.Subject { return rbacv1.Subject{Kind: rbacv1.GroupKind, Name: n} }

func TestAuthorizerBindings(t *testing.T) {
	x := NewIndex()
	x.Upsert(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"}, Rules: []rbacv1.PolicyRule{rule(s("get", "list"), s(""), s("pods"), nil)}})
	x.Upsert(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "cm-writer"}, Rules: []rbacv1.PolicyRule{rule(s("create"), s(""), s("configmaps"), nil)}})
	x.Upsert(crb("readers", "pod-reader", group("readers")))
	x.Upsert(rb("team", "alice-cm", "Role", "cm-writer", user("alice")))
	x.Upsert(rb("team", "sa-pods", "ClusterRole", "pod-reader", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "bot"}))
	x.Upsert(rb("team", "dangling", "Role", "missing", user("carol")))
	z := New(x)
	alice := &authn.User{Name: "alice", Groups: []string{"system:authenticated"}}
	bob := &authn.User{Name: "bob", Groups: []string{"readers"}}
	bot := &authn.User{Name: "system:serviceaccount:team:bot"}
	otherBot := &authn.User{Name: "system:serviceaccount:other:bot"}
	carol := &authn.User{Name: "carol"}
	cases := []struct {
		name string
		u    *authn.User
		a    authz.Attributes
		want bool
	}{
		{"role binding grants in its namespace", alice, res("create", "", "configmaps", "", "team", ""), true},
		{"role binding grants nothing elsewhere", alice, res("create", "", "configmaps", "", "other", ""), false},
		{"role binding grants exactly its verb", alice, res("delete", "", "configmaps", "", "team", "x"), false},
		{"group cluster binding grants everywhere", bob, res("list", "", "pods", "", "", ""), true},
		{"group binding grants only its rules", bob, res("delete", "", "pods", "", "d", "p"), false},
		{"service account subject defaults to the binding namespace", bot, res("get", "", "pods", "", "team", "p"), true},
		{"service account of another namespace", otherBot, res("get", "", "pods", "", "team", "p"), false},
		{"no binding", &authn.User{Name: "mallory"}, res("get", "", "pods", "", "team", "p"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.a.User = c.u
			got, reason, err := z.Authorize(context.Background(), c.a)
			if err != nil || got != c.want {
				t.Errorf("Authorize = %v (%q, %v), want %v", got, reason, err, c.want)
			}
		})
	}
	a := res("get", "", "pods", "", "team", "p")
	a.User = carol
	if ok, reason, _ := z.Authorize(context.Background(), a); ok || !strings.Contains(reason, `role.rbac.authorization.k8s.io "missing" not found`) {
		t.Errorf("dangling role: allowed=%v reason %q", ok, reason)
	}
	// Revoking is immediate.
	x.Delete(crb("readers", "", nil...))
	a = res("list", "", "pods", "", "", "")
	a.User = bob
	if ok, _, _ := z.Authorize(context.Background(), a); ok {
		t.Error("deleted binding still grants")
	}
}

func TestConfirmNoEscalation(t *testing.T) {
	x := NewIndex()
	x.Upsert(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "r"}, Rules: []rbacv1.PolicyRule{rule(s("get", "list"), s(""), s("pods"), nil)}})
	x.Upsert(rb("team", "b", "ClusterRole", "r", user("alice")))
	z := New(x)
	alice := &authn.User{Name: "alice"}
	if err := z.ConfirmNoEscalation(alice, "team", []rbacv1.PolicyRule{rule(s("get"), s(""), s("pods"), nil)}); err != nil {
		t.Errorf("granting a held rule: %v", err)
	}
	err := z.ConfirmNoEscalation(alice, "team", []rbacv1.PolicyRule{rule(s("get", "delete"), s(""), s("pods"), nil)})
	if !errors.Is(err, ErrEscalation) || !strings.Contains(err.Error(), `Verbs:["delete"]`) {
		t.Errorf("escalation: %v", err)
	}
	if err := z.ConfirmNoEscalation(alice, "other", []rbacv1.PolicyRule{rule(s("get"), s(""), s("pods"), nil)}); !errors.Is(err, ErrEscalation) {
		t.Errorf("rules held in another namespace count: %v", err)
	}
}

func TestDefaultPolicyLoads(t *testing.T) {
	p, err := bootstrap.Default()
	if err != nil {
		t.Fatal(err)
	}
	x := NewIndex()
	for i := range p.Roles {
		x.Upsert(&p.Roles[i])
	}
	for i := range p.RoleBindings {
		x.Upsert(&p.RoleBindings[i])
	}
	for i := range p.ClusterRoles {
		x.Upsert(&p.ClusterRoles[i])
	}
	for i := range p.ClusterRoleBindings {
		x.Upsert(&p.ClusterRoleBindings[i])
	}
	z := New(x)
	cases := []struct {
		u    *authn.User
		a    authz.Attributes
		want bool
	}{
		{&authn.User{Name: "system:anonymous", Groups: s("system:unauthenticated")}, authz.Attributes{Verb: "get", Path: "/healthz"}, true},
		{&authn.User{Name: "system:anonymous", Groups: s("system:unauthenticated")}, authz.Attributes{Verb: "get", Path: "/api"}, false},
		{&authn.User{Name: "u", Groups: s("system:authenticated")}, authz.Attributes{Verb: "get", Path: "/apis/apps/v1"}, true},
		{&authn.User{Name: "u", Groups: s("system:authenticated")}, res("create", "authorization.k8s.io", "selfsubjectaccessreviews", "", "", ""), true},
		{&authn.User{Name: "u", Groups: s("system:authenticated")}, res("list", "", "pods", "", "default", ""), false},
		{&authn.User{Name: "system:kube-scheduler"}, res("create", "", "pods", "binding", "default", "p"), true},
		{&authn.User{Name: "system:kube-scheduler"}, res("get", "", "secrets", "", "default", "s"), false},
		{&authn.User{Name: "system:kube-proxy"}, res("watch", "discovery.k8s.io", "endpointslices", "", "", ""), true},
		{&authn.User{Name: "system:kube-proxy"}, res("list", "", "secrets", "", "", ""), false},
		{&authn.User{Name: "system:kube-controller-manager"}, res("create", "apps", "replicasets", "", "default", ""), true},
		{&authn.User{Name: "system:kube-controller-manager"}, res("delete", "", "pods", "", "default", "p"), true},
		{&authn.User{Name: "system:kube-controller-manager"}, res("create", "", "services", "", "kube-system", ""), true},
		{&authn.User{Name: "system:kube-controller-manager"}, res("create", "", "services", "", "default", ""), false},
		{&authn.User{Name: "system:node:n1", Groups: s("system:nodes")}, res("list", "", "nodes", "", "", ""), true},
	}
	for _, c := range cases {
		c.a.User = c.u
		got, reason, err := z.Authorize(context.Background(), c.a)
		if err != nil || got != c.want {
			t.Errorf("%s %+v: allowed=%v (%q, %v), want %v", c.u.Name, c.a, got, reason, err, c.want)
		}
	}
	if _, ok := p.ClusterRole("admin"); !ok {
		t.Error("no admin role")
	}
}
