package apiserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/component-helpers/auth/rbac/reconciliation"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/node"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
	"github.com/waggle-io/waggle/controlplane/storage"
)

// Authorization modes (--authorization-mode).
const (
	ModeAlwaysAllow = "AlwaysAllow"
	ModeAlwaysDeny  = "AlwaysDeny"
	ModeNode        = "Node"
	ModeRBAC        = "RBAC"
)

// DefaultAuthorizationModes is kube-apiserver's usual production setting.
var DefaultAuthorizationModes = []string{ModeNode, ModeRBAC}

// authorization is the server's authorization state: the chain, and the
// indexes the RBAC and Node authorizers read (fed from the watch caches).
type authorization struct {
	modes  []string
	rbac   *rbac.Authorizer
	index  *rbac.Index
	graph  *node.Graph
	synced []*atomic.Bool
	policy *bootstrap.Policy
	ready  atomic.Bool // bootstrap policy reconciled
	// following counts the authorizers' open cache watchers.
	following atomic.Int32
}

// setupAuthorization builds the authorizer chain from the configured modes
// and starts following the objects it needs. With RBAC, members of
// system:masters are allowed before any mode is asked, as kube-apiserver
// does.
func (s *Server) setupAuthorization(ctx context.Context) error {
	if s.cfg.Authorizer != nil {
		s.authz = s.cfg.Authorizer
		return nil
	}
	modes := s.cfg.AuthorizationModes
	if len(modes) == 0 {
		modes = DefaultAuthorizationModes
	}
	a := &authorization{modes: modes}
	s.authorization = a
	var chain []authz.Authorizer
	seen := map[string]bool{}
	for _, m := range modes {
		if seen[m] {
			return fmt.Errorf("apiserver: --authorization-mode %q given twice", m)
		}
		seen[m] = true
		switch m {
		case ModeAlwaysAllow:
			chain = append(chain, authz.AlwaysAllow{})
		case ModeAlwaysDeny:
			chain = append(chain, authz.AlwaysDeny{})
		case ModeRBAC:
			a.index = rbac.NewIndex()
			a.rbac = rbac.New(a.index)
			chain = append(chain, a.rbac)
		case ModeNode:
			a.graph = node.NewGraph()
		default:
			return fmt.Errorf("apiserver: unknown --authorization-mode %q (known: AlwaysAllow, AlwaysDeny, Node, RBAC)", m)
		}
	}
	if seen[ModeNode] || seen[ModeRBAC] {
		p, err := bootstrap.Default()
		if err != nil {
			return fmt.Errorf("apiserver: %w", err)
		}
		a.policy = p
	}
	if a.graph != nil {
		nodeRole, ok := a.policy.ClusterRole("system:node")
		if !ok {
			return errors.New("apiserver: bootstrap policy has no system:node role")
		}
		// Node goes where it was named in the list.
		i := slices.Index(modes, ModeNode)
		chain = slices.Insert(chain, min(i, len(chain)), authz.Authorizer(node.New(a.graph, nodeRole.Rules)))
	}
	if seen[ModeRBAC] {
		chain = append([]authz.Authorizer{rbac.PrivilegedGroups{authn.GroupMasters}}, chain...)
	}
	s.authz = authz.Union(chain...)

	if a.index != nil {
		idx := a.index
		for _, res := range []string{"clusterroles", "clusterrolebindings", "roles", "rolebindings"} {
			if err := s.follow(ctx, res, func(t watch.EventType, obj runtime.Object) {
				if t == watch.Deleted {
					idx.Delete(obj)
				} else {
					idx.Upsert(obj)
				}
			}); err != nil {
				return err
			}
		}
		s.admission = append(s.admission, rbacEscalation{s})
	}
	if a.graph != nil {
		s.admission = append(s.admission, nodeRestriction{s})
		g := a.graph
		if err := s.follow(ctx, "pods", func(t watch.EventType, obj runtime.Object) {
			p := obj.(*corev1.Pod)
			if t == watch.Deleted {
				g.DeletePod(p.Namespace, p.Name)
			} else {
				g.UpsertPod(p)
			}
		}); err != nil {
			return err
		}
		if s.registries["podcertificaterequests"] != nil {
			if err := s.follow(ctx, "podcertificaterequests", func(t watch.EventType, obj runtime.Object) {
				r := obj.(*certificatesv1.PodCertificateRequest)
				if t == watch.Deleted {
					g.DeletePodCertificateRequest(r.Namespace, r.Name)
				} else {
					g.UpsertPodCertificateRequest(r.Namespace, r.Name, string(r.Spec.NodeName))
				}
			}); err != nil {
				return err
			}
		}
		if s.registries["persistentvolumeclaims"] != nil {
			if err := s.follow(ctx, "persistentvolumeclaims", func(t watch.EventType, obj runtime.Object) {
				c := obj.(*corev1.PersistentVolumeClaim)
				if t == watch.Deleted {
					g.DeleteClaim(c.Namespace, c.Name)
				} else {
					g.UpsertClaim(c)
				}
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// follow feeds apply with every object of resource from the watch cache:
// the current state, then each change, resuming after a closed watcher.
// (A resume older than the cache's window replays everything again; apply
// replaces objects by name, and a replay cannot miss a deletion that is
// still in the window, which is the case for every watcher this fast.)
func (s *Server) follow(ctx context.Context, resource string, apply func(watch.EventType, runtime.Object)) error {
	reg := s.registries[resource]
	if reg == nil {
		return fmt.Errorf("apiserver: authorization needs the %s resource, which is not served", resource)
	}
	synced := &atomic.Bool{}
	s.authorization.synced = append(s.authorization.synced, synced)
	bgCtx := s.bgCtx
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		var from int64
		for bgCtx.Err() == nil {
			w, err := reg.cache.Watch(bgCtx, from, storage.Predicate{})
			var ce *storage.CompactedError
			if errors.As(err, &ce) {
				from = 0
				continue
			}
			if err != nil {
				if bgCtx.Err() == nil {
					s.log.Debug("authorization: watch", "resource", resource, "err", err)
					select {
					case <-bgCtx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
				continue
			}
			s.authorization.following.Add(1)
			for {
				e, t, err := w.Next(bgCtx, synced.Load())
				if err != nil {
					break
				}
				if e == nil { // the initial state is applied
					synced.Store(true)
					continue
				}
				if e.Type == watch.Bookmark || e.Obj == nil {
					continue
				}
				apply(t, e.Obj.Obj)
				from = e.Rev
			}
			w.Stop()
			s.authorization.following.Add(-1)
		}
	}()
	return nil
}

// authorizationReady reports whether the authorizers have their state.
func (s *Server) authorizationReady() error {
	a := s.authorization
	if a == nil {
		return nil
	}
	for _, b := range a.synced {
		if !b.Load() {
			return errors.New("authorization state not synced yet")
		}
	}
	if a.policy != nil && !a.ready.Load() {
		return errors.New("default RBAC policy not reconciled yet")
	}
	return nil
}

// reconcilePolicy makes sure the default roles and bindings exist with at
// least their default rules and subjects, as kube-apiserver's
// rbac/bootstrap-roles hook does: missing ones are created, missing rules,
// subjects, labels and annotations added; what users added stays; objects
// annotated rbac.authorization.kubernetes.io/autoupdate=false are left alone.
func (s *Server) reconcilePolicy(ctx context.Context) error {
	a := s.authorization
	if a == nil || a.policy == nil {
		return nil
	}
	p := a.policy
	ruleClient := func(res string) reconciliation.RuleOwnerModifier { return regRoles{ctx: ctx, reg: s.registries[res]} }
	bindClient := func(res string) reconciliation.RoleBindingModifier {
		return regBindings{ctx: ctx, reg: s.registries[res]}
	}
	var errs []error
	for i := range p.ClusterRoles {
		o := reconciliation.ReconcileRoleOptions{Role: reconciliation.ClusterRoleRuleOwner{ClusterRole: p.ClusterRoles[i].DeepCopy()}, Client: ruleClient("clusterroles"), Confirm: true}
		if _, err := o.Run(); err != nil {
			errs = append(errs, fmt.Errorf("clusterrole %s: %w", p.ClusterRoles[i].Name, err))
		}
	}
	for i := range p.ClusterRoleBindings {
		o := reconciliation.ReconcileRoleBindingOptions{RoleBinding: reconciliation.ClusterRoleBindingAdapter{ClusterRoleBinding: p.ClusterRoleBindings[i].DeepCopy()}, Client: bindClient("clusterrolebindings"), Confirm: true}
		if _, err := o.Run(); err != nil {
			errs = append(errs, fmt.Errorf("clusterrolebinding %s: %w", p.ClusterRoleBindings[i].Name, err))
		}
	}
	for i := range p.Roles {
		o := reconciliation.ReconcileRoleOptions{Role: reconciliation.RoleRuleOwner{Role: p.Roles[i].DeepCopy()}, Client: ruleClient("roles"), Confirm: true}
		if _, err := o.Run(); err != nil {
			errs = append(errs, fmt.Errorf("role %s/%s: %w", p.Roles[i].Namespace, p.Roles[i].Name, err))
		}
	}
	for i := range p.RoleBindings {
		o := reconciliation.ReconcileRoleBindingOptions{RoleBinding: reconciliation.RoleBindingAdapter{RoleBinding: p.RoleBindings[i].DeepCopy()}, Client: bindClient("rolebindings"), Confirm: true}
		if _, err := o.Run(); err != nil {
			errs = append(errs, fmt.Errorf("rolebinding %s/%s: %w", p.RoleBindings[i].Namespace, p.RoleBindings[i].Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("apiserver: reconcile default RBAC policy: %w", err)
	}
	a.ready.Store(true)
	return nil
}

// waitAuthorizationReady waits until the authorizers have their state and
// the default policy has reached the RBAC index, so the components started
// right after the server are not refused for a moment.
func (s *Server) waitAuthorizationReady(ctx context.Context) error {
	a := s.authorization
	if a == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := s.authorizationReady()
		if err == nil && a.index != nil {
			for i := range a.policy.ClusterRoleBindings {
				if _, ok := a.index.ClusterRole(a.policy.ClusterRoleBindings[i].RoleRef.Name); !ok {
					err = errors.New("default policy not indexed yet")
					break
				}
			}
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apiserver: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// regRoles and regBindings adapt the registries to the reconciler.
type regRoles struct {
	ctx context.Context
	reg *registry
}

func ruleOwner(obj runtime.Object) reconciliation.RuleOwner {
	switch o := obj.(type) {
	case *rbacv1.ClusterRole:
		return reconciliation.ClusterRoleRuleOwner{ClusterRole: o}
	case *rbacv1.Role:
		return reconciliation.RoleRuleOwner{Role: o}
	}
	panic(fmt.Sprintf("not a role: %T", obj))
}

func (c regRoles) Get(namespace, name string) (reconciliation.RuleOwner, error) {
	o, err := c.reg.get(c.ctx, namespace, name, "")
	if err != nil {
		return nil, err
	}
	return ruleOwner(o.Obj.DeepCopyObject()), nil
}

func (c regRoles) Create(in reconciliation.RuleOwner) (reconciliation.RuleOwner, error) {
	out, err := c.reg.create(c.ctx, in.GetNamespace(), in.GetObject().DeepCopyObject(), writeOpts{})
	if err != nil {
		return nil, err
	}
	return ruleOwner(out), nil
}

func (c regRoles) Update(in reconciliation.RuleOwner) (reconciliation.RuleOwner, error) {
	out, err := c.reg.guaranteedUpdate(c.ctx, in.GetNamespace(), in.GetName(), "", writeOpts{}, func(runtime.Object) (runtime.Object, error) {
		return in.GetObject().DeepCopyObject(), nil
	})
	if err != nil {
		return nil, err
	}
	return ruleOwner(out), nil
}

type regBindings struct {
	ctx context.Context
	reg *registry
}

func bindingOf(obj runtime.Object) reconciliation.RoleBinding {
	switch o := obj.(type) {
	case *rbacv1.ClusterRoleBinding:
		return reconciliation.ClusterRoleBindingAdapter{ClusterRoleBinding: o}
	case *rbacv1.RoleBinding:
		return reconciliation.RoleBindingAdapter{RoleBinding: o}
	}
	panic(fmt.Sprintf("not a binding: %T", obj))
}

func (c regBindings) Get(namespace, name string) (reconciliation.RoleBinding, error) {
	o, err := c.reg.get(c.ctx, namespace, name, "")
	if err != nil {
		return nil, err
	}
	return bindingOf(o.Obj.DeepCopyObject()), nil
}

func (c regBindings) Create(in reconciliation.RoleBinding) (reconciliation.RoleBinding, error) {
	out, err := c.reg.create(c.ctx, in.GetNamespace(), in.GetObject().DeepCopyObject(), writeOpts{})
	if err != nil {
		return nil, err
	}
	return bindingOf(out), nil
}

func (c regBindings) Update(in reconciliation.RoleBinding) (reconciliation.RoleBinding, error) {
	out, err := c.reg.guaranteedUpdate(c.ctx, in.GetNamespace(), in.GetName(), "", writeOpts{}, func(runtime.Object) (runtime.Object, error) {
		return in.GetObject().DeepCopyObject(), nil
	})
	if err != nil {
		return nil, err
	}
	return bindingOf(out), nil
}

func (c regBindings) Delete(namespace, name string, uid types.UID) error {
	_, _, err := c.reg.deleteObject(c.ctx, namespace, name, &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}, writeOpts{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// rbacEscalation is upstream's RBAC registry check, as an admission step: a
// Role or ClusterRole may be written only by a user who holds every rule in
// it (or may "escalate" on it), a binding only by one who holds the bound
// role's rules (or may "bind" it); an aggregationRule needs full authority.
// Writes by the server itself (no user) and by system:masters pass.
type rbacEscalation struct{ s *Server }

func (rbacEscalation) Name() string { return "RBACEscalation" }

func (p rbacEscalation) Admit(ctx context.Context, a *AdmissionAttributes) error {
	if a.Resource.Group != rbacv1.GroupName || (a.Operation != OpCreate && a.Operation != OpUpdate) || a.Subresource != "" {
		return nil
	}
	u, ok := authn.UserFrom(ctx)
	if !ok || slices.Contains(u.Groups, authn.GroupMasters) {
		return nil
	}
	z := p.s.authorization.rbac
	gr := a.Resource.GroupResource()
	allowedTo := func(verb, resource, namespace, name string) bool {
		ok, _, err := p.s.authz.Authorize(ctx, authz.Attributes{User: u, Verb: verb, APIGroup: rbacv1.GroupName, APIVersion: "v1",
			Resource: resource, Namespace: namespace, Name: name, ResourceRequest: true})
		return ok && err == nil
	}
	forbid := func(err error) error { return apierrors.NewForbidden(gr, a.Name, err) }
	switch a.Resource.Resource {
	case "clusterroles", "roles":
		var rules []rbacv1.PolicyRule
		var agg, oldAgg *rbacv1.AggregationRule
		var oldRules []rbacv1.PolicyRule
		switch o := a.Object.(type) {
		case *rbacv1.ClusterRole:
			rules, agg = o.Rules, o.AggregationRule
			if old, ok := a.OldObject.(*rbacv1.ClusterRole); ok {
				oldRules, oldAgg = old.Rules, old.AggregationRule
			}
		case *rbacv1.Role:
			rules = o.Rules
			if old, ok := a.OldObject.(*rbacv1.Role); ok {
				oldRules = old.Rules
			}
		default:
			return nil
		}
		if a.Operation == OpUpdate && apiequality.Semantic.DeepEqual(rules, oldRules) && apiequality.Semantic.DeepEqual(agg, oldAgg) {
			return nil
		}
		if allowedTo("escalate", a.Resource.Resource, a.Namespace, a.Name) {
			return nil
		}
		if agg != nil && !apiequality.Semantic.DeepEqual(agg, oldAgg) {
			if err := z.ConfirmNoEscalation(u, "", rbac.FullAuthority); err != nil {
				return forbid(errors.New("must have cluster-admin privileges to use the aggregationRule"))
			}
		}
		if agg != nil {
			return nil // the aggregation controller fills the rules
		}
		if err := z.ConfirmNoEscalation(u, a.Namespace, rules); err != nil {
			return forbid(err)
		}
	case "clusterrolebindings", "rolebindings":
		var ref rbacv1.RoleRef
		var oldRef *rbacv1.RoleRef
		switch o := a.Object.(type) {
		case *rbacv1.ClusterRoleBinding:
			ref = o.RoleRef
			if old, ok := a.OldObject.(*rbacv1.ClusterRoleBinding); ok {
				oldRef = &old.RoleRef
			}
		case *rbacv1.RoleBinding:
			ref = o.RoleRef
			if old, ok := a.OldObject.(*rbacv1.RoleBinding); ok {
				oldRef = &old.RoleRef
			}
		default:
			return nil
		}
		if oldRef != nil && *oldRef == ref {
			return nil
		}
		res := strings.ToLower(ref.Kind) + "s"
		if ref.APIGroup == rbacv1.GroupName && (res == "roles" || res == "clusterroles") && allowedTo("bind", res, a.Namespace, ref.Name) {
			return nil
		}
		rules, err := z.RoleRefRules(ref, a.Namespace)
		if err != nil {
			return forbid(err)
		}
		if err := z.ConfirmNoEscalation(u, a.Namespace, rules); err != nil {
			return forbid(err)
		}
	}
	return nil
}
