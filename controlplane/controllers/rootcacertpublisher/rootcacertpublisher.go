// Package rootcacertpublisher is the controller-manager's
// root-ca-cert-publisher: it keeps a `kube-root-ca.crt` ConfigMap in every
// active namespace holding the cluster's CA bundle under `ca.crt`, as
// upstream does. Pods' projected ServiceAccount volumes and in-cluster
// clients read it to verify the API server; the upstream e2e framework
// waits for it in every test namespace.
//
// It publishes; it does not sign or rotate anything.
package rootcacertpublisher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name in --controllers and in its queue metrics,
// as kube-controller-manager names it.
const Name = "root-ca-cert-publisher"

const (
	// ConfigMapName and DataKey are where upstream publishes the bundle.
	ConfigMapName         = "kube-root-ca.crt"
	DataKey               = "ca.crt"
	descriptionAnnotation = "kubernetes.io/description"
	description           = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."
)

// Controller publishes rootCA in every namespace.
type Controller struct {
	client kubernetes.Interface
	log    *slog.Logger
	rootCA []byte
	nsList corelisters.NamespaceLister
	cmList corelisters.ConfigMapLister
	queue  workqueue.TypedRateLimitingInterface[string]
	synced []cache.InformerSynced
}

// New builds the controller on factory's namespace and ConfigMap informers;
// the caller starts factory. rootCA is the PEM bundle to publish.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, rootCA []byte) (*Controller, error) {
	if len(bytes.TrimSpace(rootCA)) == 0 {
		return nil, errors.New("no root CA bundle to publish (--root-ca-file, or the CA of the controller-manager's kubeconfig)")
	}
	nsInf := factory.Core().V1().Namespaces()
	cmInf := factory.Core().V1().ConfigMaps()
	c := &Controller{
		client: client, log: log.With("controller", Name), rootCA: rootCA,
		nsList: nsInf.Lister(), cmList: cmInf.Lister(),
		queue:  ctrlutil.NewQueue(Name),
		synced: []cache.InformerSynced{nsInf.Informer().HasSynced, cmInf.Informer().HasSynced},
	}
	nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueNamespace(obj) },
		UpdateFunc: func(_, cur any) { c.enqueueNamespace(cur) },
	})
	cmInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, cur any) { c.enqueueConfigMap(cur) },
		DeleteFunc: func(obj any) { c.enqueueConfigMap(obj) },
	})
	return c, nil
}

func (c *Controller) enqueueNamespace(obj any) {
	if ns, ok := ctrlutil.Unwrap(obj).(*corev1.Namespace); ok {
		c.queue.Add(ns.Name)
	}
}

func (c *Controller) enqueueConfigMap(obj any) {
	if cm, ok := ctrlutil.Unwrap(obj).(*corev1.ConfigMap); ok && cm.Name == ConfigMapName {
		c.queue.Add(cm.Namespace)
	}
}

// Run syncs namespaces with workers goroutines until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced...)
}

func (c *Controller) sync(ctx context.Context, nsName string) error {
	if ns, err := ctrlutil.ActiveNamespace(c.nsList, nsName); err != nil || ns == nil {
		return err
	}
	want := map[string]string{DataKey: string(c.rootCA)}
	cm, err := c.cmList.ConfigMaps(nsName).Get(ConfigMapName)
	if apierrors.IsNotFound(err) {
		_, err = c.client.CoreV1().ConfigMaps(nsName).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Annotations: map[string]string{descriptionAnnotation: description}},
			Data:       want,
		}, metav1.CreateOptions{})
		switch {
		case err == nil, apierrors.IsAlreadyExists(err):
			return nil
		case apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			return nil // the namespace is going away
		default:
			return fmt.Errorf("create %s/%s: %w", nsName, ConfigMapName, err)
		}
	}
	if err != nil {
		return err
	}
	if maps.Equal(cm.Data, want) && len(cm.BinaryData) == 0 && cm.Annotations[descriptionAnnotation] == description {
		return nil
	}
	// Someone changed it: put the bundle back (other annotations stay).
	upd := cm.DeepCopy()
	upd.Data, upd.BinaryData = want, nil
	if upd.Annotations == nil {
		upd.Annotations = map[string]string{}
	}
	upd.Annotations[descriptionAnnotation] = description
	if _, err := c.client.CoreV1().ConfigMaps(nsName).Update(ctx, upd, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update %s/%s: %w", nsName, ConfigMapName, err)
	}
	return nil
}
