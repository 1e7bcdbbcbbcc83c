// Package secureserving serves a control-plane component's /healthz, /livez,
// /readyz and /metrics the way kube-scheduler and kube-controller-manager
// serve their ports 10259 and 10257: HTTPS (a self-signed certificate when
// none is given), delegated authentication (client certificates from the
// cluster's client CA, front-proxy request headers, bearer tokens through
// TokenReview, anonymous otherwise) and delegated authorization
// (SubjectAccessReview), with the health paths always allowed. It is built
// from k8s.io/apiserver's serving options and its delegating authenticator
// and authorizer factories, and k8s.io/controller-manager's handler chain.
//
// It is not the API server's serving path, nor the kubelet's (which
// authenticates against its own configuration).
package secureserving

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/authorization/path"
	"k8s.io/apiserver/pkg/authorization/union"
	genericserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	cmapp "k8s.io/controller-manager/app"
)

// Options are the serving flags kube-scheduler and kube-controller-manager
// share, under upstream's names.
type Options struct {
	// BindAddress and SecurePort: where HTTPS is served (port 0: off).
	BindAddress string
	SecurePort  int
	// Listener, when set (tests), is served instead of BindAddress and
	// SecurePort.
	Listener net.Listener
	// CertDir holds the generated self-signed pair <PairName>.crt/.key
	// when TLSCertFile and TLSPrivateKeyFile are not given; empty keeps the
	// generated pair in memory.
	CertDir                        string
	TLSCertFile, TLSPrivateKeyFile string
	// ClientCAFile, when set, verifies client certificates instead of the
	// client-ca-file of kube-system/extension-apiserver-authentication.
	ClientCAFile string
	// AuthenticationKubeconfig and AuthorizationKubeconfig reach the API
	// server that answers TokenReviews and SubjectAccessReviews; empty uses
	// the component's own client configuration (upstream's in-cluster
	// default, for a component that is given its kubeconfig).
	AuthenticationKubeconfig, AuthorizationKubeconfig string
	// AlwaysAllowPaths skip authorization (default /healthz, /readyz,
	// /livez).
	AlwaysAllowPaths []string
}

// Defaults returns the options with upstream's defaults on port.
func Defaults(port int) Options {
	return Options{
		BindAddress:      "0.0.0.0",
		SecurePort:       port,
		AlwaysAllowPaths: options.NewDelegatingAuthorizationOptions().AlwaysAllowPaths,
	}
}

// AddFlags registers the options' flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "IP address to serve HTTPS /healthz, /livez, /readyz and /metrics on")
	fs.IntVar(&o.SecurePort, "secure-port", o.SecurePort, "HTTPS port of /healthz, /livez, /readyz and /metrics (0: off)")
	fs.StringVar(&o.CertDir, "cert-dir", o.CertDir, "directory of the self-signed serving certificate generated when --tls-cert-file is not given (empty: kept in memory)")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", o.TLSCertFile, "serving certificate (PEM, with its chain)")
	fs.StringVar(&o.TLSPrivateKeyFile, "tls-private-key-file", o.TLSPrivateKeyFile, "the serving certificate's private key")
	fs.StringVar(&o.ClientCAFile, "client-ca-file", o.ClientCAFile, "CA bundle verifying client certificates (default: client-ca-file of kube-system/extension-apiserver-authentication)")
	fs.StringVar(&o.AuthenticationKubeconfig, "authentication-kubeconfig", o.AuthenticationKubeconfig, "kubeconfig allowed to create tokenreviews.authentication.k8s.io (default: --kubeconfig)")
	fs.StringVar(&o.AuthorizationKubeconfig, "authorization-kubeconfig", o.AuthorizationKubeconfig, "kubeconfig allowed to create subjectaccessreviews.authorization.k8s.io (default: --kubeconfig)")
	fs.Func("authorization-always-allow-paths", "HTTP paths served without authorization, comma-separated (default /healthz,/readyz,/livez)", func(v string) error {
		o.AlwaysAllowPaths = nil
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				o.AlwaysAllowPaths = append(o.AlwaysAllowPaths, p)
			}
		}
		return nil
	})
}

// Validate reports the options' errors.
func (o Options) Validate() error {
	var errs []error
	if o.SecurePort < 0 || o.SecurePort > 65535 {
		errs = append(errs, fmt.Errorf("--secure-port %d is out of range", o.SecurePort))
	}
	if o.Listener == nil && o.SecurePort != 0 && net.ParseIP(o.BindAddress) == nil {
		errs = append(errs, fmt.Errorf("--bind-address %q is not an IP address", o.BindAddress))
	}
	if (o.TLSCertFile == "") != (o.TLSPrivateKeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-private-key-file go together"))
	}
	return errors.Join(errs...)
}

// Enabled says whether Serve serves anything.
func (o Options) Enabled() bool { return o.Listener != nil || o.SecurePort != 0 }

// Server is a prepared secure server: the listener is bound, so a port
// conflict is reported before the component starts its work.
type Server struct {
	info    *genericserver.SecureServingInfo
	handler http.Handler
	log     *slog.Logger
}

// New binds the listener and builds the authenticator and authorizer for
// handler; pairName names the generated certificate (kube-scheduler,
// kube-controller-manager). rc is the component's own client configuration,
// the default for the delegation kubeconfigs. New returns nil, nil when o
// is not Enabled.
func New(o Options, pairName string, rc *rest.Config, handler http.Handler, log *slog.Logger) (*Server, error) {
	if !o.Enabled() {
		return nil, nil
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	sso := options.NewSecureServingOptions()
	sso.BindAddress = net.ParseIP(o.BindAddress)
	sso.BindPort = o.SecurePort
	if o.Listener != nil {
		sso.Listener = o.Listener
		if a, ok := o.Listener.Addr().(*net.TCPAddr); ok {
			sso.BindAddress, sso.BindPort = a.IP, a.Port
		}
	}
	sso.ServerCert.CertDirectory = o.CertDir
	sso.ServerCert.PairName = pairName
	sso.ServerCert.CertKey = options.CertKey{CertFile: o.TLSCertFile, KeyFile: o.TLSPrivateKeyFile}
	// As kube-scheduler and kube-controller-manager: a certificate for
	// localhost and 127.0.0.1 when none is given.
	if err := sso.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return nil, fmt.Errorf("self-signed serving certificate: %w", err)
	}
	var info *genericserver.SecureServingInfo
	if err := sso.ApplyTo(&info); err != nil {
		return nil, fmt.Errorf("secure serving on %s:%d: %w", o.BindAddress, o.SecurePort, err)
	}
	authn, err := authentication(o, rc, info)
	if err != nil {
		info.Listener.Close()
		return nil, err
	}
	authz, err := authorization(o, rc)
	if err != nil {
		info.Listener.Close()
		return nil, err
	}
	h := cmapp.BuildHandlerChain(handler, &genericserver.AuthorizationInfo{Authorizer: authz}, authn)
	return &Server{info: info, handler: h, log: log}, nil
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.info.Listener.Addr() }

// Serve serves until ctx ends, then shuts down. A nil Server waits for ctx.
func (s *Server) Serve(ctx context.Context) error {
	if s == nil {
		<-ctx.Done()
		return nil
	}
	stopped, _, err := s.info.Serve(s.handler, 5*time.Second, ctx.Done())
	if err != nil {
		return fmt.Errorf("serve HTTPS on %s: %w", s.Addr(), err)
	}
	s.log.Info("serving health and metrics over HTTPS", "addr", s.Addr().String())
	<-ctx.Done()
	<-stopped
	return nil
}

// client builds a clientset from kubeconfig, or from rc when it is empty,
// with the rate limits k8s.io/apiserver's delegation options use.
func client(kubeconfig string, rc *rest.Config, timeout time.Duration) (kubernetes.Interface, error) {
	var c *rest.Config
	if kubeconfig != "" {
		var err error
		c, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %q: %w", kubeconfig, err)
		}
	} else if rc != nil {
		c = rest.CopyConfig(rc)
	} else {
		return nil, errors.New("no kubeconfig to delegate authentication and authorization with")
	}
	c.QPS, c.Burst, c.Timeout = 200, 400, timeout
	return kubernetes.NewForConfig(c)
}

// authentication is what options.DelegatingAuthenticationOptions.ApplyTo
// builds, from a client configuration instead of a kubeconfig file only:
// client certificates, front-proxy headers (both from
// kube-system/extension-apiserver-authentication, kept up to date by their
// controllers, which the serving TLS config runs), TokenReview, anonymous.
func authentication(o Options, rc *rest.Config, info *genericserver.SecureServingInfo) (*genericserver.AuthenticationInfo, error) {
	d := options.NewDelegatingAuthenticationOptions()
	cs, err := client(o.AuthenticationKubeconfig, rc, 0)
	if err != nil {
		return nil, fmt.Errorf("delegated authentication: %w", err)
	}
	cfg := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: true},
		CacheTTL:                 d.CacheTTL,
		WebhookRetryBackoff:      d.WebhookRetryBackoff,
		TokenAccessReviewClient:  cs.AuthenticationV1(),
		TokenAccessReviewTimeout: d.TokenRequestTimeout,
	}
	ai := &genericserver.AuthenticationInfo{}
	const ns, name = "kube-system", "extension-apiserver-authentication"
	if o.ClientCAFile != "" {
		d.ClientCert.ClientCA = o.ClientCAFile
		cfg.ClientCertificateCAContentProvider, err = d.ClientCert.GetClientCAContentProvider()
	} else {
		cfg.ClientCertificateCAContentProvider, err = dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", ns, name, "client-ca-file", cs)
	}
	if err != nil {
		return nil, fmt.Errorf("client CA: %w", err)
	}
	if err := ai.ApplyClientCert(cfg.ClientCertificateCAContentProvider, info); err != nil {
		return nil, fmt.Errorf("client CA: %w", err)
	}
	reqCA, err := dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", ns, name, "requestheader-client-ca-file", cs)
	if err != nil {
		return nil, fmt.Errorf("request-header CA: %w", err)
	}
	rh := &options.DynamicRequestHeaderController{
		ConfigMapCAController: reqCA,
		RequestHeaderAuthRequestController: headerrequest.NewRequestHeaderAuthRequestController(name, ns, cs,
			"requestheader-username-headers", "requestheader-uid-headers", "requestheader-group-headers",
			"requestheader-extra-headers-prefix", "requestheader-allowed-names"),
	}
	cfg.RequestHeaderConfig = &authenticatorfactory.RequestHeaderConfig{
		CAContentProvider:   rh,
		UsernameHeaders:     headerrequest.StringSliceProviderFunc(rh.UsernameHeaders),
		UIDHeaders:          headerrequest.StringSliceProviderFunc(rh.UIDHeaders),
		GroupHeaders:        headerrequest.StringSliceProviderFunc(rh.GroupHeaders),
		ExtraHeaderPrefixes: headerrequest.StringSliceProviderFunc(rh.ExtraHeaderPrefixes),
		AllowedClientNames:  headerrequest.StringSliceProviderFunc(rh.AllowedClientNames),
	}
	ai.RequestHeaderConfig = cfg.RequestHeaderConfig
	if err := ai.ApplyClientCert(rh, info); err != nil {
		return nil, fmt.Errorf("request-header CA: %w", err)
	}
	ai.Authenticator, _, err = cfg.New()
	if err != nil {
		return nil, fmt.Errorf("delegated authentication: %w", err)
	}
	return ai, nil
}

// authorization is what options.DelegatingAuthorizationOptions.ApplyTo
// builds: system:masters and the always-allowed paths, then
// SubjectAccessReview.
func authorization(o Options, rc *rest.Config) (authorizer.Authorizer, error) {
	d := options.NewDelegatingAuthorizationOptions()
	cs, err := client(o.AuthorizationKubeconfig, rc, d.ClientTimeout)
	if err != nil {
		return nil, fmt.Errorf("delegated authorization: %w", err)
	}
	var as []union.NamedAuthorizer
	as = append(as, union.NamedAuthorizer{AuthorizerName: "kubernetes.io/always-allow-groups", Authorizer: authorizerfactory.NewPrivilegedGroups(d.AlwaysAllowGroups...)})
	if len(o.AlwaysAllowPaths) > 0 {
		p, err := path.NewAuthorizer(o.AlwaysAllowPaths)
		if err != nil {
			return nil, fmt.Errorf("--authorization-always-allow-paths: %w", err)
		}
		as = append(as, union.NamedAuthorizer{AuthorizerName: "kubernetes.io/always-allow-paths", Authorizer: p})
	}
	sar, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: cs.AuthorizationV1(),
		AllowCacheTTL:             d.AllowCacheTTL,
		DenyCacheTTL:              d.DenyCacheTTL,
		WebhookRetryBackoff:       d.WebhookRetryBackoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("delegated authorization: %w", err)
	}
	as = append(as, union.NamedAuthorizer{AuthorizerName: "kubernetes.io/webhook", Authorizer: sar})
	return union.New(as...)
}
