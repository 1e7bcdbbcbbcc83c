package apiserver

import (
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Checks kube-apiserver makes that the conformance suite found missing:
// immutable ConfigMaps and Secrets, and pod sysctls.

const immutableMsg = "field is immutable when `immutable` is set"

// validateConfigMapUpdate: once immutable is true, it stays so and data
// and binaryData never change.
func validateConfigMapUpdate(cm, old *corev1.ConfigMap) field.ErrorList {
	var errs field.ErrorList
	if old.Immutable != nil && *old.Immutable {
		if cm.Immutable == nil || !*cm.Immutable {
			errs = append(errs, field.Forbidden(field.NewPath("immutable"), immutableMsg))
		}
		if !apiequality.Semantic.DeepEqual(cm.Data, old.Data) {
			errs = append(errs, field.Forbidden(field.NewPath("data"), immutableMsg))
		}
		if !apiequality.Semantic.DeepEqual(cm.BinaryData, old.BinaryData) {
			errs = append(errs, field.Forbidden(field.NewPath("binaryData"), immutableMsg))
		}
	}
	return errs
}

// validateSecretUpdate: type never changes; once immutable is true, it
// stays so and data never changes.
func validateSecretUpdate(s, old *corev1.Secret) field.ErrorList {
	var errs field.ErrorList
	if s.Type != old.Type {
		errs = append(errs, field.Invalid(field.NewPath("type"), s.Type, "field is immutable"))
	}
	if old.Immutable != nil && *old.Immutable {
		if s.Immutable == nil || !*s.Immutable {
			errs = append(errs, field.Forbidden(field.NewPath("immutable"), immutableMsg))
		}
		if !apiequality.Semantic.DeepEqual(s.Data, old.Data) {
			errs = append(errs, field.Forbidden(field.NewPath("data"), immutableMsg))
		}
	}
	return errs
}

// sysctlName is upstream's SysctlContainSlashFmt: dot- or slash-separated
// segments of lower-case alphanumerics, '-' and '_'.
var sysctlName = regexp.MustCompile(`^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$`)

const sysctlMaxLength = 253

// validateSysctls checks spec.securityContext.sysctls as upstream: valid,
// unique names; none in the net.* namespace with hostNetwork, nor IPC ones
// with hostIPC.
func validateSysctls(spec *corev1.PodSpec, path *field.Path) field.ErrorList {
	if spec.SecurityContext == nil {
		return nil
	}
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, s := range spec.SecurityContext.Sysctls {
		p := path.Index(i).Child("name")
		switch {
		case s.Name == "":
			errs = append(errs, field.Required(p, ""))
		case len(s.Name) > sysctlMaxLength || !sysctlName.MatchString(s.Name):
			errs = append(errs, field.Invalid(p, s.Name, fmt.Sprintf("must have at most %d characters and match regex %s", sysctlMaxLength, sysctlName.String())))
		case seen[s.Name]:
			errs = append(errs, field.Duplicate(p, s.Name))
		case spec.HostNetwork && hasPrefixSysctl(s.Name, "net."):
			errs = append(errs, field.Invalid(p, s.Name, "may not be specified when 'hostNetwork' is true"))
		case spec.HostIPC && (hasPrefixSysctl(s.Name, "kernel.shm") || hasPrefixSysctl(s.Name, "kernel.msg") || hasPrefixSysctl(s.Name, "kernel.sem") || hasPrefixSysctl(s.Name, "fs.mqueue.")):
			errs = append(errs, field.Invalid(p, s.Name, "may not be specified when 'hostIPC' is true"))
		}
		seen[s.Name] = true
	}
	return errs
}

func hasPrefixSysctl(name, prefix string) bool {
	n := []byte(name)
	for i, c := range n {
		if c == '/' {
			n[i] = '.'
		}
	}
	return len(n) >= len(prefix) && string(n[:len(prefix)]) == prefix
}
