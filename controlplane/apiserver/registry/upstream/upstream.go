// Package upstream gives the API server kube-apiserver's own validation,
// defaulting and version conversion for built-in kinds, by calling
// k8s.io/kubernetes (pkg/apis/<group>: the internal types, their v1
// defaulters and conversions, and pkg/apis/<group>/validation). A served
// object is converted to its internal type, validated there, and the
// field errors — with upstream's field paths and messages — come back.
//
// It decides nothing itself: which kinds use it, and what a strategy adds
// around it (status resets, generation), is the registry's business.
package upstream

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	apiregistrationinstall "k8s.io/kube-aggregator/pkg/apis/apiregistration/install"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	// The internal types, defaulters and conversions of every group used.
	_ "k8s.io/kubernetes/pkg/apis/admissionregistration/install"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	_ "k8s.io/kubernetes/pkg/apis/autoscaling/install"
	_ "k8s.io/kubernetes/pkg/apis/batch/install"
	_ "k8s.io/kubernetes/pkg/apis/certificates/install"
	_ "k8s.io/kubernetes/pkg/apis/coordination/install"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	_ "k8s.io/kubernetes/pkg/apis/discovery/install"
	_ "k8s.io/kubernetes/pkg/apis/events/install"
	_ "k8s.io/kubernetes/pkg/apis/flowcontrol/install"
	_ "k8s.io/kubernetes/pkg/apis/networking/install"
	_ "k8s.io/kubernetes/pkg/apis/node/install"
	_ "k8s.io/kubernetes/pkg/apis/policy/install"
	_ "k8s.io/kubernetes/pkg/apis/rbac/install"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	_ "k8s.io/kubernetes/pkg/apis/scheduling/install"
	_ "k8s.io/kubernetes/pkg/apis/storage/install"
	_ "k8s.io/kubernetes/pkg/apis/storagemigration/install"
)

// kube-aggregator's APIService joins kube-apiserver's scheme: its internal
// type, defaults and conversions.
func init() { apiregistrationinstall.Install(legacyscheme.Scheme) }

// Validation is upstream's validation of one kind, on internal objects.
// Update and Status may be nil (nothing beyond Create's checks); a status
// write is checked by Status alone, as kube-apiserver's status strategies
// do.
type Validation struct {
	Create func(obj runtime.Object) field.ErrorList
	Update func(obj, old runtime.Object) field.ErrorList
	Status func(obj, old runtime.Object) field.ErrorList
	// Subs validates writes through other subresources (approval).
	Subs map[string]func(obj, old runtime.Object) field.ErrorList
}

// validations by internal group and kind; filled by the per-group files.
var validations = map[schema.GroupKind]Validation{}

func register(gk schema.GroupKind, v Validation) { validations[gk] = v }

// Has reports whether upstream validation is wired for gk.
func Has(gk schema.GroupKind) bool {
	_, ok := validations[gk]
	return ok
}

// Default applies kube-apiserver's defaults to a versioned object (the
// generated SetObjectDefaults_* of its version).
func Default(obj runtime.Object) { legacyscheme.Scheme.Default(obj) }

// toInternal converts a versioned object to its internal type.
func toInternal(obj runtime.Object) (runtime.Object, schema.GroupKind, error) {
	gvks, _, err := legacyscheme.Scheme.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return nil, schema.GroupKind{}, fmt.Errorf("upstream: %T is not a known kind: %v", obj, err)
	}
	gk := gvks[0].GroupKind()
	out, err := legacyscheme.Scheme.ConvertToVersion(obj, schema.GroupVersion{Group: gk.Group, Version: runtime.APIVersionInternal})
	if err != nil {
		return nil, gk, fmt.Errorf("upstream: convert %s to internal: %w", gvks[0], err)
	}
	return out, gk, nil
}

// ToInternal converts a versioned object to its internal type (a copy).
func ToInternal(obj runtime.Object) (runtime.Object, error) {
	out, _, err := toInternal(obj)
	return out, err
}

// internalError reports a conversion failure as a field error, so that it
// reaches the client as a 422 rather than being lost.
func internalError(err error) field.ErrorList {
	return field.ErrorList{field.InternalError(nil, err)}
}

// ValidateCreate validates a new versioned object. ok is false when no
// upstream validation is wired for its kind.
func ValidateCreate(obj runtime.Object) (errs field.ErrorList, ok bool) {
	in, gk, err := toInternal(obj)
	if err != nil {
		return internalError(err), true
	}
	v, ok := validations[gk]
	if !ok {
		return nil, false
	}
	return v.Create(in), true
}

// ValidateUpdate validates an update (sub "") or a status write (sub
// "status") of a versioned object.
func ValidateUpdate(obj, old runtime.Object, sub string) (errs field.ErrorList, ok bool) {
	in, gk, err := toInternal(obj)
	if err != nil {
		return internalError(err), true
	}
	v, ok := validations[gk]
	if !ok {
		return nil, false
	}
	oldIn, _, err := toInternal(old)
	if err != nil {
		return internalError(err), true
	}
	switch {
	case v.Subs[sub] != nil:
		return v.Subs[sub](in, oldIn), true
	case sub != "" && sub != "status":
		return nil, true
	case sub == "status" && v.Status != nil:
		return v.Status(in, oldIn), true
	case sub == "status":
		return nil, true
	case v.Update != nil:
		return v.Update(in, oldIn), true
	default:
		return v.Create(in), true
	}
}

// Convert converts a versioned object to another version of its kind
// through the internal type (autoscaling/v1 ⇄ autoscaling/v2
// HorizontalPodAutoscalers, as kube-apiserver stores them).
func Convert(obj runtime.Object, to schema.GroupVersion) (runtime.Object, error) {
	in, gk, err := toInternal(obj)
	if err != nil {
		return nil, err
	}
	out, err := legacyscheme.Scheme.ConvertToVersion(in, to)
	if err != nil {
		return nil, fmt.Errorf("upstream: convert %s to %s: %w", gk, to, err)
	}
	return out, nil
}
