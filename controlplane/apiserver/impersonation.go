package apiserver

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
)

// impersonate applies the Impersonate-User/-Group/-Uid/-Extra-<key>
// headers as kube-apiserver does: the authenticated user must be allowed
// the "impersonate" verb on users (or serviceaccounts, for a
// ServiceAccount's user name), groups, uids and userextras/<key> (the last
// two in authentication.k8s.io) named; the request then runs as the
// impersonated user, with system:authenticated added unless the groups
// asked for name system:authenticated or system:unauthenticated
// (system:anonymous gets system:unauthenticated instead). Without the
// headers u is returned unchanged.
func (s *Server) impersonate(ctx context.Context, r *http.Request, u *authn.User) (*authn.User, error) {
	name := r.Header.Get(authenticationv1.ImpersonateUserHeader)
	groups := r.Header.Values(authenticationv1.ImpersonateGroupHeader)
	uid := r.Header.Get(authenticationv1.ImpersonateUIDHeader)
	extra := impersonatedExtra(r.Header)
	if name == "" {
		if len(groups) > 0 || uid != "" || len(extra) > 0 {
			return nil, apierrors.NewBadRequest("requested impersonation of groups, uid or extra without impersonating a user")
		}
		return u, nil
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
	// Each value of each extra key is checked on its own, as upstream:
	// impersonate on userextras/<key> named by the value.
	for _, key := range slices.Sorted(maps.Keys(extra)) {
		for _, v := range extra[key] {
			if err := checkExtra(ctx, s, u, key, v); err != nil {
				return nil, err
			}
		}
	}
	out := &authn.User{Name: name, UID: uid, Groups: slices.Clone(groups)}
	if len(extra) > 0 {
		out.Extra = extra
	}
	if rest, ok := strings.CutPrefix(name, "system:serviceaccount:"); ok && len(groups) == 0 {
		ns, _, _ := strings.Cut(rest, ":")
		out.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns}
	}
	if name == authn.UserAnonymous {
		if !slices.Contains(out.Groups, authn.GroupUnauthenticated) {
			out.Groups = append(out.Groups, authn.GroupUnauthenticated)
		}
	} else if !slices.Contains(out.Groups, authn.GroupAuthenticated) && !slices.Contains(out.Groups, authn.GroupUnauthenticated) {
		out.Groups = append(out.Groups, authn.GroupAuthenticated)
	}
	return out, nil
}

// impersonatedExtra reads the Impersonate-Extra-<key> headers: the key is
// lower-cased and %-decoded (a key that does not decode is kept as sent),
// each header value is one value of the key, as upstream.
func impersonatedExtra(h http.Header) map[string][]string {
	var extra map[string][]string
	for k, vs := range h {
		enc, ok := strings.CutPrefix(k, authenticationv1.ImpersonateUserExtraHeaderPrefix)
		if !ok {
			continue
		}
		key := strings.ToLower(enc)
		if dec, err := url.PathUnescape(key); err == nil {
			key = dec
		}
		if extra == nil {
			extra = map[string][]string{}
		}
		extra[key] = append(extra[key], vs...)
	}
	return extra
}

// checkExtra authorizes impersonating one value of an extra key: verb
// impersonate on authentication.k8s.io userextras, subresource key, name
// value.
func checkExtra(ctx context.Context, s *Server, u *authn.User, key, value string) error {
	a := authz.Attributes{User: u, Verb: "impersonate", APIGroup: authenticationv1.GroupName, Resource: "userextras", Subresource: key, Name: value, ResourceRequest: true}
	if ok, reason, _ := s.authz.Authorize(ctx, a); !ok {
		msg := fmt.Sprintf("User %q cannot impersonate resource \"userextras/%s\" in API group %q at the cluster scope", u.Name, key, authenticationv1.GroupName)
		if reason != "" {
			msg += ": " + reason
		}
		return apierrors.NewForbidden(schema.GroupResource{Group: authenticationv1.GroupName, Resource: "userextras"}, value, fmt.Errorf("%s", msg))
	}
	return nil
}
