// Package persistentvolume runs Kubernetes' PersistentVolume controller
// (k8s.io/kubernetes/pkg/controller/volume/persistentvolume, the
// "persistentvolume-binder") in the controller-manager: it binds each
// PersistentVolumeClaim to a matching PersistentVolume (capacity, access
// modes, storageClassName, selector, volumeMode; pre-bound claimRef and
// volumeName honoured) and sets both sides' phases and bind annotations;
// defers claims of a WaitForFirstConsumer StorageClass until the scheduler
// names a node (volume.kubernetes.io/selected-node); hands dynamic
// provisioning to the class's provisioner by annotating the claim
// (volume.kubernetes.io/storage-provisioner); and reclaims a released
// volume as its policy says (Retain: Released, kept; Delete: deleted by
// its provisioner, or Failed when nothing can delete it).
//
// It runs with no in-tree volume plugins, as a cluster whose volumes are
// all provisioned and deleted outside the controller (CSI, or a built-in
// provisioner) does; Recycle is not supported (deprecated upstream).
package persistentvolume

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	upstream "k8s.io/kubernetes/pkg/controller/volume/persistentvolume"
)

// Name is the controller's name (--controllers), as kube-controller-manager's.
const Name = "persistentvolume-binder"

// DefaultSyncPeriod is --pvclaimbinder-sync-period.
const DefaultSyncPeriod = 15 * time.Second

// Controller is the upstream binder.
type Controller struct {
	c   *upstream.PersistentVolumeController
	log *slog.Logger
}

// New builds the binder over the shared factory.
func New(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, syncPeriod time.Duration) (*Controller, error) {
	if syncPeriod <= 0 {
		syncPeriod = DefaultSyncPeriod
	}
	c, err := upstream.NewController(ctx, upstream.ControllerParameters{
		KubeClient:                client,
		SyncPeriod:                syncPeriod,
		VolumeInformer:            factory.Core().V1().PersistentVolumes(),
		ClaimInformer:             factory.Core().V1().PersistentVolumeClaims(),
		ClassInformer:             factory.Storage().V1().StorageClasses(),
		PodInformer:               factory.Core().V1().Pods(),
		NodeInformer:              factory.Core().V1().Nodes(),
		EnableDynamicProvisioning: true,
	})
	if err != nil {
		return nil, fmt.Errorf("persistentvolume-binder: %w", err)
	}
	return &Controller{c: c, log: log.With("controller", Name)}, nil
}

// Run runs the binder until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	c.log.Info("starting")
	defer c.log.Info("stopped")
	c.c.Run(ctx)
}
