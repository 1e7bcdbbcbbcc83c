package upstream

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	api "k8s.io/kubernetes/pkg/apis/core"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
)

// ValidateProjectedVolumes checks the projected volumes of a pod spec's
// volumes (at fldPath, "spec.volumes") with kube-apiserver's own code:
// the volumes are defaulted as upstream (on a copy), converted to the
// internal type and run through ValidateVolumes, and only the errors
// under a projected volume's "projected" field come back. Its sources —
// podCertificate (signer name, key type, maxExpirationSeconds within
// [3600, 7862400], paths), clusterTrustBundle, serviceAccountToken,
// configMap, secret, downwardAPI — thus answer with upstream's field paths
// and messages. The other volume types stay the caller's business.
func ValidateProjectedVolumes(vols []corev1.Volume, fldPath *field.Path) field.ErrorList {
	var prefixes []string
	for i := range vols {
		if vols[i].Projected != nil {
			prefixes = append(prefixes, fldPath.Index(i).Child("projected").String())
		}
	}
	if len(prefixes) == 0 {
		return nil
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Volumes: make([]corev1.Volume, len(vols))}}
	for i := range vols {
		vols[i].DeepCopyInto(&pod.Spec.Volumes[i])
	}
	legacyscheme.Scheme.Default(pod)
	var in api.Pod
	if err := legacyscheme.Scheme.Convert(pod, &in, nil); err != nil {
		return internalError(err)
	}
	_, all := corevalidation.ValidateVolumes(in.Spec.Volumes, nil, fldPath, podOpts)
	var errs field.ErrorList
	for _, e := range all {
		for _, p := range prefixes {
			if e.Field == p || strings.HasPrefix(e.Field, p+".") || strings.HasPrefix(e.Field, p+"[") {
				errs = append(errs, e)
				break
			}
		}
	}
	return errs
}
