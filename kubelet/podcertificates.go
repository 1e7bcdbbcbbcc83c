package kubelet

import (
	"bytes"
	"context"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"k8s.io/kubernetes/pkg/kubelet/podcertificate"
	"k8s.io/utils/clock"
)

// podCertificates returns the manager of the pods' podCertificate projected
// sources: upstream's own (k8s.io/kubernetes/pkg/kubelet/podcertificate,
// IssuingManager), which generates each source's key, creates the
// PodCertificateRequest with its proof of possession as the node, follows
// it to issuance (or denial, failure) and creates a new one at the
// certificate's beginRefreshAt. It is started on first use, with its two
// informers — PodCertificateRequests of this node (spec.nodeName) and this
// Node (metadata.name), the only lists the Node authorizer lets a kubelet
// make — so a node whose pods use no podCertificate source watches nothing
// more.
func (k *Kubelet) podCertificates() podcertificate.Manager {
	k.podCertsOnce.Do(func() {
		ctx := k.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		byNode := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.cfg.NodeName).String()
			}))
		self := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", k.cfg.NodeName).String()
			}))
		recorder := k.recorder
		if recorder == nil {
			// A kubelet built without Run records no events.
			recorder = record.NewBroadcaster().NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: k.cfg.NodeName})
		}
		m := podcertificate.NewIssuingManager(k.client, podCertificatePods{k}, recorder,
			byNode.Certificates().V1().PodCertificateRequests(), self.Core().V1().Nodes(),
			types.NodeName(k.cfg.NodeName), clock.RealClock{})
		byNode.Start(ctx.Done())
		self.Start(ctx.Done())
		go m.Run(ctx)
		k.podCerts.Store(m)
	})
	return k.podCerts.Load()
}

// forgetPodCertificates drops the credentials of a pod that is gone (the
// manager would find that out at its next pass; this is at once).
func (k *Kubelet) forgetPodCertificates(pod *v1.Pod) {
	if m := k.podCerts.Load(); m != nil {
		m.ForgetPod(context.Background(), pod)
	}
}

// podCertificatePods is the manager's view of the pods on this node: those
// with a pod worker, static pods excepted (mirror pods get no certificates,
// and NodeRestriction refuses a request for one).
type podCertificatePods struct{ k *Kubelet }

func (p podCertificatePods) GetPodByUID(uid types.UID) (*v1.Pod, bool) {
	p.k.mu.Lock()
	w := p.k.workers[uid]
	p.k.mu.Unlock()
	if w == nil || w.static {
		return nil, false
	}
	pod, _ := w.snapshot()
	return pod, true
}

func (p podCertificatePods) GetPods() []*v1.Pod {
	p.k.mu.Lock()
	ws := make([]*podWorker, 0, len(p.k.workers))
	for _, w := range p.k.workers {
		if !w.static {
			ws = append(ws, w)
		}
	}
	p.k.mu.Unlock()
	out := make([]*v1.Pod, 0, len(ws))
	for _, w := range ws {
		pod, _ := w.snapshot()
		out = append(out, pod)
	}
	return out
}

// podCertificateFiles writes source sourceIndex of projected volume volName
// as upstream's projected volume does: the private key followed by the
// certificate chain at credentialBundlePath, the key alone at keyPath, the
// chain alone at certificateChainPath (each only when named), in the
// volume's defaultMode. Until the signer has issued the request the mount
// fails ("credential bundle is not issued yet"), so the pod waits with a
// FailedMount event and the worker retries at its next sync; a denied or
// failed request is a permanent mount failure, as upstream.
func (k *Kubelet) podCertificateFiles(ctx context.Context, pod *v1.Pod, volName string, sourceIndex int, src *v1.PodCertificateProjection, defMode *int32) ([]file, error) {
	m := k.podCertificates()
	m.TrackPod(ctx, pod)
	key, chain, err := m.GetPodCertificateCredentialBundle(ctx, pod.Namespace, pod.Name, string(pod.UID), volName, sourceIndex)
	if err != nil {
		return nil, fmt.Errorf("podCertificate of signer %q: %w", src.SignerName, err)
	}
	mode := os.FileMode(v1.ProjectedVolumeSourceDefaultMode)
	if defMode != nil {
		mode = os.FileMode(*defMode)
	}
	var out []file
	if src.CredentialBundlePath != "" {
		out = append(out, file{src.CredentialBundlePath, bytes.Join([][]byte{key, chain}, nil), mode})
	}
	if src.KeyPath != "" {
		out = append(out, file{src.KeyPath, key, mode})
	}
	if src.CertificateChainPath != "" {
		out = append(out, file{src.CertificateChainPath, chain, mode})
	}
	return out, nil
}
