package crd

import (
	"context"
	"fmt"
	"strings"

	apihelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"
)

// Version is one served (or stored) version of a CRD: everything needed to
// decode, default, validate, print and store its custom resources.
type Version struct {
	CRD         *apiextensionsv1.CustomResourceDefinition
	GVR         schema.GroupVersionResource
	Kind        string
	ListKind    string
	Singular    string
	Namespaced  bool
	ShortNames  []string
	Categories  []string
	Served      bool
	Storage     bool
	Status      bool // the status subresource is served
	Scale       *apiextensionsv1.CustomResourceSubresourceScale
	StorageGV   schema.GroupVersion
	Deprecated  bool
	Warning     string
	FieldLabels []string // metadata.name, metadata.namespace and the selectable fields

	structural   *structuralschema.Structural
	preserve     bool // spec.preserveUnknownFields (v1: always false)
	strategy     customStrategy
	status       statusStrategy
	table        rest.TableConvertor
	typeConv     managedfields.TypeConverter
	versionNames map[string]bool
	conv         runtime.ObjectConvertor // nil: conversion None
}

// customStrategy and statusStrategy are the upstream strategies' methods
// used here (their types are unexported upstream).
type customStrategy interface {
	PrepareForCreate(ctx context.Context, obj runtime.Object)
	PrepareForUpdate(ctx context.Context, obj, old runtime.Object)
	Validate(ctx context.Context, obj runtime.Object) field.ErrorList
	ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList
	WarningsOnCreate(ctx context.Context, obj runtime.Object) []string
	WarningsOnUpdate(ctx context.Context, obj, old runtime.Object) []string
	GetAttrs(obj runtime.Object) (labels.Set, fields.Set, error)
}

type statusStrategy interface {
	PrepareForUpdate(ctx context.Context, obj, old runtime.Object)
	ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList
}

// Versions builds the serving information of every served or stored
// version of an accepted CRD (status.acceptedNames set). A schema the
// server cannot serve is an error (validation refuses those CRDs first).
//
// conv converts objects between the CRD's versions: nil for conversion
// None (apiVersion rewritten), else the converter of upstream's
// conversion.CRConverterFactory (a conversion webhook).
func Versions(crd *apiextensionsv1.CustomResourceDefinition, conv runtime.ObjectConvertor) ([]*Version, error) {
	storage, err := apihelpers.GetCRDStorageVersion(crd)
	if err != nil {
		return nil, err
	}
	names := crd.Status.AcceptedNames
	if names.Plural == "" || names.Kind == "" {
		return nil, fmt.Errorf("CustomResourceDefinition %s has no accepted names yet", crd.Name)
	}
	listKind := names.ListKind
	if listKind == "" {
		listKind = names.Kind + "List"
	}
	singular := names.Singular
	if singular == "" {
		singular = strings.ToLower(names.Kind)
	}
	valid := map[string]bool{}
	for _, v := range crd.Spec.Versions {
		valid[v.Name] = true
	}
	var out []*Version
	for _, v := range crd.Spec.Versions {
		if !v.Served && !v.Storage {
			continue
		}
		ver := &Version{
			CRD:          crd,
			GVR:          schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: names.Plural},
			Kind:         names.Kind,
			ListKind:     listKind,
			Singular:     singular,
			Namespaced:   crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
			ShortNames:   names.ShortNames,
			Categories:   names.Categories,
			Served:       v.Served,
			Storage:      v.Storage,
			StorageGV:    schema.GroupVersion{Group: crd.Spec.Group, Version: storage},
			Deprecated:   v.Deprecated,
			preserve:     crd.Spec.PreserveUnknownFields,
			versionNames: valid,
			conv:         conv,
		}
		if v.DeprecationWarning != nil {
			ver.Warning = *v.DeprecationWarning
		} else if v.Deprecated {
			ver.Warning = fmt.Sprintf("%s/%s %s is deprecated", crd.Spec.Group, v.Name, names.Kind)
		}
		if err := ver.build(crd, v); err != nil {
			return nil, fmt.Errorf("CustomResourceDefinition %s version %s: %w", crd.Name, v.Name, err)
		}
		out = append(out, ver)
	}
	return out, nil
}

func (ver *Version) build(crd *apiextensionsv1.CustomResourceDefinition, v apiextensionsv1.CustomResourceDefinitionVersion) error {
	val, err := apihelpers.GetSchemaForVersion(crd, v.Name)
	if err != nil {
		return err
	}
	var props *apiextensions.JSONSchemaProps
	if val != nil {
		in := &apiextensions.CustomResourceValidation{}
		if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(val, in, nil); err != nil {
			return fmt.Errorf("convert schema: %w", err)
		}
		props = in.OpenAPIV3Schema
		s, err := structuralschema.NewStructural(props)
		if err != nil && !crd.Spec.PreserveUnknownFields {
			return fmt.Errorf("the server could not properly serve the CR schema: %w", err)
		}
		if s != nil && !crd.Spec.PreserveUnknownFields {
			s = s.DeepCopy()
			if err := structuraldefaulting.PruneDefaults(s); err != nil {
				return fmt.Errorf("prune defaults: %w", err)
			}
		}
		ver.structural = s
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(props)
	if err != nil {
		return err
	}
	subs, err := apihelpers.GetSubresourcesForVersion(crd, v.Name)
	if err != nil {
		return err
	}
	var statusSpec *apiextensions.CustomResourceSubresourceStatus
	var statusValidator apiservervalidation.SchemaValidator
	var scaleSpec *apiextensions.CustomResourceSubresourceScale
	if subs != nil && subs.Status != nil {
		ver.Status = true
		statusSpec = &apiextensions.CustomResourceSubresourceStatus{}
		if props != nil && props.Properties != nil {
			if ss, ok := props.Properties["status"]; ok {
				if statusValidator, _, err = apiservervalidation.NewSchemaValidator(&ss); err != nil {
					return err
				}
			}
		}
	}
	if subs != nil && subs.Scale != nil {
		ver.Scale = subs.Scale
		scaleSpec = &apiextensions.CustomResourceSubresourceScale{}
		if err := apiextensionsv1.Convert_v1_CustomResourceSubresourceScale_To_apiextensions_CustomResourceSubresourceScale(subs.Scale, scaleSpec, nil); err != nil {
			return err
		}
	}
	kind := ver.GVR.GroupVersion().WithKind(ver.Kind)
	st := customresource.NewStrategy(Scheme, ver.Namespaced, kind, validator, statusValidator, ver.structural, statusSpec, scaleSpec, v.SelectableFields)
	ver.strategy = st
	ver.status = customresource.NewStatusStrategy(st)
	ver.FieldLabels = []string{"metadata.name"}
	if ver.Namespaced {
		ver.FieldLabels = append(ver.FieldLabels, "metadata.namespace")
	}
	for _, sf := range v.SelectableFields {
		ver.FieldLabels = append(ver.FieldLabels, strings.TrimPrefix(sf.JSONPath, "."))
	}

	cols := v.AdditionalPrinterColumns
	if len(cols) == 0 {
		cols = []apiextensionsv1.CustomResourceColumnDefinition{{Name: "Age", Type: "date",
			Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"], JSONPath: ".metadata.creationTimestamp"}}
	}
	if ver.table, err = tableconvertor.New(cols); err != nil {
		ver.table = nil // upstream falls back to the default printing
	}

	ver.typeConv = managedfields.NewDeducedTypeConverter()
	if doc, err := builder.BuildOpenAPIV3(crd, v.Name, builder.Options{}); err == nil && doc.Components != nil {
		if tc, err := managedfields.NewTypeConverter(doc.Components.Schemas, crd.Spec.PreserveUnknownFields); err == nil {
			ver.typeConv = tc
		}
	}
	return nil
}

// New returns an empty object of the version's kind.
func (ver *Version) New() runtime.Object {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(ver.GVR.GroupVersion().WithKind(ver.Kind))
	return u
}

// NewList returns an empty list of the version's kind.
func (ver *Version) NewList() runtime.Object {
	l := &unstructured.UnstructuredList{Object: map[string]any{}}
	l.SetGroupVersionKind(ver.GVR.GroupVersion().WithKind(ver.ListKind))
	return l
}

// TypeConverter is the structured-merge-diff schema for server-side apply:
// from the CRD's OpenAPI v3 (list types and map keys included), or deduced
// from the objects when the schema cannot be turned into one.
func (ver *Version) TypeConverter() managedfields.TypeConverter { return ver.typeConv }

// Structural is the version's structural schema (nil without one).
func (ver *Version) Structural() *structuralschema.Structural { return ver.structural }

// Coerce is what upstream's decoder does to a written custom resource:
// unknown fields pruned (unless x-kubernetes-preserve-unknown-fields keeps
// them), nulls the schema does not allow dropped, metadata (embedded
// resources' too) coerced. It returns the paths of the pruned fields, for
// fieldValidation Strict (error) and Warn (warnings). dropInvalidMeta is set
// for reads from storage.
func (ver *Version) Coerce(u *unstructured.Unstructured, dropInvalidMeta bool) ([]string, error) {
	kind, foundKind, _ := unstructured.NestedString(u.Object, "kind")
	apiVersion, foundAPIVersion, _ := unstructured.NestedString(u.Object, "apiVersion")
	om, foundMeta, unknown, err := schemaobjectmeta.GetObjectMetaWithOptions(u.Object, schemaobjectmeta.ObjectMetaOptions{
		DropMalformedFields: dropInvalidMeta, ReturnUnknownFieldPaths: !dropInvalidMeta,
	})
	if err != nil {
		return nil, err
	}
	if ver.structural != nil {
		if !ver.preserve {
			opts := structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: !dropInvalidMeta}
			unknown = append(unknown, structuralpruning.PruneWithOptions(u.Object, ver.structural, true, opts)...)
			structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, ver.structural)
		}
		ferr, paths := schemaobjectmeta.CoerceWithOptions(nil, u.Object, ver.structural, false, schemaobjectmeta.CoerceOptions{
			DropInvalidFields: dropInvalidMeta, ReturnUnknownFieldPaths: !dropInvalidMeta,
		})
		if ferr != nil {
			return nil, field.ErrorList{ferr}.ToAggregate()
		}
		unknown = append(unknown, paths...)
		if dropInvalidMeta && om != nil && om.Generation == 0 {
			om.Generation = 1
		}
	}
	if foundKind {
		u.SetKind(kind)
	}
	if foundAPIVersion {
		u.SetAPIVersion(apiVersion)
	}
	if foundMeta {
		if err := schemaobjectmeta.SetObjectMeta(u.Object, om); err != nil {
			return nil, err
		}
	}
	return unknown, nil
}

// Default applies the schema's defaults (on writes and on every read from
// storage, as upstream).
func (ver *Version) Default(u *unstructured.Unstructured) {
	if ver.structural != nil {
		structuraldefaulting.Default(u.Object, ver.structural)
	}
}

// Convert rewrites u into this version. With conversion None only
// apiVersion changes, as upstream's nop converter; with a conversion
// webhook the webhook converts (upstream's converter: ConversionReview,
// its checks of the answer). An apiVersion the CRD does not have is an
// error.
func (ver *Version) Convert(u *unstructured.Unstructured) error {
	return ver.ConvertTo(u, ver.GVR.GroupVersion())
}

// ConvertTo converts u into the version to of the same CRD.
func (ver *Version) ConvertTo(u *unstructured.Unstructured, to schema.GroupVersion) error {
	gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
	if err != nil {
		return err
	}
	if gv.Group != ver.GVR.Group || !ver.versionNames[gv.Version] {
		return fmt.Errorf("request to convert CR from an invalid group/version: %s", gv)
	}
	if gv == to {
		return nil
	}
	if ver.conv == nil {
		u.SetAPIVersion(to.String())
		return nil
	}
	out, err := ver.conv.ConvertToVersion(u, to)
	if err != nil {
		return err
	}
	cu, ok := out.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("conversion returned %T", out)
	}
	*u = *cu
	return nil
}

// Converter returns the version's object converter for the field manager.
func (ver *Version) Converter() Converter { return Converter{Group: ver.GVR.Group, Conv: ver.conv} }

// PrepareForCreate: status dropped when the status subresource is on,
// generation 1.
func (ver *Version) PrepareForCreate(ctx context.Context, u *unstructured.Unstructured) {
	ver.strategy.PrepareForCreate(ctx, u)
}

// PrepareForUpdate: writes of the main resource keep status (with the
// status subresource) and bump generation on any change outside metadata;
// status writes change status only.
func (ver *Version) PrepareForUpdate(ctx context.Context, u, old *unstructured.Unstructured, sub string) {
	if sub == "status" {
		ver.status.PrepareForUpdate(ctx, u, old)
		return
	}
	ver.strategy.PrepareForUpdate(ctx, u, old)
}

// Validate is upstream's custom resource validation: metadata, the
// OpenAPI schema (kube-openapi's validator), embedded resources, list-type
// invariants, scale replicas, then x-kubernetes-validations CEL rules with
// the upstream per-call and per-request cost limits.
func (ver *Version) Validate(ctx context.Context, u *unstructured.Unstructured) field.ErrorList {
	return ver.strategy.Validate(ctx, u)
}

// ValidateUpdate validates an update, with transition rules (oldSelf) and
// ratcheting as upstream; status writes validate the status schema.
func (ver *Version) ValidateUpdate(ctx context.Context, u, old *unstructured.Unstructured, sub string) field.ErrorList {
	if sub == "status" {
		return ver.status.ValidateUpdate(ctx, u, old)
	}
	return ver.strategy.ValidateUpdate(ctx, u, old)
}

// Warnings of a write (finalizer names that are not qualified).
func (ver *Version) Warnings(ctx context.Context, u, old *unstructured.Unstructured) []string {
	if old == nil {
		return ver.strategy.WarningsOnCreate(ctx, u)
	}
	return ver.strategy.WarningsOnUpdate(ctx, u, old)
}

// Fields are the field-selector values of an object: metadata.name,
// metadata.namespace and the version's selectableFields.
func (ver *Version) Fields(u *unstructured.Unstructured) fields.Set {
	_, fs, err := ver.strategy.GetAttrs(u)
	if err != nil || fs == nil {
		fs = fields.Set{"metadata.name": u.GetName()}
		if ver.Namespaced {
			fs["metadata.namespace"] = u.GetNamespace()
		}
	}
	return fs
}

// Table renders objects (one or an UnstructuredList) with the version's
// additionalPrinterColumns (Name first, Age by default), as kubectl get
// shows them.
func (ver *Version) Table(ctx context.Context, obj runtime.Object, opts *metav1.TableOptions) (*metav1.Table, error) {
	if ver.table == nil {
		return nil, fmt.Errorf("no printer columns for %s", ver.GVR)
	}
	return ver.table.ConvertToTable(ctx, obj, opts)
}

// Converter is the runtime.ObjectConvertor of a CRD's objects with
// conversion None (upstream's nop converter): converting to another
// version of the group rewrites apiVersion, nothing else. The field
// manager converts through it.
type Converter struct {
	Group string
	// Conv, when set, converts (a conversion webhook's converter).
	Conv runtime.ObjectConvertor
}

// Convert is not used for custom resources.
func (c Converter) Convert(in, out, context any) error {
	return fmt.Errorf("unstructured objects convert only with ConvertToVersion")
}

// ConvertToVersion rewrites in's apiVersion to the target's.
func (c Converter) ConvertToVersion(in runtime.Object, target runtime.GroupVersioner) (runtime.Object, error) {
	if c.Conv != nil {
		return c.Conv.ConvertToVersion(in.DeepCopyObject(), target)
	}
	from := in.GetObjectKind().GroupVersionKind()
	to, ok := target.KindForGroupVersionKinds([]schema.GroupVersionKind{from})
	if !ok {
		return nil, fmt.Errorf("%v is unstructured and is not suitable for converting to %q", from, target)
	}
	out := in.DeepCopyObject()
	out.GetObjectKind().SetGroupVersionKind(to)
	return out, nil
}

// ConvertFieldLabel keeps field labels as they are.
func (c Converter) ConvertFieldLabel(gvk schema.GroupVersionKind, label, value string) (string, string, error) {
	return label, value, nil
}

// Creater makes empty unstructured objects of any kind.
type Creater struct{}

// New returns an empty object of kind.
func (Creater) New(kind schema.GroupVersionKind) (runtime.Object, error) {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(kind)
	return u, nil
}
