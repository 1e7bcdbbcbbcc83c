// Package printers turns API objects into metav1.Table, the server-side
// rendering behind `kubectl get` (requests with Accept: ...;as=Table). Each
// catalog resource has the columns kubectl users know from kube-apiserver
// (pods: NAME READY STATUS RESTARTS AGE, wide: IP NODE ...), with pod STATUS
// computed as kube-apiserver does; wide columns carry priority 1 and are
// always present, kubectl hides them without -o wide. Types without a
// printer here are rendered by kube-apiserver's own printers
// (k8s.io/kubernetes/pkg/printers/internalversion, on the internal type);
// types neither knows get Name and Created At.
//
// It renders only: it neither fetches objects nor writes HTTP responses.
package printers

import (
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
)

// Options of one rendering.
type Options struct {
	// NoHeaders leaves out the column definitions (?includeObject ...
	// &noHeaders=true, kubectl --no-headers with server-side printing).
	NoHeaders bool
	// IncludeObject says what each row carries: None, Metadata (as
	// PartialObjectMetadata; the default when empty, and kubectl's) or
	// Object.
	IncludeObject metav1.IncludeObjectPolicy
	// Now is the time ages are computed from; zero means time.Now().
	Now time.Time
}

type rowFunc func(obj runtime.Object, now time.Time) ([]any, []metav1.TableRowCondition)

type printer struct {
	columns []metav1.TableColumnDefinition
	row     rowFunc
}

var registry = map[reflect.Type]printer{}

// register adds the printer of T.
func register[T runtime.Object](columns []metav1.TableColumnDefinition, row func(T, time.Time) []any) {
	registerWithConditions(columns, func(o T, now time.Time) ([]any, []metav1.TableRowCondition) { return row(o, now), nil })
}

func registerWithConditions[T runtime.Object](columns []metav1.TableColumnDefinition, row func(T, time.Time) ([]any, []metav1.TableRowCondition)) {
	var zero T
	registry[reflect.TypeOf(zero)] = printer{
		columns: columns,
		row:     func(obj runtime.Object, now time.Time) ([]any, []metav1.TableRowCondition) { return row(obj.(T), now) },
	}
}

var defaultPrinter = printer{
	columns: []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name", Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]},
		{Name: "Created At", Type: "date", Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]},
	},
	row: func(obj runtime.Object, _ time.Time) ([]any, []metav1.TableRowCondition) {
		m, err := meta.Accessor(obj)
		if err != nil {
			return []any{"<unknown>", "<unknown>"}, nil
		}
		return []any{m.GetName(), m.GetCreationTimestamp().UTC().Format(time.RFC3339)}, nil
	},
}

// Columns returns the column definitions used for objects of obj's type.
func Columns(obj runtime.Object) []metav1.TableColumnDefinition {
	return printerFor(obj).columns
}

// Has reports whether obj's type (or, for a list, its items' type) has
// columns of its own, not only the generic Name/Created At ones. A virtual
// resource is served as a Table only when it has: kube-apiserver converts
// componentstatuses but answers 406 for a review's Table.
func Has(obj runtime.Object) bool {
	if meta.IsListType(obj) {
		obj = elemOfList(obj)
	}
	_, ok := ownPrinter(obj)
	return ok
}

// ownPrinter is obj's type's printer: Waggle's, else upstream's.
func ownPrinter(obj runtime.Object) (printer, bool) {
	if p, ok := registry[reflect.TypeOf(obj)]; ok {
		return p, true
	}
	return upstreamPrinter(obj)
}

func printerFor(obj runtime.Object) printer {
	if p, ok := ownPrinter(obj); ok {
		return p
	}
	return defaultPrinter
}

// Table renders obj, one object or a list, as a Table.
func Table(obj runtime.Object, opts Options) (*metav1.Table, error) {
	if obj == nil {
		return nil, fmt.Errorf("printers: nil object")
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	switch opts.IncludeObject {
	case "", metav1.IncludeNone, metav1.IncludeMetadata, metav1.IncludeObject:
	default:
		return nil, fmt.Errorf("printers: includeObject %q: want None, Metadata or Object", opts.IncludeObject)
	}
	t := &metav1.Table{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "Table"}, Rows: []metav1.TableRow{}}

	var items []runtime.Object
	if meta.IsListType(obj) {
		var err error
		if items, err = meta.ExtractList(obj); err != nil {
			return nil, fmt.Errorf("printers: extract list %T: %w", obj, err)
		}
		if la, err := meta.ListAccessor(obj); err == nil {
			t.ResourceVersion = la.GetResourceVersion()
			t.Continue = la.GetContinue()
			t.RemainingItemCount = la.GetRemainingItemCount()
		}
	} else {
		items = []runtime.Object{obj}
		if m, err := meta.Accessor(obj); err == nil {
			t.ResourceVersion = m.GetResourceVersion()
		}
	}

	var p printer
	if len(items) > 0 {
		p = printerFor(items[0])
	} else {
		p = printerFor(elemOfList(obj))
	}
	if !opts.NoHeaders {
		t.ColumnDefinitions = p.columns
	}
	for _, item := range items {
		ip := printerFor(item)
		cells, conds := ip.row(item, now)
		row := metav1.TableRow{Cells: cells, Conditions: conds}
		raw, err := rowObject(item, opts.IncludeObject)
		if err != nil {
			return nil, err
		}
		row.Object = raw
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

// elemOfList returns an empty item of a (typed) list, so that an empty list
// still gets its resource's columns.
func elemOfList(list runtime.Object) runtime.Object {
	v := reflect.ValueOf(list)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		if f := v.FieldByName("Items"); f.IsValid() && f.Kind() == reflect.Slice {
			et := f.Type().Elem()
			if et.Kind() == reflect.Struct {
				if o, ok := reflect.New(et).Interface().(runtime.Object); ok {
					return o
				}
			}
		}
	}
	return list
}

// rowObject encodes what a row carries under policy.
func rowObject(obj runtime.Object, policy metav1.IncludeObjectPolicy) (runtime.RawExtension, error) {
	switch policy {
	case metav1.IncludeNone:
		return runtime.RawExtension{}, nil
	case metav1.IncludeObject:
		c := obj.DeepCopyObject()
		setKind(c)
		raw, err := json.Marshal(c)
		if err != nil {
			return runtime.RawExtension{}, fmt.Errorf("printers: encode %T: %w", obj, err)
		}
		return runtime.RawExtension{Raw: raw, Object: c}, nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return runtime.RawExtension{}, fmt.Errorf("printers: %T has no metadata: %w", obj, err)
	}
	pom := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadata"}}
	if om, ok := m.(*metav1.ObjectMeta); ok {
		pom.ObjectMeta = *om.DeepCopy()
	} else {
		pom.ObjectMeta = metav1.ObjectMeta{
			Name: m.GetName(), Namespace: m.GetNamespace(), UID: m.GetUID(), ResourceVersion: m.GetResourceVersion(),
			Generation: m.GetGeneration(), CreationTimestamp: m.GetCreationTimestamp(), DeletionTimestamp: m.GetDeletionTimestamp(),
			Labels: m.GetLabels(), Annotations: m.GetAnnotations(), OwnerReferences: m.GetOwnerReferences(), Finalizers: m.GetFinalizers(),
			GenerateName: m.GetGenerateName(), ManagedFields: m.GetManagedFields(), DeletionGracePeriodSeconds: m.GetDeletionGracePeriodSeconds(),
		}
	}
	raw, err := json.Marshal(pom)
	if err != nil {
		return runtime.RawExtension{}, fmt.Errorf("printers: encode metadata: %w", err)
	}
	return runtime.RawExtension{Raw: raw, Object: pom}, nil
}

// setKind fills apiVersion and kind from the catalog's scheme when the
// object lacks them.
func setKind(obj runtime.Object) {
	if !obj.GetObjectKind().GroupVersionKind().Empty() {
		return
	}
	gvks, _, err := catalog.Scheme.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return
	}
	obj.GetObjectKind().SetGroupVersionKind(gvks[0])
}

// age is kubectl's AGE: "<unknown>" for a zero time.
func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func microAge(t metav1.MicroTime, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}
