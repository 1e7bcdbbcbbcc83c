package openapi

import (
	"reflect"
	"strings"
)

// schema is one JSON schema object; JSON encoding sorts its keys, so the
// documents (and their hashes) are stable.
type jsonSchema = map[string]any

// openAPITyper is implemented by apimachinery types whose JSON form is not
// their Go shape (metav1.Time, resource.Quantity, intstr.IntOrString, ...).
type openAPITyper interface {
	OpenAPISchemaType() []string
	OpenAPISchemaFormat() string
}

type openAPIV3OneOf interface {
	OpenAPIV3OneOfTypes() []string
}

type swaggerDoc interface {
	SwaggerDoc() map[string]string
}

// generator builds the definitions reachable from a set of Go types, for
// OpenAPI v2 (#/definitions/) or v3 (#/components/schemas/).
type generator struct {
	v3   bool
	defs map[string]jsonSchema
	// gvks are the x-kubernetes-group-version-kind of top-level kinds,
	// keyed by definition name.
	gvks map[string][]gvk
}

type gvk struct{ Group, Version, Kind string }

func (k gvk) ext() map[string]any {
	return map[string]any{"group": k.Group, "version": k.Version, "kind": k.Kind}
}

func newGenerator(v3 bool, gvks map[string][]gvk) *generator {
	return &generator{v3: v3, defs: map[string]jsonSchema{}, gvks: gvks}
}

func (g *generator) refPrefix() string {
	if g.v3 {
		return "#/components/schemas/"
	}
	return "#/definitions/"
}

// DefinitionName is the OpenAPI name of a Go type, as Kubernetes spells
// it: the package path with its domain reversed, then the type name
// (k8s.io/api/core/v1.Pod is io.k8s.api.core.v1.Pod).
func DefinitionName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pkg := t.PkgPath()
	first, rest, _ := strings.Cut(pkg, "/")
	labels := strings.Split(first, ".")
	for i, j := 0, len(labels)-1; i < j; i, j = i+1, j-1 {
		labels[i], labels[j] = labels[j], labels[i]
	}
	name := strings.Join(labels, ".")
	if rest != "" {
		name += "." + strings.ReplaceAll(rest, "/", ".")
	}
	return name + "." + t.Name()
}

// ref returns a reference to t's definition, generating it when new.
func (g *generator) ref(t reflect.Type) jsonSchema {
	name := DefinitionName(t)
	if _, ok := g.defs[name]; !ok {
		g.defs[name] = nil // placeholder: breaks recursion (JSONSchemaProps-like cycles)
		g.defs[name] = g.define(t, name)
	}
	return jsonSchema{"$ref": g.refPrefix() + name}
}

// define builds the definition of a named struct (or special) type.
func (g *generator) define(t reflect.Type, name string) jsonSchema {
	zero := reflect.New(t).Elem().Interface()
	docs := map[string]string{}
	if d, ok := zero.(swaggerDoc); ok {
		docs = d.SwaggerDoc()
	}
	s := jsonSchema{}
	if desc := docs[""]; desc != "" {
		s["description"] = desc
	}
	if typer, ok := zero.(openAPITyper); ok {
		if oneOf, ok := zero.(openAPIV3OneOf); ok && g.v3 {
			var alts []any
			for _, ty := range oneOf.OpenAPIV3OneOfTypes() {
				alts = append(alts, jsonSchema{"type": ty})
			}
			if typer.OpenAPISchemaFormat() == "int-or-string" {
				s["x-kubernetes-int-or-string"] = true
				s["anyOf"] = alts
			} else {
				s["oneOf"] = alts
			}
		} else {
			if ts := typer.OpenAPISchemaType(); len(ts) > 0 {
				s["type"] = ts[0]
			}
			if f := typer.OpenAPISchemaFormat(); f != "" {
				s["format"] = f
			}
		}
		return s
	}
	switch name {
	case "io.k8s.apimachinery.pkg.runtime.RawExtension", "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
		"io.k8s.apimachinery.pkg.apis.meta.v1.Patch":
		s["type"] = "object"
		if g.v3 && name == "io.k8s.apimachinery.pkg.runtime.RawExtension" {
			s["x-kubernetes-preserve-unknown-fields"] = true
		}
		return s
	}
	if t.Kind() != reflect.Struct {
		for k, v := range g.inline(t) {
			s[k] = v
		}
		return s
	}
	props := jsonSchema{}
	var required []any
	g.fields(t, docs, props, &required)
	s["type"] = "object"
	if len(props) > 0 {
		s["properties"] = props
	}
	if len(required) > 0 {
		s["required"] = required
	}
	if kinds := g.gvks[name]; len(kinds) > 0 {
		var ext []any
		for _, k := range kinds {
			ext = append(ext, k.ext())
		}
		s["x-kubernetes-group-version-kind"] = ext
	}
	return s
}

// fields adds t's JSON fields (flattening inline embedded structs) to props.
func (g *generator) fields(t reflect.Type, docs map[string]string, props jsonSchema, required *[]any) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" && f.Anonymous {
			et := f.Type
			for et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			var edocs map[string]string
			if d, ok := reflect.New(et).Elem().Interface().(swaggerDoc); ok {
				edocs = d.SwaggerDoc()
			}
			g.fields(et, edocs, props, required)
			continue
		}
		if name == "" {
			name = f.Name
		}
		p := g.property(f.Type)
		extra := jsonSchema{}
		if desc := docs[name]; desc != "" {
			extra["description"] = desc
		}
		if ps := f.Tag.Get("patchStrategy"); ps != "" {
			extra["x-kubernetes-patch-strategy"] = ps
		}
		if pk := f.Tag.Get("patchMergeKey"); pk != "" {
			extra["x-kubernetes-patch-merge-key"] = pk
		}
		if _, isRef := p["$ref"]; isRef && g.v3 && len(extra) > 0 {
			// OpenAPI 3.0 ignores the siblings of a $ref: wrap it, as
			// Kubernetes does.
			p = jsonSchema{"allOf": []any{p}}
		}
		for k, v := range extra {
			p[k] = v
		}
		props[name] = p
		if !strings.Contains(opts, "omitempty") && f.Type.Kind() != reflect.Pointer {
			*required = append(*required, name)
		}
	}
}

// property is the schema of a field of type t: a $ref for named structs
// and special types, inline for the rest.
func (g *generator) property(t reflect.Type) jsonSchema {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Name() != "" && t.PkgPath() != "" {
		zero := reflect.New(t).Elem().Interface()
		if _, special := zero.(openAPITyper); special || t.Kind() == reflect.Struct {
			return g.ref(t)
		}
	}
	return g.inline(t)
}

func (g *generator) inline(t reflect.Type) jsonSchema {
	switch t.Kind() {
	case reflect.Bool:
		return jsonSchema{"type": "boolean"}
	case reflect.Int32, reflect.Int16, reflect.Int8, reflect.Uint16, reflect.Uint8:
		return jsonSchema{"type": "integer", "format": "int32"}
	case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return jsonSchema{"type": "integer", "format": "int64"}
	case reflect.Float32, reflect.Float64:
		return jsonSchema{"type": "number", "format": "double"}
	case reflect.String:
		return jsonSchema{"type": "string"}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return jsonSchema{"type": "string", "format": "byte"}
		}
		return jsonSchema{"type": "array", "items": g.property(t.Elem())}
	case reflect.Map:
		return jsonSchema{"type": "object", "additionalProperties": g.property(t.Elem())}
	case reflect.Struct:
		return g.ref(t)
	case reflect.Pointer:
		return g.property(t.Elem())
	}
	// interface{} and anything else: any JSON value.
	if g.v3 {
		return jsonSchema{"x-kubernetes-preserve-unknown-fields": true}
	}
	return jsonSchema{"type": "object"}
}
