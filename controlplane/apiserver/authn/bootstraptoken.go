package authn

import (
	"fmt"
	"net/http"
	"strings"

	corev1listers "k8s.io/client-go/listers/core/v1"
	bootstraptokenutil "k8s.io/cluster-bootstrap/token/util"
	"k8s.io/kubernetes/plugin/pkg/auth/authenticator/token/bootstrap"
)

// bootstrapTokens authenticates Bootstrap Tokens (issue 14, as
// kube-apiserver's --enable-bootstrap-token-auth): bearer tokens of the form
// <id>.<secret> matched against the Secret kube-system/bootstrap-token-<id>
// of type bootstrap.kubernetes.io/token. The checks (type, constant-time
// secret comparison, expiration, usage-bootstrap-authentication, the
// auth-extra-groups) are upstream's own authenticator's.
type bootstrapTokens struct {
	upstream *bootstrap.TokenAuthenticator
}

// NewBootstrapTokens authenticates bootstrap tokens against the Secrets of
// kube-system that lister reads. A token user is system:bootstrap:<id> in
// system:bootstrappers plus the token's auth-extra-groups.
func NewBootstrapTokens(lister corev1listers.SecretNamespaceLister) Authenticator {
	return &bootstrapTokens{upstream: bootstrap.NewTokenAuthenticator(lister)}
}

func (a *bootstrapTokens) Authenticate(r *http.Request) (*User, bool, error) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return nil, false, nil
	}
	tok = strings.TrimSpace(tok)
	if !bootstraptokenutil.IsValidBootstrapToken(tok) {
		// Not a bootstrap token: another authenticator's.
		return nil, false, nil
	}
	resp, ok, err := a.upstream.AuthenticateToken(r.Context(), tok)
	if err != nil {
		return nil, false, fmt.Errorf("bootstrap token: %w", err)
	}
	if !ok {
		// Upstream answers 401 for a bootstrap-shaped token that matches no
		// valid Secret (unknown, expired, wrong secret, not for
		// authentication); it is never anonymous.
		return nil, false, fmt.Errorf("%w: invalid bootstrap token", ErrInvalidCredentials)
	}
	return withAuthenticated(&User{Name: resp.User.GetName(), UID: resp.User.GetUID(), Groups: resp.User.GetGroups()}), true, nil
}
