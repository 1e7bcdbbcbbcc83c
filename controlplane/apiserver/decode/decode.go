// Package decode turns request bodies (JSON or YAML) into typed API objects
// the way kube-apiserver does with ?fieldValidation=Strict|Warn|Ignore:
// case-sensitive field names, integers kept as integers, and unknown or
// duplicate fields reported as a "strict decoding error" (Strict), as
// warnings (Warn) or not at all (Ignore).
//
// It only decodes: size limits belong to the HTTP layer (bodies over 3 MiB
// are refused before they reach here) and validation of values to the
// registry. Malformed input is an error wrapping ErrMalformed, never a panic.
package decode

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Field validation directives (the fieldValidation query parameter).
const (
	Strict = "Strict"
	Warn   = "Warn"
	Ignore = "Ignore"
)

// Sentinel categories.
var (
	// ErrMalformed: the body is not valid JSON or YAML for the type (400).
	ErrMalformed = errors.New("malformed body")
	// ErrStrict: the body has unknown or duplicate fields and validation is
	// Strict (400 BadRequest).
	ErrStrict = errors.New("strict decoding error")
	// ErrDirective: the fieldValidation value is not Strict, Warn or Ignore.
	ErrDirective = errors.New("invalid fieldValidation")
)

// StrictError lists the unknown and duplicate fields of a body. Its message
// is kube-apiserver's: `strict decoding error: unknown field "spec.foo",
// duplicate field "x"`.
type StrictError struct{ Fields []string }

func (e *StrictError) Error() string {
	return "strict decoding error: " + strings.Join(e.Fields, ", ")
}

// Is makes errors.Is(err, ErrStrict) hold.
func (e *StrictError) Is(target error) bool { return target == ErrStrict }

// StrictDecode decodes data (JSON or YAML) into into, failing with a
// *StrictError on unknown or duplicate fields.
func StrictDecode(data []byte, into runtime.Object) error {
	_, err := Decode(data, into, Strict)
	return err
}

// Decode decodes data (JSON or YAML) into into under the fieldValidation
// directive ("" means Warn, kube-apiserver's default for clients that send
// none). With Warn it returns the problems as warnings for the Warning
// header; with Strict as a *StrictError. into is filled even when
// warnings are returned.
func Decode(data []byte, into any, directive string) (warnings []string, err error) {
	switch directive {
	case "", Warn, Strict, Ignore:
	default:
		return nil, fmt.Errorf("%w: %q (want Strict, Warn or Ignore)", ErrDirective, directive)
	}
	var fields []string
	if !IsJSON(data) {
		if directive != Ignore {
			if _, derr := yaml.YAMLToJSONStrict(data); derr != nil {
				fields = append(fields, yamlDuplicates(derr)...)
			}
		}
		j, yerr := yaml.YAMLToJSON(data)
		if yerr != nil {
			return nil, fmt.Errorf("%w: yaml: %v", ErrMalformed, trimYAMLErr(yerr))
		}
		data = j
	}
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) || len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: empty body", ErrMalformed)
	}
	strictErrs, uerr := kjson.UnmarshalStrict(data, into)
	if uerr != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, uerr)
	}
	for _, e := range strictErrs {
		fields = append(fields, e.Error())
	}
	if len(fields) == 0 || directive == Ignore {
		return nil, nil
	}
	if directive == Strict {
		return nil, &StrictError{Fields: fields}
	}
	return fields, nil
}

// IsJSON reports whether data looks like JSON (its first non-space byte
// opens an object or array); anything else is treated as YAML.
func IsJSON(data []byte) bool {
	t := bytes.TrimLeft(data, " \t\r\n")
	return len(t) > 0 && (t[0] == '{' || t[0] == '[')
}

// yamlDupRE matches go-yaml's duplicate key errors ("line 3: key "name"
// already set in map"); older versions say "mapping key ... already defined".
var yamlDupRE = regexp.MustCompile(`line (\d+): (?:mapping )?key ("(?:[^"\\]|\\.)*") already (?:set in map|defined)`)

// yamlDuplicates rewrites go-yaml's duplicate key errors in the JSON
// decoder's words, with the line.
func yamlDuplicates(err error) []string {
	var out []string
	for _, m := range yamlDupRE.FindAllStringSubmatch(err.Error(), -1) {
		out = append(out, fmt.Sprintf("duplicate field %s (line %s)", m[2], m[1]))
	}
	return out
}

func trimYAMLErr(err error) string {
	return strings.TrimPrefix(strings.TrimPrefix(err.Error(), "error converting YAML to JSON: "), "yaml: ")
}
