package apiserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/waggle-io/waggle/controlplane/storage"
)

// kubeSystemSecrets reads the Secrets of kube-system from the watch cache,
// for the bootstrap token authenticator (upstream's reads an informer's
// lister; the watch cache is this server's informer).
type kubeSystemSecrets struct{ s *Server }

var _ corev1listers.SecretNamespaceLister = kubeSystemSecrets{}

func (l kubeSystemSecrets) Get(name string) (*corev1.Secret, error) {
	reg := l.s.registries["secrets"]
	if reg == nil || reg.cache == nil {
		return nil, errors.New("secrets are not served")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o, _, err := reg.cache.Get(ctx, 0, reg.key(metav1.NamespaceSystem, name))
	if errors.Is(err, storage.ErrNotFound) {
		return nil, reg.notFound(name)
	}
	if err != nil {
		return nil, err
	}
	sec, ok := o.Obj.(*corev1.Secret)
	if !ok {
		return nil, fmt.Errorf("secret %s: unexpected %T", name, o.Obj)
	}
	return sec, nil
}

func (l kubeSystemSecrets) List(sel labels.Selector) ([]*corev1.Secret, error) {
	reg := l.s.registries["secrets"]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	objs, _, err := reg.cache.List(ctx, 0, storage.Predicate{KeyPrefix: reg.prefix(metav1.NamespaceSystem)})
	if err != nil {
		return nil, err
	}
	var out []*corev1.Secret
	for _, o := range objs {
		if sec, ok := o.Obj.(*corev1.Secret); ok && sel.Matches(labels.Set(sec.Labels)) {
			out = append(out, sec)
		}
	}
	return out, nil
}

// bootstrapClusterInfo keeps the kube-public/cluster-info ConfigMap that
// kubeadm creates: a kubeconfig with the cluster's CA and an API server URL
// and no credentials, readable by anyone (system:anonymous may get it, see
// the default policy), which the bootstrapsigner controller signs with each
// bootstrap token (jws-kubeconfig-<id>) so a joining node can check it knows
// the same token before trusting the CA. An existing ConfigMap keeps its
// server URL (the first server's, or what an administrator put there) and
// gets the CA refreshed.
func (s *Server) bootstrapClusterInfo(ctx context.Context) error {
	ca := s.bundle.CAPEM()
	if len(ca) == 0 {
		return nil
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[""] = &clientcmdapi.Cluster{Server: s.url, CertificateAuthorityData: ca}
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return fmt.Errorf("apiserver: cluster-info: %w", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.ConfigMapClusterInfo, Namespace: metav1.NamespacePublic},
		Data:       map[string]string{bootstrapapi.KubeConfigKey: string(data)},
	}
	return s.upsert(ctx, "configmaps", cm, func(cur runtime.Object) bool {
		c := cur.(*corev1.ConfigMap)
		old, err := clientcmd.Load([]byte(c.Data[bootstrapapi.KubeConfigKey]))
		if err != nil || len(old.Clusters) != 1 {
			if c.Data == nil {
				c.Data = map[string]string{}
			}
			c.Data[bootstrapapi.KubeConfigKey] = string(data)
			return true
		}
		for name, cl := range old.Clusters {
			if apiequality.Semantic.DeepEqual(cl.CertificateAuthorityData, ca) {
				return false
			}
			cl.CertificateAuthorityData = ca
			old.Clusters[name] = cl
		}
		b, err := clientcmd.Write(*old)
		if err != nil {
			return false
		}
		c.Data[bootstrapapi.KubeConfigKey] = string(b)
		return true
	})
}
