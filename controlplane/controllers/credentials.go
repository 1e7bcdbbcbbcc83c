package controllers

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/controller-manager/pkg/clientbuilder"
)

// ServiceAccountNamespace holds the controllers' ServiceAccounts under
// --use-service-account-credentials, as upstream.
const ServiceAccountNamespace = "kube-system"

// ControllerServiceAccount is the kube-system ServiceAccount controller
// runs as under --use-service-account-credentials ("" for the
// controller-manager's own identity).
func ControllerServiceAccount(controller string) string {
	for _, s := range starters() {
		if s.name == controller {
			return s.serviceAccount
		}
	}
	return ""
}

// forController returns d with the clients of the ServiceAccount sa when
// d.serviceAccounts is set (--use-service-account-credentials) and sa is
// not empty; the shared informers keep the controller-manager's own
// client, as upstream.
func (d Deps) forController(sa string) (Deps, error) {
	if d.serviceAccounts == nil || sa == "" {
		return d, nil
	}
	rc, err := d.serviceAccounts.Config(sa)
	if err != nil {
		return d, fmt.Errorf("credentials of ServiceAccount %s/%s: %w", ServiceAccountNamespace, sa, err)
	}
	// rc is a copy of the controller-manager's own (content type included)
	// with the ServiceAccount's token.
	return d, d.useConfig(rc)
}

// serviceAccountClients is upstream's DynamicControllerClientBuilder over
// rc without its credentials (a client certificate would otherwise
// authenticate first): it creates each controller's ServiceAccount if
// missing and keeps a bound token for it fresh through TokenRequest, using
// the controller-manager's own client for both.
func serviceAccountClients(rc *rest.Config, own kubernetes.Interface) clientbuilder.ControllerClientBuilder {
	return clientbuilder.NewDynamicClientBuilder(rest.AnonymousClientConfig(rc), own.CoreV1(), ServiceAccountNamespace)
}
