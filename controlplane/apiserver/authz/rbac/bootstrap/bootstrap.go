// Package bootstrap holds the default RBAC policy the API server reconciles
// at every start: upstream Kubernetes 1.37's bootstrap roles and bindings
// (policy/*.yaml, the objects kube-apiserver creates, as a cluster dump
// shows them: cluster-admin, admin/edit/view and their aggregation,
// system:basic-user, system:discovery, system:public-info-viewer,
// system:node, system:kube-scheduler, system:kube-controller-manager,
// system:node-proxier, the system:controller:* roles, ...), plus what
// Waggle's own components need beyond them (Extra).
//
// It is data only: reconciling it (adding what is missing, never removing
// what users added, skipping objects annotated
// rbac.authorization.kubernetes.io/autoupdate=false) is the API server's
// job, through k8s.io/component-helpers/auth/rbac/reconciliation.
package bootstrap

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

//go:embed policy/*.yaml
var files embed.FS

// Policy is a set of RBAC objects.
type Policy struct {
	ClusterRoles        []rbacv1.ClusterRole
	ClusterRoleBindings []rbacv1.ClusterRoleBinding
	Roles               []rbacv1.Role
	RoleBindings        []rbacv1.RoleBinding
}

// Well-known identities of Waggle's components.
const (
	SchedulerUser         = "system:kube-scheduler"
	ControllerManagerUser = "system:kube-controller-manager"
	ProxyUser             = "system:kube-proxy"
	NodesGroup            = "system:nodes"
	NodeUserPrefix        = "system:node:"
	// KubeletAPIUser is the API server's client identity towards kubelets.
	KubeletAPIUser = "kube-apiserver-kubelet-client"
	// BootstrapNodeGroup is the extra group of the bootstrap tokens nodes
	// join with (kubeadm's is system:bootstrappers:kubeadm:default-node-token).
	BootstrapNodeGroup = "system:bootstrappers:waggle:default-node-token"
	// BootstrapServerGroup is the extra group of the tokens further servers
	// of an HA control plane join with: they may read the shared control
	// plane certificates (see apiserver.ControlPlaneBootstrapPath).
	BootstrapServerGroup = "system:bootstrappers:waggle:server-token"
	// ControlPlaneBootstrapURL is that path.
	ControlPlaneBootstrapURL = "/waggle/v1/control-plane-bootstrap"
	// NodeProxyCredentialsURL is where a joining node's token gets the
	// proxy's client certificate (see apiserver.NodeProxyCredentialsPath).
	NodeProxyCredentialsURL = "/waggle/v1/node-proxy-credentials"
)

var (
	once   sync.Once
	policy Policy
	errP   error
)

// Default returns the default policy (a fresh copy each call).
func Default() (*Policy, error) {
	once.Do(func() { errP = load(&policy) })
	if errP != nil {
		return nil, errP
	}
	out := &Policy{}
	for i := range policy.ClusterRoles {
		out.ClusterRoles = append(out.ClusterRoles, *policy.ClusterRoles[i].DeepCopy())
	}
	for i := range policy.ClusterRoleBindings {
		out.ClusterRoleBindings = append(out.ClusterRoleBindings, *policy.ClusterRoleBindings[i].DeepCopy())
	}
	for i := range policy.Roles {
		out.Roles = append(out.Roles, *policy.Roles[i].DeepCopy())
	}
	for i := range policy.RoleBindings {
		out.RoleBindings = append(out.RoleBindings, *policy.RoleBindings[i].DeepCopy())
	}
	return out, nil
}

// ClusterRole returns the default ClusterRole name.
func (p *Policy) ClusterRole(name string) (*rbacv1.ClusterRole, bool) {
	for i := range p.ClusterRoles {
		if p.ClusterRoles[i].Name == name {
			return &p.ClusterRoles[i], true
		}
	}
	return nil, false
}

func load(p *Policy) error {
	entries, err := files.ReadDir("policy")
	if err != nil {
		return err
	}
	for _, e := range entries {
		data, err := files.ReadFile("policy/" + e.Name())
		if err != nil {
			return err
		}
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := yaml.Unmarshal(data, &list); err != nil {
			return fmt.Errorf("bootstrap policy %s: %w", e.Name(), err)
		}
		for _, raw := range list.Items {
			var tm metav1.TypeMeta
			if err := json.Unmarshal(raw, &tm); err != nil {
				return err
			}
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			switch tm.Kind {
			case "ClusterRole":
				var o rbacv1.ClusterRole
				err = dec.Decode(&o)
				p.ClusterRoles = append(p.ClusterRoles, o)
			case "ClusterRoleBinding":
				var o rbacv1.ClusterRoleBinding
				err = dec.Decode(&o)
				p.ClusterRoleBindings = append(p.ClusterRoleBindings, o)
			case "Role":
				var o rbacv1.Role
				err = dec.Decode(&o)
				p.Roles = append(p.Roles, o)
			case "RoleBinding":
				var o rbacv1.RoleBinding
				err = dec.Decode(&o)
				p.RoleBindings = append(p.RoleBindings, o)
			default:
				err = fmt.Errorf("unexpected kind %q", tm.Kind)
			}
			if err != nil {
				return fmt.Errorf("bootstrap policy %s: %w", e.Name(), err)
			}
		}
	}
	extra(p)
	return nil
}

func withNamespace(m metav1.ObjectMeta, ns string) metav1.ObjectMeta {
	m.Namespace = ns
	return m
}

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{"kubernetes.io/bootstrapping": "rbac-defaults"},
		Annotations: map[string]string{"rbac.authorization.kubernetes.io/autoupdate": "true"},
	}
}

// extra adds what Waggle's components need beyond upstream's policy:
//
//   - Without --use-service-account-credentials the controller-manager
//     runs every controller under its own identity, so each
//     system:controller:* role upstream binds to a kube-system
//     ServiceAccount is also bound to system:kube-controller-manager, by a
//     binding named waggle:controller-manager:<controller>. With it (as
//     `waggle up` runs), each controller runs as the ServiceAccount
//     upstream's binding names; Waggle's endpointslice controller, which
//     also writes Endpoints, gets system:controller:endpoint-controller too
//     (waggle:endpointslice-controller:endpoints), and the roles of
//     Waggle's own controllers below name their ServiceAccounts
//     (persistent-volume-binder runs the local-path provisioner; clusterdns).
//   - Waggle's proxy enforces NetworkPolicy at each pod's veth, so beyond
//     system:node-proxier it reads pods, namespaces and NetworkPolicies
//     (ClusterRole waggle:proxy).
//   - Waggle's node agent programs the routes to other nodes' pod CIDRs
//     (cni/routes), as a CNI daemon does, so nodes read all Nodes
//     (ClusterRole waggle:node-routes bound to system:nodes); the Node
//     authorizer alone would let a node read only itself.
//   - The API server reaches kubelets (logs, exec, port-forward, node
//     proxy) as kube-apiserver-kubelet-client, bound to
//     system:kubelet-api-admin (binding waggle:kube-apiserver-kubelet-client),
//     as kops and managed clusters bind their API servers' kubelet clients;
//     kubeadm instead puts that certificate in a cluster-admin group.
//   - The controller-manager's clusterdns controller publishes the
//     kube-system/kube-dns Service and its EndpointSlice (Role
//     waggle:controller:clusterdns in kube-system).
//   - The namespaced system:controller:* Roles (bootstrap-signer in
//     kube-system and kube-public, token-cleaner in kube-system) are bound to
//     the controller-manager too, by RoleBindings of the same names.
//   - Joining nodes, as kubeadm sets up: tokens in the group
//     system:bootstrappers:waggle:default-node-token (what `waggle token
//     create` makes) may create CSRs (system:node-bootstrapper) whose node
//     client certificates the csrapproving controller approves
//     (certificatesigningrequests:nodeclient); nodes may renew their own
//     (selfnodeclient); and anyone may read kube-public/cluster-info, the
//     signed CA a joining machine discovers (kubeadm's
//     bootstrap-signer-clusterinfo Role, bound to system:anonymous).
//   - Joining nodes' proxies: node join tokens may get a system:kube-proxy
//     client certificate (NodeProxyCredentialsURL, ClusterRole
//     waggle:node-proxy-credentials), as k3s's agent gets its kube-proxy
//     certificate with its token; the node's own identity, which the Node
//     authorizer keeps to its own pods, could not run the proxy.
//   - Joining servers: tokens in system:bootstrappers:waggle:server-token
//     may get the shared control plane certificates
//     (ControlPlaneBootstrapURL, ClusterRole waggle:control-plane-bootstrap).
func extra(p *Policy) {
	for _, r := range p.Roles {
		if _, ok := strings.CutPrefix(r.Name, "system:controller:"); !ok {
			continue
		}
		p.RoleBindings = append(p.RoleBindings, rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: withNamespace(meta("waggle:controller-manager:"+strings.TrimPrefix(r.Name, "system:controller:")), r.Namespace),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: r.Name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ControllerManagerUser}},
		})
	}
	crb := func(name, role string, subject rbacv1.Subject) rbacv1.ClusterRoleBinding {
		return rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: meta(name),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{subject},
		}
	}
	bootstrappers := rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: BootstrapNodeGroup}
	p.ClusterRoleBindings = append(p.ClusterRoleBindings,
		crb("waggle:kubelet-bootstrap", "system:node-bootstrapper", bootstrappers),
		crb("waggle:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", bootstrappers),
		crb("waggle:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
			rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: NodesGroup}))
	p.ClusterRoles = append(p.ClusterRoles, rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: meta("waggle:control-plane-bootstrap"),
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{ControlPlaneBootstrapURL}, Verbs: []string{"get"}}},
	})
	p.ClusterRoleBindings = append(p.ClusterRoleBindings, crb("waggle:control-plane-bootstrap", "waggle:control-plane-bootstrap",
		rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: BootstrapServerGroup}))
	p.ClusterRoles = append(p.ClusterRoles, rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: meta("waggle:node-proxy-credentials"),
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{NodeProxyCredentialsURL}, Verbs: []string{"get"}}},
	})
	p.ClusterRoleBindings = append(p.ClusterRoleBindings, crb("waggle:node-proxy-credentials", "waggle:node-proxy-credentials", bootstrappers))
	p.Roles = append(p.Roles, rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: withNamespace(meta("waggle:bootstrap-signer-clusterinfo"), "kube-public"),
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
			ResourceNames: []string{"cluster-info"}, Verbs: []string{"get"}}},
	})
	p.RoleBindings = append(p.RoleBindings, rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: withNamespace(meta("waggle:bootstrap-signer-clusterinfo"), "kube-public"),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "waggle:bootstrap-signer-clusterinfo"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "system:anonymous"}},
	})
	// waggle proxy --nodeport-devices: one Lease per LoadBalancer IP
	// chooses the node that answers ARP for it (dataplane/l2announce).
	p.Roles = append(p.Roles, rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: withNamespace(meta("waggle:proxy:l2-announcement"), "kube-system"),
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
		},
	})
	p.RoleBindings = append(p.RoleBindings, rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: withNamespace(meta("waggle:proxy:l2-announcement"), "kube-system"),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "waggle:proxy:l2-announcement"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ProxyUser}},
	})
	// The local-path provisioner (controlplane/controllers/localpath)
	// creates its default StorageClass at start; creating and deleting its
	// volumes is the persistent-volume-binder role's.
	p.ClusterRoles = append(p.ClusterRoles, rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: meta("waggle:controller:local-path-provisioner"),
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: []string{"get", "list", "watch", "create"}},
		},
	})
	controllerSA := func(name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "kube-system", Name: name}
	}
	localPath := crb("waggle:controller:local-path-provisioner", "waggle:controller:local-path-provisioner",
		rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ControllerManagerUser})
	localPath.Subjects = append(localPath.Subjects, controllerSA("persistent-volume-binder"))
	p.ClusterRoleBindings = append(p.ClusterRoleBindings, localPath,
		crb("waggle:endpointslice-controller:endpoints", "system:controller:endpoint-controller", controllerSA("endpointslice-controller")))
	p.Roles = append(p.Roles, rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: withNamespace(meta("waggle:controller:clusterdns"), "kube-system"),
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "create", "update"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "create", "update"}},
		},
	})
	p.RoleBindings = append(p.RoleBindings, rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: withNamespace(meta("waggle:controller:clusterdns"), "kube-system"),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "waggle:controller:clusterdns"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ControllerManagerUser}, controllerSA("clusterdns")},
	})
	for _, r := range p.ClusterRoles {
		ctrl, ok := strings.CutPrefix(r.Name, "system:controller:")
		if !ok {
			continue
		}
		p.ClusterRoleBindings = append(p.ClusterRoleBindings, rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: meta("waggle:controller-manager:" + ctrl),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.Name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ControllerManagerUser}},
		})
	}
	p.ClusterRoleBindings = append(p.ClusterRoleBindings, rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: meta("waggle:kube-apiserver-kubelet-client"),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: KubeletAPIUser}},
	})
	// The resource metrics API is served natively (no metrics-server
	// deployment brings this role): reading it is aggregated into view,
	// edit and admin, as metrics-server's manifest does.
	reader := meta("system:aggregated-metrics-reader")
	for _, r := range []string{"view", "edit", "admin"} {
		reader.Labels["rbac.authorization.k8s.io/aggregate-to-"+r] = "true"
	}
	p.ClusterRoles = append(p.ClusterRoles, rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: reader,
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"metrics.k8s.io"}, Resources: []string{"pods", "nodes"}, Verbs: []string{"get", "list", "watch"}}},
	})
	p.ClusterRoles = append(p.ClusterRoles, rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: meta("waggle:node-routes"),
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}},
	})
	p.ClusterRoleBindings = append(p.ClusterRoleBindings, rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: meta("waggle:node-routes"),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "waggle:node-routes"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: NodesGroup}},
	})
	p.ClusterRoles = append(p.ClusterRoles, rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: meta("waggle:proxy"),
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "watch"}},
		},
	})
	p.ClusterRoleBindings = append(p.ClusterRoleBindings, rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: meta("waggle:proxy"),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "waggle:proxy"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ProxyUser}},
	})
}
