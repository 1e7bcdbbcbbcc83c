package apiserver

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/waggle-io/waggle/controlplane/apiserver/serviceaccount"
)

// Upstream's names for the ServiceAccount admission plugin's volume.
const (
	// DefaultServiceAccountName is the ServiceAccount a pod naming none runs as.
	DefaultServiceAccountName = "default"
	// ServiceAccountTokenMountPath is where every container gets the volume.
	ServiceAccountTokenMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// ServiceAccountVolumePrefix starts the volume's name (kube-api-access-<5 random>).
	ServiceAccountVolumePrefix = "kube-api-access-"
	// RootCAConfigMap is the ConfigMap the root-ca-cert-publisher keeps in
	// every namespace.
	RootCAConfigMap = "kube-root-ca.crt"
)

// serviceAccountAdmission is upstream's ServiceAccount admission plugin
// on pod creation: a pod naming no ServiceAccount runs as `default`; the
// ServiceAccount must exist (else 403 "error looking up service account");
// unless automountServiceAccountToken is false on the pod (which wins) or
// on the ServiceAccount, every container and init container gets the
// projected kube-api-access-<rand> volume (a bound token of 3607 s,
// kube-root-ca.crt's ca.crt, the namespace) read-only at
// /var/run/secrets/kubernetes.io/serviceaccount, except a container that
// already mounts something there; a pod with no imagePullSecrets gets the
// ServiceAccount's. Mirror pods are left alone (they may not name a
// ServiceAccount: NodeRestriction). Not done: the
// kubernetes.io/enforce-mountable-secrets annotation.
type serviceAccountAdmission struct{ s *Server }

func (serviceAccountAdmission) Name() string { return "ServiceAccount" }

func (p serviceAccountAdmission) Admit(ctx context.Context, a *AdmissionAttributes) error {
	if a.Resource.Resource != "pods" || a.Resource.Group != "" || a.Operation != OpCreate || a.Subresource != "" {
		return nil
	}
	pod, ok := a.Object.(*corev1.Pod)
	if !ok {
		return nil
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return nil
	}
	if pod.Spec.ServiceAccountName == "" {
		pod.Spec.ServiceAccountName = DefaultServiceAccountName
	}
	sa, err := getTyped[*corev1.ServiceAccount](ctx, p.s, "serviceaccounts", a.Namespace, pod.Spec.ServiceAccountName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			err = fmt.Errorf("error looking up service account %s/%s: serviceaccount %q not found", a.Namespace, pod.Spec.ServiceAccountName, pod.Spec.ServiceAccountName)
			return apierrors.NewForbidden(a.Resource.GroupResource(), a.Name, err)
		}
		return err
	}
	if len(pod.Spec.ImagePullSecrets) == 0 && len(sa.ImagePullSecrets) > 0 {
		pod.Spec.ImagePullSecrets = append([]corev1.LocalObjectReference(nil), sa.ImagePullSecrets...)
	}
	if !shouldAutomount(sa, pod) {
		return nil
	}
	name := ""
	for _, v := range pod.Spec.Volumes {
		if strings.HasPrefix(v.Name, ServiceAccountVolumePrefix) && v.Projected != nil {
			name = v.Name // already added (a retried create)
		}
	}
	if name == "" {
		taken := map[string]bool{}
		for _, v := range pod.Spec.Volumes {
			taken[v.Name] = true
		}
		for name == "" || taken[name] {
			name = ServiceAccountVolumePrefix + utilrand.String(5)
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Projected: TokenVolumeSource()}})
	}
	mount := func(cs []corev1.Container) {
		for i := range cs {
			has := false
			for _, m := range cs[i].VolumeMounts {
				if m.MountPath == ServiceAccountTokenMountPath || m.Name == name {
					has = true
				}
			}
			if !has {
				cs[i].VolumeMounts = append(cs[i].VolumeMounts, corev1.VolumeMount{Name: name, ReadOnly: true, MountPath: ServiceAccountTokenMountPath})
			}
		}
	}
	mount(pod.Spec.InitContainers)
	mount(pod.Spec.Containers)
	return nil
}

func shouldAutomount(sa *corev1.ServiceAccount, pod *corev1.Pod) bool {
	if pod.Spec.AutomountServiceAccountToken != nil {
		return *pod.Spec.AutomountServiceAccountToken
	}
	if sa.AutomountServiceAccountToken != nil {
		return *sa.AutomountServiceAccountToken
	}
	return true
}

// TokenVolumeSource is upstream's projected kube-api-access volume: a
// pod-bound token (3607 s: with extended expiration it lasts a year but is
// flagged stale after the hour), the cluster CA and the namespace, files
// mode 0644.
func TokenVolumeSource() *corev1.ProjectedVolumeSource {
	exp := int64(serviceaccount.WarnOnlyExpirationSeconds)
	mode := int32(corev1.ProjectedVolumeSourceDefaultMode)
	return &corev1.ProjectedVolumeSource{
		DefaultMode: &mode,
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &exp}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: RootCAConfigMap},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
			}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
				Path:     "namespace",
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"},
			}}}},
		},
	}
}
