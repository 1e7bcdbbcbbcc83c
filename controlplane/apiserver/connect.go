package apiserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	utilproxy "k8s.io/apimachinery/pkg/util/proxy"

	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/storage"
	kubeletclient "github.com/waggle-io/waggle/kubelet/client"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
)

// kubeletTransport is the API server's client to kubelets: it presents a
// client certificate of the cluster CA for kube-apiserver-kubelet-client
// (no group: the kubelets authorize it by SubjectAccessReview, and the
// default policy binds it to system:kubelet-api-admin) when the server
// holds the CA key.
type kubeletTransport struct {
	once sync.Once
	rt   http.RoundTripper
	err  error
}

func (s *Server) kubeletRT() (http.RoundTripper, error) {
	s.kubelet.once.Do(func() {
		var cert tls.Certificate
		if s.bundle.HasCAKey() {
			c, k, err := s.bundle.IssueClient(bootstrap.KubeletAPIUser, nil)
			if err != nil {
				s.kubelet.err = err
				return
			}
			if cert, err = tls.X509KeyPair(c, k); err != nil {
				s.kubelet.err = err
				return
			}
		}
		s.kubelet.rt = kubeletclient.Transport(cert, nil)
	})
	return s.kubelet.rt, s.kubelet.err
}

// connect serves the subresources that reach a node: pods/log, pods/exec,
// pods/attach, pods/portforward (proxied to the pod's kubelet with SPDY and
// WebSocket upgrades passed through),
// pods/proxy (to the pod's IP) and nodes/proxy (to the kubelet).
func (s *Server) connect(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	if req.sub != "log" {
		// CONNECT admission sees the connect options, as upstream (pods/log
		// is a read there, not admitted).
		a := &AdmissionAttributes{Operation: OpConnect, Resource: req.reg.res, Subresource: req.sub, Namespace: req.ns, Name: req.name,
			Object: connectOptions(req, r)}
		if err := s.admit(ctx, a); err != nil {
			return err
		}
		if err := s.validate(ctx, a); err != nil {
			return err
		}
	}
	var target *url.URL
	var err error
	toKubelet := req.reg.res.Resource == "pods" && req.sub != "proxy" // the kubelet's API, with the kubelet client certificate
	switch {
	case req.reg.res.Resource == "nodes" && req.sub == "proxy":
		target, toKubelet, err = s.nodeTarget(ctx, r, req)
		if err != nil {
			return err
		}
	case req.reg.res.Resource == "services" && req.sub == "proxy":
		target, err = s.serviceTarget(ctx, r, req)
		if err != nil {
			return err
		}
	case req.reg.res.Resource == "pods":
		target, err = s.podTarget(ctx, r, req)
		if err != nil {
			return err
		}
	default:
		return apierrors.NewServiceUnavailable(fmt.Sprintf("%s/%s is not served", req.reg.res.Resource, req.sub))
	}
	rt := http.DefaultTransport
	switch {
	case toKubelet:
		if rt, err = s.kubeletRT(); err != nil {
			return apierrors.NewInternalError(fmt.Errorf("kubelet client certificate: %w", err))
		}
	case target.Scheme == "https":
		// A pod's, a Service's or a node's other port: TLS without the
		// kubelet client certificate (it is for kubelets only), and, as
		// upstream's proxy transport, without verifying the server.
		rt = &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}} //nolint:gosec // upstream's proxy does not verify backends either
	}
	if req.sub == "proxy" {
		// The proxy subresources as upstream's: apimachinery's
		// UpgradeAwareHandler with its wrapping transport, which redirects
		// a GET of .../proxy to .../proxy/, rewrites the links of HTML
		// answers under the proxy path, sets X-Forwarded-*, and passes
		// upgrades (WebSocket) through. The client's credentials are for
		// the API server only.
		out := r.Clone(ctx)
		for _, h := range []string{"Authorization", "Impersonate-User", "Impersonate-Group", "Impersonate-Uid"} {
			out.Header.Del(h)
		}
		for k := range out.Header {
			if strings.HasPrefix(k, "Impersonate-Extra-") {
				out.Header.Del(k)
			}
		}
		h := utilproxy.NewUpgradeAwareHandler(target, rt, true, false, subresourceProxyResponder{req: req, target: target})
		h.UseLocationHost = true
		h.FlushInterval = -1
		h.ServeHTTP(w, out)
		return nil
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = target
			pr.Out.Host = target.Host
			// The client's credentials are for the API server only.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Impersonate-User")
			pr.Out.Header.Del("Impersonate-Group")
		},
		Transport:     rt,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			writeStatus(w, apierrors.NewServiceUnavailable(proxyError(req, target, err)), req.reg.gr, req.name)
		},
	}
	proxy.ServeHTTP(w, r)
	return nil
}

// subresourceProxyResponder answers the proxy subresources' backend errors
// with a 503 Status.
type subresourceProxyResponder struct {
	req    *request
	target *url.URL
}

func (p subresourceProxyResponder) Error(w http.ResponseWriter, _ *http.Request, err error) {
	// The wrapping transport reports a backend failure as "error trying to
	// reach service: ..." whatever the target: say which, as before.
	if se := (*apierrors.StatusError)(nil); errors.As(err, &se) {
		msg, ok := strings.CutPrefix(se.ErrStatus.Message, "error trying to reach service: ")
		if !ok {
			writeStatus(w, se, p.req.reg.gr, p.req.name)
			return
		}
		err = errors.New(msg)
	}
	writeStatus(w, apierrors.NewServiceUnavailable(proxyError(p.req, p.target, err)), p.req.reg.gr, p.req.name)
}

// proxySubpath is the backend path of a pods/services proxy request, as
// upstream derives it: empty for .../proxy (a GET of it is redirected to
// .../proxy/), "/" for .../proxy/, "/a/b" for .../proxy/a/b, a trailing
// slash kept.
func proxySubpath(r *http.Request, req *request) string {
	if req.proxyPath != "" {
		return "/" + req.proxyPath
	}
	if strings.HasSuffix(r.URL.Path, "/proxy/") {
		return "/"
	}
	return ""
}

// proxyError is the message of a 503 from the proxy: what could not be
// reached (upstream's "error trying to reach service: ..."), and, when the
// backend answered something that is not HTTP, that it is not an HTTP port.
func proxyError(req *request, target *url.URL, err error) string {
	what := "the node"
	switch {
	case req.reg.res.Resource == "services":
		what = "service"
	case req.reg.res.Resource == "pods" && req.sub == "proxy":
		what = "pod"
	}
	msg := fmt.Sprintf("error trying to reach %s: %v", what, err)
	if strings.Contains(err.Error(), "malformed HTTP") || errors.Is(err, io.ErrUnexpectedEOF) {
		msg += fmt.Sprintf(" (%s did not answer HTTP: the proxy subresource speaks HTTP only, is %s an HTTP port?)", target.Host, target.Port())
	}
	return msg
}

// nodeTarget resolves nodes/<[scheme:]name[:port]>/proxy as upstream: the
// kubelet's own port (or none) goes to the kubelet's API with the kubelet
// client certificate; another port goes to that port on the node's address,
// over http unless https is asked for.
func (s *Server) nodeTarget(ctx context.Context, r *http.Request, req *request) (*url.URL, bool, error) {
	scheme, name, port, ok := utilnet.SplitSchemeNamePort(req.name)
	if !ok || name == "" {
		return nil, false, apierrors.NewBadRequest(fmt.Sprintf("invalid node request %q", req.name))
	}
	node, err := s.node(ctx, name)
	if err != nil {
		return nil, false, err
	}
	target, err := kubeletclient.NodeProxyURL(node, req.proxyPath, r.URL.RawQuery)
	if err != nil {
		return nil, false, apierrors.NewServiceUnavailable(err.Error())
	}
	kubeletPort := strconv.Itoa(int(node.Status.DaemonEndpoints.KubeletEndpoint.Port))
	if port == "" || port == kubeletPort {
		return target, true, nil
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return nil, false, apierrors.NewBadRequest("invalid port " + strconv.Quote(port))
	}
	if scheme == "" {
		scheme = "http"
	}
	target.Scheme = scheme
	target.Host = net.JoinHostPort(target.Hostname(), port)
	return target, false, nil
}

func (s *Server) node(ctx context.Context, name string) (*corev1.Node, error) {
	o, err := s.registries["nodes"].get(ctx, "", name, "")
	if err != nil {
		return nil, err
	}
	return o.Obj.(*corev1.Node), nil
}

func (s *Server) podTarget(ctx context.Context, r *http.Request, req *request) (*url.URL, error) {
	scheme, name, port, ok := utilnet.SplitSchemeNamePort(req.name)
	if !ok || name == "" {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid pod request %q", req.name))
	}
	if scheme == "" {
		scheme = "http"
	}
	o, err := req.reg.get(ctx, req.ns, name, "")
	if err != nil {
		return nil, err
	}
	pod := o.Obj.(*corev1.Pod)
	if req.sub == "proxy" {
		if pod.Status.PodIP == "" {
			return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("pod %s has no IP yet", name))
		}
		if port == "" {
			// As upstream: the first declared container port, else the
			// scheme's default.
			for _, c := range pod.Spec.Containers {
				if len(c.Ports) > 0 {
					port = strconv.Itoa(int(c.Ports[0].ContainerPort))
					break
				}
			}
		}
		host := pod.Status.PodIP
		if port != "" {
			if _, err := strconv.ParseUint(port, 10, 16); err != nil {
				return nil, apierrors.NewBadRequest("invalid port " + strconv.Quote(port))
			}
			host = net.JoinHostPort(pod.Status.PodIP, port)
		} else if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		return &url.URL{Scheme: scheme, Host: host, Path: proxySubpath(r, req), RawQuery: r.URL.RawQuery}, nil
	}
	if pod.Spec.NodeName == "" {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("pod %s is not scheduled to a node yet", name))
	}
	node, err := s.node(ctx, pod.Spec.NodeName)
	if err != nil {
		return nil, err
	}
	if req.sub == "portforward" {
		// The ports travel in the stream (SPDY headers or WebSocket
		// query), not as a container: the kubelet forwards to the pod's
		// network namespace.
		u, err := kubeletclient.PortForwardURL(node, req.ns, name)
		if err != nil {
			return nil, apierrors.NewServiceUnavailable(err.Error())
		}
		u.RawQuery = r.URL.RawQuery
		return u, nil
	}
	container := r.URL.Query().Get("container")
	if container == "" {
		if len(pod.Spec.Containers) != 1 {
			var names []string
			for _, c := range pod.Spec.Containers {
				names = append(names, c.Name)
			}
			return nil, apierrors.NewBadRequest(fmt.Sprintf("a container name must be specified for pod %s, choose one of: %v", name, names))
		}
		container = pod.Spec.Containers[0].Name
	} else if !hasContainer(pod, container) {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("container %s is not valid for pod %s", container, name))
	}
	var u *url.URL
	switch req.sub {
	case "log":
		opts, err := logOptions(r.URL.Query())
		if err != nil {
			return nil, err
		}
		opts.Container = container
		u, err = kubeletclient.LogURL(node, req.ns, name, opts)
	case "exec", "attach":
		q := r.URL.Query()
		opts := &corev1.PodExecOptions{Command: q["command"], Stdin: truthy(q.Get("stdin")), Stdout: truthy(q.Get("stdout")),
			Stderr: truthy(q.Get("stderr")), TTY: truthy(q.Get("tty"))}
		opts.Container = container
		if req.sub == "exec" {
			if len(opts.Command) == 0 {
				return nil, apierrors.NewBadRequest("you must specify at least 1 command")
			}
			u, err = kubeletclient.ExecURL(node, req.ns, name, opts)
		} else {
			u, err = kubeletclient.AttachURL(node, req.ns, name, opts)
		}
	default:
		return nil, apierrors.NewMethodNotSupported(req.reg.gr, req.sub)
	}
	if err != nil {
		return nil, apierrors.NewServiceUnavailable(err.Error())
	}
	return u, nil
}

// hasContainer reports whether the pod has a container of that name: an
// init, app or ephemeral one (kubectl debug execs into and reads the logs
// of ephemeral containers, as upstream allows).
func hasContainer(p *corev1.Pod, name string) bool {
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		if c.Name == name {
			return true
		}
	}
	for _, c := range p.Spec.EphemeralContainers {
		if c.Name == name {
			return true
		}
	}
	return false
}

func truthy(v string) bool { return v == "true" || v == "1" }

// logOptions parses pods/log query parameters (core/v1's conversion from
// url.Values lives in k8s.io/kubernetes, so it is done here).
func logOptions(q url.Values) (*corev1.PodLogOptions, error) {
	opts := &corev1.PodLogOptions{Follow: truthy(q.Get("follow")), Previous: truthy(q.Get("previous")), Timestamps: truthy(q.Get("timestamps"))}
	for name, dst := range map[string]**int64{"tailLines": &opts.TailLines, "limitBytes": &opts.LimitBytes, "sinceSeconds": &opts.SinceSeconds} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return nil, apierrors.NewBadRequest(fmt.Sprintf("%s must be a non-negative integer, not %q", name, v))
			}
			*dst = &n
		}
	}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("sinceTime must be an RFC 3339 time, not %q", v))
		}
		opts.SinceTime = &metav1.Time{Time: t}
	}
	return opts, nil
}

// serviceTarget resolves services/<[scheme:]name[:port]>/proxy/<path> to a
// ready endpoint of the Service, as kube-apiserver does: the port is the
// Service port's name or number (the only port when omitted).
func (s *Server) serviceTarget(ctx context.Context, r *http.Request, req *request) (*url.URL, error) {
	parts := strings.Split(req.name, ":")
	scheme := "http"
	if len(parts) == 3 {
		scheme, parts = parts[0], parts[1:]
	}
	if scheme != "http" && scheme != "https" {
		return nil, apierrors.NewBadRequest("invalid scheme " + strconv.Quote(scheme))
	}
	name, portName := parts[0], ""
	if len(parts) == 2 {
		portName = parts[1]
	}
	o, err := req.reg.get(ctx, req.ns, name, "")
	if err != nil {
		return nil, err
	}
	svc := o.Obj.(*corev1.Service)
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if portName == "" && len(svc.Spec.Ports) == 1 || p.Name == portName || strconv.Itoa(int(p.Port)) == portName {
			sp = p
			break
		}
	}
	if sp == nil {
		return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("no service port %q found for service %q", portName, name))
	}
	slices, _, err := s.registries["endpointslices"].cache.List(ctx, 0, storagePredicateForService(s, req.ns, name))
	if err != nil {
		return nil, err
	}
	for _, so := range slices {
		sl := so.Obj.(*discoveryv1.EndpointSlice)
		var port int32
		for _, p := range sl.Ports {
			if p.Port != nil && (p.Name == nil && sp.Name == "" || p.Name != nil && *p.Name == sp.Name) {
				port = *p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready || len(ep.Addresses) == 0 {
				continue
			}
			return &url.URL{Scheme: scheme, Host: net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(port))), Path: proxySubpath(r, req), RawQuery: r.URL.RawQuery}, nil
		}
	}
	return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", name))
}

func storagePredicateForService(s *Server, ns, name string) storage.Predicate {
	return storage.Predicate{
		KeyPrefix: s.registries["endpointslices"].prefix(ns),
		Label:     labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name}),
	}
}

// connectOptions is the options object kube-apiserver's connecters pass to
// admission for a CONNECT: decoded from the query (exec, attach,
// portforward) or the proxied path.
func connectOptions(req *request, r *http.Request) runtime.Object {
	var opts runtime.Object
	switch {
	case req.reg.res.Resource == "pods" && req.sub == "exec":
		opts = &corev1.PodExecOptions{}
	case req.reg.res.Resource == "pods" && req.sub == "attach":
		opts = &corev1.PodAttachOptions{}
	case req.reg.res.Resource == "pods" && req.sub == "portforward":
		opts = &corev1.PodPortForwardOptions{}
	case req.reg.res.Resource == "pods" && req.sub == "proxy":
		return &corev1.PodProxyOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodProxyOptions"}, Path: req.proxyPath}
	case req.reg.res.Resource == "services" && req.sub == "proxy":
		return &corev1.ServiceProxyOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceProxyOptions"}, Path: req.proxyPath}
	case req.reg.res.Resource == "nodes" && req.sub == "proxy":
		return &corev1.NodeProxyOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NodeProxyOptions"}, Path: req.proxyPath}
	default:
		return nil
	}
	// kube-apiserver's query conversions (url.Values to the options).
	_ = legacyscheme.ParameterCodec.DecodeParameters(r.URL.Query(), corev1.SchemeGroupVersion, opts)
	gvks, _, err := catalog.Scheme.ObjectKinds(opts)
	if err == nil && len(gvks) > 0 {
		opts.GetObjectKind().SetGroupVersionKind(gvks[0])
	}
	return opts
}
