package controllers

import (
	"context"
	"errors"
	"time"

	certinformers "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/kubernetes"

	"k8s.io/kubernetes/pkg/controller/bootstrap"
	"k8s.io/kubernetes/pkg/controller/certificates/approver"
	"k8s.io/kubernetes/pkg/controller/certificates/cleaner"
	"k8s.io/kubernetes/pkg/controller/certificates/signer"
)

// Names of the controllers of node bootstrap and certificates, as
// kube-controller-manager's --controllers knows them.
const (
	BootstrapSignerName = "bootstrapsigner"
	TokenCleanerName    = "tokencleaner"
	CSRApprovingName    = "csrapproving"
	CSRSigningName      = "csrsigning"
	CSRCleanerName      = "csrcleaner"
)

// certificateStarters are upstream's own controllers for bootstrap tokens
// and the CertificateSigningRequest API (k8s.io/kubernetes/pkg/controller/
// bootstrap and .../certificates), wired as kube-controller-manager wires
// them:
//
//   - bootstrapsigner signs kube-public/cluster-info with every bootstrap
//     token marked usage-bootstrap-signing (jws-kubeconfig-<id>); tokencleaner
//     deletes expired token Secrets. Both are off unless named in
//     --controllers, as upstream (`waggle up` names them, as kubeadm does).
//   - csrapproving approves node client CSRs (kubernetes.io/kube-apiserver-
//     client-kubelet) whose requester may create
//     certificatesigningrequests/nodeclient (or selfnodeclient for a node
//     renewing its own), checked by SubjectAccessReview; kubelet serving CSRs
//     are left for an administrator (`kubectl certificate approve`), as
//     upstream.
//   - csrsigning signs approved CSRs of the kubelet-serving,
//     kube-apiserver-client-kubelet, kube-apiserver-client and legacy-unknown
//     signers with --cluster-signing-cert-file/--cluster-signing-key-file
//     (the cluster CA); without them it does not run.
//   - csrcleaner deletes old approved, denied and pending CSRs.
func certificateStarters() []starter {
	return []starter{
		{name: BootstrapSignerName, serviceAccount: "bootstrap-signer", off: true, build: func(d Deps) (func(context.Context), error) {
			s, err := bootstrap.NewSigner(d.Client, d.Factory.Core().V1().Secrets(), d.Factory.Core().V1().ConfigMaps(), bootstrap.DefaultSignerOptions())
			if err != nil {
				return nil, err
			}
			return s.Run, nil
		}},
		{name: TokenCleanerName, serviceAccount: "token-cleaner", off: true, build: func(d Deps) (func(context.Context), error) {
			c, err := bootstrap.NewTokenCleaner(d.Client, d.Factory.Core().V1().Secrets(), bootstrap.DefaultTokenCleanerOptions())
			if err != nil {
				return nil, err
			}
			return c.Run, nil
		}},
		{name: CSRApprovingName, serviceAccount: "certificate-controller", build: func(d Deps) (func(context.Context), error) {
			if err := served(d, "certificates.k8s.io/v1", "certificatesigningrequests"); err != nil {
				return nil, err
			}
			c := approver.NewCSRApprovingController(d.Ctx, d.Client, d.Factory.Certificates().V1().CertificateSigningRequests())
			return func(ctx context.Context) { c.Run(ctx, 5) }, nil
		}},
		{name: CSRSigningName, serviceAccount: "certificate-controller", build: func(d Deps) (func(context.Context), error) {
			cert, key := d.Config.ClusterSigningCertFile, d.Config.ClusterSigningKeyFile
			if cert == "" || key == "" {
				return nil, errors.New("--cluster-signing-cert-file and --cluster-signing-key-file are not set")
			}
			if err := served(d, "certificates.k8s.io/v1", "certificatesigningrequests"); err != nil {
				return nil, err
			}
			inf := d.Factory.Certificates().V1().CertificateSigningRequests()
			ttl := d.Config.ClusterSigningDuration
			var runs []func(context.Context, int)
			for _, mk := range []func(context.Context, kubernetesClient, csrInformer, string, string, durationT) (*signer.CSRSigningController, error){
				signer.NewKubeletServingCSRSigningController,
				signer.NewKubeletClientCSRSigningController,
				signer.NewKubeAPIServerClientCSRSigningController,
				signer.NewLegacyUnknownCSRSigningController,
			} {
				c, err := mk(d.Ctx, d.Client, inf, cert, key, ttl)
				if err != nil {
					return nil, err
				}
				runs = append(runs, c.Run)
			}
			return func(ctx context.Context) {
				done := make(chan struct{}, len(runs))
				for _, run := range runs {
					go func() { run(ctx, 5); done <- struct{}{} }()
				}
				for range runs {
					<-done
				}
			}, nil
		}},
		{name: CSRCleanerName, serviceAccount: "certificate-controller", build: func(d Deps) (func(context.Context), error) {
			if err := served(d, "certificates.k8s.io/v1", "certificatesigningrequests"); err != nil {
				return nil, err
			}
			c := cleaner.NewCSRCleanerController(d.Client.CertificatesV1().CertificateSigningRequests(), d.Factory.Certificates().V1().CertificateSigningRequests())
			return func(ctx context.Context) { c.Run(ctx, 1) }, nil
		}},
	}
}

type (
	kubernetesClient = kubernetes.Interface
	csrInformer      = certinformers.CertificateSigningRequestInformer
	durationT        = time.Duration
)
