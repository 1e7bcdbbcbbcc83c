// Package client is how the API server reaches a kubelet's API: it builds
// the URLs of container logs, exec, attach, port-forward and the node proxy
// from the Node object and the pods/log, pods/exec options, and the TLS
// transport that presents the API server's client certificate. The API
// server proxies the request (upgrades included) to the URL and follows no
// redirect.
//
// It is not the kubelet API's server (kubelet/server) and holds no state.
package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
)

// ErrNoAddress means the Node has no address or no kubelet port yet.
var ErrNoAddress = errors.New("node has no kubelet address")

// Endpoint returns https://<address>:<port> of the node's kubelet, preferring
// its InternalIP, then ExternalIP, then Hostname.
func Endpoint(node *v1.Node) (*url.URL, error) {
	port := node.Status.DaemonEndpoints.KubeletEndpoint.Port
	if port == 0 {
		return nil, fmt.Errorf("%w: node %s reports no kubelet port", ErrNoAddress, node.Name)
	}
	for _, t := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP, v1.NodeHostName} {
		for _, a := range node.Status.Addresses {
			if a.Type == t && a.Address != "" {
				return &url.URL{Scheme: "https", Host: net.JoinHostPort(a.Address, strconv.Itoa(int(port)))}, nil
			}
		}
	}
	return nil, fmt.Errorf("%w: node %s reports no address", ErrNoAddress, node.Name)
}

// LogURL is the kubelet URL serving a container's log with opts (follow,
// previous, tailLines, limitBytes, timestamps, sinceSeconds, sinceTime).
func LogURL(node *v1.Node, ns, pod string, opts *v1.PodLogOptions) (*url.URL, error) {
	u, err := Endpoint(node)
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &v1.PodLogOptions{}
	}
	u.Path = "/containerLogs/" + url.PathEscape(ns) + "/" + url.PathEscape(pod) + "/" + url.PathEscape(opts.Container)
	q := url.Values{}
	if opts.Follow {
		q.Set("follow", "true")
	}
	if opts.Previous {
		q.Set("previous", "true")
	}
	if opts.Timestamps {
		q.Set("timestamps", "true")
	}
	if opts.TailLines != nil {
		q.Set("tailLines", strconv.FormatInt(*opts.TailLines, 10))
	}
	if opts.LimitBytes != nil {
		q.Set("limitBytes", strconv.FormatInt(*opts.LimitBytes, 10))
	}
	if opts.SinceSeconds != nil {
		q.Set("sinceSeconds", strconv.FormatInt(*opts.SinceSeconds, 10))
	}
	if opts.SinceTime != nil {
		q.Set("sinceTime", opts.SinceTime.UTC().Format(time.RFC3339))
	}
	u.RawQuery = q.Encode()
	return u, nil
}

// ExecURL is the kubelet URL of an exec with opts (command, stdin, stdout,
// stderr, tty). The API server forwards the client's upgrade request (SPDY
// or WebSocket, with its Sec-WebSocket-Protocol / X-Stream-Protocol-Version
// headers) to it unchanged.
func ExecURL(node *v1.Node, ns, pod string, opts *v1.PodExecOptions) (*url.URL, error) {
	return streamURL(node, "exec", ns, pod, opts)
}

// AttachURL is the kubelet URL of an attach (not served by Waggle's kubelet
// yet: it answers 404).
func AttachURL(node *v1.Node, ns, pod string, opts *v1.PodExecOptions) (*url.URL, error) {
	return streamURL(node, "attach", ns, pod, opts)
}

func streamURL(node *v1.Node, kind, ns, pod string, opts *v1.PodExecOptions) (*url.URL, error) {
	u, err := Endpoint(node)
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &v1.PodExecOptions{}
	}
	u.Path = "/" + kind + "/" + url.PathEscape(ns) + "/" + url.PathEscape(pod) + "/" + url.PathEscape(opts.Container)
	q := url.Values{}
	for _, c := range opts.Command {
		q.Add("command", c)
	}
	// The kubelet API's parameter names: input, output, error, tty.
	for k, v := range map[string]bool{v1.ExecStdinParam: opts.Stdin, v1.ExecStdoutParam: opts.Stdout, v1.ExecStderrParam: opts.Stderr, v1.ExecTTYParam: opts.TTY} {
		if v {
			q.Set(k, "1")
		}
	}
	u.RawQuery = q.Encode()
	return u, nil
}

// PortForwardURL is the kubelet URL of pods/portforward (ports travel in
// the client's stream headers, as kubectl sends them).
func PortForwardURL(node *v1.Node, ns, pod string) (*url.URL, error) {
	u, err := Endpoint(node)
	if err != nil {
		return nil, err
	}
	u.Path = "/portForward/" + url.PathEscape(ns) + "/" + url.PathEscape(pod)
	return u, nil
}

// NodeProxyURL is the kubelet URL that nodes/proxy/<path> reaches.
func NodeProxyURL(node *v1.Node, path string, rawQuery string) (*url.URL, error) {
	u, err := Endpoint(node)
	if err != nil {
		return nil, err
	}
	if path == "" || path[0] != '/' {
		path = "/" + path
	}
	u.Path = path
	u.RawQuery = rawQuery
	return u, nil
}

// TLSConfig is the client TLS config for kubelets: the API server's client
// certificate, and either the CA that signed the kubelets' serving certs or,
// when caPool is nil, no verification of them (kubelets serve self-signed
// certificates by default, as with Kubernetes' default
// --kubelet-certificate-authority unset).
func TLSConfig(clientCert tls.Certificate, caPool *x509.CertPool) *tls.Config {
	return &tls.Config{
		Certificates:       []tls.Certificate{clientCert},
		RootCAs:            caPool,
		InsecureSkipVerify: caPool == nil, //nolint:gosec // see doc comment
		MinVersion:         tls.VersionTLS12,
		// SPDY and WebSocket upgrades need HTTP/1.1.
		NextProtos: []string{"http/1.1"},
	}
}

// Transport returns an HTTP transport to kubelets with TLSConfig; it
// follows no redirects (the caller's http.Client should not either: use
// Client).
func Transport(clientCert tls.Certificate, caPool *x509.CertPool) *http.Transport {
	return &http.Transport{
		TLSClientConfig:     TLSConfig(clientCert, caPool),
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 10,
	}
}

// Client is an http.Client on Transport that never follows redirects.
func Client(clientCert tls.Certificate, caPool *x509.CertPool) *http.Client {
	return &http.Client{
		Transport:     Transport(clientCert, caPool),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
