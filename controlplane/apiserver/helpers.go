package apiserver

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var schemaGR = schema.GroupResource{}

func metaSetList(list runtime.Object, objs []runtime.Object) error {
	if objs == nil {
		objs = []runtime.Object{}
	}
	return meta.SetList(list, objs)
}

func fieldRequired(path ...string) field.ErrorList {
	return field.ErrorList{field.Required(field.NewPath(path[0], path[1:]...), "")}
}

func fieldInvalid(v any, msg string, path ...string) field.ErrorList {
	return field.ErrorList{field.Invalid(field.NewPath(path[0], path[1:]...), v, msg)}
}
