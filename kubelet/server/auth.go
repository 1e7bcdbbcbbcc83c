package server

import (
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// Auth is how the kubelet API decides who may call it, as upstream's
// kubelet does with --authentication-token-webhook, --client-ca-file and
// --authorization-mode=Webhook: an Authenticator (client certificates of the
// client CA, bearer tokens by TokenReview, anonymous when enabled) and an
// Authorizer (a SubjectAccessReview per request against the node's
// subresources, see RequestAttributes).
type Auth struct {
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	// NodeName is the name in the attributes (nodes/<NodeName>/proxy...).
	NodeName string
}

// The kubelet API paths whose subresource is not nodes/proxy, as upstream's
// kubelet (pkg/kubelet/server/auth.go, KubeletFineGrainedAuthz GA in 1.36).
const (
	podsPath          = "/pods"
	runningPodsPath   = "/runningpods/"
	allocatedPodsPath = "/allocatedPods"
	healthzPath       = "/healthz"
	configzPath       = "/configz"
	statsPath         = "/stats/"
	metricsPath       = "/metrics"
	logsPath          = "/logs/"
	checkpointPath    = "/checkpoint/"
	statuszPath       = "/statusz"
	flagzPath         = "/flagz"
)

func isSubpath(subpath, path string) bool {
	path = strings.TrimSuffix(path, "/")
	return subpath == path || (strings.HasPrefix(subpath, path) && subpath[len(path)] == '/')
}

// RequestAttributes are the authorization attributes of a kubelet API
// request, one per candidate subresource of the node (the request is allowed
// when any is): the verb from the method (GET get, POST create, PUT update,
// PATCH patch, DELETE delete), resource nodes, name the node, and the
// subresource from the path — /pods, /runningpods and /allocatedPods are
// nodes/pods then nodes/proxy, /healthz nodes/healthz then nodes/proxy,
// /configz nodes/configz then nodes/proxy; /stats nodes/stats, /metrics
// nodes/metrics, /logs nodes/log, /checkpoint nodes/checkpoint, /statusz
// nodes/statusz, /flagz nodes/configz; everything else (exec, run, attach,
// portForward, containerLogs) nodes/proxy.
func RequestAttributes(node string, u user.Info, r *http.Request) []authorizer.Attributes {
	verb := ""
	switch r.Method {
	case http.MethodPost:
		verb = "create"
	case http.MethodGet, http.MethodHead:
		verb = "get"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	}
	p := r.URL.Path
	var subs []string
	switch {
	case isSubpath(p, allocatedPodsPath), isSubpath(p, podsPath), isSubpath(p, runningPodsPath):
		subs = append(subs, "pods")
	case isSubpath(p, healthzPath):
		subs = append(subs, "healthz")
	case isSubpath(p, configzPath):
		subs = append(subs, "configz")
	}
	switch {
	case isSubpath(p, statsPath):
		subs = append(subs, "stats")
	case isSubpath(p, metricsPath):
		subs = append(subs, "metrics")
	case isSubpath(p, logsPath):
		subs = append(subs, "log")
	case isSubpath(p, checkpointPath):
		subs = append(subs, "checkpoint")
	case isSubpath(p, statuszPath):
		subs = append(subs, "statusz")
	case isSubpath(p, flagzPath):
		subs = append(subs, "configz")
	default:
		subs = append(subs, "proxy")
	}
	attrs := make([]authorizer.Attributes, 0, len(subs))
	for _, s := range subs {
		attrs = append(attrs, authorizer.AttributesRecord{
			User: u, Verb: verb, APIVersion: "v1", Resource: "nodes", Subresource: s,
			Name: node, ResourceRequest: true, Path: p,
		})
	}
	return attrs
}

// filter authenticates and authorizes every request before next, with
// upstream's answers: 401 "Unauthorized" when no credential is recognized,
// 403 "Forbidden (user=..., verb=..., resource=nodes, subresource(s)=[...])"
// when no attribute is allowed, 500 when the authorizer fails.
func (s *Server) filter(next http.Handler) http.Handler {
	a := s.cfg.Auth
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a == nil || a.Authenticator == nil || a.Authorizer == nil {
			plain(w, http.StatusUnauthorized, "Unauthorized")
			return
		}
		resp, ok, err := a.Authenticator.AuthenticateRequest(r)
		if err != nil {
			s.cfg.Log.Info("kubelet API: unable to authenticate the request", "err", err, "remote", r.RemoteAddr)
		}
		if err != nil || !ok {
			plain(w, http.StatusUnauthorized, "Unauthorized")
			return
		}
		attrs := RequestAttributes(a.NodeName, resp.User, r)
		subs := make([]string, 0, len(attrs))
		for _, attr := range attrs {
			subs = append(subs, attr.GetSubresource())
			decision, _, err := a.Authorizer.Authorize(r.Context(), attr)
			if err != nil {
				s.cfg.Log.Error("kubelet API: authorization error", "err", err, "user", resp.User.GetName(), "verb", attr.GetVerb(), "subresource", attr.GetSubresource())
				plain(w, http.StatusInternalServerError, fmt.Sprintf("Authorization error (user=%s, verb=%s, resource=%s, subresource=%s)",
					resp.User.GetName(), attr.GetVerb(), attr.GetResource(), attr.GetSubresource()))
				return
			}
			if decision == authorizer.DecisionAllow {
				// The request reaches the handler with the credential
				// consumed, as upstream: no Authorization header is
				// passed on.
				r.Header.Del("Authorization")
				next.ServeHTTP(w, r)
				return
			}
		}
		s.cfg.Log.Info("kubelet API: forbidden", "user", resp.User.GetName(), "verb", attrs[0].GetVerb(), "subresources", subs, "path", r.URL.Path)
		plain(w, http.StatusForbidden, fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=%s, subresource(s)=%v)\n",
			resp.User.GetName(), attrs[0].GetVerb(), attrs[0].GetResource(), subs))
	})
}

func plain(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	fmt.Fprint(w, msg)
}
