package apiserver

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func seedBodies(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}]}}`), "application/json")
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, image: i, ports: [{containerPort: 99999}]}]\n"), "application/yaml")
	f.Add([]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"ports":[{"port":80,"targetPort":"http"}]}}`), "application/json")
	f.Add([]byte(strings.Repeat("[", 300)), "application/json")
	f.Add([]byte("a: &a [x,x]\nb: &b [*a,*a]\nc: [*b,*b]\n"), "application/yaml")
	f.Add([]byte("k8s\x00\x0a\x04\x0a\x02v1"), protobufType)
	f.Add([]byte(`{"metadata":{"name":"\u0000"},"spec":{"containers":null}}`), "application/json")
}

// FuzzDecodeDefaultValidate feeds arbitrary bodies through the create path's
// pure steps for every served type: decoding never panics, and whatever
// decodes can be defaulted, validated and encoded for storage.
func FuzzDecodeDefaultValidate(f *testing.F) {
	seedBodies(f)
	resources := catalog.All()
	f.Fuzz(func(t *testing.T, body []byte, ct string) {
		if len(body) > MaxBodyBytes {
			return
		}
		for i := range resources {
			res := &resources[i]
			obj, _, err := decodeObject(res, body, ct, "Strict")
			if err != nil {
				continue
			}
			st := strategyFor(res)
			if st.prepareCreate != nil {
				st.prepareCreate(obj)
			}
			if st.defaults != nil {
				st.defaults(obj)
			}
			r := &registry{res: res, st: st}
			_ = st.validateCreate(r, obj)
			_ = st.validateUpdate(r, obj, obj.DeepCopyObject(), "")
			_ = st.validateUpdate(r, obj, obj.DeepCopyObject(), "status")
			_ = st.fieldSet(obj)
			if _, err := encodeForStorage(res, obj, true); err != nil {
				t.Fatalf("%s: decoded object does not encode: %v", res.Resource, err)
			}
		}
	})
}

// FuzzCheckDepth: the nesting scanner never panics and agrees with the
// JSON decoder on anything shallow enough.
func FuzzCheckDepth(f *testing.F) {
	f.Add([]byte(`{"a":[1,{"b":"[[["}]}`))
	f.Add([]byte(strings.Repeat("{\"a\":", 250)))
	f.Add([]byte(`"\\"[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := checkDepth(b); err != nil {
			return
		}
		var v any
		_ = json.Unmarshal(b, &v)
	})
}

// FuzzContinueToken: continue tokens come from clients; bad ones are a
// clean error, good ones round-trip.
func FuzzContinueToken(f *testing.F) {
	f.Add(encodeContinue(42, "/registry/pods/ns/a", "/registry/pods/"))
	f.Add("garbage")
	f.Add("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoiIn0")
	f.Fuzz(func(t *testing.T, tok string) {
		rv, key, err := decodeContinue(tok, "/registry/pods/")
		if err != nil {
			return
		}
		if (rv <= 0 && rv != -1) || !strings.HasPrefix(key, "/registry/pods/") {
			t.Fatalf("accepted token gives rv %d key %q", rv, key)
		}
	})
}

// FuzzWithResourceVersion: splicing the revision into stored JSON (what
// builds before protobuf storage wrote, still read) gives the same document
// as re-encoding, and the same as a protobuf value of the same object.
func FuzzWithResourceVersion(f *testing.F) {
	f.Add("a", "app", "x", int64(7))
	f.Add("", "", "", int64(1))
	f.Fuzz(func(t *testing.T, name, k, v string, rev int64) {
		if rev <= 0 {
			return
		}
		res, _ := catalog.Lookup(corev1.SchemeGroupVersion.WithResource("configmaps"))
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{k: v}}, Data: map[string]string{k: v}}
		cm.SetGroupVersionKind(res.GroupVersionKind())
		stored, err := json.Marshal(cm)
		if err != nil {
			t.Skipf("input not encodable for storage: %v", err)
		}
		pb, err := encodeForStorage(res, cm.DeepCopy(), true)
		if err != nil || !bytes.HasPrefix(pb, protobufMagic) {
			t.Fatalf("protobuf storage: %v %q", err, pb)
		}
		c := &storageCodec{res: res, fields: strategyFor(res).fieldSet}
		o, err := c.Decode("/k", stored, rev)
		if err != nil {
			t.Fatal(err)
		}
		if o.JSON == nil {
			t.Fatalf("stored JSON %s not spliced", stored)
		}
		want, _ := json.Marshal(o.Obj)
		norm := func(j []byte) []byte {
			var a any
			if err := json.Unmarshal(j, &a); err != nil {
				t.Fatalf("JSON invalid: %v: %s", err, j)
			}
			out, _ := json.Marshal(a)
			return out
		}
		got, err := o.EncodedJSON()
		if err != nil {
			t.Fatal(err)
		}
		if aj, bj := norm(got), norm(want); !bytes.Equal(aj, bj) {
			t.Fatalf("spliced %s\nencoded %s", aj, bj)
		}
		// JSON turns invalid UTF-8 into U+FFFD where protobuf keeps the
		// bytes (as upstream's protobuf storage does).
		if !utf8.ValidString(name + k + v) {
			return
		}
		po, err := c.Decode("/k", pb, rev)
		if err != nil {
			t.Fatal(err)
		}
		pj, err := po.EncodedJSON()
		if err != nil {
			t.Fatal(err)
		}
		if aj, bj := norm(pj), norm(got); !bytes.Equal(aj, bj) {
			t.Fatalf("from protobuf %s\nfrom JSON %s", aj, bj)
		}
	})
}
