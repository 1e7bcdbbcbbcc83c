// Package authn authenticates API requests: it turns an x509 client
// certificate or a static bearer token into a User (name, uid, groups) and
// carries that user in the request's context.
//
// An Authenticator answers (user, true, nil) when its credential is present
// and valid, (nil, false, nil) when it does not apply (no certificate, no
// token), and an error when a credential is present but invalid — the server
// answers 401 then. Union tries each in turn. Bearer adapts a
// TokenAuthenticator (service-account JWTs: package serviceaccount) to a
// request authenticator; the audiences a token must be meant for ride in the
// context (WithAudiences). It is not authorization (see package authz), and
// it holds no OIDC.
package authn

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/binary"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Well-known groups.
const (
	GroupAuthenticated   = "system:authenticated"
	GroupUnauthenticated = "system:unauthenticated"
	GroupMasters         = "system:masters"
	// UserAnonymous is the user of a request without credentials (when
	// anonymous requests are allowed).
	UserAnonymous = "system:anonymous"
)

// ErrInvalidCredentials is wrapped by every error for a credential that is
// present but wrong.
var ErrInvalidCredentials = errors.New("invalid credentials")

// User is an authenticated identity.
type User struct {
	Name   string
	UID    string
	Groups []string
	// Extra is the authenticator's extra information (a service-account
	// token's pod name and uid, node name and uid, credential id), as
	// user.Info's GetExtra upstream.
	Extra map[string][]string
}

// TokenAuthenticator authenticates a bearer token, with the same answers
// as Authenticator.
type TokenAuthenticator interface {
	AuthenticateToken(ctx context.Context, token string) (*User, bool, error)
}

type audiencesKey struct{}

// WithAudiences returns ctx asking token authenticators for a token meant
// for one of auds (a TokenReview's spec.audiences); without it they use
// the server's own --api-audiences.
func WithAudiences(ctx context.Context, auds []string) context.Context {
	return context.WithValue(ctx, audiencesKey{}, auds)
}

// AudiencesFrom returns the audiences WithAudiences put in ctx.
func AudiencesFrom(ctx context.Context) ([]string, bool) {
	a, ok := ctx.Value(audiencesKey{}).([]string)
	return a, ok
}

type bearer struct{ t TokenAuthenticator }

// Bearer authenticates requests by their `Authorization: Bearer` token
// through t; requests without a bearer token do not apply.
func Bearer(t TokenAuthenticator) Authenticator { return bearer{t} }

func (b bearer) Authenticate(r *http.Request) (*User, bool, error) {
	tok, ok := BearerToken(r)
	if !ok {
		return nil, false, nil
	}
	u, ok, err := b.t.AuthenticateToken(r.Context(), tok)
	if err != nil || !ok {
		return nil, false, err
	}
	return withAuthenticated(u), true, nil
}

// BearerToken returns the request's bearer token, if it has one.
func BearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// Authenticator authenticates one request.
type Authenticator interface {
	Authenticate(r *http.Request) (*User, bool, error)
}

type ctxKey struct{}

// WithUser returns ctx carrying u.
func WithUser(ctx context.Context, u *User) context.Context {
	return context.WithValue(ctx, ctxKey{}, u)
}

// UserFrom returns the user carried by ctx.
func UserFrom(ctx context.Context) (*User, bool) {
	u, ok := ctx.Value(ctxKey{}).(*User)
	return u, ok && u != nil
}

// withAuthenticated returns a copy of u with system:authenticated added.
func withAuthenticated(u *User) *User {
	c := *u
	c.Groups = slices.Clone(u.Groups)
	if !slices.Contains(c.Groups, GroupAuthenticated) {
		c.Groups = append(c.Groups, GroupAuthenticated)
	}
	return &c
}

// x509Auth authenticates verified client certificates.
type x509Auth struct {
	pool *x509.CertPool
	// now is the clock the chains are verified against (time.Now).
	now func() time.Time

	// verified remembers the chains that verified, by the digest of the
	// certificates the client presented, with the time window in which the
	// chain found stays valid: a client sends the same certificates on
	// every request of a connection (and of every connection it makes), and
	// verifying them again (an ECDSA or RSA signature check per
	// certificate) cost as much as the rest of the authentication and
	// authorization of a create. Only successes are kept; the pool is
	// fixed, so what verified once verifies again inside its window.
	mu       sync.Mutex
	verified map[[sha256.Size]byte]validity
}

// validity is the window in which every certificate of a verified chain is
// valid.
type validity struct{ notBefore, notAfter time.Time }

// maxVerified bounds the remembered chains; past it the memory starts over.
const maxVerified = 4096

// NewX509 authenticates requests whose TLS client certificate chains to pool:
// the subject's common name is the user, its organizations the groups.
// Verification happens here (not only in the TLS handshake) so that the
// authenticator stays correct behind any TLS configuration.
func NewX509(pool *x509.CertPool) Authenticator { return newX509(pool, time.Now) }

func newX509(pool *x509.CertPool, now func() time.Time) *x509Auth {
	return &x509Auth{pool: pool, now: now, verified: map[[sha256.Size]byte]validity{}}
}

func (a *x509Auth) Authenticate(r *http.Request) (*User, bool, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil, false, nil
	}
	if err := a.verify(r.TLS.PeerCertificates); err != nil {
		return nil, false, err
	}
	leaf := r.TLS.PeerCertificates[0]
	if leaf.Subject.CommonName == "" {
		return nil, false, fmt.Errorf("%w: client certificate has no common name", ErrInvalidCredentials)
	}
	return withAuthenticated(&User{Name: leaf.Subject.CommonName, Groups: slices.Clone(leaf.Subject.Organization)}), true, nil
}

// verify checks that the presented certificates (leaf first, then
// intermediates) chain to the pool for client authentication now.
func (a *x509Auth) verify(certs []*x509.Certificate) error {
	now := a.now()
	h := sha256.New()
	var n [8]byte
	for _, c := range certs {
		binary.BigEndian.PutUint64(n[:], uint64(len(c.Raw)))
		h.Write(n[:])
		h.Write(c.Raw)
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	a.mu.Lock()
	v, ok := a.verified[key]
	a.mu.Unlock()
	if ok && !now.Before(v.notBefore) && !now.After(v.notAfter) {
		return nil
	}
	leaf := certs[0]
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{
		Roots:         a.pool,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return fmt.Errorf("%w: client certificate %q: %v", ErrInvalidCredentials, leaf.Subject.CommonName, err)
	}
	if len(chains) == 0 {
		return nil
	}
	v = validity{notBefore: chains[0][0].NotBefore, notAfter: chains[0][0].NotAfter}
	for _, c := range chains[0][1:] {
		if c.NotBefore.After(v.notBefore) {
			v.notBefore = c.NotBefore
		}
		if c.NotAfter.Before(v.notAfter) {
			v.notAfter = c.NotAfter
		}
	}
	a.mu.Lock()
	if len(a.verified) >= maxVerified {
		clear(a.verified)
	}
	a.verified[key] = v
	a.mu.Unlock()
	return nil
}

type tokenEntry struct {
	token []byte
	user  User
}

type tokenFile struct{ entries []tokenEntry }

// NewTokenFile reads a static token file in kube-apiserver's format: one CSV
// line per token, `token,user,uid[,"group1,group2"]`. Blank lines and lines
// starting with # are ignored. A malformed file is refused with its line
// number.
func NewTokenFile(path string) (Authenticator, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	a, err := parseTokenFile(f)
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return a, nil
}

func parseTokenFile(rd io.Reader) (*tokenFile, error) {
	r := csv.NewReader(rd)
	r.FieldsPerRecord = -1
	r.TrimLeadingSpace = true
	r.Comment = '#'
	a := &tokenFile{}
	seen := map[string]int{}
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err // csv errors carry the line
		}
		line, _ := r.FieldPos(0)
		if len(rec) < 3 {
			return nil, fmt.Errorf("line %d: want token,user,uid[,\"groups\"], got %d field(s)", line, len(rec))
		}
		tok, name, uid := strings.TrimSpace(rec[0]), strings.TrimSpace(rec[1]), strings.TrimSpace(rec[2])
		switch {
		case tok == "":
			return nil, fmt.Errorf("line %d: empty token", line)
		case name == "":
			return nil, fmt.Errorf("line %d: empty user name", line)
		}
		if prev, dup := seen[tok]; dup {
			return nil, fmt.Errorf("line %d: token already defined on line %d", line, prev)
		}
		seen[tok] = line
		u := User{Name: name, UID: uid}
		if len(rec) >= 4 {
			for _, g := range strings.Split(rec[3], ",") {
				if g = strings.TrimSpace(g); g != "" {
					u.Groups = append(u.Groups, g)
				}
			}
		}
		a.entries = append(a.entries, tokenEntry{token: []byte(tok), user: u})
	}
	return a, nil
}

func (a *tokenFile) Authenticate(r *http.Request) (*User, bool, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, false, nil
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return nil, false, nil
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return nil, false, fmt.Errorf("%w: empty bearer token", ErrInvalidCredentials)
	}
	var found *User
	b := []byte(tok)
	// Compare against every entry in constant time so neither the position
	// of a match nor a near-miss shows in the timing.
	for i := range a.entries {
		if subtle.ConstantTimeCompare(a.entries[i].token, b) == 1 {
			found = &a.entries[i].user
		}
	}
	if found == nil {
		return nil, false, fmt.Errorf("%w: unknown bearer token", ErrInvalidCredentials)
	}
	return withAuthenticated(found), true, nil
}

type union []Authenticator

// Union tries each authenticator in order: the first that applies decides.
// When none applies but one reported an invalid credential, that error is
// returned (so a wrong token is a 401, not anonymous).
func Union(as ...Authenticator) Authenticator { return union(as) }

func (u union) Authenticate(r *http.Request) (*User, bool, error) {
	var errs []error
	for _, a := range u {
		if a == nil {
			continue
		}
		user, ok, err := a.Authenticate(r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			return user, true, nil
		}
	}
	if len(errs) > 0 {
		return nil, false, errors.Join(errs...)
	}
	return nil, false, nil
}
