package apiserver

import (
	"context"
	"errors"
	"fmt"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/storage"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
)

// Operation is what a request does to an object, for admission.
type Operation string

// Admission operations.
const (
	OpCreate  Operation = "CREATE"
	OpUpdate  Operation = "UPDATE"
	OpDelete  Operation = "DELETE"
	OpConnect Operation = "CONNECT"
)

// AdmissionAttributes describe one write for the admission chain. A mutating
// plugin may change Object.
type AdmissionAttributes struct {
	Operation   Operation
	Resource    *catalog.Resource
	Subresource string
	Namespace   string
	Name        string
	Object      runtime.Object
	OldObject   runtime.Object
	DryRun      bool
}

// Admitter is one admission plugin. Plugins run in order after
// authorization and defaulting, before validation; the first error refuses
// the request (return an apierrors StatusError to choose the code).
type Admitter interface {
	Name() string
	Admit(ctx context.Context, a *AdmissionAttributes) error
}

func (s *Server) admit(ctx context.Context, a *AdmissionAttributes) error {
	if err := s.runBuiltin(ctx, s.admission, a); err != nil {
		return err
	}
	return dynamicError(s.admitDynamic(ctx, a))
}

// validate runs the validating admission phase, after the strategy's
// validation and before storage, in kube-apiserver's order: the built-in
// validating plugins, then policies and webhooks, and ResourceQuota last,
// so that only a request every other check admitted is charged.
func (s *Server) validate(ctx context.Context, a *AdmissionAttributes) error {
	if s.podSecurity != nil {
		if err := s.podSecurity.check(ctx, a); err != nil {
			return err
		}
	}
	if err := s.runBuiltin(ctx, s.validating, a); err != nil {
		return err
	}
	if err := dynamicError(s.validateDynamic(ctx, a)); err != nil {
		return err
	}
	if s.quota == nil {
		return nil
	}
	return s.runBuiltin(ctx, []Admitter{s.quota}, a)
}

func (s *Server) runBuiltin(ctx context.Context, plugins []Admitter, a *AdmissionAttributes) error {
	for _, p := range plugins {
		if err := p.Admit(ctx, a); err != nil {
			var se *apierrors.StatusError
			if errors.As(err, &se) {
				return err
			}
			if isTransient(err) {
				// A plugin that could not read what it checks (etcd down,
				// a timeout) has not refused anything: 503/504, which
				// clients retry, never a final 403.
				return statusFor(err, a.Resource.GroupResource(), a.Name)
			}
			return apierrors.NewForbidden(a.Resource.GroupResource(), a.Name, fmt.Errorf("admission plugin %s: %w", p.Name(), err))
		}
	}
	return nil
}

// dynamicError keeps the plugins' Status errors (their codes and messages
// are upstream's) and makes anything else a 500.
func dynamicError(err error) error {
	if err == nil {
		return nil
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return err
	}
	return apierrors.NewInternalError(err)
}

// immortalNamespaces cannot be deleted.
var immortalNamespaces = map[string]bool{"default": true, "kube-system": true, "kube-public": true}

// initialNamespaces exist from the first start.
var initialNamespaces = []string{"default", "kube-system", "kube-public", "kube-node-lease"}

// namespaceLifecycle refuses creates in a missing or Terminating namespace
// and the deletion of the system namespaces.
type namespaceLifecycle struct{ s *Server }

func (namespaceLifecycle) Name() string { return "NamespaceLifecycle" }

func (p namespaceLifecycle) Admit(ctx context.Context, a *AdmissionAttributes) error {
	if a.Resource.Resource == "namespaces" {
		if a.Operation == OpDelete && immortalNamespaces[a.Name] {
			return apierrors.NewForbidden(a.Resource.GroupResource(), a.Name, errors.New("this namespace may not be deleted"))
		}
		return nil
	}
	if a.Operation != OpCreate || !a.Resource.Namespaced {
		return nil
	}
	nsReg := p.s.registries["namespaces"]
	// The cache first; a miss is checked in etcd (a namespace just created
	// may not have reached the cache yet).
	o, _, err := nsReg.cache.Get(ctx, 0, nsReg.key("", a.Namespace))
	if errors.Is(err, storage.ErrNotFound) {
		o, err = nsReg.get(ctx, "", a.Namespace, "")
	}
	if err != nil {
		if apierrors.IsNotFound(err) || errors.Is(err, storage.ErrNotFound) {
			return apierrors.NewNotFound(corev1.Resource("namespaces"), a.Namespace)
		}
		return err
	}
	ns := o.Obj.(*corev1.Namespace)
	if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
		// Events about the namespace's own cleanup may still be written.
		if a.Resource.Resource == "events" {
			return nil
		}
		return apierrors.NewForbidden(a.Resource.GroupResource(), a.Name,
			fmt.Errorf("unable to create new content in namespace %s because it is being terminated", a.Namespace))
	}
	return nil
}

// defaultTolerationSeconds gives every pod the 300 s NoExecute tolerations
// for not-ready and unreachable nodes, unless it already tolerates them.
type defaultTolerationSeconds struct{ seconds int64 }

func (defaultTolerationSeconds) Name() string { return "DefaultTolerationSeconds" }

func (p defaultTolerationSeconds) Admit(_ context.Context, a *AdmissionAttributes) error {
	// On create and on update, as upstream: an update that replaces the
	// tolerations gets these back, so it only adds to the old ones (which
	// pod update validation demands).
	if a.Resource.Resource != "pods" || (a.Operation != OpCreate && a.Operation != OpUpdate) || a.Subresource != "" {
		return nil
	}
	pod, ok := a.Object.(*corev1.Pod)
	if !ok {
		return nil
	}
	for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		tolerated := false
		for _, t := range pod.Spec.Tolerations {
			if (t.Key == key || t.Key == "") &&
				(t.Effect == "" || t.Effect == corev1.TaintEffectNoExecute) {
				tolerated = true
				break
			}
		}
		if !tolerated {
			secs := p.seconds
			pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{
				Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &secs,
			})
		}
	}
	return nil
}
