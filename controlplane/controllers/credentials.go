package controllers

import (
	"fmt"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/controller-manager/pkg/clientbuilder"

	"github.com/waggle-io/waggle/controlplane/controllers/clusterdns"
	"github.com/waggle-io/waggle/controlplane/controllers/clusterroleaggregation"
	"github.com/waggle-io/waggle/controlplane/controllers/cronjob"
	"github.com/waggle-io/waggle/controlplane/controllers/daemonset"
	"github.com/waggle-io/waggle/controlplane/controllers/deployment"
	"github.com/waggle-io/waggle/controlplane/controllers/disruption"
	"github.com/waggle-io/waggle/controlplane/controllers/endpointslice"
	"github.com/waggle-io/waggle/controlplane/controllers/garbagecollector"
	"github.com/waggle-io/waggle/controlplane/controllers/job"
	"github.com/waggle-io/waggle/controlplane/controllers/lbipam"
	"github.com/waggle-io/waggle/controlplane/controllers/localpath"
	"github.com/waggle-io/waggle/controlplane/controllers/namespace"
	"github.com/waggle-io/waggle/controlplane/controllers/nodeipam"
	"github.com/waggle-io/waggle/controlplane/controllers/nodelifecycle"
	"github.com/waggle-io/waggle/controlplane/controllers/persistentvolume"
	"github.com/waggle-io/waggle/controlplane/controllers/podgc"
	"github.com/waggle-io/waggle/controlplane/controllers/replicaset"
	"github.com/waggle-io/waggle/controlplane/controllers/resourcequota"
	"github.com/waggle-io/waggle/controlplane/controllers/rootcacertpublisher"
	"github.com/waggle-io/waggle/controlplane/controllers/serviceaccount"
	"github.com/waggle-io/waggle/controlplane/controllers/statefulset"
	"github.com/waggle-io/waggle/controlplane/controllers/ttlafterfinished"
)

// ServiceAccountNamespace holds the controllers' ServiceAccounts under
// --use-service-account-credentials, as upstream.
const ServiceAccountNamespace = "kube-system"

// controllerServiceAccounts names, per controller, the kube-system
// ServiceAccount it runs as under --use-service-account-credentials: the
// one kube-controller-manager uses for the same controller, whose
// system:controller:<sa> ClusterRole upstream's bootstrap policy binds to
// it. Where one Waggle controller does the work of two upstream ones it
// runs as the first, and the bootstrap policy (controlplane/apiserver/
// authz/rbac/bootstrap) binds the second role to it as well; Waggle's own
// controllers have their roles bound there too. A controller missing here
// (serviceaccount-token, which mints the tokens) keeps the
// controller-manager's own credentials, as upstream's root client.
var controllerServiceAccounts = map[string]string{
	replicaset.Name:                               "replicaset-controller",
	replicaset.RCName:                             "replication-controller",
	deployment.Name:                               "deployment-controller",
	daemonset.Name:                                "daemon-set-controller",
	endpointslice.Name:                            "endpointslice-controller", // and endpoint-controller's role
	"endpointslicemirroring":                      "endpointslicemirroring-controller",
	clusterroleaggregation.Name:                   "clusterrole-aggregation-controller",
	rootcacertpublisher.Name:                      "root-ca-cert-publisher",
	"validatingadmissionpolicy-status-controller": "validatingadmissionpolicy-status-controller",
	serviceaccount.Name:                           "service-account-controller",
	namespace.Name:                                "namespace-controller",
	nodeipam.Name:                                 "node-controller",
	nodelifecycle.Name:                            "node-controller",
	statefulset.Name:                              "statefulset-controller",
	job.Name:                                      "job-controller",
	cronjob.Name:                                  "cronjob-controller",
	ttlafterfinished.Name:                         "ttl-after-finished-controller",
	clusterdns.Name:                               "clusterdns",
	disruption.Name:                               "disruption-controller",
	podgc.Name:                                    "pod-garbage-collector",
	lbipam.Name:                                   "service-controller",
	persistentvolume.Name:                         "persistent-volume-binder",
	localpath.Name:                                "persistent-volume-binder", // and waggle:controller:local-path-provisioner
	resourcequota.Name:                            "resourcequota-controller",
	garbagecollector.Name:                         "generic-garbage-collector",
	HPAName:                                       "horizontal-pod-autoscaler",
	BootstrapSignerName:                           "bootstrap-signer",
	TokenCleanerName:                              "token-cleaner",
	CSRApprovingName:                              "certificate-controller",
	CSRSigningName:                                "certificate-controller",
	CSRCleanerName:                                "certificate-controller",
}

// ControllerServiceAccount is the kube-system ServiceAccount controller
// runs as under --use-service-account-credentials ("" for the
// controller-manager's own identity).
func ControllerServiceAccount(controller string) string { return controllerServiceAccounts[controller] }

// forController returns d with the clients of controller's ServiceAccount
// when d.serviceAccounts is set (--use-service-account-credentials); the
// shared informers keep the controller-manager's own client, as upstream.
func (d Deps) forController(controller string) (Deps, error) {
	sa := controllerServiceAccounts[controller]
	if d.serviceAccounts == nil || sa == "" {
		return d, nil
	}
	rc, err := d.serviceAccounts.Config(sa)
	if err != nil {
		return d, fmt.Errorf("credentials of ServiceAccount %s/%s: %w", ServiceAccountNamespace, sa, err)
	}
	d.RestConfig = rc
	if d.Client, err = kubernetes.NewForConfig(rc); err != nil {
		return d, err
	}
	if d.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
		return d, err
	}
	if d.Metadata, err = metadata.NewForConfig(rc); err != nil {
		return d, err
	}
	return d, nil
}

// serviceAccountClients is upstream's DynamicControllerClientBuilder over
// rc without its credentials (a client certificate would otherwise
// authenticate first): it creates each controller's ServiceAccount if
// missing and keeps a bound token for it fresh through TokenRequest, using
// the controller-manager's own client for both.
func serviceAccountClients(rc *rest.Config, own kubernetes.Interface) clientbuilder.ControllerClientBuilder {
	return clientbuilder.NewDynamicClientBuilder(rest.AnonymousClientConfig(rc), own.CoreV1(), ServiceAccountNamespace)
}
