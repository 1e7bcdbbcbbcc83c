package apiserver

import (
	"context"
	"errors"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac"
)

// installReviews answers the access-review kinds from the server's own
// authenticator and authorizer chain, as kube-apiserver does:
// SelfSubjectReview (who am I), SubjectAccessReview and
// LocalSubjectAccessReview (may this user...), SelfSubjectAccessReview (may
// I...: `kubectl auth can-i`), SelfSubjectRulesReview (what may I do in a
// namespace: `kubectl auth can-i --list`).
func (s *Server) installReviews() error {
	authnGV, authzGV := authenticationv1.SchemeGroupVersion, authorizationv1.SchemeGroupVersion
	for _, h := range []struct {
		gvr schema.GroupVersionResource
		fn  VirtualCreate
	}{
		{authnGV.WithResource("selfsubjectreviews"), s.selfSubjectReview},
		{authnGV.WithResource("tokenreviews"), s.tokenReview},
		{authzGV.WithResource("subjectaccessreviews"), s.subjectAccessReview},
		{authzGV.WithResource("localsubjectaccessreviews"), s.localSubjectAccessReview},
		{authzGV.WithResource("selfsubjectaccessreviews"), s.selfSubjectAccessReview},
		{authzGV.WithResource("selfsubjectrulesreviews"), s.selfSubjectRulesReview},
	} {
		if _, ok := s.catalog.Lookup(h.gvr); !ok {
			continue // not served by this catalog
		}
		if err := s.HandleCreate(h.gvr, h.fn); err != nil {
			return err
		}
	}
	return nil
}

func requester(ctx context.Context) (*authn.User, error) {
	u, ok := authn.UserFrom(ctx)
	if !ok {
		return nil, apierrors.NewUnauthorized("no user on the request")
	}
	return u, nil
}

func (s *Server) selfSubjectReview(ctx context.Context, req *VirtualRequest) (runtime.Object, error) {
	u, err := requester(ctx)
	if err != nil {
		return nil, err
	}
	r := req.Object.(*authenticationv1.SelfSubjectReview)
	r.Status.UserInfo = authenticationv1.UserInfo{Username: u.Name, UID: u.UID, Groups: slices.Clone(u.Groups)}
	for k, v := range u.Extra {
		if r.Status.UserInfo.Extra == nil {
			r.Status.UserInfo.Extra = map[string]authenticationv1.ExtraValue{}
		}
		r.Status.UserInfo.Extra[k] = slices.Clone(v)
	}
	return r, nil
}

// attributesOf turns a review's spec into authorizer attributes, refusing
// a spec that names both or neither kind of attributes (422, as upstream).
func attributesOf(gk schema.GroupKind, u *authn.User, ra *authorizationv1.ResourceAttributes, nra *authorizationv1.NonResourceAttributes) (authz.Attributes, error) {
	spec := field.NewPath("spec")
	switch {
	case ra == nil && nra == nil:
		return authz.Attributes{}, apierrors.NewInvalid(gk, "", field.ErrorList{field.Required(spec.Child("resourceAttributes"), "exactly one of nonResourceAttributes or resourceAttributes must be specified")})
	case ra != nil && nra != nil:
		return authz.Attributes{}, apierrors.NewInvalid(gk, "", field.ErrorList{field.Invalid(spec.Child("nonResourceAttributes"), nra, "cannot be specified in combination with resourceAttributes")})
	case ra != nil:
		return authz.Attributes{User: u, Verb: ra.Verb, APIGroup: ra.Group, APIVersion: ra.Version, Resource: ra.Resource,
			Subresource: ra.Subresource, Namespace: ra.Namespace, Name: ra.Name, ResourceRequest: true}, nil
	}
	return authz.Attributes{User: u, Verb: nra.Verb, Path: nra.Path}, nil
}

func (s *Server) decide(ctx context.Context, a authz.Attributes) authorizationv1.SubjectAccessReviewStatus {
	ok, reason, err := s.authz.Authorize(ctx, a)
	st := authorizationv1.SubjectAccessReviewStatus{Allowed: ok, Reason: reason}
	if err != nil && !ok {
		st.EvaluationError = err.Error()
	}
	return st
}

func reviewedUser(gk schema.GroupKind, spec *authorizationv1.SubjectAccessReviewSpec) (*authn.User, error) {
	if spec.User == "" && len(spec.Groups) == 0 {
		return nil, apierrors.NewInvalid(gk, "", field.ErrorList{field.Required(field.NewPath("spec", "user"), "at least one of user or group must be specified")})
	}
	return &authn.User{Name: spec.User, UID: spec.UID, Groups: slices.Clone(spec.Groups)}, nil
}

// reviewSubject decides a (Local)SubjectAccessReview's spec: the user or
// groups it names, asking for its attributes.
func (s *Server) reviewSubject(ctx context.Context, gk schema.GroupKind, spec *authorizationv1.SubjectAccessReviewSpec) (authorizationv1.SubjectAccessReviewStatus, error) {
	u, err := reviewedUser(gk, spec)
	if err != nil {
		return authorizationv1.SubjectAccessReviewStatus{}, err
	}
	a, err := attributesOf(gk, u, spec.ResourceAttributes, spec.NonResourceAttributes)
	if err != nil {
		return authorizationv1.SubjectAccessReviewStatus{}, err
	}
	return s.decide(ctx, a), nil
}

func (s *Server) subjectAccessReview(ctx context.Context, req *VirtualRequest) (runtime.Object, error) {
	r := req.Object.(*authorizationv1.SubjectAccessReview)
	gk := authorizationv1.SchemeGroupVersion.WithKind("SubjectAccessReview").GroupKind()
	st, err := s.reviewSubject(ctx, gk, &r.Spec)
	if err != nil {
		return nil, err
	}
	r.Status = st
	return r, nil
}

// localSubjectAccessReview is a SubjectAccessReview confined to the
// namespace of its request, as upstream's: the attributes must name it.
func (s *Server) localSubjectAccessReview(ctx context.Context, req *VirtualRequest) (runtime.Object, error) {
	r := req.Object.(*authorizationv1.LocalSubjectAccessReview)
	gk := authorizationv1.SchemeGroupVersion.WithKind("LocalSubjectAccessReview").GroupKind()
	if r.Spec.ResourceAttributes == nil || r.Spec.ResourceAttributes.Namespace != req.Namespace {
		return nil, apierrors.NewInvalid(gk, "", field.ErrorList{field.Invalid(field.NewPath("spec", "resourceAttributes", "namespace"), r.Spec.ResourceAttributes, "must match metadata.namespace")})
	}
	st, err := s.reviewSubject(ctx, gk, &r.Spec)
	if err != nil {
		return nil, err
	}
	r.Status = st
	return r, nil
}

func (s *Server) selfSubjectAccessReview(ctx context.Context, req *VirtualRequest) (runtime.Object, error) {
	u, err := requester(ctx)
	if err != nil {
		return nil, err
	}
	r := req.Object.(*authorizationv1.SelfSubjectAccessReview)
	gk := authorizationv1.SchemeGroupVersion.WithKind("SelfSubjectAccessReview").GroupKind()
	a, err := attributesOf(gk, u, r.Spec.ResourceAttributes, r.Spec.NonResourceAttributes)
	if err != nil {
		return nil, err
	}
	r.Status = s.decide(ctx, a)
	return r, nil
}

func (s *Server) selfSubjectRulesReview(ctx context.Context, req *VirtualRequest) (runtime.Object, error) {
	u, err := requester(ctx)
	if err != nil {
		return nil, err
	}
	r := req.Object.(*authorizationv1.SelfSubjectRulesReview)
	var rules []rbacv1.PolicyRule
	incomplete := false
	if slices.Contains(u.Groups, authn.GroupMasters) && s.authorization != nil && s.authorization.rbac != nil {
		rules = append(rules, rbac.FullAuthority...)
	}
	switch {
	case s.authorization == nil || s.authorization.rbac == nil:
		// AlwaysAllow or an injected authorizer: no rules to list.
		incomplete = true
		r.Status.EvaluationError = errors.New("the server's authorizer does not list rules").Error()
	default:
		rs, inc := s.authorization.rbac.RulesFor(u, r.Spec.Namespace)
		rules, incomplete = append(rules, rs...), inc
	}
	r.Status.ResourceRules, r.Status.NonResourceRules = nil, nil
	for _, p := range rules {
		if len(p.NonResourceURLs) > 0 {
			r.Status.NonResourceRules = append(r.Status.NonResourceRules, authorizationv1.NonResourceRule{Verbs: p.Verbs, NonResourceURLs: p.NonResourceURLs})
			continue
		}
		r.Status.ResourceRules = append(r.Status.ResourceRules, authorizationv1.ResourceRule{Verbs: p.Verbs, APIGroups: p.APIGroups, Resources: p.Resources, ResourceNames: p.ResourceNames})
	}
	r.Status.Incomplete = incomplete
	return r, nil
}
