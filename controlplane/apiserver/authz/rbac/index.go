package rbac

import (
	"sync"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
)

// Index is an in-memory Source: roles by name, bindings by the subjects
// they name, so a lookup costs the bindings of the user and its groups.
// Feed it with Upsert and Delete (the API server does from its watch
// caches). Safe for concurrent use.
type Index struct {
	mu           sync.RWMutex
	clusterRoles map[string]*rbacv1.ClusterRole
	roles        map[string]*rbacv1.Role // ns/name
	crbs         subjectIndex[*rbacv1.ClusterRoleBinding]
	rbs          map[string]*subjectIndex[*rbacv1.RoleBinding] // by namespace
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{
		clusterRoles: map[string]*rbacv1.ClusterRole{},
		roles:        map[string]*rbacv1.Role{},
		crbs:         newSubjectIndex[*rbacv1.ClusterRoleBinding](),
		rbs:          map[string]*subjectIndex[*rbacv1.RoleBinding]{},
	}
}

// subjectIndex holds bindings by name and by subject key ("u:alice",
// "g:devs"; ServiceAccounts are keyed by their user name).
type subjectIndex[B any] struct {
	byName    map[string]B
	keys      map[string][]string // binding name → its subject keys
	bySubject map[string]map[string]B
}

func newSubjectIndex[B any]() subjectIndex[B] {
	return subjectIndex[B]{byName: map[string]B{}, keys: map[string][]string{}, bySubject: map[string]map[string]B{}}
}

func subjectKeys(subjects []rbacv1.Subject, bindingNamespace string) []string {
	var keys []string
	for _, s := range subjects {
		switch s.Kind {
		case rbacv1.UserKind:
			keys = append(keys, "u:"+s.Name)
		case rbacv1.GroupKind:
			keys = append(keys, "g:"+s.Name)
		case rbacv1.ServiceAccountKind:
			ns := s.Namespace
			if ns == "" {
				ns = bindingNamespace
			}
			if ns != "" {
				keys = append(keys, "u:"+ServiceAccountUsername(ns, s.Name))
			}
		}
	}
	return keys
}

func (x *subjectIndex[B]) put(name string, b B, keys []string) {
	x.del(name)
	x.byName[name] = b
	x.keys[name] = keys
	for _, k := range keys {
		m := x.bySubject[k]
		if m == nil {
			m = map[string]B{}
			x.bySubject[k] = m
		}
		m[name] = b
	}
}

func (x *subjectIndex[B]) del(name string) {
	for _, k := range x.keys[name] {
		if m := x.bySubject[k]; m != nil {
			delete(m, name)
			if len(m) == 0 {
				delete(x.bySubject, k)
			}
		}
	}
	delete(x.keys, name)
	delete(x.byName, name)
}

func (x *subjectIndex[B]) lookup(u *authn.User) []B {
	var out []B
	var seen map[string]bool
	add := func(m map[string]B) {
		for name, b := range m {
			if seen != nil {
				if seen[name] {
					continue
				}
				seen[name] = true
			}
			out = append(out, b)
		}
	}
	n := 0
	if m := x.bySubject["u:"+u.Name]; m != nil {
		n++
		add(m)
	}
	for _, g := range u.Groups {
		m := x.bySubject["g:"+g]
		if m == nil {
			continue
		}
		if n++; n == 2 && seen == nil {
			// A second matching subject may repeat a binding: dedupe from now on.
			seen = make(map[string]bool, len(out)+len(m))
			for _, b := range out {
				seen[bindingName(b)] = true
			}
		}
		add(m)
	}
	return out
}

func bindingName(b any) string {
	switch v := b.(type) {
	case *rbacv1.ClusterRoleBinding:
		return v.Name
	case *rbacv1.RoleBinding:
		return v.Name
	}
	return ""
}

// Upsert adds or replaces a Role, ClusterRole, RoleBinding or
// ClusterRoleBinding; other objects are ignored. obj must not be mutated
// afterwards.
func (x *Index) Upsert(obj runtime.Object) {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch o := obj.(type) {
	case *rbacv1.ClusterRole:
		x.clusterRoles[o.Name] = o
	case *rbacv1.Role:
		x.roles[o.Namespace+"/"+o.Name] = o
	case *rbacv1.ClusterRoleBinding:
		x.crbs.put(o.Name, o, subjectKeys(o.Subjects, ""))
	case *rbacv1.RoleBinding:
		si := x.rbs[o.Namespace]
		if si == nil {
			s := newSubjectIndex[*rbacv1.RoleBinding]()
			si = &s
			x.rbs[o.Namespace] = si
		}
		si.put(o.Name, o, subjectKeys(o.Subjects, o.Namespace))
	}
}

// Delete removes obj (matched by kind, namespace and name).
func (x *Index) Delete(obj runtime.Object) {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch o := obj.(type) {
	case *rbacv1.ClusterRole:
		delete(x.clusterRoles, o.Name)
	case *rbacv1.Role:
		delete(x.roles, o.Namespace+"/"+o.Name)
	case *rbacv1.ClusterRoleBinding:
		x.crbs.del(o.Name)
	case *rbacv1.RoleBinding:
		if si := x.rbs[o.Namespace]; si != nil {
			si.del(o.Name)
			if len(si.byName) == 0 {
				delete(x.rbs, o.Namespace)
			}
		}
	}
}

// ClusterRoleBindingsFor implements Source.
func (x *Index) ClusterRoleBindingsFor(u *authn.User) []*rbacv1.ClusterRoleBinding {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.crbs.lookup(u)
}

// RoleBindingsFor implements Source.
func (x *Index) RoleBindingsFor(namespace string, u *authn.User) []*rbacv1.RoleBinding {
	x.mu.RLock()
	defer x.mu.RUnlock()
	si := x.rbs[namespace]
	if si == nil {
		return nil
	}
	return si.lookup(u)
}

// ClusterRole implements Source.
func (x *Index) ClusterRole(name string) (*rbacv1.ClusterRole, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r, ok := x.clusterRoles[name]
	return r, ok
}

// Role implements Source.
func (x *Index) Role(namespace, name string) (*rbacv1.Role, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r, ok := x.roles[namespace+"/"+name]
	return r, ok
}
