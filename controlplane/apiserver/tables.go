package apiserver

import (
	"errors"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/waggle-io/waggle/controlplane/apiserver/openapi"
	"github.com/waggle-io/waggle/controlplane/apiserver/printers"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// tableFor renders obj (one object or a list) as a Table.
func tableFor(r *http.Request, obj runtime.Object, noHeaders bool) (*metav1.Table, error) {
	return printTable(obj, noHeaders, includeObjectPolicy(r))
}

func printTable(obj runtime.Object, noHeaders bool, include metav1.IncludeObjectPolicy) (*metav1.Table, error) {
	t, err := printers.Table(obj, printers.Options{NoHeaders: noHeaders, IncludeObject: include})
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	return t, nil
}

func mountOpenAPI(r chi.Router) {
	h := openapi.Handler()
	r.Handle("/openapi/v2", h)
	r.Handle("/openapi/v3", h)
	r.Handle("/openapi/v3/*", h)
}
