package printers

import (
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/registry/upstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sprinters "k8s.io/kubernetes/pkg/printers"
	"k8s.io/kubernetes/pkg/printers/internalversion"
)

// upstreamGenerator holds kube-apiserver's own printers (the ones behind
// its TableConvertor, on internal types): types without a printer here
// get exactly kube-apiserver's columns and cells from it.
var upstreamGenerator = sync.OnceValue(func() *k8sprinters.HumanReadableGenerator {
	return k8sprinters.NewTableGenerator().With(internalversion.AddHandlers)
})

var upstreamPrinters sync.Map // reflect.Type -> *printer (nil: none)

// upstreamPrinter returns a printer of obj's type backed by the upstream
// generator, if it has one.
func upstreamPrinter(obj runtime.Object) (printer, bool) {
	t := reflect.TypeOf(obj)
	if p, ok := upstreamPrinters.Load(t); ok {
		if p == nil {
			return printer{}, false
		}
		return *p.(*printer), true
	}
	p := newUpstreamPrinter(t)
	if p == nil {
		upstreamPrinters.Store(t, nil)
		return printer{}, false
	}
	upstreamPrinters.Store(t, p)
	return *p, true
}

func newUpstreamPrinter(t reflect.Type) *printer {
	if t.Kind() != reflect.Pointer {
		return nil
	}
	zero, ok := reflect.New(t.Elem()).Interface().(runtime.Object)
	if !ok {
		return nil
	}
	in, err := upstream.ToInternal(zero)
	if err != nil {
		return nil
	}
	tbl, err := upstreamGenerator().GenerateTable(in, k8sprinters.GenerateOptions{Wide: true})
	if err != nil {
		return nil
	}
	return &printer{columns: tbl.ColumnDefinitions, row: upstreamRow}
}

// upstreamRow renders one object through the upstream generator.
func upstreamRow(obj runtime.Object, _ time.Time) ([]any, []metav1.TableRowCondition) {
	in, err := upstream.ToInternal(obj)
	if err != nil {
		return []any{fmt.Sprintf("<%v>", err)}, nil
	}
	tbl, err := upstreamGenerator().GenerateTable(in, k8sprinters.GenerateOptions{Wide: true, NoHeaders: true})
	if err != nil || len(tbl.Rows) == 0 {
		return []any{fmt.Sprintf("<%v>", err)}, nil
	}
	return tbl.Rows[0].Cells, tbl.Rows[0].Conditions
}
