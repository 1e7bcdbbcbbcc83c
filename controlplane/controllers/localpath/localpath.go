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
// none). A released volume of reclaim policy Delete is removed from its node
// as rancher's provisioner does it: a helper pod (Options.HelperImage, in
// kube-system, pinned to the volume's node, tolerating every taint) mounts
// the parent directory and removes the volume's directory; once it has
// succeeded the PersistentVolume object is deleted, and the helper pod
// after it. A failed helper leaves the volume Released with a
// VolumeFailedDelete event and is retried with back-off. Without a helper
// image the object alone is deleted and the directory stays on the node.
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
	"strings"

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
	ReasonVolumeFailedDelete    = "VolumeFailedDelete"
)

// HelperNamespace holds the helper pods that remove volumes' directories,
// labelled HelperLabel=<volume name>.
const (
	HelperNamespace = "kube-system"
	HelperLabel     = "waggle.io/local-path-delete"
)

// Options configure the controller.
type Options struct {
	// Dir is the parent directory of the volumes on every node.
	Dir string
	// NoDefaultClass skips creating the local-path StorageClass.
	NoDefaultClass bool
	// HelperImage runs the helper pods that remove a deleted volume's
	// directory on its node: an image every node has, whose
	// /waggle-echo rm -r removes a tree (Waggle's own echo image, which
	// `waggle up` and the labs import on every node). Empty: directories
	// are left on the nodes.
	HelperImage string
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
	helpers  corelisters.PodLister // with a HelperImage
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
	if opts.HelperImage != "" {
		podInf := factory.Core().V1().Pods()
		c.helpers = podInf.Lister()
		c.synced = append(c.synced, podInf.Informer().HasSynced)
		helperKey := func(obj any) {
			if p, ok := ctrlutil.Unwrap(obj).(*corev1.Pod); ok && p.Namespace == HelperNamespace && p.Labels[HelperLabel] != "" {
				c.queue.Add("pv/" + p.Labels[HelperLabel])
			}
		}
		podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: helperKey, UpdateFunc: func(_, cur any) { helperKey(cur) }})
	}
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
	// Only a directory this provisioner named (<volume>_<ns>_<claim>) is
	// removed; any other path of a volume carrying the annotation is left.
	if c.opts.HelperImage != "" && pv.Spec.HostPath != nil && strings.HasPrefix(filepath.Base(pv.Spec.HostPath.Path), pv.Name+"_") {
		done, err := c.removeDirectory(ctx, pv)
		if err != nil || !done {
			return err
		}
	}
	uid := pv.UID
	err = c.client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &pv.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete released volume %s: %w", name, err)
	}
	c.log.Info("deleted released volume", "volume", name)
	if c.helpers != nil {
		err := c.client.CoreV1().Pods(HelperNamespace).Delete(ctx, helperName(name), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete helper pod of %s: %w", name, err)
		}
	}
	return nil
}

func helperName(volume string) string { return "local-path-delete-" + volume }

// removeDirectory runs (or waits for) the helper pod that removes pv's
// directory on its node: done once it has succeeded. A failed helper is
// reported on the volume and deleted, and the error retries with back-off.
func (c *Controller) removeDirectory(ctx context.Context, pv *corev1.PersistentVolume) (done bool, err error) {
	pod, err := c.helpers.Pods(HelperNamespace).Get(helperName(pv.Name))
	switch {
	case apierrors.IsNotFound(err):
		return false, c.createHelper(ctx, pv)
	case err != nil:
		return false, err
	case pod.Status.Phase == corev1.PodSucceeded:
		return true, nil
	case pod.Status.Phase == corev1.PodFailed:
		msg := pod.Status.Message
		for _, st := range pod.Status.ContainerStatuses {
			if t := st.State.Terminated; t != nil {
				msg = fmt.Sprintf("exit code %d: %s %s", t.ExitCode, t.Reason, t.Message)
			}
		}
		c.recorder.Eventf(pv, corev1.EventTypeWarning, ReasonVolumeFailedDelete, "removing %s on its node failed (helper pod %s/%s: %s)",
			pv.Spec.HostPath.Path, HelperNamespace, pod.Name, msg)
		if err := c.client.CoreV1().Pods(HelperNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		return false, fmt.Errorf("helper pod removing %s failed: %s", pv.Spec.HostPath.Path, msg)
	}
	for _, st := range pod.Status.ContainerStatuses {
		if w := st.State.Waiting; w != nil && imageUnavailable[w.Reason] {
			// The node cannot run the helper: the object goes, the
			// directory stays, as without a helper image.
			c.recorder.Eventf(pv, corev1.EventTypeWarning, ReasonVolumeFailedDelete, "helper image %s is not available on node %s (%s): %s is left on the node",
				c.opts.HelperImage, pod.Spec.NodeName, w.Reason, pv.Spec.HostPath.Path)
			return true, nil
		}
	}
	return false, nil // running; its next status change requeues the volume
}

// imageUnavailable are the waiting reasons of a helper that will not start.
var imageUnavailable = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "ErrImageNeverPull": true, "InvalidImageName": true}

// createHelper starts the pod that removes pv's directory: on the node its
// affinity names, the parent directory mounted, the volume's directory
// removed by name.
func (c *Controller) createHelper(ctx context.Context, pv *corev1.PersistentVolume) error {
	node := volumeNode(pv)
	if node == "" {
		return fmt.Errorf("volume %s names no node", pv.Name)
	}
	// The affinity holds the hostname label; the pod needs the node's name.
	if nodes, err := c.nodes.List(labels.SelectorFromSet(labels.Set{hostnameLabel: node})); err == nil && len(nodes) == 1 {
		node = nodes[0].Name
	}
	parent, dir := filepath.Dir(pv.Spec.HostPath.Path), filepath.Base(pv.Spec.HostPath.Path)
	no, dirType := false, corev1.HostPathDirectoryOrCreate
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: helperName(pv.Name), Namespace: HelperNamespace, Labels: map[string]string{HelperLabel: pv.Name}},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &no,
			Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Volumes: []corev1.Volume{{Name: "parent", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: parent, Type: &dirType}}}},
			Containers: []corev1.Container{{
				Name: "remove", Image: c.opts.HelperImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      []string{"/waggle-echo", "rm", "-r", filepath.Join("/parent", dir)},
				VolumeMounts: []corev1.VolumeMount{{Name: "parent", MountPath: "/parent"}},
			}},
		},
	}
	if _, err := c.client.CoreV1().Pods(HelperNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create helper pod for %s: %w", pv.Name, err)
	}
	c.log.Info("removing a released volume's directory", "volume", pv.Name, "node", node, "path", pv.Spec.HostPath.Path)
	return nil
}

// volumeNode is the hostname a local volume's required affinity pins it to.
func volumeNode(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, t := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if e.Key == hostnameLabel && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}
