package apiserver

import (
	"context"
	"fmt"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/node"
)

// nodeRestriction is upstream's NodeRestriction admission plugin: what a
// kubelet (system:node:<name>) writes must be about itself. It may create
// only mirror pods bound to itself that reference no API objects, delete
// and update the status of only its pods, write only its own Node (adding
// or changing no node-restriction.kubernetes.io/ labels, nor kubernetes.io
// or k8s.io labels outside the kubelet's set, nor its taints once created)
// and only its own Lease in kube-node-lease, and create only
// PodCertificateRequests for its own pods (podcertificates.go). Requests by
// other users pass untouched.
type nodeRestriction struct{ s *Server }

func (nodeRestriction) Name() string { return "NodeRestriction" }

func (p nodeRestriction) Admit(ctx context.Context, a *AdmissionAttributes) error {
	u, _ := authn.UserFrom(ctx)
	self, ok := node.NodeName(u)
	if !ok {
		return nil
	}
	gr := a.Resource.GroupResource()
	forbid := func(format string, args ...any) error {
		return apierrors.NewForbidden(gr, a.Name, fmt.Errorf("node %q "+format, append([]any{self}, args...)...))
	}
	switch {
	case a.Resource.Group == "" && a.Resource.Resource == "pods":
		switch {
		case a.Subresource == "" && a.Operation == OpCreate:
			pod, ok := a.Object.(*corev1.Pod)
			if !ok {
				return nil
			}
			if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; !mirror {
				return forbid("can only create mirror pods")
			}
			if pod.Spec.NodeName != self {
				return forbid("can only create pods with spec.nodeName set to itself")
			}
			for _, ref := range pod.OwnerReferences {
				if ref.APIVersion != "v1" || ref.Kind != "Node" || ref.Name != self {
					return forbid("can only create pods with an owner reference set to itself")
				}
			}
			if pod.Spec.ServiceAccountName != "" {
				return forbid("can not create pods that reference a service account")
			}
			for _, v := range pod.Spec.Volumes {
				if v.Secret != nil || v.ConfigMap != nil || v.PersistentVolumeClaim != nil || v.Projected != nil || v.Ephemeral != nil {
					return forbid("can not create pods that reference secrets, configmaps, persistentvolumeclaims or projected volumes")
				}
			}
			for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
				for _, e := range c.Env {
					if e.ValueFrom != nil && (e.ValueFrom.SecretKeyRef != nil || e.ValueFrom.ConfigMapKeyRef != nil) {
						return forbid("can not create pods that reference secrets or configmaps")
					}
				}
				if len(c.EnvFrom) > 0 {
					return forbid("can not create pods that reference secrets or configmaps")
				}
			}
		case a.Subresource == "" && a.Operation == OpDelete, a.Subresource == "status":
			old, ok := a.OldObject.(*corev1.Pod)
			if ok && old.Spec.NodeName != self {
				return forbid("can only %s pods with spec.nodeName set to itself", strings.ToLower(string(a.Operation)))
			}
		}
	case a.Resource.Group == "" && a.Resource.Resource == "nodes":
		if a.Name != self {
			return forbid("is not allowed to modify node %q", a.Name)
		}
		n, ok := a.Object.(*corev1.Node)
		if !ok {
			return nil
		}
		var oldLabels map[string]string
		old, _ := a.OldObject.(*corev1.Node)
		if old != nil {
			oldLabels = old.Labels
		}
		for k, v := range n.Labels {
			if ov, had := oldLabels[k]; had && ov == v {
				continue
			}
			if forbiddenNodeLabel(k) {
				return forbid("is not allowed to modify labels: %s", k)
			}
		}
		for k := range oldLabels {
			if _, kept := n.Labels[k]; !kept && forbiddenNodeLabel(k) {
				return forbid("is not allowed to modify labels: %s", k)
			}
		}
		if a.Operation == OpUpdate && old != nil && a.Subresource == "" && !apiequality.Semantic.DeepEqual(old.Spec.Taints, n.Spec.Taints) {
			return forbid("is not allowed to modify taints")
		}
	case a.Resource.Group == "" && a.Resource.Resource == "serviceaccounts" && a.Subresource == "token" && a.Operation == OpCreate:
		// As upstream: a node's token must be bound to a pod scheduled on
		// it (the server then records the node in the claims itself).
		tr, ok := a.Object.(*authenticationv1.TokenRequest)
		if !ok {
			return nil
		}
		ref := tr.Spec.BoundObjectRef
		if ref == nil || ref.APIVersion != "v1" || ref.Kind != "Pod" || ref.Name == "" {
			return apierrors.NewForbidden(gr, a.Name, fmt.Errorf("node requested token not bound to a pod"))
		}
		if ref.UID == "" {
			return apierrors.NewForbidden(gr, a.Name, fmt.Errorf("node requested token with a pod binding without a uid"))
		}
		pod, err := getTyped[*corev1.Pod](ctx, p.s, "pods", a.Namespace, ref.Name)
		if apierrors.IsNotFound(err) {
			return err
		}
		if err != nil {
			return apierrors.NewForbidden(gr, a.Name, err)
		}
		if ref.UID != pod.UID {
			return apierrors.NewForbidden(gr, a.Name, fmt.Errorf("the UID in the bound object reference (%s) does not match the UID in record. The object might have been deleted and then recreated", ref.UID))
		}
		if pod.Spec.NodeName != self {
			return apierrors.NewForbidden(gr, a.Name, fmt.Errorf("node requested token bound to a pod scheduled on a different node"))
		}
	case a.Resource.Group == certificatesv1.GroupName && a.Resource.Resource == "podcertificaterequests":
		return p.admitNodePodCertificateRequest(ctx, self, a)
	case a.Resource.Group == coordinationv1.GroupName && a.Resource.Resource == "leases":
		if a.Namespace == corev1.NamespaceNodeLease && a.Name != self {
			return forbid("is not allowed to modify the lease of node %q", a.Name)
		}
	}
	return nil
}

// forbiddenNodeLabel: labels under node-restriction.kubernetes.io/ are for
// the administrator only; other kubernetes.io and k8s.io labels a kubelet
// may set only from the set it sets itself.
func forbiddenNodeLabel(key string) bool {
	domain, _, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	if domain == "node-restriction.kubernetes.io" || strings.HasSuffix(domain, ".node-restriction.kubernetes.io") {
		return true
	}
	if !(domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || domain == "k8s.io" || strings.HasSuffix(domain, ".k8s.io")) {
		return false
	}
	switch key {
	case "kubernetes.io/hostname", "kubernetes.io/arch", "kubernetes.io/os",
		"beta.kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/instance-type",
		"failure-domain.beta.kubernetes.io/region", "failure-domain.beta.kubernetes.io/zone",
		"topology.kubernetes.io/region", "topology.kubernetes.io/zone", "node.kubernetes.io/instance-type":
		return false
	}
	return !(domain == "kubelet.kubernetes.io" || strings.HasSuffix(domain, ".kubelet.kubernetes.io") ||
		domain == "node.kubernetes.io" || strings.HasSuffix(domain, ".node.kubernetes.io"))
}
