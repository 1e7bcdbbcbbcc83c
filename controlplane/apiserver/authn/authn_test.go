package authn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
)

// authServer serves the authenticated user as JSON, 401 on error, 204 when
// no authenticator applied.
func authServer(t *testing.T, b *pki.Bundle, a Authenticator) *httptest.Server {
	t.Helper()
	cfg, err := b.ServerTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, ok, err := a.Authenticate(r)
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusUnauthorized)
		case !ok:
			w.WriteHeader(http.StatusNoContent)
		default:
			ctx := WithUser(r.Context(), u)
			got, _ := UserFrom(ctx)
			json.NewEncoder(w).Encode(got)
		}
	}))
	srv.TLS = cfg
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func client(t *testing.T, caPEM []byte, certPEM, keyPEM []byte) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("bad CA PEM")
	}
	cfg := &tls.Config{RootCAs: pool}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
}

func TestX509AuthenticatesRealClientCertificates(t *testing.T) {
	b, err := pki.Ensure(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := authServer(t, b, NewX509(b.CAPool()))

	cert, key, err := b.IssueClient("alice", []string{"dev", "system:masters"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client(t, b.CAPEM(), cert, key).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var u User
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
		t.Fatalf("status %d: %v", resp.StatusCode, err)
	}
	if u.Name != "alice" || !slices.Equal(u.Groups, []string{"dev", "system:masters", GroupAuthenticated}) {
		t.Errorf("user = %+v", u)
	}

	// No certificate: the authenticator does not apply.
	resp, err = client(t, b.CAPEM(), nil, nil).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("anonymous: status %d, want 204 (not applicable)", resp.StatusCode)
	}
}

func TestX509RejectsCertificateOfAnotherCA(t *testing.T) {
	b, err := pki.Ensure(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.Ensure(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The TLS layer already refuses a certificate of an unknown CA (verify
	// if given); the authenticator must refuse it on its own as well, e.g.
	// behind a TLS config that does not verify.
	cert, key, _ := other.IssueClient("mallory", []string{"system:masters"})
	_ = key
	blk, _ := pem.Decode(cert)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}
	_, ok, err := NewX509(b.CAPool()).Authenticate(r)
	if ok || !errors.Is(err, ErrInvalidCredentials) {
		t.Errorf("foreign certificate: ok=%v err=%v, want ErrInvalidCredentials", ok, err)
	}
}

// A verified chain is remembered, but only inside the window in which all
// its certificates are valid: once the clock leaves it, the same
// certificates are refused as expired (or not yet valid), and accepted
// again when it comes back.
func TestX509RemembersVerifiedChainsOnlyWhileValid(t *testing.T) {
	b, err := pki.Ensure(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, _, err := b.IssueClient("alice", []string{"dev"})
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(cert)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a := newX509(b.CAPool(), func() time.Time { return now })
	auth := func() (*User, error) {
		r := httptest.NewRequest("GET", "/", nil)
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}
		u, ok, err := a.Authenticate(r)
		if err == nil && !ok {
			t.Fatal("a client certificate did not apply")
		}
		return u, err
	}
	for i := 0; i < 2; i++ {
		u, err := auth()
		if err != nil || u.Name != "alice" || !slices.Equal(u.Groups, []string{"dev", GroupAuthenticated}) {
			t.Fatalf("request %d: user %+v, err %v", i, u, err)
		}
	}
	if len(a.verified) != 1 {
		t.Fatalf("%d chains remembered, want 1", len(a.verified))
	}
	for _, at := range []time.Time{leaf.NotAfter.Add(time.Second), leaf.NotBefore.Add(-time.Second)} {
		now = at
		if _, err := auth(); !errors.Is(err, ErrInvalidCredentials) || !strings.Contains(err.Error(), "expired or is not yet valid") {
			t.Errorf("at %s (certificate valid %s to %s): err %v, want an expired certificate refused", at, leaf.NotBefore, leaf.NotAfter, err)
		}
	}
	now = leaf.NotAfter
	if _, err := auth(); err != nil {
		t.Errorf("at the last valid instant: %v", err)
	}
}

func writeTokens(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTokenFileAuthenticatesBearerTokens(t *testing.T) {
	a, err := NewTokenFile(writeTokens(t, `# comment
secret-1,alice,uid-1,"dev,ops"
secret-2,bob,uid-2

secret-3, carol , uid-3, "a"
`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		header    string
		wantUser  string
		wantGroup []string
		wantOK    bool
		wantErr   bool
	}{
		{"token with groups", "Bearer secret-1", "alice", []string{"dev", "ops", GroupAuthenticated}, true, false},
		{"token without groups", "Bearer secret-2", "bob", []string{GroupAuthenticated}, true, false},
		{"spaces trimmed", "bearer secret-3", "carol", []string{"a", GroupAuthenticated}, true, false},
		{"unknown token is an error", "Bearer nope", "", nil, false, true},
		{"prefix of a token is an error", "Bearer secret", "", nil, false, true},
		{"empty bearer is an error", "Bearer ", "", nil, false, true},
		{"no header does not apply", "", "", nil, false, false},
		{"basic auth does not apply", "Basic YTpi", "", nil, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/api", nil)
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			u, ok, err := a.Authenticate(r)
			if (err != nil) != tc.wantErr || ok != tc.wantOK {
				t.Fatalf("ok=%v err=%v", ok, err)
			}
			if tc.wantErr && !errors.Is(err, ErrInvalidCredentials) {
				t.Errorf("error %v is not ErrInvalidCredentials", err)
			}
			if ok && (u.Name != tc.wantUser || !slices.Equal(u.Groups, tc.wantGroup)) {
				t.Errorf("user = %+v", u)
			}
		})
	}
}

func TestTokenFileRejectsMalformedFilesWithLineNumber(t *testing.T) {
	cases := []struct{ name, content, wantInErr string }{
		{"too few fields", "a,b,c\nonly,two\n", "line 2"},
		{"empty token", "a,b,c\n,user,uid\n", "line 2: empty token"},
		{"empty user", "tok,,uid\n", "line 1: empty user"},
		{"duplicate token", "t,a,1\nt,b,2\n", "line 2: token already defined on line 1"},
		{"bad quoting", "t,a,1,\"g1\n", "line"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewTokenFile(writeTokens(t, tc.content))
			if err == nil || !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("error = %v, want it to contain %q", err, tc.wantInErr)
			}
		})
	}
	if _, err := NewTokenFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing file accepted")
	}
}

type fixed struct {
	u   *User
	ok  bool
	err error
}

func (f fixed) Authenticate(*http.Request) (*User, bool, error) { return f.u, f.ok, f.err }

func TestUnionFirstApplicableWinsAndInvalidIsNotAnonymous(t *testing.T) {
	alice := &User{Name: "alice"}
	bad := errors.New("bad token")
	cases := []struct {
		name    string
		as      []Authenticator
		want    string
		wantErr bool
	}{
		{"none apply", []Authenticator{fixed{}, fixed{}}, "", false},
		{"second applies", []Authenticator{fixed{}, fixed{u: alice, ok: true}}, "alice", false},
		{"error then success", []Authenticator{fixed{err: bad}, fixed{u: alice, ok: true}}, "alice", false},
		{"only error", []Authenticator{fixed{}, fixed{err: bad}}, "", true},
		{"nil skipped", []Authenticator{nil, fixed{u: alice, ok: true}}, "alice", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, ok, err := Union(tc.as...).Authenticate(httptest.NewRequest("GET", "/", nil))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if tc.want == "" && ok || tc.want != "" && (!ok || u.Name != tc.want) {
				t.Errorf("u=%v ok=%v", u, ok)
			}
		})
	}
}

func TestUserFromEmptyContext(t *testing.T) {
	if _, ok := UserFrom(context.Background()); ok {
		t.Error("user found in empty context")
	}
	if _, ok := UserFrom(WithUser(context.Background(), nil)); ok {
		t.Error("nil user reported as present")
	}
}

func FuzzTokenFile(f *testing.F) {
	f.Add("t,u,1,\"a,b\"\n")
	f.Add("# c\n\nt,u,1\n")
	f.Add("\"unterminated\n")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseTokenFile(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, e := range a.entries {
			if len(e.token) == 0 || e.user.Name == "" {
				t.Fatalf("accepted an entry with empty token or user: %+v", e)
			}
		}
	})
}
