package apiserver

import (
	"context"
	"fmt"
	"net/http"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/storage"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// newRegistry makes the registry of one catalog entry: a watch cache over
// its etcd prefix for stored resources (converting to and from the
// storage version where the resource shares another's store), nothing
// for virtual ones.
func (s *Server) newRegistry(r catalog.Resource) (*registry, error) {
	res := &r
	st := strategyFor(res)
	reg := &registry{res: res, gr: res.GroupResource(), store: s.store, st: st, srv: s}
	if res.Virtual {
		return reg, nil
	}
	codec := &storageCodec{res: res, fields: st.fieldSet}
	if res.StoredAs != nil {
		owner, ok := s.catalog.Lookup(*res.StoredAs)
		if !ok {
			return nil, fmt.Errorf("apiserver: %s is stored as %s, which is not served", res.GroupVersionResource, res.StoredAs)
		}
		conv, err := converterFor(res, owner)
		if err != nil {
			return nil, err
		}
		codec.conv = conv
	}
	reg.codec = codec
	// Each kind brings its own schema; custom resources will pass their
	// CRD's (managedfields.NewTypeConverter).
	tc, err := BuiltinTypeConverter(res)
	if err != nil {
		return nil, fmt.Errorf("apiserver: schema of %s: %w", res.Resource, err)
	}
	if reg.fms, err = fieldManagers(res, st, tc, nil); err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	reg.cache = storage.NewCacher(s.store, storage.CacherConfig{
		Resource: res.Group + "/" + res.Version + "/" + res.Resource, Prefix: res.EtcdPrefix(), Codec: codec,
		BookmarkInterval: s.cfg.BookmarkInterval, Log: s.log,
	})
	return reg, nil
}

// converter turns objects of a resource into its store's version and back.
type converter struct {
	storage     *catalog.Resource
	toStorage   func(runtime.Object) (runtime.Object, error)
	fromStorage func(runtime.Object) (runtime.Object, error)
}

// VirtualCreate answers a create of a resource that is never stored
// (TokenReview, SubjectAccessReview, SelfSubjectReview, ...). It gets the
// decoded request object and returns the object to answer with, usually
// the same object with its status filled; the requesting user is in ctx
// (authn.UserFrom). Errors are API errors (apierrors) or become 500s.
type VirtualCreate func(ctx context.Context, req *VirtualRequest) (runtime.Object, error)

// VirtualRequest is one create of a virtual resource.
type VirtualRequest struct {
	Resource  *catalog.Resource
	Namespace string
	Object    runtime.Object
	DryRun    bool
}

// HandleCreate installs the handler of a virtual resource (one of the
// catalog's Virtual entries). Call it before Serve.
func (s *Server) HandleCreate(gvr schema.GroupVersionResource, fn VirtualCreate) error {
	r, ok := s.catalog.Lookup(gvr)
	if !ok || !r.Virtual {
		return fmt.Errorf("apiserver: %s is not a virtual resource", gvr)
	}
	s.virtual[gvr.Group+"/"+gvr.Version+"/"+gvr.Resource] = fn
	return nil
}

// serveVirtual answers a create of a virtual resource through its handler.
func (s *Server) serveVirtual(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	res := req.reg.res
	if r.Method != http.MethodPost || req.name != "" || req.sub != "" {
		return apierrors.NewMethodNotSupported(req.reg.gr, r.Method)
	}
	fn := s.virtual[res.Group+"/"+res.Version+"/"+res.Resource]
	if fn == nil {
		return apierrors.NewServiceUnavailable(fmt.Sprintf("%s is served, but nothing answers it yet on this server", req.reg.gr))
	}
	if wantsTable(r) && !acceptsPlain(r) {
		// A virtual resource's storage has no table conversion: upstream's
		// negotiation refuses a Table-only Accept before the request runs.
		return errNotAcceptable()
	}
	obj, wo, warnings, err := decodeWrite(r, req)
	if err != nil {
		return err
	}
	if res.Namespaced {
		m := objectMeta(obj)
		if m.GetNamespace() != "" && m.GetNamespace() != req.ns {
			return apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
		}
		m.SetNamespace(req.ns)
	}
	out, err := fn(ctx, &VirtualRequest{Resource: res, Namespace: req.ns, Object: obj, DryRun: wo.dryRun})
	if err != nil {
		return err
	}
	warn(w, warnings)
	return s.writeObject(w, r, req.reg, http.StatusCreated, out)
}

// Catalog is the set of resources the server serves.
func (s *Server) Catalog() *catalog.Catalog { return s.catalog }
