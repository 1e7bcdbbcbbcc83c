package apiserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/decode"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultComponentProbes are the health endpoints componentstatuses reads,
// at the components' standard ports.
var DefaultComponentProbes = map[string]string{
	"scheduler":          "https://127.0.0.1:10259/healthz",
	"controller-manager": "https://127.0.0.1:10257/healthz",
}

// serveCoreVirtual serves the two storage-less core/v1 resources: bindings
// (create) and componentstatuses (get, list).
func (s *Server) serveCoreVirtual(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, verb string) error {
	switch {
	case req.reg.res.Resource == "bindings" && verb == "create":
		return s.serveBindingResource(ctx, w, r, req)
	case req.reg.res.Resource == "componentstatuses" && (verb == "get" || verb == "list"):
		return s.serveComponentStatuses(ctx, w, r, req, verb)
	}
	return apierrors.NewMethodNotSupported(req.reg.gr, r.Method)
}

// serveBindingResource serves POST .../namespaces/<ns>/bindings: the
// Binding names the pod, which is bound as through pods/<name>/binding.
func (s *Server) serveBindingResource(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var b corev1.Binding
	if _, err := decodeInto(body, &b, r.Header.Get("Content-Type"), decode.Ignore); err != nil {
		return err
	}
	if b.Name == "" {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Binding").GroupKind(), "", fieldRequired("metadata", "name"))
	}
	pods := &request{reg: s.registries["pods"], verb: "create", ns: req.ns, name: b.Name, sub: "binding"}
	return s.bindPod(ctx, w, r, pods, &b)
}

// serveComponentStatuses answers componentstatuses (deprecated upstream,
// still read by tools) from the components' health endpoints and etcd's.
func (s *Server) serveComponentStatuses(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, verb string) error {
	probes := s.cfg.ComponentProbes
	if probes == nil {
		probes = DefaultComponentProbes
	}
	names := []string{"etcd-0"}
	for n := range probes {
		names = append(names, n)
	}
	sort.Strings(names)
	if verb == "get" {
		if req.name != "etcd-0" && probes[req.name] == "" {
			return apierrors.NewNotFound(req.reg.gr, req.name)
		}
		names = []string{req.name}
	}
	list := &corev1.ComponentStatusList{TypeMeta: metav1.TypeMeta{Kind: "ComponentStatusList", APIVersion: "v1"}, Items: []corev1.ComponentStatus{}}
	for _, n := range names {
		var msg string
		var err error
		if n == "etcd-0" {
			if _, err = s.store.Revision(ctx); err == nil {
				msg = `{"health":"true","reason":""}`
			}
		} else {
			msg, err = probeHealth(ctx, probes[n])
		}
		cond := corev1.ComponentCondition{Type: corev1.ComponentHealthy, Status: corev1.ConditionTrue, Message: msg}
		if err != nil {
			cond.Status, cond.Message, cond.Error = corev1.ConditionFalse, "", err.Error()
		}
		list.Items = append(list.Items, corev1.ComponentStatus{TypeMeta: metav1.TypeMeta{Kind: "ComponentStatus", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: n}, Conditions: []corev1.ComponentCondition{cond}})
	}
	warn(w, []string{"v1 ComponentStatus is deprecated in v1.19+"}) // as kube-apiserver says
	if verb == "get" {
		return s.writeObject(w, r, req.reg, http.StatusOK, &list.Items[0])
	}
	return s.writeObject(w, r, req.reg, http.StatusOK, list)
}

// probeHealth GETs a component's /healthz (self-signed serving
// certificates are expected, as upstream's probe does) and returns its
// body when it answers 200.
func probeHealth(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // health probe only
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(fmt.Sprintf("Unhealthy: %d %s", resp.StatusCode, strings.TrimSpace(string(b))))
	}
	return strings.TrimSpace(string(b)), nil
}
