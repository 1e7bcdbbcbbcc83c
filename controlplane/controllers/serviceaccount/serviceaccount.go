// Package serviceaccount is the controller-manager's ServiceAccount
// controller: it keeps a `default` ServiceAccount in every active namespace,
// creating it when a namespace appears and re-creating it if it is deleted.
//
// It is not the token controller: it issues no tokens or Secrets.
package serviceaccount

import (
	"context"
	"fmt"
	"log/slog"

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

// Name is the controller's name in --controllers and in its queue metrics.
const Name = "serviceaccount"

// Options configure the controller.
type Options struct {
	// ServiceAccounts are the names ensured in every namespace (default:
	// just "default", as Kubernetes).
	ServiceAccounts []string
}

// Controller ensures the ServiceAccounts of Options in every namespace.
type Controller struct {
	client kubernetes.Interface
	log    *slog.Logger
	names  []string
	nsList corelisters.NamespaceLister
	saList corelisters.ServiceAccountLister
	queue  workqueue.TypedRateLimitingInterface[string]
	synced []cache.InformerSynced
}

// New builds the controller on factory's namespace and ServiceAccount
// informers; the caller starts factory.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	if len(opts.ServiceAccounts) == 0 {
		opts.ServiceAccounts = []string{"default"}
	}
	nsInf := factory.Core().V1().Namespaces()
	saInf := factory.Core().V1().ServiceAccounts()
	c := &Controller{
		client: client, log: log.With("controller", Name), names: opts.ServiceAccounts,
		nsList: nsInf.Lister(), saList: saInf.Lister(),
		queue:  ctrlutil.NewQueue(Name),
		synced: []cache.InformerSynced{nsInf.Informer().HasSynced, saInf.Informer().HasSynced},
	}
	enqueueNS := func(obj any) {
		if ns, ok := ctrlutil.Unwrap(obj).(*corev1.Namespace); ok {
			c.queue.Add(ns.Name)
		}
	}
	nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueueNS,
		UpdateFunc: func(_, cur any) { enqueueNS(cur) },
	})
	saInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if sa, ok := ctrlutil.Unwrap(obj).(*corev1.ServiceAccount); ok {
				c.queue.Add(sa.Namespace)
			}
		},
	})
	return c
}

// Run syncs namespaces with workers goroutines until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced...)
}

func (c *Controller) sync(ctx context.Context, nsName string) error {
	if ns, err := ctrlutil.ActiveNamespace(c.nsList, nsName); err != nil || ns == nil {
		return err
	}
	for _, name := range c.names {
		if _, err := c.saList.ServiceAccounts(nsName).Get(name); err == nil {
			continue
		}
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: nsName}}
		_, err := c.client.CoreV1().ServiceAccounts(nsName).Create(ctx, sa, metav1.CreateOptions{})
		switch {
		case err == nil:
			c.log.Debug("created service account", "namespace", nsName, "name", name)
		case apierrors.IsAlreadyExists(err):
		case apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			return nil // the namespace is going away
		default:
			return fmt.Errorf("create service account %s/%s: %w", nsName, name, err)
		}
	}
	return nil
}
