package apiserver

import (
	"context"
	"fmt"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
)

// podCertificateSigning is the check of upstream's PodCertificateRequest
// status strategy: a status write that changes the status (issuing,
// denying, failing) needs the "sign" verb on certificates.k8s.io
// "signers" for the request's signerName, or for its domain's wildcard
// ("example.com/*"), as certauthorization.IsAuthorizedForSignerName asks.
// A refusal is a 422 naming spec.signerName, as upstream's.
type podCertificateSigning struct{ s *Server }

func (podCertificateSigning) Name() string { return "PodCertificateRequestSigning" }

func (p podCertificateSigning) Admit(ctx context.Context, a *AdmissionAttributes) error {
	if a.Resource.Group != certificatesv1.GroupName || a.Resource.Resource != "podcertificaterequests" ||
		a.Operation != OpUpdate || a.Subresource != "status" {
		return nil
	}
	req, ok := a.Object.(*certificatesv1.PodCertificateRequest)
	old, okOld := a.OldObject.(*certificatesv1.PodCertificateRequest)
	if !ok || !okOld || apiequality.Semantic.DeepEqual(req.Status, old.Status) {
		return nil
	}
	u, _ := authn.UserFrom(ctx)
	if u == nil || p.s.authz == nil {
		return nil // the server's own writes
	}
	signer := old.Spec.SignerName
	if p.s.authorizedForSigner(ctx, u, "sign", signer) {
		return nil
	}
	return apierrors.NewInvalid(schema.GroupKind{Group: certificatesv1.GroupName, Kind: "PodCertificateRequest"}, a.Name, field.ErrorList{
		field.Forbidden(field.NewPath("spec", "signerName"), fmt.Sprintf("User %q is not permitted to \"sign\" for signer %q", u.Name, signer)),
	})
}

// authorizedForSigner is upstream's certauthorization.IsAuthorizedForSignerName:
// verb on certificates.k8s.io "signers" named by the signer, or by its
// domain's wildcard ("example.com/*").
func (s *Server) authorizedForSigner(ctx context.Context, u *authn.User, verb, signer string) bool {
	allowed := func(name string) bool {
		ok, _, err := s.authz.Authorize(ctx, authz.Attributes{User: u, Verb: verb, APIGroup: certificatesv1.GroupName,
			APIVersion: "*", Resource: "signers", Name: name, ResourceRequest: true})
		return ok && err == nil
	}
	domain, _, _ := strings.Cut(signer, "/")
	return allowed(signer) || allowed(domain+"/*")
}

// admitNodePodCertificateRequest is upstream NodeRestriction's check of a
// PodCertificateRequest a node creates: it must name the node itself (and
// its UID), a pod bound to it (by name and UID, not a mirror pod), that
// pod's ServiceAccount (by name and UID), and a signer the pod mounts a
// podCertificate source of (or one the node may
// "request-serviceaccounts-podcertificate-signer"). Mismatched UIDs may be
// a cache lag and are not Forbidden, as upstream.
func (p nodeRestriction) admitNodePodCertificateRequest(ctx context.Context, self string, a *AdmissionAttributes) error {
	gr := a.Resource.GroupResource()
	forbid := func(format string, args ...any) error {
		return apierrors.NewForbidden(gr, a.Name, fmt.Errorf(format, args...))
	}
	if a.Operation != OpCreate {
		return forbid("unexpected operation %v", a.Operation)
	}
	if a.Subresource != "" {
		return forbid("unexpected subresource %v", a.Subresource)
	}
	req, ok := a.Object.(*certificatesv1.PodCertificateRequest)
	if !ok {
		return forbid("unexpected type %T", a.Object)
	}
	if string(req.Spec.NodeName) != self {
		return forbid("PodCertificateRequest.Spec.NodeName=%q, which is not the requesting node %q", req.Spec.NodeName, self)
	}
	node, err := getTyped[*corev1.Node](ctx, p.s, "nodes", "", self)
	if err != nil {
		return fmt.Errorf("while retrieving node %q named in the PodCertificateRequest: %w", self, err)
	}
	ns := a.Namespace
	if node.UID != req.Spec.NodeUID {
		return apierrors.NewInternalError(fmt.Errorf("PodCertificateRequest for pod %q names node UID %q, inconsistent with the running node (%q)", ns+"/"+req.Spec.PodName, req.Spec.NodeUID, node.UID))
	}
	pod, err := getTyped[*corev1.Pod](ctx, p.s, "pods", ns, req.Spec.PodName)
	if apierrors.IsNotFound(err) {
		return err
	}
	if err != nil {
		return forbid("while retrieving pod %q named in the PodCertificateRequest: %v", ns+"/"+req.Spec.PodName, err)
	}
	if req.Spec.PodUID != pod.UID {
		return apierrors.NewInternalError(fmt.Errorf("PodCertificateRequest for pod %q contains pod UID (%q) which differs from running pod %q", ns+"/"+req.Spec.PodName, req.Spec.PodUID, pod.UID))
	}
	if pod.Spec.NodeName != self {
		return forbid("pod %q is not running on node %q named in the PodCertificateRequest", ns+"/"+req.Spec.PodName, req.Spec.NodeName)
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return forbid("pod %q is a mirror pod", ns+"/"+req.Spec.PodName)
	}
	if req.Spec.ServiceAccountName != pod.Spec.ServiceAccountName {
		return forbid("PodCertificateRequest for pod %q contains serviceAccountName (%q) that differs from running pod (%q)", ns+"/"+req.Spec.PodName, req.Spec.ServiceAccountName, pod.Spec.ServiceAccountName)
	}
	sa, err := getTyped[*corev1.ServiceAccount](ctx, p.s, "serviceaccounts", ns, req.Spec.ServiceAccountName)
	if apierrors.IsNotFound(err) {
		return err
	}
	if err != nil {
		return forbid("while retrieving service account %q named in the PodCertificateRequest: %v", ns+"/"+req.Spec.ServiceAccountName, err)
	}
	if req.Spec.ServiceAccountUID != sa.UID {
		return apierrors.NewInternalError(fmt.Errorf("PodCertificateRequest for pod %q names service account UID %q, which differs from the running service account (%q)", ns+"/"+req.Spec.PodName, req.Spec.ServiceAccountUID, sa.UID))
	}
	if mountsPodCertificate(pod, req.Spec.SignerName) {
		return nil
	}
	u, _ := authn.UserFrom(ctx)
	// RBAC names cannot hold slashes: the signer's are colons here, as in
	// ClusterTrustBundle names.
	ok, _, err = p.s.authz.Authorize(ctx, authz.Attributes{User: u, Verb: "request-serviceaccounts-podcertificate-signer",
		APIGroup: gr.Group, APIVersion: a.Resource.Version, Resource: strings.ReplaceAll(req.Spec.SignerName, "/", ":"),
		Namespace: ns, Name: req.Spec.ServiceAccountName, ResourceRequest: true})
	if ok {
		return nil
	}
	if err != nil {
		return forbid("error authorizing %s to request podcertificaterequests for signer %q: %v", u.Name, req.Spec.SignerName, err)
	}
	return forbid("pod %q does not mount a podCertificate projected volume for signer %q", ns+"/"+req.Spec.PodName, req.Spec.SignerName)
}

func mountsPodCertificate(pod *corev1.Pod, signer string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.PodCertificate != nil && s.PodCertificate.SignerName == signer {
				return true
			}
		}
	}
	return false
}
