package apiserver

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/extensions/crd"
	"github.com/waggle-io/waggle/controlplane/apiserver/registry/upstream"
	apiextensionsac "k8s.io/apiextensions-apiserver/pkg/client/applyconfiguration"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/client-go/applyconfigurations"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorapply "k8s.io/kube-aggregator/pkg/client/applyconfiguration"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// Server-side apply and managedFields go through k8s.io/apimachinery's
// managedfields.FieldManager, as in kube-apiserver: every create, update and
// patch records its manager's fields (UpdateNoErrors), and apply patches
// are merged by structured-merge-diff (Apply), which also reports
// conflicts. The merge needs each kind's schema: a TypeConverter.

// TypeConverterFunc returns the structured-merge-diff schema of a resource's
// kind. Built-in kinds use the schema client-go's applyconfigurations ship;
// custom resources plug in one built from their CRD's structural schema
// (managedfields.NewTypeConverter).
type TypeConverterFunc func(res *catalog.Resource) (managedfields.TypeConverter, error)

// builtinTypeConverter is the schema of every k8s.io/api type, parsed once
// on first use.
var builtinTypeConverter = sync.OnceValue(func() managedfields.TypeConverter {
	return applyconfigurations.NewTypeConverter(catalog.Scheme)
})

// extensionsTypeConverter is apiextensions.k8s.io's (the schema its
// generated apply configurations ship).
var extensionsTypeConverter = sync.OnceValue(func() managedfields.TypeConverter {
	return apiextensionsac.NewTypeConverter(catalog.Scheme)
})

// aggregatorTypeConverter is kube-aggregator's schema (APIService).
var aggregatorTypeConverter = sync.OnceValue(func() managedfields.TypeConverter {
	return aggregatorapply.NewTypeConverter(catalog.Scheme)
})

// BuiltinTypeConverter is the TypeConverterFunc of the built-in kinds.
func BuiltinTypeConverter(res *catalog.Resource) (managedfields.TypeConverter, error) {
	if res != nil && res.Group == "apiextensions.k8s.io" {
		return extensionsTypeConverter(), nil
	}
	if res != nil && res.Group == apiregistrationv1.GroupName {
		return aggregatorTypeConverter(), nil
	}
	return builtinTypeConverter(), nil
}

// defaulter adapts a strategy's defaults to runtime.ObjectDefaulter: the
// field manager defaults an applied object after merging it, as
// kube-apiserver's decoder does for other writes.
type defaulter func(runtime.Object)

func (d defaulter) Default(obj runtime.Object) {
	if d != nil {
		d(obj)
	}
}

// fieldManagers builds the field managers of one resource: the resource
// itself ("") and each subresource a client writes the parent object
// through (status, scale, finalize). Each resets the fields its endpoint
// does not write, as upstream's strategies' GetResetFields do, so a manager
// never owns a field its write could not set.
func fieldManagers(res *catalog.Resource, st *strategy, tc managedfields.TypeConverter, cr *crd.Version) (map[string]*managedfields.FieldManager, error) {
	gv := res.GroupVersion()
	apiVersion := fieldpath.APIVersion(gv.String())
	reset := func(paths ...fieldpath.Path) map[fieldpath.APIVersion]fieldpath.Filter {
		if len(paths) == 0 {
			return nil
		}
		return map[fieldpath.APIVersion]fieldpath.Filter{apiVersion: fieldpath.NewExcludeSetFilter(fieldpath.NewSet(paths...))}
	}
	status := fieldpath.MakePathOrDie("status")
	spec := fieldpath.MakePathOrDie("spec")
	subs := map[string]map[fieldpath.APIVersion]fieldpath.Filter{}
	if st.hasStatus {
		subs[""] = reset(status)
	} else {
		subs[""] = nil
	}
	for _, sub := range res.Subs {
		switch sub.Name {
		case "status":
			paths := []fieldpath.Path{spec}
			for _, f := range st.statusMetaResets {
				paths = append(paths, fieldpath.MakePathOrDie("metadata", f))
			}
			subs["status"] = reset(paths...)
		case "approval":
			subs["approval"] = reset(spec)
		case "scale", "ephemeralcontainers", "resize":
			subs[sub.Name] = reset(status)
		case "finalize":
			subs["finalize"] = reset(status)
		}
	}
	out := make(map[string]*managedfields.FieldManager, len(subs))
	for sub, rf := range subs {
		var fm *managedfields.FieldManager
		var err error
		if res.CustomResourceDefinition != "" {
			// Custom resources: unstructured objects, converted between
			// versions by rewriting apiVersion (conversion None).
			conv := crd.Converter{Group: res.Group}
			if cr != nil {
				conv = cr.Converter()
			}
			fm, err = managedfields.NewDefaultCRDFieldManager(tc, conv, defaulter(st.defaults), crd.Creater{},
				res.GroupVersionKind(), gv, sub, rf)
		} else {
			fm, err = managedfields.NewDefaultFieldManager(tc, versionConvertor{catalog.Scheme}, defaulter(st.defaults), catalog.Scheme,
				res.GroupVersionKind(), gv, sub, rf)
		}
		if err != nil {
			return nil, fmt.Errorf("field manager of %s %q: %w", res.Resource, sub, err)
		}
		out[sub] = fm
	}
	return out, nil
}

// versionConvertor is catalog.Scheme, which holds only the versioned types,
// plus what it cannot do alone: converting between two versions of a kind
// whose conversion goes through kube-apiserver's internal type
// (autoscaling/v1 ⇄ v2 HorizontalPodAutoscalers). The field manager needs
// it to carry an object's managedFields entries of another version (an HPA
// made by `kubectl autoscale` through v1, whose status the controller
// writes through v2); it converts to a hub version first, and for a
// versioned-only scheme an object is its own hub.
type versionConvertor struct{ *runtime.Scheme }

func (c versionConvertor) ConvertToVersion(in runtime.Object, target runtime.GroupVersioner) (runtime.Object, error) {
	if c.inVersion(in, target) {
		return in, nil
	}
	out, err := c.Scheme.ConvertToVersion(in, target)
	if err == nil {
		return out, nil
	}
	gv, ok := target.(schema.GroupVersion)
	if !ok {
		return nil, err
	}
	typed := in
	if u, ok := in.(runtime.Unstructured); ok {
		t, nerr := c.Scheme.New(in.GetObjectKind().GroupVersionKind())
		if nerr != nil {
			return nil, err
		}
		if cerr := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), t); cerr != nil {
			return nil, fmt.Errorf("%w (and from unstructured: %w)", err, cerr)
		}
		t.GetObjectKind().SetGroupVersionKind(in.GetObjectKind().GroupVersionKind())
		typed = t
	}
	if gv.Version == runtime.APIVersionInternal {
		return typed, nil
	}
	conv, cerr := upstream.Convert(typed, gv)
	if cerr != nil {
		return nil, fmt.Errorf("%w (and through the internal type: %w)", err, cerr)
	}
	return conv, nil
}

// inVersion reports whether in is a typed object that already is, with its
// kind set, what the scheme would convert it to for target. The scheme's
// conversion would return a deep copy of it with the same kind set; the
// field manager only reads the objects it converts (it converts the live
// and the new object of every write to its version, the kind's own, to read
// their fields), so it gets in itself, unchanged, and a write no longer
// deep-copies both objects for nothing.
func (c versionConvertor) inVersion(in runtime.Object, target runtime.GroupVersioner) bool {
	if _, ok := in.(runtime.Unstructured); ok {
		return false
	}
	gvk := in.GetObjectKind().GroupVersionKind()
	if gvk.Empty() {
		return false
	}
	kinds, _, err := c.Scheme.ObjectKinds(in)
	if err != nil {
		return false
	}
	want, ok := target.KindForGroupVersionKinds(kinds)
	return ok && want == gvk && slices.Contains(kinds, gvk)
}

// fieldManagerName is the manager a write is recorded under: the
// fieldManager parameter, or else the client's User-Agent up to its first
// "/" (kubectl-client-side-apply, kube-controller-manager, ...), as
// kube-apiserver names it.
func fieldManagerName(param, userAgent string) string {
	if param != "" {
		return param
	}
	m, _, _ := strings.Cut(userAgent, "/")
	var buf bytes.Buffer
	for _, r := range m {
		if !unicode.IsPrint(r) {
			continue
		}
		if buf.Len()+utf8.RuneLen(r) > metav1validation.FieldManagerMaxLength {
			break
		}
		buf.WriteRune(r)
	}
	return buf.String()
}
