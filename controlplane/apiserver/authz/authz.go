// Package authz decides whether an authenticated user may do what a request
// asks. AttributesFrom turns an HTTP request into Kubernetes' request
// attributes (verb, API group and version, resource, subresource,
// namespace, name; or a non-resource path), the same vocabulary RBAC
// speaks, and an Authorizer answers allow or deny for them.
//
// Today the server runs AlwaysAllow behind authentication. RBAC and node
// restriction come later as further Authorizers chained with Union; this
// package does not hold them and is not admission (which may mutate).
package authz

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/fields"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
)

// Attributes of one request, as Kubernetes' authorizer sees them.
type Attributes struct {
	User            *authn.User
	Verb            string
	APIGroup        string
	APIVersion      string
	Resource        string
	Subresource     string
	Namespace       string
	Name            string
	Path            string
	ResourceRequest bool
	// FieldSelector is the request's raw fieldSelector (lists and
	// watches), which the Node authorizer checks.
	FieldSelector string
}

// String is a short human form used in denial messages and logs.
func (a Attributes) String() string {
	user := "<anonymous>"
	if a.User != nil {
		user = a.User.Name
	}
	if !a.ResourceRequest {
		return fmt.Sprintf("user %q cannot %s path %q", user, a.Verb, a.Path)
	}
	res := a.Resource
	if a.Subresource != "" {
		res += "/" + a.Subresource
	}
	where := "at the cluster scope"
	if a.Namespace != "" {
		where = fmt.Sprintf("in the namespace %q", a.Namespace)
	}
	return fmt.Sprintf("user %q cannot %s resource %q in API group %q %s", user, a.Verb, res, a.APIGroup, where)
}

// Authorizer decides on one request. An error means it could not decide.
type Authorizer interface {
	Authorize(ctx context.Context, a Attributes) (allowed bool, reason string, err error)
}

// AlwaysAllow allows everything.
type AlwaysAllow struct{}

// Authorize allows.
func (AlwaysAllow) Authorize(context.Context, Attributes) (bool, string, error) { return true, "", nil }

// AlwaysDeny denies everything (useful to test the chain).
type AlwaysDeny struct{}

// Authorize denies.
func (AlwaysDeny) Authorize(context.Context, Attributes) (bool, string, error) {
	return false, "all requests are denied", nil
}

// Func adapts a function to Authorizer.
type Func func(ctx context.Context, a Attributes) (bool, string, error)

// Authorize calls f.
func (f Func) Authorize(ctx context.Context, a Attributes) (bool, string, error) { return f(ctx, a) }

type union []Authorizer

// Union asks each authorizer in order; the first allow wins. When none
// allows, the reasons are joined; errors are returned only when nobody
// allowed (so one broken authorizer does not block what another allows).
func Union(as ...Authorizer) Authorizer { return union(as) }

func (u union) Authorize(ctx context.Context, a Attributes) (bool, string, error) {
	var reasons []string
	var errs []error
	for _, z := range u {
		if z == nil {
			continue
		}
		ok, reason, err := z.Authorize(ctx, a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			return true, reason, nil
		}
		if reason != "" {
			reasons = append(reasons, reason)
		}
	}
	return false, strings.Join(reasons, "; "), errors.Join(errs...)
}

// AttributesFrom parses r's path and method into attributes, as
// kube-apiserver's RequestInfoFactory does:
//
//	/api/v1/namespaces/{ns}/{resource}/{name}/{subresource}
//	/apis/{group}/{version}/{resource}/{name}
//	/api/v1/watch/...            (deprecated watch prefix)
//
// GET is get with a name, list without (watch with ?watch=true); POST
// create; PUT update; PATCH patch; DELETE delete with a name and
// deletecollection without. Anything else (/healthz, /api, /apis/apps,
// /openapi/v2, /version) is a non-resource request whose verb is the
// lower-cased method.
func AttributesFrom(r *http.Request, user *authn.User) Attributes {
	a := Attributes{User: user, Path: r.URL.Path, Verb: strings.ToLower(r.Method)}
	parts := splitPath(r.URL.Path)
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		a.APIVersion, parts = parts[1], parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		a.APIGroup, a.APIVersion, parts = parts[1], parts[2], parts[3:]
	default:
		return a
	}
	if len(parts) == 0 {
		// /api/v1, /apis/apps/v1: discovery documents.
		a.APIGroup, a.APIVersion = "", ""
		return a
	}
	q := r.URL.Query()
	watchPrefix := false
	if parts[0] == "watch" {
		watchPrefix, parts = true, parts[1:]
	}
	if len(parts) == 0 || parts[0] == "" {
		return a
	}
	a.ResourceRequest = true
	if len(parts) >= 2 && parts[0] == "namespaces" {
		a.Namespace = parts[1]
		if len(parts) >= 3 {
			parts = parts[2:]
		} else {
			// /namespaces/{name}: the namespace object itself.
			parts = []string{"namespaces", parts[1]}
		}
	}
	// A namespace's own subresources: /namespaces/{ns}/status|finalize.
	if a.Namespace != "" && len(parts) == 1 && (parts[0] == "status" || parts[0] == "finalize") {
		parts = []string{"namespaces", a.Namespace, parts[0]}
	}
	if len(parts) > 0 {
		a.Resource = parts[0]
	}
	if len(parts) > 1 {
		a.Name = parts[1]
	}
	if len(parts) > 2 {
		a.Subresource = parts[2] // proxy paths keep only "proxy"
	}

	isWatch := watchPrefix || truthy(q.Get("watch"))
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		switch {
		case isWatch:
			a.Verb = "watch"
		case a.Name == "":
			a.Verb = "list"
		default:
			a.Verb = "get"
		}
	case http.MethodPost:
		a.Verb = "create"
	case http.MethodPut:
		a.Verb = "update"
	case http.MethodPatch:
		a.Verb = "patch"
	case http.MethodDelete:
		if a.Name == "" {
			a.Verb = "deletecollection"
		} else {
			a.Verb = "delete"
		}
	}
	// A list or watch narrowed to one name by field selector is about that
	// name (kubectl get pod x -w does this), as in Kubernetes.
	if a.Verb == "list" || a.Verb == "watch" || a.Verb == "deletecollection" {
		a.FieldSelector = q.Get("fieldSelector")
	}
	if (a.Verb == "list" || a.Verb == "watch" || a.Verb == "deletecollection") && a.Name == "" {
		if fs := a.FieldSelector; fs != "" {
			if sel, err := fields.ParseSelector(fs); err == nil {
				if name, ok := sel.RequiresExactMatch("metadata.name"); ok {
					a.Name = name
				}
			}
		}
	}
	return a
}

func truthy(s string) bool { return s == "true" || s == "1" }

func splitPath(p string) []string {
	p = strings.Trim(p, "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}
