package apiserver

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"reflect"
	"slices"

	certificatesv1 "k8s.io/api/certificates/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
)

// csrAdmission is kube-apiserver's three CertificateSigningRequest plugins
// (plugin/pkg/admission/certificates), each a validating step that may be
// disabled by its upstream name:
//
//   - CertificateApproval: approving or denying (the approval subresource)
//     needs "approve" on the request's signer;
//   - CertificateSigning: changing status.certificate or the conditions
//     through the status subresource needs "sign" on the signer;
//   - CertificateSubjectRestriction: a request to the
//     kubernetes.io/kube-apiserver-client signer may not ask for the
//     system:masters group, which no authorizer could ever revoke.
//
// The signer is read from the stored object, so a write cannot rename it to
// one the user holds. A refusal is a 403, as upstream's.
type csrAdmission struct {
	s                               *Server
	approval, signing, restrictions bool
}

func (csrAdmission) Name() string {
	return "CertificateApproval,CertificateSigning,CertificateSubjectRestriction"
}

// newCSRAdmission is the plugins not named in disabled, or nil if none is
// left.
func newCSRAdmission(s *Server, disabled []string) Admitter {
	c := csrAdmission{s: s,
		approval:     !slices.Contains(disabled, "CertificateApproval"),
		signing:      !slices.Contains(disabled, "CertificateSigning"),
		restrictions: !slices.Contains(disabled, "CertificateSubjectRestriction"),
	}
	if !c.approval && !c.signing && !c.restrictions {
		return nil
	}
	return c
}

func (c csrAdmission) Admit(ctx context.Context, a *AdmissionAttributes) error {
	if a.Resource.Group != certificatesv1.GroupName || a.Resource.Resource != "certificatesigningrequests" {
		return nil
	}
	csr, _ := a.Object.(*certificatesv1.CertificateSigningRequest)
	old, _ := a.OldObject.(*certificatesv1.CertificateSigningRequest)
	forbid := func(format string, args ...any) error {
		return apierrors.NewForbidden(a.Resource.GroupResource(), a.Name, fmt.Errorf(format, args...))
	}
	switch {
	case a.Operation == OpCreate && a.Subresource == "" && c.restrictions:
		if csr == nil || csr.Spec.SignerName != certificatesv1.KubeAPIServerClientSignerName {
			return nil
		}
		block, _ := pem.Decode(csr.Spec.Request)
		if block == nil || block.Type != "CERTIFICATE REQUEST" {
			return forbid("failed to parse CSR: PEM block type must be CERTIFICATE REQUEST")
		}
		req, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil {
			return forbid("failed to parse CSR: %v", err)
		}
		if slices.Contains(req.Subject.Organization, authn.GroupMasters) {
			return forbid("use of %s signer with system:masters group is not allowed", certificatesv1.KubeAPIServerClientSignerName)
		}
	case a.Operation == OpUpdate && a.Subresource == "approval" && c.approval:
		if old == nil || c.s.authz == nil {
			return nil
		}
		if u, _ := authn.UserFrom(ctx); u != nil && !c.s.authorizedForSigner(ctx, u, "approve", old.Spec.SignerName) {
			return forbid("user not permitted to approve requests with signerName %q", old.Spec.SignerName)
		}
	case a.Operation == OpUpdate && a.Subresource == "status" && c.signing:
		if old == nil || csr == nil || c.s.authz == nil {
			return nil
		}
		if reflect.DeepEqual(old.Status.Certificate, csr.Status.Certificate) && apiequality.Semantic.DeepEqual(old.Status.Conditions, csr.Status.Conditions) {
			return nil
		}
		if u, _ := authn.UserFrom(ctx); u != nil && !c.s.authorizedForSigner(ctx, u, "sign", old.Spec.SignerName) {
			return forbid("user not permitted to sign requests with signerName %q", old.Spec.SignerName)
		}
	}
	return nil
}
