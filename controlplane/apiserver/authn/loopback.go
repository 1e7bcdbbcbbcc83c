package authn

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"
)

// LoopbackUser is the identity of the API server's own clients (the
// informers of its admission plugins), as kube-apiserver's loopback
// client: system:apiserver in system:masters.
var LoopbackUser = User{Name: "system:apiserver", Groups: []string{"system:masters", GroupAuthenticated}}

// Loopback authenticates the bearer token of the server's own loopback
// client. The token is random per process and never written anywhere.
type Loopback struct{ token string }

// NewLoopback makes a fresh random token.
func NewLoopback() *Loopback {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return &Loopback{token: base64.RawURLEncoding.EncodeToString(b)}
}

// Token is the bearer token the loopback client sends.
func (l *Loopback) Token() string { return l.token }

// Authenticate recognizes the loopback token and nothing else.
func (l *Loopback) Authenticate(r *http.Request) (*User, bool, error) {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(l.token)) != 1 {
		return nil, false, nil
	}
	u := LoopbackUser
	return &u, true, nil
}
