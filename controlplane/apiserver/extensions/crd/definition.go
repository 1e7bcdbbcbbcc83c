// Package crd is the CustomResourceDefinition half of Waggle's extension
// APIs: what kube-apiserver's apiextensions-apiserver does to a CRD and to
// the custom resources it defines, done with that server's own packages
// (k8s.io/apiextensions-apiserver): the CRD's defaulting, validation
// (structural schemas, CEL cost limits) and strategy; per served version a
// structural schema, pruning, defaulting, metadata coercion, OpenAPI schema
// validation through k8s.io/kube-openapi's validator, x-kubernetes-validations
// CEL rules, list-type invariants, embedded resources, printer columns,
// conversion (None, rewriting apiVersion) and the OpenAPI v2/v3 documents.
//
// It holds no storage and serves no HTTP: package apiserver stores CRDs and
// custom resources in its one generic registry and calls in here for what
// differs. Objects of custom resources are *unstructured.Unstructured.
package crd

import (
	"context"
	"fmt"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdregistry "k8s.io/apiextensions-apiserver/pkg/registry/customresourcedefinition"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Scheme knows apiextensions.k8s.io's internal, v1 and v1beta1 types with
// their conversions and defaults, as apiextensions-apiserver installs them.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	install.Install(s)
	metav1.AddToGroupVersion(s, metav1.SchemeGroupVersion)
	return s
}()

// CleanupFinalizer is the finalizer a deleted CRD carries until every
// instance is gone (customresourcecleanup.apiextensions.k8s.io).
const CleanupFinalizer = apiextensionsv1.CustomResourceCleanupFinalizer

var (
	defStrategy       = crdregistry.NewStrategy(Scheme)
	defStatusStrategy = crdregistry.NewStatusStrategy(Scheme)
)

func toInternal(crd *apiextensionsv1.CustomResourceDefinition) (*apiextensions.CustomResourceDefinition, error) {
	out := &apiextensions.CustomResourceDefinition{}
	if err := Scheme.Convert(crd, out, nil); err != nil {
		return nil, fmt.Errorf("convert CustomResourceDefinition %s to internal: %w", crd.Name, err)
	}
	return out, nil
}

func fromInternal(in *apiextensions.CustomResourceDefinition, into *apiextensionsv1.CustomResourceDefinition) error {
	out := &apiextensionsv1.CustomResourceDefinition{}
	if err := Scheme.Convert(in, out, nil); err != nil {
		return fmt.Errorf("convert CustomResourceDefinition %s from internal: %w", in.Name, err)
	}
	out.TypeMeta = into.TypeMeta
	*into = *out
	return nil
}

// Default applies apiextensions.k8s.io/v1's defaults (scope-independent
// fields, conversion strategy None, listKind and singular names,
// x-kubernetes-list-type map keys' defaults...), as the decoder does in
// kube-apiserver.
func Default(crd *apiextensionsv1.CustomResourceDefinition) { Scheme.Default(crd) }

// internalError turns a conversion failure into a field error (it means a
// bug, not bad input: every v1 object converts).
func internalError(err error) field.ErrorList {
	return field.ErrorList{field.InternalError(field.NewPath(""), err)}
}

// PrepareForCreate is the upstream strategy's: status cleared, generation
// 1, the storage version recorded in status.storedVersions.
func PrepareForCreate(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) error {
	in, err := toInternal(crd)
	if err != nil {
		return err
	}
	defStrategy.PrepareForCreate(ctx, in)
	return fromInternal(in, crd)
}

// PrepareForUpdate keeps status, bumps generation on spec changes and
// records a new storage version, as upstream; status writes
// (sub "status") keep the spec and the metadata.
func PrepareForUpdate(ctx context.Context, crd, old *apiextensionsv1.CustomResourceDefinition, sub string) error {
	in, err := toInternal(crd)
	if err != nil {
		return err
	}
	oin, err := toInternal(old)
	if err != nil {
		return err
	}
	if sub == "status" {
		defStatusStrategy.PrepareForUpdate(ctx, in, oin)
	} else {
		defStrategy.PrepareForUpdate(ctx, in, oin)
	}
	return fromInternal(in, crd)
}

// Validate is apiextensions-apiserver's ValidateCustomResourceDefinition:
// names, versions, the structural schema rules (a non-structural schema is
// refused with upstream's messages), defaults against their schema,
// x-kubernetes-validations compiled within the CEL cost limits, printer
// columns, conversion.
func Validate(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) field.ErrorList {
	in, err := toInternal(crd)
	if err != nil {
		return internalError(err)
	}
	return defStrategy.Validate(ctx, in)
}

// ValidateUpdate validates an update (spec, or status for sub "status").
func ValidateUpdate(ctx context.Context, crd, old *apiextensionsv1.CustomResourceDefinition, sub string) field.ErrorList {
	in, err := toInternal(crd)
	if err != nil {
		return internalError(err)
	}
	oin, err := toInternal(old)
	if err != nil {
		return internalError(err)
	}
	if sub == "status" {
		return defStatusStrategy.ValidateUpdate(ctx, in, oin)
	}
	return defStrategy.ValidateUpdate(ctx, in, oin)
}

// Warnings are upstream's create/update warnings (unrecognized formats,
// list-type set of non-scalars); old is nil for a create.
func Warnings(ctx context.Context, crd, old *apiextensionsv1.CustomResourceDefinition) []string {
	in, err := toInternal(crd)
	if err != nil {
		return nil
	}
	if old == nil {
		return defStrategy.WarningsOnCreate(ctx, in)
	}
	oin, err := toInternal(old)
	if err != nil {
		return nil
	}
	return defStrategy.WarningsOnUpdate(ctx, in, oin)
}

// MarkForDeletion is what upstream's CRD REST Delete does to a CRD being
// deleted: it gets the cleanup finalizer and a Terminating condition, so
// its instances are deleted before it goes. It reports whether it changed
// anything.
func MarkForDeletion(crd *apiextensionsv1.CustomResourceDefinition) bool {
	if crd.DeletionTimestamp != nil {
		return false
	}
	has := false
	for _, f := range crd.Finalizers {
		if f == CleanupFinalizer {
			has = true
		}
	}
	if !has {
		crd.Finalizers = append(crd.Finalizers, CleanupFinalizer)
	}
	SetCondition(crd, apiextensionsv1.CustomResourceDefinitionCondition{
		Type: apiextensionsv1.Terminating, Status: apiextensionsv1.ConditionTrue,
		Reason: "InstanceDeletionPending", Message: "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
	})
	return true
}
