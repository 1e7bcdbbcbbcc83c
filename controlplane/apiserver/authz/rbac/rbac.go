// Package rbac is the RBAC authorizer: it allows a request when a
// ClusterRoleBinding, or a RoleBinding in the request's namespace, binds
// the user (by name, group or ServiceAccount) to a role with a rule that
// covers the request, with upstream Kubernetes' semantics: verbs, API
// groups, resources with subresources ("pods/log", "*/scale"), `*`,
// resourceNames, and nonResourceURLs with trailing-`*` prefixes.
//
// The roles and bindings come from a Source; Index is the in-memory,
// subject-indexed Source the API server feeds from its watch caches, so a
// decision costs the bindings that name the user and its groups, not every
// binding in the cluster. Escalation checks (a user may grant only what it
// holds) are in escalation.go. This package does not store or serve the RBAC
// objects, and it holds no default policy (see package bootstrap).
package rbac

import (
	"context"
	"fmt"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
)

// Source gives the authorizer the RBAC objects. The binding methods may
// return a superset of the bindings that apply to u; the authorizer checks
// every subject itself. Returned objects are shared: never mutate them.
type Source interface {
	ClusterRoleBindingsFor(u *authn.User) []*rbacv1.ClusterRoleBinding
	RoleBindingsFor(namespace string, u *authn.User) []*rbacv1.RoleBinding
	ClusterRole(name string) (*rbacv1.ClusterRole, bool)
	Role(namespace, name string) (*rbacv1.Role, bool)
}

// Authorizer is the RBAC authorizer.
type Authorizer struct{ src Source }

// New returns an RBAC authorizer over src.
func New(src Source) *Authorizer { return &Authorizer{src: src} }

// Authorize allows a when a bound rule covers it. A denial carries no
// reason unless a binding referred to a role that does not exist (as
// upstream, the caller adds the "cannot" sentence).
func (z *Authorizer) Authorize(_ context.Context, a authz.Attributes) (bool, string, error) {
	if a.User == nil {
		return false, "", nil
	}
	var allowedBy string
	var missing []string
	z.visit(a.User, a.Namespace, func(source string, rules []rbacv1.PolicyRule, err string) bool {
		if err != "" {
			missing = append(missing, err)
			return true
		}
		for i := range rules {
			if RuleAllows(a, &rules[i]) {
				allowedBy = source
				return false
			}
		}
		return true
	})
	if allowedBy != "" {
		return true, "RBAC: allowed by " + allowedBy, nil
	}
	if len(missing) > 0 {
		return false, "RBAC: " + strings.Join(missing, ", "), nil
	}
	return false, "", nil
}

// RulesFor returns the rules that apply to u in namespace (cluster-wide
// rules included), and whether some binding's role could not be resolved
// (SelfSubjectRulesReview's incomplete flag).
func (z *Authorizer) RulesFor(u *authn.User, namespace string) (rules []rbacv1.PolicyRule, incomplete bool) {
	z.visit(u, namespace, func(_ string, rs []rbacv1.PolicyRule, err string) bool {
		if err != "" {
			incomplete = true
			return true
		}
		rules = append(rules, rs...)
		return true
	})
	return rules, incomplete
}

// visit calls fn with the rules of every role bound to u, cluster role
// bindings first, then the role bindings of namespace, until fn returns
// false. source describes the binding; err is set (and rules nil) when its
// role is missing.
func (z *Authorizer) visit(u *authn.User, namespace string, fn func(source string, rules []rbacv1.PolicyRule, err string) bool) {
	for _, b := range z.src.ClusterRoleBindingsFor(u) {
		subj, ok := appliesTo(u, b.Subjects, "")
		if !ok {
			continue
		}
		rules, err := z.roleRules(b.RoleRef, "")
		if !fn(describe("ClusterRoleBinding", b.Name, "", b.RoleRef, subj), rules, err) {
			return
		}
	}
	if namespace == "" {
		return
	}
	for _, b := range z.src.RoleBindingsFor(namespace, u) {
		subj, ok := appliesTo(u, b.Subjects, namespace)
		if !ok {
			continue
		}
		rules, err := z.roleRules(b.RoleRef, namespace)
		if !fn(describe("RoleBinding", b.Name, namespace, b.RoleRef, subj), rules, err) {
			return
		}
	}
}

func (z *Authorizer) roleRules(ref rbacv1.RoleRef, namespace string) ([]rbacv1.PolicyRule, string) {
	switch ref.Kind {
	case "ClusterRole":
		if r, ok := z.src.ClusterRole(ref.Name); ok {
			return r.Rules, ""
		}
		return nil, fmt.Sprintf("clusterrole.rbac.authorization.k8s.io %q not found", ref.Name)
	case "Role":
		if namespace != "" {
			if r, ok := z.src.Role(namespace, ref.Name); ok {
				return r.Rules, ""
			}
		}
		return nil, fmt.Sprintf("role.rbac.authorization.k8s.io %q not found", ref.Name)
	}
	return nil, fmt.Sprintf("unsupported role reference kind: %q", ref.Kind)
}

func describe(kind, name, namespace string, ref rbacv1.RoleRef, s *rbacv1.Subject) string {
	b := fmt.Sprintf("%s %q", kind, name)
	if namespace != "" {
		b = fmt.Sprintf("%s %q", kind, namespace+"/"+name)
	}
	subj := fmt.Sprintf("%s %q", s.Kind, s.Name)
	if s.Kind == rbacv1.ServiceAccountKind {
		subj = fmt.Sprintf("%s %q", s.Kind, s.Namespace+"/"+s.Name)
	}
	return fmt.Sprintf("%s of %s %q to %s", b, ref.Kind, ref.Name, subj)
}

// appliesTo returns the first subject that names u. A ServiceAccount
// subject without a namespace means the binding's namespace.
func appliesTo(u *authn.User, subjects []rbacv1.Subject, bindingNamespace string) (*rbacv1.Subject, bool) {
	for i := range subjects {
		s := &subjects[i]
		switch s.Kind {
		case rbacv1.UserKind:
			if s.Name == u.Name {
				return s, true
			}
		case rbacv1.GroupKind:
			if slices.Contains(u.Groups, s.Name) {
				return s, true
			}
		case rbacv1.ServiceAccountKind:
			ns := s.Namespace
			if ns == "" {
				ns = bindingNamespace
			}
			if ns != "" && u.Name == ServiceAccountUsername(ns, s.Name) {
				return s, true
			}
		}
	}
	return nil, false
}

// ServiceAccountUsername is the user name a ServiceAccount authenticates as.
func ServiceAccountUsername(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// RuleAllows reports whether rule covers the request a.
func RuleAllows(a authz.Attributes, rule *rbacv1.PolicyRule) bool {
	if !verbMatches(rule, a.Verb) {
		return false
	}
	if !a.ResourceRequest {
		return nonResourceURLMatches(rule, a.Path)
	}
	return apiGroupMatches(rule, a.APIGroup) &&
		resourceMatches(rule, a.Resource, a.Subresource) &&
		resourceNameMatches(rule, a.Name)
}

func verbMatches(rule *rbacv1.PolicyRule, verb string) bool {
	for _, v := range rule.Verbs {
		if v == rbacv1.VerbAll || v == verb {
			return true
		}
	}
	return false
}

func apiGroupMatches(rule *rbacv1.PolicyRule, group string) bool {
	for _, g := range rule.APIGroups {
		if g == rbacv1.APIGroupAll || g == group {
			return true
		}
	}
	return false
}

// resourceMatches: "*" matches everything, "pods" only pods itself,
// "pods/log" that subresource, "*/scale" the scale subresource of any
// resource.
func resourceMatches(rule *rbacv1.PolicyRule, resource, subresource string) bool {
	combined := resource
	if subresource != "" {
		combined = resource + "/" + subresource
	}
	for _, r := range rule.Resources {
		switch {
		case r == rbacv1.ResourceAll, r == combined:
			return true
		case subresource != "" && strings.HasPrefix(r, "*/") && r[2:] == subresource:
			return true
		}
	}
	return false
}

// resourceNameMatches: no resourceNames allows any name (and nameless
// requests such as list and create); otherwise the request's name must be
// listed, so a nameless request is not allowed.
func resourceNameMatches(rule *rbacv1.PolicyRule, name string) bool {
	if len(rule.ResourceNames) == 0 {
		return true
	}
	return slices.Contains(rule.ResourceNames, name)
}

func nonResourceURLMatches(rule *rbacv1.PolicyRule, path string) bool {
	for _, u := range rule.NonResourceURLs {
		switch {
		case u == rbacv1.NonResourceAll, u == path:
			return true
		case strings.HasSuffix(u, "*") && strings.HasPrefix(path, strings.TrimSuffix(u, "*")):
			return true
		}
	}
	return false
}

// PrivilegedGroups allows every request of a user in one of groups
// (system:masters), before and regardless of RBAC, as kube-apiserver does.
type PrivilegedGroups []string

// Authorize allows members of the groups.
func (p PrivilegedGroups) Authorize(_ context.Context, a authz.Attributes) (bool, string, error) {
	if a.User == nil {
		return false, "", nil
	}
	for _, g := range p {
		if slices.Contains(a.User.Groups, g) {
			return true, "", nil
		}
	}
	return false, "", nil
}
