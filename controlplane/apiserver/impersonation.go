package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
)

// impersonate applies the Impersonate-User/-Group/-Uid headers as
// kube-apiserver does: the authenticated user must be allowed the
// "impersonate" verb on users (or serviceaccounts, for a ServiceAccount's
// user name), groups and uids (authentication.k8s.io) named; the request
// then runs as the impersonated user (with system:authenticated). Without
// the headers u is returned unchanged. Impersonate-Extra-* is refused
// (Waggle's users carry no extra fields).
func (s *Server) impersonate(ctx context.Context, r *http.Request, u *authn.User) (*authn.User, error) {
	name := r.Header.Get(authenticationv1.ImpersonateUserHeader)
	groups := r.Header.Values(authenticationv1.ImpersonateGroupHeader)
	uid := r.Header.Get(authenticationv1.ImpersonateUIDHeader)
	hasExtra := false
	for k := range r.Header {
		if strings.HasPrefix(k, authenticationv1.ImpersonateUserExtraHeaderPrefix) {
			hasExtra = true
		}
	}
	if name == "" {
		if len(groups) > 0 || uid != "" || hasExtra {
			return nil, apierrors.NewBadRequest("requested impersonation of groups, uid or extra without impersonating a user")
		}
		return u, nil
	}
	if hasExtra {
		return nil, apierrors.NewBadRequest("impersonating user extra fields is not supported")
	}
	check := func(group, resource, namespace, target string) error {
		a := authz.Attributes{User: u, Verb: "impersonate", APIGroup: group, Resource: resource, Namespace: namespace, Name: target, ResourceRequest: true}
		ok, reason, _ := s.authz.Authorize(ctx, a)
		if !ok {
			msg := fmt.Sprintf("User %q cannot impersonate resource %q in API group %q", u.Name, resource, group)
			if namespace != "" {
				msg += fmt.Sprintf(" in the namespace %q", namespace)
			} else {
				msg += " at the cluster scope"
			}
			if reason != "" {
				msg += ": " + reason
			}
			return apierrors.NewForbidden(schema.GroupResource{Group: group, Resource: resource}, target, fmt.Errorf("%s", msg))
		}
		return nil
	}
	if rest, ok := strings.CutPrefix(name, "system:serviceaccount:"); ok {
		ns, sa, ok := strings.Cut(rest, ":")
		if !ok {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid ServiceAccount user name %q", name))
		}
		if err := check("", "serviceaccounts", ns, sa); err != nil {
			return nil, err
		}
	} else if err := check("", "users", "", name); err != nil {
		return nil, err
	}
	for _, g := range groups {
		if err := check("", "groups", "", g); err != nil {
			return nil, err
		}
	}
	if uid != "" {
		if err := check(authenticationv1.GroupName, "uids", "", uid); err != nil {
			return nil, err
		}
	}
	out := &authn.User{Name: name, UID: uid, Groups: slices.Clone(groups)}
	if rest, ok := strings.CutPrefix(name, "system:serviceaccount:"); ok && len(groups) == 0 {
		ns, _, _ := strings.Cut(rest, ":")
		out.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns}
	}
	if name != "system:anonymous" && !slices.Contains(out.Groups, authn.GroupAuthenticated) {
		out.Groups = append(out.Groups, authn.GroupAuthenticated)
	}
	return out, nil
}
