// Package localpath is Waggle's built-in dynamic provisioner for node-local
// storage, the counterpart of rancher's local-path-provisioner that k3s
// ships: a PersistentVolumeClaim of a StorageClass whose provisioner is
// Provisioner gets a hostPath PersistentVolume (type DirectoryOrCreate)
// under --local-path-dir on the node the scheduler chose for its first
// consumer (volume.kubernetes.io/selected-node), pinned there by the
// volume's required node affinity (kubernetes.io/hostname), so every later
// consumer lands on the same node. The directory is created by that node's
// kubelet when it first mounts the volume (mode 0777, as rancher's helper
// does; with the pod's fsGroup when it has one).
//
// The controller also makes sure the default StorageClass exists at start
// (ClassName, WaitForFirstConsumer, reclaim Delete, the default class unless
// another class already is), as k3s deploys its local-path class.
//
// It runs in the controller-manager, not on the nodes, so nodes need no
// right to create PersistentVolumes (upstream's Node authorizer gives them
// none). What that costs: a released volume of reclaim policy Delete has its
// PersistentVolume object deleted, but its directory stays on the node (a
// node-side cleanup, as rancher's helper pod, is not done yet).
//
// Binding itself is upstream's persistentvolume-binder: it hands a
// WaitForFirstConsumer claim to this provisioner by setting
// volume.kubernetes.io/storage-provisioner once a node is selected, and
// binds the pre-bound volume this controller creates.
package localpath

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name (--controllers, queue metrics).
const Name = "local-path-provisioner"

// Provisioner is the StorageClass provisioner this controller serves.
const Provisioner = "waggle.io/local-path"

// ClassName is the default StorageClass created at start.
const ClassName = "local-path"

// DefaultDir is --local-path-dir: where on a node the volumes' directories
// are.
const DefaultDir = "/var/lib/waggle/storage"

// Well-known annotations (upstream's names).
const (
	annSelectedNode    = "volume.kubernetes.io/selected-node"
	annStorageProvisnr = "volume.kubernetes.io/storage-provisioner"
	annBetaProvisioner = "volume.beta.kubernetes.io/storage-provisioner"
	annProvisionedBy   = "pv.kubernetes.io/provisioned-by"
	annDefaultClass    = "storageclass.kubernetes.io/is-default-class"
	hostnameLabel      = "kubernetes.io/hostname"
)

// Event reasons, upstream's (sig-storage-lib-external-provisioner).
const (
	ReasonProvisioningSucceeded = "ProvisioningSucceeded"
	ReasonProvisioningFailed    = "ProvisioningFailed"
)

// Options configure the controller.
type Options struct {
	// Dir is the parent directory of the volumes on every node.
	Dir string
	// NoDefaultClass skips creating the local-path StorageClass.
	NoDefaultClass bool
}

// Controller provisions and deletes local-path volumes.
type Controller struct {
	client   kubernetes.Interface
	log      *slog.Logger
	opts     Options
	claims   corelisters.PersistentVolumeClaimLister
	volumes  corelisters.PersistentVolumeLister
	classes  storagelisters.StorageClassLister
	nodes    corelisters.NodeLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	stopRec  func()
}

// New builds the provisioner over the shared factory.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	if opts.Dir == "" {
		opts.Dir = DefaultDir
	}
	pvcInf, pvInf := factory.Core().V1().PersistentVolumeClaims(), factory.Core().V1().PersistentVolumes()
	scInf, nodeInf := factory.Storage().V1().StorageClasses(), factory.Core().V1().Nodes()
	rec, stop := ctrlutil.NewRecorder(client, Provisioner+"_"+Name)
	c := &Controller{client: client, log: log.With("controller", Name), opts: opts,
		claims: pvcInf.Lister(), volumes: pvInf.Lister(), classes: scInf.Lister(), nodes: nodeInf.Lister(),
		synced: []cache.InformerSynced{pvcInf.Informer().HasSynced, pvInf.Informer().HasSynced, scInf.Informer().HasSynced, nodeInf.Informer().HasSynced},
		queue:  ctrlutil.NewQueue(Name), recorder: rec, stopRec: stop}
	claimKey := func(obj any) {
		if k := ctrlutil.KeyFunc(obj); k != "" {
			c.queue.Add("pvc/" + k)
		}
	}
	pvcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: claimKey, UpdateFunc: func(_, cur any) { claimKey(cur) }})
	volKey := func(obj any) {
		if pv, ok := ctrlutil.Unwrap(obj).(*corev1.PersistentVolume); ok && pv.Annotations[annProvisionedBy] == Provisioner {
			c.queue.Add("pv/" + pv.Name)
		}
	}
	pvInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: volKey, UpdateFunc: func(_, cur any) { volKey(cur) }})
	return c
}

// Run ensures the default class, then provisions until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.stopRec()
	if !cache.WaitForNamedCacheSync(Name, ctx.Done(), c.synced...) {
		return
	}
	if !c.opts.NoDefaultClass {
		if err := c.ensureClass(ctx); err != nil {
			c.log.Error("default StorageClass", "err", err)
		}
	}
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced...)
}

// ensureClass creates the local-path StorageClass when it is missing: the
// cluster's default unless another class already is.
func (c *Controller) ensureClass(ctx context.Context) error {
	if _, err := c.classes.Get(ClassName); err == nil {
		return nil
	}
	all, err := c.classes.List(labels.Everything())
	if err != nil {
		return err
	}
	isDefault := "true"
	for _, sc := range all {
		if sc.Annotations[annDefaultClass] == "true" {
			isDefault = "false"
		}
	}
	wffc, del := storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: ClassName, Annotations: map[string]string{annDefaultClass: isDefault}},
		Provisioner:       Provisioner,
		ReclaimPolicy:     &del,
		VolumeBindingMode: &wffc,
	}
	if _, err := c.client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create StorageClass %s: %w", ClassName, err)
	}
	c.log.Info("created StorageClass", "name", ClassName, "default", isDefault)
	return nil
}

func (c *Controller) sync(ctx context.Context, key string) error {
	switch {
	case len(key) > 4 && key[:4] == "pvc/":
		return c.syncClaim(ctx, key[4:])
	case len(key) > 3 && key[:3] == "pv/":
		return c.syncVolume(ctx, key[3:])
	}
	return nil
}

// VolumeName is the name of the volume provisioned for a claim (upstream's
// external provisioners' "pvc-<claim uid>").
func VolumeName(claim *corev1.PersistentVolumeClaim) string { return "pvc-" + string(claim.UID) }

// Path is where on its node the volume of claim lives (rancher's layout:
// <dir>/<volume>_<namespace>_<claim>).
func Path(dir string, claim *corev1.PersistentVolumeClaim) string {
	return filepath.Join(dir, VolumeName(claim)+"_"+claim.Namespace+"_"+claim.Name)
}

func (c *Controller) syncClaim(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	claim, err := c.claims.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	p := claim.Annotations[annStorageProvisnr]
	if p == "" {
		p = claim.Annotations[annBetaProvisioner]
	}
	if p != Provisioner || claim.Spec.VolumeName != "" || claim.DeletionTimestamp != nil || claim.Status.Phase != corev1.ClaimPending {
		return nil
	}
	pvName := VolumeName(claim)
	if _, err := c.volumes.Get(pvName); err == nil {
		return nil // provisioned; the binder binds it
	}
	nodeName := claim.Annotations[annSelectedNode]
	if nodeName == "" {
		c.recorder.Event(claim, corev1.EventTypeWarning, ReasonProvisioningFailed,
			"a local-path volume needs a node: use a StorageClass with volumeBindingMode WaitForFirstConsumer")
		return nil
	}
	if claim.Spec.StorageClassName == nil {
		return nil
	}
	class, err := c.classes.Get(*claim.Spec.StorageClassName)
	if err != nil {
		return fmt.Errorf("class of claim %s: %w", key, err)
	}
	if claim.Spec.Selector != nil {
		c.recorder.Event(claim, corev1.EventTypeWarning, ReasonProvisioningFailed, "claim Selector is not supported")
		return nil
	}
	for _, m := range claim.Spec.AccessModes {
		if m != corev1.ReadWriteOnce && m != corev1.ReadWriteOncePod {
			c.recorder.Eventf(claim, corev1.EventTypeWarning, ReasonProvisioningFailed,
				"failed to provision volume with StorageClass %q: access mode %s is not supported by a node-local volume (only ReadWriteOnce and ReadWriteOncePod)", class.Name, m)
			return nil
		}
	}
	hostname := nodeName
	if node, err := c.nodes.Get(nodeName); err == nil && node.Labels[hostnameLabel] != "" {
		hostname = node.Labels[hostnameLabel]
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if class.ReclaimPolicy != nil {
		reclaim = *class.ReclaimPolicy
	}
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName, Annotations: map[string]string{annProvisionedBy: Provisioner}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: claim.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes:                   claim.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              class.Name,
			MountOptions:                  class.MountOptions,
			VolumeMode:                    claim.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID, ResourceVersion: claim.ResourceVersion},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: Path(c.opts.Dir, claim), Type: &dirOrCreate}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{hostname}}},
			}}}},
		},
	}
	if m := claim.Spec.VolumeMode; m != nil && *m == corev1.PersistentVolumeBlock {
		c.recorder.Event(claim, corev1.EventTypeWarning, ReasonProvisioningFailed, "volumeMode Block is not supported by local-path volumes")
		return nil
	}
	if _, err := c.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.recorder.Eventf(claim, corev1.EventTypeWarning, ReasonProvisioningFailed, "failed to provision volume with StorageClass %q: %v", class.Name, err)
		return fmt.Errorf("create volume %s for %s: %w", pvName, key, err)
	}
	c.recorder.Eventf(claim, corev1.EventTypeNormal, ReasonProvisioningSucceeded, "Successfully provisioned volume %s", pvName)
	c.log.Info("provisioned", "claim", key, "volume", pvName, "node", nodeName)
	return nil
}

// syncVolume deletes a released volume of reclaim policy Delete (the
// binder leaves that to its provisioner).
func (c *Controller) syncVolume(ctx context.Context, name string) error {
	pv, err := c.volumes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pv.Annotations[annProvisionedBy] != Provisioner || pv.DeletionTimestamp != nil ||
		pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.Status.Phase != corev1.VolumeReleased {
		return nil
	}
	uid := pv.UID
	err = c.client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &pv.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete released volume %s: %w", name, err)
	}
	c.log.Info("deleted released volume", "volume", name)
	return nil
}
