package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/decode"
	"github.com/waggle-io/waggle/controlplane/apiserver/extensions/crd"
	"github.com/waggle-io/waggle/controlplane/storage"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Custom resources are served by the same registry as built-in kinds; what
// differs comes from their CRD version (package extensions/crd): objects
// are *unstructured.Unstructured, decoded with the schema's pruning,
// metadata coercion and defaults, validated by apiextensions-apiserver's
// strategy, stored in the CRD's storage version.

// crdStrategy is the CustomResourceDefinition's own strategy: upstream's
// defaults, preparation and validation, and deletion through the
// customresourcecleanup finalizer.
func crdStrategy(s *strategy) {
	s.generation = false // the upstream strategy keeps metadata.generation
	s.defaults = func(o runtime.Object) { crd.Default(o.(*apiextensionsv1.CustomResourceDefinition)) }
	s.prepareCreate = func(o runtime.Object) {
		if err := crd.PrepareForCreate(context.Background(), o.(*apiextensionsv1.CustomResourceDefinition)); err != nil {
			panic(err) // every v1 object converts to the internal version
		}
	}
	s.prepareUpdate = func(o, old runtime.Object, sub string) {
		if err := crd.PrepareForUpdate(context.Background(), o.(*apiextensionsv1.CustomResourceDefinition), old.(*apiextensionsv1.CustomResourceDefinition), sub); err != nil {
			panic(err)
		}
	}
	s.validateAll = func(o, old runtime.Object, sub string) field.ErrorList {
		if old == nil {
			return crd.Validate(context.Background(), o.(*apiextensionsv1.CustomResourceDefinition))
		}
		return crd.ValidateUpdate(context.Background(), o.(*apiextensionsv1.CustomResourceDefinition), old.(*apiextensionsv1.CustomResourceDefinition), sub)
	}
	s.mark = func(o runtime.Object) bool {
		crd.MarkForDeletion(o.(*apiextensionsv1.CustomResourceDefinition))
		return true
	}
}

// customResource describes one served CRD version as a catalog entry.
func customResource(ver *crd.Version) catalog.Resource {
	r := catalog.Resource{
		GroupVersionResource:     ver.GVR,
		Kind:                     ver.Kind,
		ListKind:                 ver.ListKind,
		Singular:                 ver.Singular,
		Namespaced:               ver.Namespaced,
		ShortNames:               ver.ShortNames,
		Categories:               ver.Categories,
		New:                      ver.New,
		NewList:                  ver.NewList,
		Prefix:                   "/registry/" + ver.GVR.Group + "/" + ver.GVR.Resource + "/",
		CustomResourceDefinition: ver.CRD.Name,
		// The verbs upstream's CRD handler serves. Set here, not left to the
		// catalog's default, because the registry keeps this copy: without
		// them deletecollection answered 405 on every custom resource.
		Verbs: []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
	}
	if ver.Status {
		r.Subs = append(r.Subs, catalog.Subresource{Name: "status", Verbs: []string{"get", "patch", "update"}})
	}
	if ver.Scale != nil {
		r.Subs = append(r.Subs, catalog.Subresource{Name: "scale", Kind: "Scale", Group: "autoscaling", Version: "v1", Verbs: []string{"get", "patch", "update"}})
	}
	return r
}

// newCustomRegistry builds the registry of one served CRD version, its
// watch cache running until the returned registry's stop is called.
func (s *Server) newCustomRegistry(ver *crd.Version, terminating func() bool) (*registry, error) {
	res := customResource(ver)
	st := &strategy{hasStatus: ver.Status, nameFn: apivalidation.NameIsDNSSubdomain, fieldLabels: map[string]bool{}}
	for _, f := range ver.FieldLabels {
		st.fieldLabels[f] = true
	}
	st.fieldSet = func(o runtime.Object) fields.Set { return ver.Fields(o.(*unstructured.Unstructured)) }
	st.prepareCreate = func(o runtime.Object) { ver.PrepareForCreate(context.Background(), o.(*unstructured.Unstructured)) }
	st.prepareUpdate = func(o, old runtime.Object, sub string) {
		if sub == "" || sub == "status" {
			ver.PrepareForUpdate(context.Background(), o.(*unstructured.Unstructured), old.(*unstructured.Unstructured), sub)
		}
	}
	st.defaults = func(o runtime.Object) { ver.Default(o.(*unstructured.Unstructured)) }
	st.validateAll = func(o, old runtime.Object, sub string) field.ErrorList {
		if old == nil {
			return ver.Validate(context.Background(), o.(*unstructured.Unstructured))
		}
		return ver.ValidateUpdate(context.Background(), o.(*unstructured.Unstructured), old.(*unstructured.Unstructured), sub)
	}
	gr := res.GroupResource()
	st.admitCreate = func() error {
		if terminating() {
			return apierrors.NewMethodNotSupported(gr, "create")
		}
		return nil
	}
	reg := &registry{res: &res, gr: gr, store: s.store, st: st, srv: s, cr: ver}
	reg.codec = &storageCodec{res: reg.res, fields: st.fieldSet, cr: ver}
	var err error
	if reg.fms, err = fieldManagers(reg.res, st, ver.TypeConverter(), ver); err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	reg.cache = storage.NewCacher(s.store, storage.CacherConfig{
		Resource: regKey(reg.res), Prefix: res.EtcdPrefix(), Codec: reg.codec,
		BookmarkInterval: s.cfg.BookmarkInterval, Log: s.log,
	})
	ctx, cancel := context.WithCancel(s.bgCtx)
	reg.stop = cancel
	s.bg.Add(1)
	go func() { defer s.bg.Done(); reg.cache.Run(ctx) }()
	return reg, nil
}

// decode decodes a create or update body of the registry's kind. Custom
// resources are decoded as upstream's CRD handler does: JSON or YAML only,
// apiVersion and kind checked (another version of the group is
// converted), unknown fields pruned and reported under fieldValidation,
// defaults applied.
func (r *registry) decode(body []byte, contentType, directive string) (runtime.Object, []string, error) {
	if r.cr == nil {
		return decodeObject(r.res, body, contentType, directive)
	}
	if mediaType(contentType) == protobufType {
		return nil, nil, apierrors.NewGenericServerResponse(http.StatusUnsupportedMediaType, "", schemaGR, "",
			"the body of the request was in an unknown format - accepted media types include: application/json, application/yaml", 0, false)
	}
	if decode.IsJSON(body) {
		if err := checkDepth(body); err != nil {
			return nil, nil, apierrors.NewBadRequest(err.Error())
		}
	}
	m := map[string]any{}
	warnings, err := decode.Decode(body, &m, directive)
	if err != nil {
		return nil, nil, apierrors.NewBadRequest(err.Error())
	}
	u := &unstructured.Unstructured{Object: m}
	gvk := u.GroupVersionKind()
	if gvk.Kind == "" {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("Object 'Kind' is missing in '%s'", strings.TrimSpace(string(body))))
	}
	if u.GetAPIVersion() == "" {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("Object 'apiVersion' is missing in '%s'", strings.TrimSpace(string(body))))
	}
	want := r.res.GroupVersionKind()
	if gvk.Group != want.Group || gvk.Kind != want.Kind {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("the API version in the data (%s) does not match the expected API version (%s)", u.GetAPIVersion(), want.GroupVersion()))
	}
	if err := r.cr.Convert(u); err != nil {
		return nil, nil, apierrors.NewBadRequest(err.Error())
	}
	unknown, err := r.cr.Coerce(u, false)
	if err != nil {
		return nil, nil, apierrors.NewBadRequest(err.Error())
	}
	if len(unknown) > 0 && directive != decode.Ignore {
		fs := make([]string, len(unknown))
		for i, p := range unknown {
			fs[i] = fmt.Sprintf("unknown field %q", p)
		}
		if directive == decode.Strict {
			return nil, nil, apierrors.NewBadRequest((&decode.StrictError{Fields: append(warnings, fs...)}).Error())
		}
		warnings = append(warnings, fs...)
	}
	r.cr.Default(u)
	return u, warnings, nil
}

// encode marshals obj for storage: without resourceVersion, with apiVersion
// and kind; custom resources in their CRD's storage version.
func (r *registry) encode(obj runtime.Object) ([]byte, error) {
	if r.cr == nil {
		return encodeForStorage(r.res, obj, r.srv == nil || r.srv.cfg.StorageMediaType != "application/json")
	}
	u := obj.(*unstructured.Unstructured)
	c := &unstructured.Unstructured{Object: make(map[string]any, len(u.Object))}
	for k, v := range u.Object {
		c.Object[k] = v
	}
	if md, ok := u.Object["metadata"].(map[string]any); ok {
		m := make(map[string]any, len(md))
		for k, v := range md {
			if k != "resourceVersion" {
				m[k] = v
			}
		}
		c.Object["metadata"] = m
	}
	if err := r.cr.ConvertTo(c, r.cr.StorageGV); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("convert to the storage version %s: %w", r.cr.StorageGV, err))
	}
	c.SetKind(r.cr.Kind)
	if md, ok := c.Object["metadata"].(map[string]any); ok {
		delete(md, "resourceVersion")
	}
	return json.Marshal(c.Object)
}

// decodeCustom reads a stored custom resource in the registry's version:
// converted, coerced (invalid metadata dropped) and defaulted, as upstream
// reads them.
func (c *storageCodec) decodeCustom(key string, value []byte, rev int64) (*storage.Object, error) {
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(value); err != nil {
		return nil, fmt.Errorf("decode %s: %w", key, err)
	}
	if err := c.cr.Convert(u); err != nil {
		return nil, fmt.Errorf("decode %s: %w", key, err)
	}
	if _, err := c.cr.Coerce(u, true); err != nil {
		return nil, fmt.Errorf("decode %s: %w", key, err)
	}
	c.cr.Default(u)
	u.SetResourceVersion(strconv.FormatInt(rev, 10))
	enc, err := json.Marshal(u.Object)
	if err != nil {
		return nil, err
	}
	return &storage.Object{Key: key, Rev: rev, Obj: u, JSON: enc, Labels: labels.Set(u.GetLabels()), Fields: c.fields(u)}, nil
}

var crdGVR = apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")

func crdKey() string { return regKey(&catalog.Resource{GroupVersionResource: crdGVR}) }

// table renders obj as a Table: custom resources with their CRD version's
// additionalPrinterColumns (apiextensions-apiserver's table convertor),
// everything else with the built-in printers.
func (r *registry) table(req *http.Request, obj runtime.Object, noHeaders bool) (*metav1.Table, error) {
	if r == nil || r.cr == nil {
		return tableFor(req, obj, noHeaders)
	}
	if !tableVersionServed(req) {
		return nil, errNoTable
	}
	if _, isStatus := obj.(*metav1.Status); isStatus {
		return nil, errNoTable
	}
	t, err := r.cr.Table(req.Context(), obj, &metav1.TableOptions{NoHeaders: noHeaders})
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	t.TypeMeta = metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "Table"}
	policy := includeObjectPolicy(req)
	for i := range t.Rows {
		switch policy {
		case metav1.IncludeNone:
			t.Rows[i].Object = runtime.RawExtension{}
		case metav1.IncludeMetadata:
			if o := t.Rows[i].Object.Object; o != nil {
				t.Rows[i].Object = runtime.RawExtension{Object: partialOf(o)}
			}
		}
	}
	return t, nil
}

// metaOfUnstructured is the ObjectMeta of an unstructured object.
func metaOfUnstructured(u *unstructured.Unstructured) metav1.ObjectMeta {
	var om metav1.ObjectMeta
	if md, ok := u.Object["metadata"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(md, &om)
	}
	return om
}

// customAccept drops protobuf from a request's Accept header: custom
// resources have no protobuf encoding, so (as upstream) clients that also
// take JSON get JSON, and it reports false when nothing acceptable is left
// (406).
func customAccept(r *http.Request) bool {
	acc := r.Header.Get("Accept")
	if !strings.Contains(acc, protobufType) {
		return true
	}
	var keep []string
	for _, part := range strings.Split(acc, ",") {
		if mt, _, _ := strings.Cut(strings.TrimSpace(part), ";"); mt == protobufType {
			continue
		}
		keep = append(keep, strings.TrimSpace(part))
	}
	if len(keep) == 0 {
		return false
	}
	r.Header.Set("Accept", strings.Join(keep, ", "))
	return true
}

// paramGV is the group version query parameters are decoded from: the
// resource's, or meta/v1's for custom resources (their group versions are
// not in the scheme; upstream registers the options unversioned).
func (r *registry) paramGV() schema.GroupVersion {
	if r.cr != nil {
		return schema.GroupVersion{Version: "v1"}
	}
	return r.res.GroupVersion()
}

// scaleOf is the autoscaling/v1 Scale of an object: built-in kinds', or a
// custom resource's from its CRD's scale paths (specReplicasPath,
// statusReplicasPath, labelSelectorPath), as upstream.
func (r *registry) scaleOf(obj runtime.Object) (*autoscalingv1.Scale, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || r.cr == nil || r.cr.Scale == nil {
		return scaleOf(obj)
	}
	sp := r.cr.Scale
	spec, _, err := unstructured.NestedInt64(u.Object, jsonPath(sp.SpecReplicasPath)...)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("%s: %w", sp.SpecReplicasPath, err))
	}
	status, _, _ := unstructured.NestedInt64(u.Object, jsonPath(sp.StatusReplicasPath)...)
	selector := ""
	if sp.LabelSelectorPath != nil {
		selector, _, _ = unstructured.NestedString(u.Object, jsonPath(*sp.LabelSelectorPath)...)
	}
	return &autoscalingv1.Scale{
		TypeMeta: metav1.TypeMeta{Kind: "Scale", APIVersion: "autoscaling/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace(), UID: u.GetUID(),
			ResourceVersion: u.GetResourceVersion(), CreationTimestamp: u.GetCreationTimestamp()},
		Spec:   autoscalingv1.ScaleSpec{Replicas: int32(spec)},
		Status: autoscalingv1.ScaleStatus{Replicas: int32(status), Selector: selector},
	}, nil
}

// setReplicas writes a scale's replicas into the object.
func (r *registry) setReplicas(obj runtime.Object, n int32) {
	if u, ok := obj.(*unstructured.Unstructured); ok && r.cr != nil && r.cr.Scale != nil {
		_ = unstructured.SetNestedField(u.Object, int64(n), jsonPath(r.cr.Scale.SpecReplicasPath)...)
		return
	}
	setReplicas(obj, n)
}

// jsonPath splits a CRD's simple JSON path (".spec.replicas").
func jsonPath(p string) []string { return strings.Split(strings.TrimPrefix(p, "."), ".") }
