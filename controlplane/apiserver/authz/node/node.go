// Package node is the Node authorizer: it decides for kubelets (users
// system:node:<name> in group system:nodes) as upstream's does. A node may
// read only the Secrets, ConfigMaps, PersistentVolumeClaims and
// PersistentVolumes of pods bound to it, and request tokens only for the
// ServiceAccounts those pods run as (and get those ServiceAccounts); it
// may create PodCertificateRequests, get those naming it, and list or
// watch them only with a spec.nodeName field selector naming itself; it
// may get, list and watch only its own Node (list/watch with a
// metadata.name field selector) and list or watch pods only with a
// spec.nodeName field selector naming itself; for
// everything else it holds the rules of the system:node ClusterRole.
// Which objects a write may touch (its own Node and Lease, its pods'
// status, mirror pods only) is the NodeRestriction admission plugin's part,
// not this package's.
//
// Graph is the index of pods by node (and claims by name) the authorizer
// consults; the API server feeds it from its watch caches.
package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac"
)

// Identity of nodes.
const (
	NodesGroup     = "system:nodes"
	NodeUserPrefix = "system:node:"
)

// NodeName returns the node a user is, when it is one.
func NodeName(u *authn.User) (string, bool) {
	if u == nil || !slices.Contains(u.Groups, NodesGroup) {
		return "", false
	}
	name, ok := strings.CutPrefix(u.Name, NodeUserPrefix)
	return name, ok && name != ""
}

// Authorizer is the Node authorizer.
type Authorizer struct {
	g     *Graph
	rules []rbacv1.PolicyRule
}

// New returns a Node authorizer over g; nodeRules are the system:node
// ClusterRole's rules, which every node holds.
func New(g *Graph, nodeRules []rbacv1.PolicyRule) *Authorizer {
	return &Authorizer{g: g, rules: nodeRules}
}

// Authorize implements authz.Authorizer. It has no opinion on users that
// are not nodes.
func (z *Authorizer) Authorize(_ context.Context, a authz.Attributes) (bool, string, error) {
	node, ok := NodeName(a.User)
	if !ok {
		return false, "", nil
	}
	if a.ResourceRequest {
		switch {
		case a.APIGroup == "" && a.Subresource == "" && (a.Resource == "secrets" || a.Resource == "configmaps"):
			return z.related(node, a, a.Resource, "get", "list", "watch")
		case a.APIGroup == "" && a.Subresource == "" && a.Resource == "persistentvolumeclaims":
			return z.related(node, a, a.Resource, "get")
		case a.APIGroup == "" && a.Subresource == "" && a.Resource == "persistentvolumes":
			return z.related(node, a, a.Resource, "get")
		case a.APIGroup == "" && a.Resource == "serviceaccounts" && a.Subresource == "token":
			if a.Verb != "create" {
				return false, "can only create tokens", nil
			}
			return z.related(node, a, "serviceaccounts", "create")
		case a.APIGroup == "" && a.Resource == "serviceaccounts" && a.Subresource == "" && a.Verb == "get":
			// The pod certificate manager reads the UID of its pods'
			// ServiceAccounts.
			return z.related(node, a, "serviceaccounts", "get")
		case a.APIGroup == "certificates.k8s.io" && a.Resource == "podcertificaterequests":
			return z.podCertificateRequest(node, a)
		case a.APIGroup == "" && a.Resource == "nodes" && a.Subresource == "":
			if (a.Verb == "get" || a.Verb == "list" || a.Verb == "watch") && a.Name != node {
				return false, fmt.Sprintf("node %q can only read its own Node object", node), nil
			}
		case a.APIGroup == "" && a.Resource == "pods" && a.Subresource == "" && (a.Verb == "list" || a.Verb == "watch"):
			if !selects(a.FieldSelector, "spec.nodeName", node) {
				return false, fmt.Sprintf("node %q can only list or watch pods with fieldSelector spec.nodeName=%s", node, node), nil
			}
		case a.APIGroup == "" && a.Resource == "pods" && a.Subresource == "" && a.Verb == "get":
			if !z.g.podOnNode(node, a.Namespace, a.Name) {
				return false, fmt.Sprintf("no relationship found between node %q and this pod", node), nil
			}
		}
	}
	for i := range z.rules {
		if rbac.RuleAllows(a, &z.rules[i]) {
			return true, "", nil
		}
	}
	return false, "", nil
}

// podCertificateRequest decides as upstream's authorizePodCertificateRequest:
// a node may create PodCertificateRequests (NodeRestriction then checks
// they are for its own pods), get those naming it, and list or watch them
// only with a spec.nodeName field selector naming itself; never their
// status, which is the signer's.
func (z *Authorizer) podCertificateRequest(node string, a authz.Attributes) (bool, string, error) {
	if a.Subresource != "" {
		return false, "nodes may not access the status subresource of PodCertificateRequests", nil
	}
	switch a.Verb {
	case "create":
		return true, "", nil
	case "get":
		if a.Name == "" || !z.g.podCertificateRequestOf(node, a.Namespace, a.Name) {
			return false, fmt.Sprintf("no relationship found between node %q and this object", node), nil
		}
		return true, "", nil
	case "list", "watch":
		if !selects(a.FieldSelector, "spec.nodeName", node) {
			return false, "can only list/watch podcertificaterequests with nodeName field selector", nil
		}
		return true, "", nil
	}
	return false, fmt.Sprintf("nodes may not %s podcertificaterequests", a.Verb), nil
}

func selects(raw, field, value string) bool {
	if raw == "" {
		return false
	}
	sel, err := fields.ParseSelector(raw)
	if err != nil {
		return false
	}
	v, ok := sel.RequiresExactMatch(field)
	return ok && v == value
}

func (z *Authorizer) related(node string, a authz.Attributes, kind string, verbs ...string) (bool, string, error) {
	if !slices.Contains(verbs, a.Verb) {
		return false, fmt.Sprintf("can only %s: %s", strings.Join(verbs, "/"), kind), nil
	}
	if a.Name == "" {
		return false, fmt.Sprintf("can only %s individual resources of this type", strings.Join(verbs, "/")), nil
	}
	if !z.g.related(node, kind, a.Namespace, a.Name) {
		return false, fmt.Sprintf("no relationship found between node %q and this object", node), nil
	}
	return true, "", nil
}

// Graph indexes pods by node with what they reference, and claims by name
// (for PersistentVolume lookups). Safe for concurrent use.
type Graph struct {
	mu     sync.RWMutex
	pods   map[string]*podRefs            // ns/name → refs
	byNode map[string]map[string]*podRefs // node → ns/name → refs
	claims map[string]string              // ns/name of a PVC → its volumeName
	pcrs   map[string]string              // ns/name of a PodCertificateRequest → its spec.nodeName
}

type podRefs struct {
	node, ns       string
	serviceAccount string
	secrets        []string
	configMaps     []string
	claims         []string
}

// NewGraph returns an empty graph.
func NewGraph() *Graph {
	return &Graph{pods: map[string]*podRefs{}, byNode: map[string]map[string]*podRefs{}, claims: map[string]string{}, pcrs: map[string]string{}}
}

// UpsertPod records (or replaces) a pod; unscheduled pods relate to no node.
func (g *Graph) UpsertPod(p *corev1.Pod) {
	key := p.Namespace + "/" + p.Name
	refs := podReferences(p)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.deletePodLocked(key)
	if refs.node == "" {
		return
	}
	g.pods[key] = refs
	m := g.byNode[refs.node]
	if m == nil {
		m = map[string]*podRefs{}
		g.byNode[refs.node] = m
	}
	m[key] = refs
}

// DeletePod forgets a pod.
func (g *Graph) DeletePod(namespace, name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.deletePodLocked(namespace + "/" + name)
}

func (g *Graph) deletePodLocked(key string) {
	old := g.pods[key]
	if old == nil {
		return
	}
	delete(g.pods, key)
	if m := g.byNode[old.node]; m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(g.byNode, old.node)
		}
	}
}

// UpsertClaim records a claim's bound volume.
func (g *Graph) UpsertClaim(c *corev1.PersistentVolumeClaim) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.claims[c.Namespace+"/"+c.Name] = c.Spec.VolumeName
}

// DeleteClaim forgets a claim.
func (g *Graph) DeleteClaim(namespace, name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.claims, namespace+"/"+name)
}

// UpsertPodCertificateRequest records the node a PodCertificateRequest names.
func (g *Graph) UpsertPodCertificateRequest(namespace, name, node string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pcrs[namespace+"/"+name] = node
}

// DeletePodCertificateRequest forgets a PodCertificateRequest.
func (g *Graph) DeletePodCertificateRequest(namespace, name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pcrs, namespace+"/"+name)
}

func (g *Graph) podCertificateRequestOf(node, namespace, name string) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	n, ok := g.pcrs[namespace+"/"+name]
	return ok && n == node
}

func (g *Graph) podOnNode(node, namespace, name string) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	p := g.pods[namespace+"/"+name]
	return p != nil && p.node == node
}

func (g *Graph) related(node, kind, namespace, name string) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, p := range g.byNode[node] {
		switch kind {
		case "secrets":
			if p.ns == namespace && slices.Contains(p.secrets, name) {
				return true
			}
		case "configmaps":
			if p.ns == namespace && slices.Contains(p.configMaps, name) {
				return true
			}
		case "persistentvolumeclaims":
			if p.ns == namespace && slices.Contains(p.claims, name) {
				return true
			}
		case "serviceaccounts":
			if p.ns == namespace && p.serviceAccount == name {
				return true
			}
		case "persistentvolumes":
			for _, c := range p.claims {
				if v := g.claims[p.ns+"/"+c]; v != "" && v == name {
					return true
				}
			}
		}
	}
	return false
}

// podReferences lists what a pod refers to: volumes (secret, configMap,
// projected, CSI and other secret references, claims, generic ephemeral
// claims), env and envFrom of every container, image pull secrets.
func podReferences(p *corev1.Pod) *podRefs {
	r := &podRefs{node: p.Spec.NodeName, ns: p.Namespace, serviceAccount: p.Spec.ServiceAccountName}
	if r.serviceAccount == "" {
		r.serviceAccount = "default"
	}
	addS := func(n string) {
		if n != "" && !slices.Contains(r.secrets, n) {
			r.secrets = append(r.secrets, n)
		}
	}
	addC := func(n string) {
		if n != "" && !slices.Contains(r.configMaps, n) {
			r.configMaps = append(r.configMaps, n)
		}
	}
	for _, s := range p.Spec.ImagePullSecrets {
		addS(s.Name)
	}
	for _, v := range p.Spec.Volumes {
		switch {
		case v.Secret != nil:
			addS(v.Secret.SecretName)
		case v.ConfigMap != nil:
			addC(v.ConfigMap.Name)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.Secret != nil {
					addS(src.Secret.Name)
				}
				if src.ConfigMap != nil {
					addC(src.ConfigMap.Name)
				}
			}
		case v.PersistentVolumeClaim != nil:
			r.claims = append(r.claims, v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			r.claims = append(r.claims, p.Name+"-"+v.Name)
		case v.CSI != nil && v.CSI.NodePublishSecretRef != nil:
			addS(v.CSI.NodePublishSecretRef.Name)
		case v.AzureFile != nil:
			addS(v.AzureFile.SecretName)
		case v.CephFS != nil && v.CephFS.SecretRef != nil:
			addS(v.CephFS.SecretRef.Name)
		case v.Cinder != nil && v.Cinder.SecretRef != nil:
			addS(v.Cinder.SecretRef.Name)
		case v.FlexVolume != nil && v.FlexVolume.SecretRef != nil:
			addS(v.FlexVolume.SecretRef.Name)
		case v.ISCSI != nil && v.ISCSI.SecretRef != nil:
			addS(v.ISCSI.SecretRef.Name)
		case v.RBD != nil && v.RBD.SecretRef != nil:
			addS(v.RBD.SecretRef.Name)
		case v.ScaleIO != nil && v.ScaleIO.SecretRef != nil:
			addS(v.ScaleIO.SecretRef.Name)
		case v.StorageOS != nil && v.StorageOS.SecretRef != nil:
			addS(v.StorageOS.SecretRef.Name)
		}
	}
	env := func(envs []corev1.EnvVar, from []corev1.EnvFromSource) {
		for _, e := range envs {
			if e.ValueFrom == nil {
				continue
			}
			if e.ValueFrom.SecretKeyRef != nil {
				addS(e.ValueFrom.SecretKeyRef.Name)
			}
			if e.ValueFrom.ConfigMapKeyRef != nil {
				addC(e.ValueFrom.ConfigMapKeyRef.Name)
			}
		}
		for _, f := range from {
			if f.SecretRef != nil {
				addS(f.SecretRef.Name)
			}
			if f.ConfigMapRef != nil {
				addC(f.ConfigMapRef.Name)
			}
		}
	}
	for _, c := range p.Spec.InitContainers {
		env(c.Env, c.EnvFrom)
	}
	for _, c := range p.Spec.Containers {
		env(c.Env, c.EnvFrom)
	}
	for _, c := range p.Spec.EphemeralContainers {
		env(c.Env, c.EnvFrom)
	}
	return r
}
