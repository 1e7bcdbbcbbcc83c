package apiserver

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagev1listers "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	volumeutil "k8s.io/kubernetes/pkg/volume/util"
)

// defaultStorageClass is kube-apiserver's DefaultStorageClass admission
// plugin: a PersistentVolumeClaim created without a class (no
// spec.storageClassName and no beta class annotation; an explicit "" asks
// for no class and is kept) gets the default StorageClass, chosen by
// upstream's own rule (volumeutil.GetDefaultClass: the newest class
// annotated storageclass.kubernetes.io/is-default-class=true, then by
// name). So charts whose claims name no class bind on `waggle up`, whose
// controller-manager ships the local-path class as the default.
//
// The classes are read consistently, not from the watch cache: a class
// created a moment before its claims (one Helm release) must count, and
// claims are created rarely enough for the read not to matter.
type defaultStorageClass struct{ s *Server }

func (defaultStorageClass) Name() string { return "DefaultStorageClass" }

// betaStorageClassAnnotation is the claim annotation that named a class
// before spec.storageClassName existed; upstream still honours it.
const betaStorageClassAnnotation = "volume.beta.kubernetes.io/storage-class"

func (p defaultStorageClass) Admit(ctx context.Context, a *AdmissionAttributes) error {
	if a.Resource.Group != "" || a.Resource.Resource != "persistentvolumeclaims" || a.Operation != OpCreate || a.Subresource != "" {
		return nil
	}
	pvc, ok := a.Object.(*corev1.PersistentVolumeClaim)
	if !ok || pvc.Spec.StorageClassName != nil {
		return nil
	}
	if _, ok := pvc.Annotations[betaStorageClassAnnotation]; ok {
		return nil
	}
	r := p.s.registries["storageclasses"]
	if r == nil {
		return nil
	}
	res, err := r.list(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return err
	}
	store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, o := range res.items {
		if err := store.Add(o.Obj.(*storagev1.StorageClass)); err != nil {
			return err
		}
	}
	def, err := volumeutil.GetDefaultClass(storagev1listers.NewStorageClassLister(store))
	if err != nil {
		gr := a.Resource.GroupVersionResource.GroupResource()
		return apierrors.NewForbidden(gr, a.Name, err)
	}
	if def != nil {
		pvc.Spec.StorageClassName = &def.Name
	}
	return nil
}
