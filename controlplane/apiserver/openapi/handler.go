package openapi

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	openapi_v2 "github.com/google/gnostic-models/openapiv2"
	"google.golang.org/protobuf/proto"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
)

// Media types of the v2 document. Clients ask for the protobuf form with
// either spelling; the response carries the one without '@', which
// mime.ParseMediaType (used by client-go) accepts.
const (
	ContentTypeV2Protobuf           = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
	ContentTypeV2ProtobufDeprecated = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
	ContentTypeV2JSON               = "application/json"
)

type handler struct {
	docs *Documents

	once    sync.Once
	v2Proto []byte
	v2Err   error
	index   []byte
}

// Handler serves /openapi/v2, /openapi/v3 and /openapi/v3/{api/v1|apis/g/v}
// for the catalog's resources. It panics if the catalog cannot be turned into
// documents (a programming error caught by the package's tests).
func Handler() http.Handler {
	docs, err := Build(catalog.All(), catalog.Groups())
	if err != nil {
		panic(err)
	}
	return NewHandler(docs)
}

// NewHandler serves already built documents.
func NewHandler(docs *Documents) http.Handler {
	keys := make([]string, 0, len(docs.V3))
	for k := range docs.V3 {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(`{"paths":{`)
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `%q:{"serverRelativeURL":%q}`, k, "/openapi/v3/"+k+"?hash="+docs.V3Hash[k])
	}
	b.WriteString(`}}`)
	return &handler{docs: docs, index: []byte(b.String())}
}

// V2Protobuf converts the v2 JSON document to gnostic's protobuf form, as
// kube-apiserver serves it to client-go.
func V2Protobuf(v2JSON []byte) ([]byte, error) {
	doc, err := openapi_v2.ParseDocument(v2JSON)
	if err != nil {
		return nil, fmt.Errorf("openapi: parse v2 document: %w", err)
	}
	b, err := proto.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("openapi: marshal v2 protobuf: %w", err)
	}
	return b, nil
}

func wantsProtobuf(accept string) bool {
	// mime.ParseMediaType rejects the '@' of the protobuf type: compare by
	// hand, first acceptable type wins.
	for _, part := range strings.Split(accept, ",") {
		mt, _, _ := strings.Cut(part, ";")
		switch strings.ToLower(strings.TrimSpace(mt)) {
		case ContentTypeV2Protobuf, ContentTypeV2ProtobufDeprecated:
			return true
		case "application/json", "*/*":
			return false
		}
	}
	return false
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case path == "/openapi/v2":
		if wantsProtobuf(r.Header.Get("Accept")) {
			h.once.Do(func() { h.v2Proto, h.v2Err = V2Protobuf(h.docs.V2) })
			if h.v2Err != nil {
				http.Error(w, h.v2Err.Error(), http.StatusInternalServerError)
				return
			}
			write(w, r, ContentTypeV2Protobuf, h.v2Proto, "")
			return
		}
		write(w, r, ContentTypeV2JSON, h.docs.V2, "")
	case path == "/openapi/v3":
		write(w, r, "application/json", h.index, "")
	case strings.HasPrefix(path, "/openapi/v3/"):
		key := strings.TrimPrefix(path, "/openapi/v3/")
		doc, ok := h.docs.V3[key]
		if !ok {
			http.Error(w, fmt.Sprintf("no OpenAPI v3 document for %q", key), http.StatusNotFound)
			return
		}
		hash := h.docs.V3Hash[key]
		etag := `"` + hash + `"`
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		if q := r.URL.Query().Get("hash"); q != "" && q == hash {
			w.Header().Set("Cache-Control", "public, immutable")
			w.Header().Set("Expires", "Fri, 31 Dec 9999 23:59:59 GMT")
		} else if q != "" {
			// A stale hash: send the client to the current one.
			w.Header().Set("Location", "/openapi/v3/"+key+"?hash="+hash)
			w.WriteHeader(http.StatusMovedPermanently)
			return
		}
		write(w, r, "application/json", doc, etag)
	default:
		http.NotFound(w, r)
	}
}

func write(w http.ResponseWriter, r *http.Request, ct string, body []byte, etag string) {
	w.Header().Set("Content-Type", ct)
	if etag != "" {
		w.Header().Set("ETag", etag)
	}
	if w.Header().Get("Cache-Control") == "" {
		w.Header().Set("Cache-Control", "no-cache, private")
	}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(body)
	}
}
