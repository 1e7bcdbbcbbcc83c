// Package serviceaccount issues and verifies the API server's
// service-account tokens, as kube-apiserver does, by calling
// k8s.io/kubernetes/pkg/serviceaccount: signed JWTs (RS256 or ES256) for
// TokenRequest, bound to a Pod, Secret or Node and checked against the live
// object and its UID at every use; legacy secret-based tokens
// (issuer kubernetes/serviceaccount) while their Secret exists, labelled
// with the day they were last used; and the OIDC discovery documents
// (/.well-known/openid-configuration, /openid/v1/jwks) for relying parties
// outside the cluster.
//
// Keys: one private key signs (--service-account-signing-key-file); every
// public key in --service-account-key-file verifies, so a key rotation
// adds the new key, switches the signer, and drops the old one once the
// tokens it signed have expired. It is not the TokenRequest endpoint (the
// server's registry serves that) nor the token controller (the
// controller-manager's).
package serviceaccount

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	typedv1core "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/kubernetes/pkg/apis/core"
	k8ssa "k8s.io/kubernetes/pkg/serviceaccount"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
)

// Getter reads the objects tokens are bound to (upstream's
// ServiceAccountTokenGetter): the live ServiceAccount, Pod, Secret, Node.
type Getter = k8ssa.ServiceAccountTokenGetter

// Upstream's limits and well-known values.
const (
	// MinExpirationSeconds is the shortest token a TokenRequest may ask
	// for (10 minutes).
	MinExpirationSeconds = 600
	// DefaultExpirationSeconds is a TokenRequest's default (1 hour).
	DefaultExpirationSeconds = 3600
	// WarnOnlyExpirationSeconds is what the ServiceAccount admission puts
	// in the projected volume (1 h + 7 s): with ExtendExpiration, such a
	// pod-bound token lasts a year but is flagged stale after the hour.
	WarnOnlyExpirationSeconds = k8ssa.WarnOnlyBoundTokenExpirationSeconds
	// ExtendedExpirationSeconds is the extended lifetime (1 year).
	ExtendedExpirationSeconds = k8ssa.ExpirationExtensionSeconds
	// LegacyIssuer is the issuer of secret-based tokens.
	LegacyIssuer = k8ssa.LegacyIssuer
	// LastUsedLabel is the label a legacy token's Secret gets, the day it
	// was last used.
	LastUsedLabel = k8ssa.LastUsedLabelKey
	// DefaultIssuer is kubeadm's issuer, used when none is configured.
	DefaultIssuer = "https://kubernetes.default.svc.cluster.local"
)

// Config configures Tokens.
type Config struct {
	// Issuers are --service-account-issuer, in order: the first signs new
	// tokens, every one is accepted (an issuer rename keeps old tokens).
	Issuers []string
	// APIAudiences are --api-audiences: the audiences a token must name
	// to authenticate to this server (default: the first issuer), and the
	// default audiences of a TokenRequest.
	APIAudiences []string
	// SigningKeyFile is the PEM private key (RSA or ECDSA) that signs.
	SigningKeyFile string
	// KeyFiles are PEM files of public (or private) keys that verify; the
	// signing key's public half is always among them.
	KeyFiles []string
	// MaxExpiration caps a TokenRequest's expirationSeconds
	// (--service-account-max-token-expiration; 0: no cap).
	MaxExpiration time.Duration
	// ExtendExpiration is --service-account-extend-token-expiration
	// (upstream's default true).
	ExtendExpiration bool
	// Getter reads bound objects; Secrets patches a legacy token's
	// Secret with its last-used day.
	Getter  Getter
	Secrets typedv1core.SecretsGetter
	// ExternalAddress is host:port of this server, for the default
	// jwks_uri of the discovery document.
	ExternalAddress string
}

// Tokens issues and verifies service-account tokens.
type Tokens struct {
	cfg       Config
	gen       k8ssa.TokenGenerator
	keys      k8ssa.PublicKeysGetter
	bound     authenticator.Token
	legacy    authenticator.Token
	discovery k8ssa.OpenIDMetadataProvider
	discErr   error
}

// New loads the keys and builds the generator and authenticators.
func New(cfg Config) (*Tokens, error) {
	if len(cfg.Issuers) == 0 {
		return nil, errors.New("service accounts: --service-account-issuer is required")
	}
	for _, iss := range cfg.Issuers {
		if iss == "" {
			return nil, errors.New("service accounts: --service-account-issuer may not be empty")
		}
		if strings.Contains(iss, ":") && !strings.HasPrefix(iss, "https://") && !strings.HasPrefix(iss, "http://") {
			return nil, fmt.Errorf("service accounts: --service-account-issuer %q contains a ':' but is not a URL", iss)
		}
	}
	if cfg.SigningKeyFile == "" {
		return nil, errors.New("service accounts: --service-account-signing-key-file is required")
	}
	if len(cfg.APIAudiences) == 0 {
		cfg.APIAudiences = []string{cfg.Issuers[0]}
	}
	if cfg.Getter == nil || cfg.Secrets == nil {
		return nil, errors.New("service accounts: a getter and a secrets writer are required")
	}
	priv, err := keyutil.PrivateKeyFromFile(cfg.SigningKeyFile)
	if err != nil {
		return nil, fmt.Errorf("service accounts: --service-account-signing-key-file: %w", err)
	}
	gen, err := k8ssa.JWTTokenGenerator(cfg.Issuers[0], priv)
	if err != nil {
		return nil, fmt.Errorf("service accounts: %w", err)
	}
	signer, ok := priv.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("service accounts: --service-account-signing-key-file: %T is not a signing key", priv)
	}
	pub := signer.Public()
	keys := []any{pub}
	for _, f := range cfg.KeyFiles {
		ks, err := keyutil.PublicKeysFromFile(f)
		if err != nil {
			return nil, fmt.Errorf("service accounts: --service-account-key-file %s: %w", f, err)
		}
		for _, k := range ks {
			if eq, ok := k.(interface{ Equal(crypto.PublicKey) bool }); ok && eq.Equal(pub) {
				continue // the signing key's own public half, already in
			}
			keys = append(keys, k)
		}
	}
	getter, err := k8ssa.StaticPublicKeysGetter(keys)
	if err != nil {
		return nil, fmt.Errorf("service accounts: %w", err)
	}
	legacyV, err := k8ssa.NewLegacyValidator(true, cfg.Getter, cfg.Secrets)
	if err != nil {
		return nil, fmt.Errorf("service accounts: %w", err)
	}
	t := &Tokens{
		cfg:    cfg,
		gen:    gen,
		keys:   getter,
		bound:  k8ssa.JWTTokenAuthenticator(cfg.Issuers, getter, cfg.APIAudiences, k8ssa.NewValidator(cfg.Getter)),
		legacy: k8ssa.JWTTokenAuthenticator([]string{LegacyIssuer}, getter, cfg.APIAudiences, legacyV),
	}
	// Discovery needs an https issuer, as upstream (which then logs and
	// serves no discovery documents).
	t.discovery, t.discErr = k8ssa.NewOpenIDMetadataProvider(cfg.Issuers[0], "", cfg.ExternalAddress, getter)
	return t, nil
}

// APIAudiences returns the server's audiences.
func (t *Tokens) APIAudiences() []string { return slices.Clone(t.cfg.APIAudiences) }

// MaxExpiration returns the cap on a TokenRequest's lifetime (0: none).
func (t *Tokens) MaxExpiration() time.Duration { return t.cfg.MaxExpiration }

// ExtendExpiration reports --service-account-extend-token-expiration.
func (t *Tokens) ExtendExpiration() bool { return t.cfg.ExtendExpiration }

// AuthenticateToken verifies a service-account token, bound or legacy. A
// token that is no service-account JWT of ours (another issuer, not a JWT)
// does not apply; one with a bad signature, expired, of the wrong audience
// or whose bound object is gone is an error (401).
func (t *Tokens) AuthenticateToken(ctx context.Context, tok string) (*authn.User, bool, error) {
	if auds, ok := authn.AudiencesFrom(ctx); ok {
		ctx = authenticator.WithAudiences(ctx, auds)
	}
	var errs []error
	for _, a := range []authenticator.Token{t.bound, t.legacy} {
		resp, ok, err := a.AuthenticateToken(ctx, tok)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			u := resp.User
			out := &authn.User{Name: u.GetName(), UID: u.GetUID(), Groups: slices.Clone(u.GetGroups())}
			if ex := u.GetExtra(); len(ex) > 0 {
				out.Extra = map[string][]string{}
				for k, v := range ex {
					out.Extra[k] = slices.Clone(v)
				}
			}
			return out, true, nil
		}
	}
	if len(errs) > 0 {
		return nil, false, fmt.Errorf("%w: service account token: %w", authn.ErrInvalidCredentials, errors.Join(errs...))
	}
	return nil, false, nil
}

// Bound is what a token is bound to: at most one of Pod, Secret, Node
// (Node may accompany Pod: the pod's node, recorded in the claims).
type Bound struct {
	Pod    *corev1.Pod
	Secret *corev1.Secret
	Node   *corev1.Node
}

// Issue signs a token for sa with upstream's claims (sub
// system:serviceaccount:<ns>:<name>, aud, exp, iat, nbf, jti and the
// kubernetes.io private claims). expirationSeconds is the lifetime;
// warnAfter, when non-zero, marks the token stale after that many seconds
// (the extended-expiration scheme).
func (t *Tokens) Issue(ctx context.Context, sa *corev1.ServiceAccount, b Bound, expirationSeconds, warnAfter int64, audiences []string) (string, error) {
	isa := core.ServiceAccount{}
	isa.Name, isa.Namespace, isa.UID = sa.Name, sa.Namespace, sa.UID
	var pod *core.Pod
	var secret *core.Secret
	var node *core.Node
	if b.Pod != nil {
		pod = &core.Pod{}
		pod.Name, pod.Namespace, pod.UID = b.Pod.Name, b.Pod.Namespace, b.Pod.UID
	}
	if b.Secret != nil {
		secret = &core.Secret{}
		secret.Name, secret.Namespace, secret.UID = b.Secret.Name, b.Secret.Namespace, b.Secret.UID
	}
	if b.Node != nil {
		node = &core.Node{}
		node.Name, node.UID = b.Node.Name, b.Node.UID
	}
	sc, pc, err := k8ssa.Claims(isa, pod, secret, node, nil, nil, expirationSeconds, warnAfter, audiences, nil)
	if err != nil {
		return "", err
	}
	return t.gen.GenerateToken(ctx, sc, pc)
}

// LegacyGenerator returns a generator of legacy tokens signed by the key
// in signingKeyFile.
func LegacyGenerator(signingKeyFile string) (func(ctx context.Context, sa *corev1.ServiceAccount, secret *corev1.Secret) (string, error), error) {
	priv, err := keyutil.PrivateKeyFromFile(signingKeyFile)
	if err != nil {
		return nil, err
	}
	gen, err := k8ssa.JWTTokenGenerator(LegacyIssuer, priv)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, sa *corev1.ServiceAccount, secret *corev1.Secret) (string, error) {
		sc, pc := k8ssa.LegacyClaims(*sa, *secret)
		return gen.GenerateToken(ctx, sc, pc)
	}, nil
}

// Discovery returns the OIDC discovery document and the JWKS with their
// cache max-age, or the reason discovery is off (an issuer that is not an
// https URL).
func (t *Tokens) Discovery() (config, jwks []byte, maxAge int, err error) {
	if t.discovery == nil {
		return nil, nil, 0, t.discErr
	}
	c, age := t.discovery.GetConfigJSON()
	k, _ := t.discovery.GetKeysetJSON()
	return c, k, age, nil
}

// Paths of the discovery documents.
const (
	OpenIDConfigPath = k8ssa.OpenIDConfigPath
	JWKSPath         = k8ssa.JWKSPath
)
