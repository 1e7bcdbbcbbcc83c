package apiserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	authenticationapi "k8s.io/kubernetes/pkg/apis/authentication"
	_ "k8s.io/kubernetes/pkg/apis/authentication/install" // TokenRequest's internal type and conversions
	authenticationvalidation "k8s.io/kubernetes/pkg/apis/authentication/validation"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/decode"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/controlplane/apiserver/serviceaccount"
)

// setupServiceAccounts loads the service-account keys (generating a pair
// under <data-dir>/pki when none is configured and the server made its own
// PKI) and adds the token authenticator.
func (s *Server) setupServiceAccounts() (authn.Authenticator, error) {
	cfg := s.cfg
	signing, keys := cfg.ServiceAccountSigningKeyFile, slices.Clone(cfg.ServiceAccountKeyFiles)
	if signing == "" {
		k, pub, err := pki.EnsureServiceAccountKey(filepath.Join(cfg.DataDir, "pki"))
		if err != nil {
			return nil, fmt.Errorf("apiserver: %w", err)
		}
		signing = k
		if len(keys) == 0 {
			keys = []string{pub}
		}
	}
	issuers := cfg.ServiceAccountIssuers
	if len(issuers) == 0 {
		issuers = []string{serviceaccount.DefaultIssuer}
	}
	host := ""
	if u := s.url; len(u) > len("https://") {
		host = u[len("https://"):]
	}
	t, err := serviceaccount.New(serviceaccount.Config{
		Issuers:          issuers,
		APIAudiences:     cfg.APIAudiences,
		SigningKeyFile:   signing,
		KeyFiles:         keys,
		MaxExpiration:    cfg.ServiceAccountMaxTokenExpiration,
		ExtendExpiration: cfg.ServiceAccountExtendTokenExpiration,
		Getter:           saGetter{s},
		Secrets:          s.loopbackClient().CoreV1(),
		ExternalAddress:  host,
	})
	if err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	if _, _, _, err := t.Discovery(); err != nil {
		s.log.Info("service-account issuer discovery is off", "reason", err)
	}
	s.tokens = t
	return authn.Bearer(t), nil
}

// Tokens is the server's service-account token issuer and verifier.
func (s *Server) Tokens() *serviceaccount.Tokens { return s.tokens }

// saGetter reads the objects tokens are bound to: from the watch cache,
// then, for what the cache does not have yet, from etcd (upstream reads
// its informers and falls back to a live lookup the same way).
type saGetter struct{ s *Server }

func getTyped[T runtime.Object](ctx context.Context, s *Server, resource, ns, name string) (T, error) {
	var zero T
	reg := s.registries[resource]
	if reg == nil {
		return zero, apierrors.NewNotFound(schema.GroupResource{Resource: resource}, name)
	}
	o, err := reg.get(ctx, ns, name, "0")
	if apierrors.IsNotFound(err) {
		o, err = reg.get(ctx, ns, name, "")
	}
	if err != nil {
		return zero, err
	}
	t, ok := o.Obj.(T)
	if !ok {
		return zero, fmt.Errorf("%s %s/%s: unexpected type %T", resource, ns, name, o.Obj)
	}
	return t, nil
}

func (g saGetter) GetServiceAccount(ctx context.Context, ns, name string) (*corev1.ServiceAccount, error) {
	return getTyped[*corev1.ServiceAccount](ctx, g.s, "serviceaccounts", ns, name)
}
func (g saGetter) GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return getTyped[*corev1.Pod](ctx, g.s, "pods", ns, name)
}
func (g saGetter) GetSecret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	return getTyped[*corev1.Secret](ctx, g.s, "secrets", ns, name)
}
func (g saGetter) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return getTyped[*corev1.Node](ctx, g.s, "nodes", "", name)
}
func (g saGetter) GetValidatingWebhookConfiguration(ctx context.Context, name string) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	return getTyped[*admissionregistrationv1.ValidatingWebhookConfiguration](ctx, g.s, "validatingwebhookconfigurations", "", name)
}
func (g saGetter) GetMutatingWebhookConfiguration(ctx context.Context, name string) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	return getTyped[*admissionregistrationv1.MutatingWebhookConfiguration](ctx, g.s, "mutatingwebhookconfigurations", "", name)
}

// loopbackClient is a client of this server that never leaves the
// process (a legacy token's last-used label is written while the request
// it authenticates waits): requests go straight to the resource handler as
// authn.LoopbackUser (system:masters), past authentication.
func (s *Server) loopbackClient() kubernetes.Interface {
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "http://loopback.invalid", Transport: loopback{s}, QPS: -1})
	if err != nil {
		panic(err) // a static config: cannot fail
	}
	return cs
}

type loopback struct{ s *Server }

func (l loopback) RoundTrip(r *http.Request) (*http.Response, error) {
	w := &bufferedResponse{header: http.Header{}, code: http.StatusOK}
	l.s.serveResource(w, r.WithContext(authn.WithUser(r.Context(), &authn.LoopbackUser)))
	return &http.Response{StatusCode: w.code, Status: http.StatusText(w.code), Header: w.header,
		Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()), Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

type bufferedResponse struct {
	header http.Header
	code   int
	body   bytes.Buffer
	wrote  bool
}

func (b *bufferedResponse) Header() http.Header { return b.header }
func (b *bufferedResponse) WriteHeader(code int) {
	if !b.wrote {
		b.code, b.wrote = code, true
	}
}
func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.wrote = true
	return b.body.Write(p)
}

var tokenRequestGVK = authenticationv1.SchemeGroupVersion.WithKind("TokenRequest")

// serveTokenRequest serves POST serviceaccounts/<name>/token as
// kube-apiserver's TokenREST: the request's name/namespace must match the
// URL; audiences default to --api-audiences; expirationSeconds (default
// 1 h) is validated upstream's way (at least 10 minutes) and capped by
// --service-account-max-token-expiration with a warning; a boundObjectRef
// names a Pod (running as this ServiceAccount), a Secret or a Node, whose
// UID must match when given; a pod-bound token asked for 3607 s with the
// API audiences lasts a year (warnafter 3607 s) when
// --service-account-extend-token-expiration is on.
func (s *Server) serveTokenRequest(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	gk := tokenRequestGVK.GroupKind()
	if s.tokens == nil {
		return apierrors.NewServiceUnavailable("service-account tokens are not configured on this server")
	}
	wo, _, err := parseWriteOpts(r)
	if err != nil {
		return err
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	tr := &authenticationv1.TokenRequest{}
	if _, err := decodeInto(body, tr, r.Header.Get("Content-Type"), decode.Ignore); err != nil {
		return err
	}
	if tr.Name != "" && tr.Name != req.name {
		return apierrors.NewInvalid(gk, req.name, field.ErrorList{field.Invalid(field.NewPath("metadata").Child("name"), tr.Name, "must match the service account name if specified")})
	}
	if tr.Namespace != "" && tr.Namespace != req.ns {
		return apierrors.NewInvalid(gk, req.name, field.ErrorList{field.Invalid(field.NewPath("metadata").Child("namespace"), tr.Namespace, "must match the service account namespace if specified")})
	}
	sa, err := getTyped[*corev1.ServiceAccount](ctx, s, "serviceaccounts", req.ns, req.name)
	if err != nil {
		return err
	}
	if tr.UID != "" && tr.UID != sa.UID {
		return apierrors.NewConflict(schema.GroupResource{Group: gk.Group, Resource: gk.Kind}, req.name,
			fmt.Errorf("the UID in the token request (%s) does not match the UID of the service account (%s)", tr.UID, sa.UID))
	}
	if tr.Spec.ExpirationSeconds == nil {
		d := int64(serviceaccount.DefaultExpirationSeconds)
		tr.Spec.ExpirationSeconds = &d
	}
	if len(tr.Spec.Audiences) == 0 {
		tr.Spec.Audiences = s.tokens.APIAudiences()
	}
	tr.Name, tr.Namespace, tr.UID = sa.Name, sa.Namespace, sa.UID
	now := time.Now()
	tr.CreationTimestamp = metav1.NewTime(now)
	tr.Status = authenticationv1.TokenRequestStatus{}

	internal := &authenticationapi.TokenRequest{}
	if err := legacyscheme.Scheme.Convert(tr, internal, nil); err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	if errs := authenticationvalidation.ValidateTokenRequest(internal); len(errs) > 0 {
		return apierrors.NewInvalid(gk, "", errs)
	}
	res := req.reg.res
	if err := s.admit(ctx, &AdmissionAttributes{Operation: OpCreate, Resource: res, Subresource: "token", Namespace: req.ns, Name: req.name, Object: tr, DryRun: wo.dryRun}); err != nil {
		return err
	}

	var b serviceaccount.Bound
	if ref := tr.Spec.BoundObjectRef; ref != nil {
		var uid string
		gvk := schema.FromAPIVersionAndKind(ref.APIVersion, ref.Kind)
		switch {
		case gvk.Group == "" && gvk.Kind == "Pod":
			pod, err := getTyped[*corev1.Pod](ctx, s, "pods", req.ns, ref.Name)
			if err != nil {
				return err
			}
			if pod.Spec.ServiceAccountName != req.name {
				return apierrors.NewBadRequest(fmt.Sprintf("cannot bind token for serviceaccount %q to pod running with different serviceaccount name.", req.name))
			}
			b.Pod, uid = pod, string(pod.UID)
			if n := pod.Spec.NodeName; n != "" {
				node, err := getTyped[*corev1.Node](ctx, s, "nodes", "", n)
				switch {
				case apierrors.IsNotFound(err):
					node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
				case err != nil:
					return apierrors.NewInternalError(err)
				}
				b.Node = node
			}
		case gvk.Group == "" && gvk.Kind == "Node":
			node, err := getTyped[*corev1.Node](ctx, s, "nodes", "", ref.Name)
			if err != nil {
				return err
			}
			b.Node, uid = node, string(node.UID)
		case gvk.Group == "" && gvk.Kind == "Secret":
			sec, err := getTyped[*corev1.Secret](ctx, s, "secrets", req.ns, ref.Name)
			if err != nil {
				return err
			}
			b.Secret, uid = sec, string(sec.UID)
		default:
			return apierrors.NewBadRequest(fmt.Sprintf("cannot bind token to object of type %s", gvk.String()))
		}
		if ref.UID != "" && string(ref.UID) != uid {
			return apierrors.NewConflict(schema.GroupResource{Group: gvk.Group, Resource: gvk.Kind}, ref.Name,
				fmt.Errorf("the UID in the bound object reference (%s) does not match the UID in record. The object might have been deleted and then recreated", ref.UID))
		}
	}
	var warnings []string
	if max := int64(s.tokens.MaxExpiration() / time.Second); max > 0 && *tr.Spec.ExpirationSeconds > max {
		warnings = append(warnings, fmt.Sprintf("requested expiration of %d seconds shortened to %d seconds", *tr.Spec.ExpirationSeconds, max))
		*tr.Spec.ExpirationSeconds = max
	}
	exp, warnAfter := *tr.Spec.ExpirationSeconds, int64(0)
	if s.tokens.ExtendExpiration() && b.Pod != nil && exp == serviceaccount.WarnOnlyExpirationSeconds && subsetOf(tr.Spec.Audiences, s.tokens.APIAudiences()) {
		warnAfter, exp = exp, serviceaccount.ExtendedExpirationSeconds
	}
	if !wo.dryRun {
		tok, err := s.tokens.Issue(ctx, sa, b, exp, warnAfter, tr.Spec.Audiences)
		if err != nil {
			return apierrors.NewInternalError(fmt.Errorf("failed to generate token: %v", err))
		}
		tr.Status.Token = tok
	}
	tr.Status.ExpirationTimestamp = metav1.NewTime(now.Add(time.Duration(*tr.Spec.ExpirationSeconds) * time.Second))
	warn(w, warnings)
	tr.SetGroupVersionKind(tokenRequestGVK)
	return s.writeObject(w, r, nil, http.StatusCreated, tr)
}

func subsetOf(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// tokenReview answers TokenReview as kube-apiserver: the token is checked
// by the server's authenticators (service-account tokens, static tokens)
// for spec.audiences (default: the API audiences); the status says who it
// is, or authenticated=false with the error. The review itself never
// fails for a bad token.
func (s *Server) tokenReview(ctx context.Context, req *VirtualRequest) (runtime.Object, error) {
	tr := req.Object.(*authenticationv1.TokenReview)
	if tr.Spec.Token == "" {
		return nil, apierrors.NewInvalid(authenticationv1.SchemeGroupVersion.WithKind("TokenReview").GroupKind(), "",
			field.ErrorList{field.Required(field.NewPath("spec", "token"), "")})
	}
	auds := tr.Spec.Audiences
	if len(auds) == 0 && s.tokens != nil {
		auds = s.tokens.APIAudiences()
	}
	hr, _ := http.NewRequestWithContext(authn.WithAudiences(ctx, auds), http.MethodGet, "/", nil)
	hr.Header.Set("Authorization", "Bearer "+tr.Spec.Token)
	u, ok, err := s.tokenAuthn.Authenticate(hr)
	tr.Status = authenticationv1.TokenReviewStatus{}
	switch {
	case err != nil:
		tr.Status.Error = err.Error()
	case !ok:
		tr.Status.Error = "token not recognized"
	default:
		tr.Status.Authenticated = true
		tr.Status.User = authenticationv1.UserInfo{Username: u.Name, UID: u.UID, Groups: slices.Clone(u.Groups)}
		if len(u.Extra) > 0 {
			tr.Status.User.Extra = map[string]authenticationv1.ExtraValue{}
			for k, v := range u.Extra {
				tr.Status.User.Extra[k] = slices.Clone(v)
			}
		}
		tr.Status.Audiences = slices.Clone(tr.Spec.Audiences)
		if len(tr.Spec.Audiences) == 0 && s.tokens != nil {
			// What the token was checked against.
			tr.Status.Audiences = auds
		}
	}
	return tr, nil
}

// serveOIDC serves the issuer discovery documents (authorized like any
// non-resource path: system:service-account-issuer-discovery grants
// them to service accounts).
func (s *Server) serveOIDC(jwks bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.tokens == nil {
			writeStatus(w, errPathNotFound(), notFoundGR, "")
			return
		}
		cfg, keys, age, err := s.tokens.Discovery()
		if err != nil {
			writeStatus(w, errPathNotFound(), notFoundGR, "")
			return
		}
		w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d", age))
		if jwks {
			w.Header().Set("Content-Type", "application/jwk-set+json")
			w.Write(keys)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(cfg)
	}
}
