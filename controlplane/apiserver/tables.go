package apiserver

import (
	"errors"
	"mime"
	"net/http"
	"strings"

	"github.com/waggle-io/waggle/controlplane/apiserver/printers"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// errNoTable: no table printer for the object; the client gets the object.
var errNoTable = errors.New("no table for this object")

// wantsTable reports whether the client asked for a Table (kubectl get:
// Accept: application/json;as=Table;v=v1;g=meta.k8s.io,application/json).
func wantsTable(r *http.Request) bool {
	acc := r.Header.Get("Accept")
	return strings.Contains(acc, "as=Table") && strings.Contains(acc, "g=meta.k8s.io")
}

// wantsPartial reports whether the client asked for metadata only
// (client-go's metadata client: Accept ...;as=PartialObjectMetadata[List]).
func wantsPartial(r *http.Request) bool {
	acc := r.Header.Get("Accept")
	return strings.Contains(acc, "as=PartialObjectMetadata") && strings.Contains(acc, "g=meta.k8s.io")
}

func partialOf(obj runtime.Object) *metav1.PartialObjectMetadata {
	p := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadata"}}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		p.ObjectMeta = metaOfUnstructured(u)
		return p
	}
	if a, ok := obj.(metav1.ObjectMetaAccessor); ok {
		if om, ok := a.GetObjectMeta().(*metav1.ObjectMeta); ok {
			p.ObjectMeta = *om.DeepCopy()
		}
	}
	return p
}

func includeObjectPolicy(r *http.Request) metav1.IncludeObjectPolicy {
	switch p := metav1.IncludeObjectPolicy(r.URL.Query().Get("includeObject")); p {
	case metav1.IncludeNone, metav1.IncludeObject, metav1.IncludeMetadata:
		return p
	}
	return metav1.IncludeMetadata
}

// tableFor renders obj (one object or a list) as a Table: errNoTable for
// objects without metadata (a review's answer, a Status) and for Table
// versions other than v1 and v1beta1, as kube-apiserver.
func tableFor(r *http.Request, obj runtime.Object, noHeaders bool) (*metav1.Table, error) {
	if !tableVersionServed(r) {
		return nil, errNoTable
	}
	if _, isStatus := obj.(*metav1.Status); isStatus {
		return nil, errNoTable
	}
	if !meta.IsListType(obj) {
		if _, err := meta.Accessor(obj); err != nil {
			return nil, errNoTable
		}
	}
	return printTable(obj, noHeaders, includeObjectPolicy(r))
}

// acceptParts splits an Accept header into media types and parameters.
func acceptParts(r *http.Request) [](map[string]string) {
	var out []map[string]string
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		params[""] = mt
		out = append(out, params)
	}
	return out
}

// tableVersionServed: the Table the client asked for is meta.k8s.io v1 or
// v1beta1.
func tableVersionServed(r *http.Request) bool {
	for _, p := range acceptParts(r) {
		if p["as"] == "Table" && p["g"] == "meta.k8s.io" && (p["v"] == "v1" || p["v"] == "v1beta1") {
			return true
		}
	}
	return false
}

// acceptsPlain: the Accept header also takes the object itself (kubectl
// sends "...;as=Table;...,application/json").
func acceptsPlain(r *http.Request) bool {
	for _, p := range acceptParts(r) {
		if p["as"] == "" && (p[""] == "application/json" || p[""] == "*/*" || p[""] == "application/*" || p[""] == protobufType || p[""] == "application/yaml") {
			return true
		}
	}
	return false
}

// errNotAcceptable is kube-apiserver's 406 for a representation it cannot
// produce.
func errNotAcceptable() error {
	return apierrors.NewGenericServerResponse(http.StatusNotAcceptable, "", schema.GroupResource{}, "",
		"only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf", 0, false)
}

func printTable(obj runtime.Object, noHeaders bool, include metav1.IncludeObjectPolicy) (*metav1.Table, error) {
	t, err := printers.Table(obj, printers.Options{NoHeaders: noHeaders, IncludeObject: include})
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	return t, nil
}
