package rbac

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/component-helpers/auth/rbac/validation"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
)

// ErrEscalation is wrapped by ConfirmNoEscalation's refusals.
var ErrEscalation = errors.New("attempting to grant RBAC permissions not currently held")

// FullAuthority is `*` on everything: what setting an aggregationRule
// requires, since it may gather any rule.
var FullAuthority = []rbacv1.PolicyRule{
	{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}},
	{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}},
}

// ConfirmNoEscalation returns nil when u already holds every rule of want
// in namespace ("" for cluster-wide), as upstream's registry does before a
// Role, ClusterRole or binding is written by someone without the escalate
// or bind verb; otherwise an error listing what is missing.
func (z *Authorizer) ConfirmNoEscalation(u *authn.User, namespace string, want []rbacv1.PolicyRule) error {
	owner, incomplete := z.RulesFor(u, namespace)
	ok, missing := validation.Covers(owner, want)
	if ok {
		return nil
	}
	var b strings.Builder
	for _, r := range compact(missing) {
		b.WriteString("\n")
		b.WriteString(describeRule(r))
	}
	if incomplete {
		b.WriteString("\nRBAC: some bound roles could not be resolved")
	}
	return fmt.Errorf("user %q (groups=%q) is %w:%s", u.Name, u.Groups, ErrEscalation, b.String())
}

// RoleRefRules returns the rules of the role a binding in namespace refers
// to ("" for a ClusterRoleBinding), or an error when it does not exist.
func (z *Authorizer) RoleRefRules(ref rbacv1.RoleRef, namespace string) ([]rbacv1.PolicyRule, error) {
	rules, err := z.roleRules(ref, namespace)
	if err != "" {
		return nil, errors.New(err)
	}
	return rules, nil
}

// compact merges broken-down rules that differ only in verbs, for a
// readable message.
func compact(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, r := range rules {
		merged := false
		for i := range out {
			o := &out[i]
			if slices.Equal(o.APIGroups, r.APIGroups) && slices.Equal(o.Resources, r.Resources) &&
				slices.Equal(o.ResourceNames, r.ResourceNames) && slices.Equal(o.NonResourceURLs, r.NonResourceURLs) {
				for _, v := range r.Verbs {
					if !slices.Contains(o.Verbs, v) {
						o.Verbs = append(o.Verbs, v)
					}
				}
				merged = true
				break
			}
		}
		if !merged {
			out = append(out, *r.DeepCopy())
		}
	}
	return out
}

// describeRule prints a rule as upstream's escalation message does:
// {APIGroups:["apps"], Resources:["deployments"], Verbs:["get"]}.
func describeRule(r rbacv1.PolicyRule) string {
	var parts []string
	q := func(ss []string) string {
		qs := make([]string, len(ss))
		for i, s := range ss {
			qs[i] = fmt.Sprintf("%q", s)
		}
		return "[" + strings.Join(qs, " ") + "]"
	}
	if len(r.APIGroups) > 0 {
		parts = append(parts, "APIGroups:"+q(r.APIGroups))
	}
	if len(r.Resources) > 0 {
		parts = append(parts, "Resources:"+q(r.Resources))
	}
	if len(r.ResourceNames) > 0 {
		parts = append(parts, "ResourceNames:"+q(r.ResourceNames))
	}
	if len(r.NonResourceURLs) > 0 {
		parts = append(parts, "NonResourceURLs:"+q(r.NonResourceURLs))
	}
	parts = append(parts, "Verbs:"+q(r.Verbs))
	return "{" + strings.Join(parts, ", ") + "}"
}
