package apiserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/decode"
	"github.com/waggle-io/waggle/controlplane/apiserver/extensions/crd"
	"github.com/waggle-io/waggle/controlplane/storage"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"sigs.k8s.io/yaml"
)

// Size limits of the issue: bodies are refused before decoding, objects
// before anything is written.
const (
	MaxBodyBytes   = 3 << 20
	MaxObjectBytes = 3 << 19 // 1.5 MiB
	// maxYAMLDepth bounds the nesting of YAML bodies before conversion.
	maxJSONDepth = 200
)

// errBadBody marks decoding failures (400).
var errBadBody = errors.New("bad request body")

// toJSON converts a body of the given content type to JSON, bounded: YAML
// is converted by sigs.k8s.io/yaml (whose parser limits alias expansion),
// and nesting is checked before any typed decoding.
func toJSON(body []byte, contentType string) ([]byte, error) {
	switch contentType {
	case "application/yaml", "application/x-yaml", "text/yaml", "application/apply-patch+yaml":
		j, err := yaml.YAMLToJSON(body)
		if err != nil {
			return nil, fmt.Errorf("%w: invalid YAML: %v", errBadBody, err)
		}
		body = j
	}
	if err := checkDepth(body); err != nil {
		return nil, err
	}
	if !json.Valid(body) {
		// Let the decoder produce a precise message.
		var v any
		err := json.Unmarshal(body, &v)
		if err == nil {
			err = errors.New("not valid JSON")
		}
		return nil, fmt.Errorf("%w: %v", errBadBody, err)
	}
	return body, nil
}

// checkDepth refuses JSON nested deeper than maxJSONDepth, scanning bytes
// without allocating (strings are skipped).
func checkDepth(b []byte) error {
	depth := 0
	inStr, esc := false, false
	for _, c := range b {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			depth++
			if depth > maxJSONDepth {
				return fmt.Errorf("%w: nesting deeper than %d levels", errBadBody, maxJSONDepth)
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}

// decodeObject decodes a body (JSON or YAML, already size-limited) into a
// new object of the resource's type under the fieldValidation directive,
// returning warnings for the Warning header.
func decodeObject(res *catalog.Resource, body []byte, contentType, directive string) (runtime.Object, []string, error) {
	obj := res.New()
	warnings, err := decodeInto(body, obj, contentType, directive)
	if err != nil {
		return nil, nil, err
	}
	gvk := res.GroupVersionKind()
	got := obj.GetObjectKind().GroupVersionKind()
	if (got.Kind != "" && got.Kind != gvk.Kind) || (got.Version != "" && got.GroupVersion() != gvk.GroupVersion()) {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("the body is a %s %s, %s expected", got.GroupVersion(), got.Kind, gvk))
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	return obj, warnings, nil
}

// protobufCodec decodes client-go's default protobuf bodies.
var protobufCodec = protobuf.NewSerializer(catalog.Scheme, catalog.Scheme)

const protobufType = "application/vnd.kubernetes.protobuf"

// decodeInto decodes a body of the given content type (JSON, YAML or
// Kubernetes protobuf) into into.
func decodeInto(body []byte, into runtime.Object, contentType, directive string) ([]string, error) {
	if mediaType(contentType) == protobufType {
		out, _, err := protobufCodec.Decode(body, nil, into)
		if err != nil {
			return nil, apierrors.NewBadRequest("invalid protobuf body: " + err.Error())
		}
		if out != into {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("unexpected object type %T in the body", out))
		}
		return nil, nil
	}
	if decode.IsJSON(body) {
		if err := checkDepth(body); err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
	}
	warnings, err := decode.Decode(body, into, directive)
	if err != nil {
		if errors.Is(err, decode.ErrDirective) || errors.Is(err, decode.ErrMalformed) || errors.Is(err, decode.ErrStrict) {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		return nil, fmt.Errorf("%w: %v", errBadBody, err)
	}
	return warnings, nil
}

// encodeForStorage marshals obj without its resourceVersion (the revision is
// the version) and with apiVersion and kind set: as Kubernetes protobuf when
// asked and its type has that encoding, else as JSON.
func encodeForStorage(res *catalog.Resource, obj runtime.Object, protobuf bool) ([]byte, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	rv := m.GetResourceVersion()
	m.SetResourceVersion("")
	obj.GetObjectKind().SetGroupVersionKind(res.GroupVersionKind())
	stored := obj
	if res.StoredAs != nil {
		c, err := converterFor(res, nil)
		if err != nil {
			return nil, err
		}
		if stored, err = c.toStorage(obj); err != nil {
			m.SetResourceVersion(rv)
			return nil, fmt.Errorf("convert %s to %s: %w", res.GroupVersionKind(), c.storage.GroupVersionKind(), err)
		}
		objectMeta(stored).SetResourceVersion("")
		stored.GetObjectKind().SetGroupVersionKind(c.storage.GroupVersionKind())
	}
	var b []byte
	if _, ok := stored.(runtime.ProtobufMarshaller); ok && protobuf {
		// Built-in kinds are stored as Kubernetes protobuf, as
		// kube-apiserver stores them: cheaper to encode here and to decode
		// in the watch cache than JSON. Custom resources stay JSON (their
		// registry encodes them), as upstream.
		b, err = encodeProtobuf(stored)
	} else {
		b, err = json.Marshal(stored)
	}
	m.SetResourceVersion(rv)
	return b, err
}

// protobufMagic begins every value stored as Kubernetes protobuf; stored
// JSON begins with '{'. Values written before built-in kinds were stored
// as protobuf are JSON, and both are read.
var protobufMagic = []byte("k8s\x00")

// unmarshalStored decodes a stored value, Kubernetes protobuf or JSON, into
// into.
func unmarshalStored(value []byte, into runtime.Object) error {
	if !bytes.HasPrefix(value, protobufMagic) {
		return json.Unmarshal(value, into)
	}
	out, _, err := protobufCodec.Decode(value, nil, into)
	if err != nil {
		return err
	}
	if out != into {
		return fmt.Errorf("stored %T where %T was expected", out, into)
	}
	return nil
}

// storageCodec decodes stored values of one resource for the watch cache and
// for direct reads.
type storageCodec struct {
	res    *catalog.Resource
	fields func(runtime.Object) fields.Set
	// conv converts from the store's version when the resource shares
	// another's store.
	conv *converter
	// cr decodes custom resources (any stored version, converted).
	cr *crd.Version
}

var metadataOpen = []byte(`"metadata":{`)

// withResourceVersion inserts "resourceVersion" into stored JSON without
// re-encoding: stored objects begin with kind and apiVersion, so the first
// `"metadata":{` is the object's own.
func withResourceVersion(stored []byte, rev int64) []byte {
	i := bytes.Index(stored, metadataOpen)
	if i < 0 {
		return nil
	}
	i += len(metadataOpen)
	rv := `"resourceVersion":"` + strconv.FormatInt(rev, 10) + `"`
	out := make([]byte, 0, len(stored)+len(rv)+1)
	out = append(out, stored[:i]...)
	out = append(out, rv...)
	if i < len(stored) && stored[i] != '}' {
		out = append(out, ',')
	}
	return append(out, stored[i:]...)
}

func (c *storageCodec) Decode(key string, value []byte, rev int64) (*storage.Object, error) {
	if c.cr != nil {
		return c.decodeCustom(key, value, rev)
	}
	if c.conv != nil {
		return c.decodeConverted(key, value, rev)
	}
	obj := c.res.New()
	if err := unmarshalStored(value, obj); err != nil {
		return nil, fmt.Errorf("decode %s: %w", key, err)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	m.SetResourceVersion(strconv.FormatInt(rev, 10))
	obj.GetObjectKind().SetGroupVersionKind(c.res.GroupVersionKind())
	o := &storage.Object{Key: key, Rev: rev, Obj: obj, Labels: labels.Set(m.GetLabels()), Fields: c.fields(obj)}
	// Stored JSON is served as it is, with the resourceVersion spliced in;
	// a protobuf value's JSON is encoded on first use (a JSON watcher or
	// read), and not at all while only protobuf clients read it.
	if value[0] == '{' && bytes.HasPrefix(bytes.TrimSpace(value), []byte(`{"kind":`)) {
		o.JSON = withResourceVersion(value, rev)
	}
	return o, nil
}

// decodeConverted decodes a value stored in another resource's version and
// converts it to this resource's.
func (c *storageCodec) decodeConverted(key string, value []byte, rev int64) (*storage.Object, error) {
	stored := c.conv.storage.New()
	if err := unmarshalStored(value, stored); err != nil {
		return nil, fmt.Errorf("decode %s: %w", key, err)
	}
	obj, err := c.conv.fromStorage(stored)
	if err != nil {
		return nil, fmt.Errorf("convert %s to %s: %w", key, c.res.GroupVersionKind(), err)
	}
	m := objectMeta(obj)
	m.SetResourceVersion(strconv.FormatInt(rev, 10))
	obj.GetObjectKind().SetGroupVersionKind(c.res.GroupVersionKind())
	return &storage.Object{Key: key, Rev: rev, Obj: obj, Labels: labels.Set(m.GetLabels()), Fields: c.fields(obj)}, nil
}

// listJSON builds a list document from already-encoded items without
// re-encoding them.
func listJSON(res *catalog.Resource, items [][]byte, rv int64, cont string, remaining *int64) []byte {
	var b bytes.Buffer
	n := 128
	for _, it := range items {
		n += len(it) + 1
	}
	b.Grow(n)
	b.WriteString(`{"kind":"`)
	b.WriteString(res.ListKind)
	b.WriteString(`","apiVersion":"`)
	b.WriteString(res.GroupVersion().String())
	b.WriteString(`","metadata":{"resourceVersion":"`)
	b.WriteString(strconv.FormatInt(rv, 10))
	b.WriteByte('"')
	if cont != "" {
		b.WriteString(`,"continue":"`)
		b.WriteString(cont)
		b.WriteByte('"')
	}
	if remaining != nil {
		b.WriteString(`,"remainingItemCount":`)
		b.WriteString(strconv.FormatInt(*remaining, 10))
	}
	b.WriteString(`},"items":[`)
	for i, it := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(it)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// objectMeta returns the metadata of any served object.
func objectMeta(obj runtime.Object) metav1.Object {
	m, err := meta.Accessor(obj)
	if err != nil {
		panic(fmt.Sprintf("served type %T has no metadata: %v", obj, err))
	}
	return m
}
