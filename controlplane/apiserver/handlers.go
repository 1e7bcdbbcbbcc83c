package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/waggle-io/waggle/controlplane/apiserver/authz"
	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/decode"
	"github.com/waggle-io/waggle/controlplane/apiserver/printers"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation/field"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// createOnUpdate lists the resources whose PUT creates a missing object,
// as in kube-apiserver.
var createOnUpdate = map[string]bool{"endpoints": true, "events": true, "leases": true}

// request is one parsed resource request.
type request struct {
	reg       *registry
	verb      string
	ns, name  string
	sub       string
	proxyPath string
}

func (s *Server) resourceHandler() http.Handler {
	return http.HandlerFunc(s.serveResource)
}

func (s *Server) serveResource(w http.ResponseWriter, r *http.Request) {
	a := authz.AttributesFrom(r, nil)
	reg := s.lookupRegistry(a.APIGroup + "/" + a.APIVersion + "/" + a.Resource)
	if p := strings.Split(strings.Trim(r.URL.Path, "/"), "/"); (len(p) == 2 && p[0] == "api") || (len(p) == 3 && p[0] == "apis") {
		// /api/v1/ and /apis/<group>/<version>/: the version's discovery.
		s.discovery.ServeHTTP(w, r)
		return
	}
	if reg == nil || !a.ResourceRequest {
		writeStatus(w, errPathNotFound(), notFoundGR, "")
		return
	}
	if reg.cr != nil {
		if !customAccept(r) {
			writeStatus(w, errNotAcceptable(), reg.gr, "")
			return
		}
		if reg.cr.Warning != "" {
			// A deprecated version: every request is told, as upstream.
			warn(w, []string{reg.cr.Warning})
		}
	}
	req := &request{reg: reg, verb: a.Verb, ns: a.Namespace, name: a.Name, sub: a.Subresource}
	if !reg.res.Namespaced {
		if a.Namespace != "" && reg.res.Resource != "namespaces" {
			writeStatus(w, errPathNotFound(), notFoundGR, "")
			return
		}
		req.ns = ""
	}
	// A list narrowed by metadata.name has Name set by AttributesFrom; the
	// URL decides whether this is a collection request.
	if a.Verb == "list" || a.Verb == "watch" || a.Verb == "deletecollection" {
		req.name = urlName(r.URL.Path, reg.res.Resource)
	}
	if req.sub != "" {
		if _, ok := reg.res.Sub(req.sub); !ok {
			writeStatus(w, errPathNotFound(), notFoundGR, "")
			return
		}
		if req.sub == "proxy" {
			if i := strings.Index(r.URL.Path, "/"+req.name+"/proxy"); i >= 0 {
				req.proxyPath = strings.TrimPrefix(r.URL.Path[i+len("/"+req.name+"/proxy"):], "/")
			}
		}
	}
	if reg.res.Namespaced && req.ns == "" && (a.Verb == "create" || req.name != "") {
		writeStatus(w, apierrors.NewBadRequest("a namespace is required for "+reg.res.Resource), reg.gr, req.name)
		return
	}
	ctx := withWarnings(r.Context(), w)
	var err error
	switch {
	case reg.res.Virtual && reg.res.Group == "" && (reg.res.Resource == "bindings" || reg.res.Resource == "componentstatuses"):
		err = s.serveCoreVirtual(ctx, w, r, req, a.Verb)
	case reg.res.Virtual && reg.res.Group == metricsv1beta1.GroupName:
		err = s.serveMetrics(ctx, w, r, req, a.Verb)
	case reg.res.Virtual:
		err = s.serveVirtual(ctx, w, r, req)
	case req.sub == "scale":
		err = s.serveScale(ctx, w, r, req)
	case req.sub == "binding" && r.Method == http.MethodPost:
		err = s.serveBinding(ctx, w, r, req)
	case req.sub == "token" && r.Method == http.MethodPost && reg.res.Resource == "serviceaccounts":
		err = s.serveTokenRequest(ctx, w, r, req)
	case req.sub == "eviction" && r.Method == http.MethodPost:
		err = s.serveEviction(ctx, w, r, req)
	case req.sub == "log" || req.sub == "exec" || req.sub == "proxy" || req.sub == "attach" || req.sub == "portforward":
		err = s.serveConnect(ctx, w, r, req)
	case req.sub == "finalize" && r.Method == http.MethodPut:
		err = s.serveUpdate(ctx, w, r, req)
	case (req.sub == "ephemeralcontainers" || req.sub == "resize") && a.Verb == "get":
		err = s.serveGet(ctx, w, r, req)
	case (req.sub == "ephemeralcontainers" || req.sub == "resize") && a.Verb == "update":
		err = s.serveUpdate(ctx, w, r, req)
	case (req.sub == "ephemeralcontainers" || req.sub == "resize") && a.Verb == "patch":
		err = s.servePatch(ctx, w, r, req)
	case req.sub != "" && req.sub != "status" && req.sub != "approval":
		err = apierrors.NewMethodNotSupported(reg.gr, r.Method)
	case a.Verb == "get":
		err = s.serveGet(ctx, w, r, req)
	case a.Verb == "list":
		err = s.serveList(ctx, w, r, req)
	case a.Verb == "watch":
		err = s.serveWatch(ctx, w, r, req)
	case a.Verb == "create" && req.sub == "" && req.name == "":
		err = s.serveCreate(ctx, w, r, req)
	case a.Verb == "update" && req.name != "":
		err = s.serveUpdate(ctx, w, r, req)
	case a.Verb == "patch" && req.name != "":
		err = s.servePatch(ctx, w, r, req)
	case a.Verb == "delete" && req.sub == "":
		err = s.serveDelete(ctx, w, r, req)
	case a.Verb == "deletecollection":
		if !contains(reg.res.Verbs, "deletecollection") {
			err = apierrors.NewMethodNotSupported(reg.gr, "deletecollection")
		} else {
			err = s.serveDeleteCollection(ctx, w, r, req)
		}
	default:
		err = apierrors.NewMethodNotSupported(reg.gr, r.Method)
	}
	if err != nil {
		writeStatus(w, err, reg.gr, req.name)
	}
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// urlName returns the object name in a resource URL, if any.
func urlName(path, resource string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := len(parts) - 2; i >= 0; i-- {
		if parts[i] == resource {
			if resource == "namespaces" && i+2 < len(parts) {
				continue
			}
			return parts[i+1]
		}
	}
	return ""
}

// readBody reads a request body (already capped by limitBody).
func readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, apierrors.NewBadRequest("the request has no body")
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("limit is %d", MaxBodyBytes))
		}
		return nil, apierrors.NewBadRequest("reading the request body: " + err.Error())
	}
	return b, nil
}

func parseWriteOpts(r *http.Request) (writeOpts, string, error) {
	q := r.URL.Query()
	wo := writeOpts{}
	for _, v := range q["dryRun"] {
		if v != metav1.DryRunAll {
			return wo, "", apierrors.NewBadRequest(fmt.Sprintf("unsupported dryRun value %q (only %q)", v, metav1.DryRunAll))
		}
		wo.dryRun = true
	}
	fv := q.Get("fieldValidation")
	switch fv {
	case "", decode.Strict, decode.Warn, decode.Ignore:
	default:
		return wo, "", apierrors.NewBadRequest(fmt.Sprintf("fieldValidation must be one of Strict, Warn, Ignore, not %q", fv))
	}
	if errs := metav1validation.ValidateFieldManager(q.Get("fieldManager"), field.NewPath("fieldManager")); len(errs) > 0 {
		kind := map[string]string{http.MethodPost: "CreateOptions", http.MethodPut: "UpdateOptions", http.MethodPatch: "PatchOptions"}[r.Method]
		return wo, "", apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: kind}, "", errs)
	}
	wo.manager = fieldManagerName(q.Get("fieldManager"), r.UserAgent())
	return wo, fv, nil
}

// warn adds Warning headers as kube-apiserver writes them (299, agent
// "-", the text as an escaped quoted-string, which client-go unquotes).
func warn(w http.ResponseWriter, warnings []string) {
	for _, m := range warnings {
		h, err := utilnet.NewWarningHeader(299, "-", m)
		if err != nil {
			h = `299 - "` + strings.ReplaceAll(strings.ReplaceAll(m, `\`, `\\`), `"`, `\"`) + `"`
		}
		w.Header().Add("Warning", h)
	}
}

// writeJSON writes raw JSON with a code.
func writeJSON(w http.ResponseWriter, code int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(b)
}

// writeObject writes obj (with apiVersion and kind) or, when the client
// asked for it, its Table.
func (s *Server) writeObject(w http.ResponseWriter, r *http.Request, reg *registry, code int, obj runtime.Object) error {
	if wantsPartial(r) && reg != nil && !meta.IsListType(obj) {
		if _, isStatus := obj.(*metav1.Status); !isStatus {
			b, err := json.Marshal(partialOf(obj))
			if err != nil {
				return err
			}
			writeJSON(w, code, b)
			return nil
		}
	}
	if wantsTable(r) && (reg == nil || !reg.res.Virtual || printers.Has(obj)) {
		if t, err := reg.table(r, obj, false); err == nil {
			b, err := json.Marshal(t)
			if err != nil {
				return err
			}
			writeJSON(w, code, b)
			return nil
		} else if !errors.Is(err, errNoTable) {
			return err
		}
		if !acceptsPlain(r) {
			return errNotAcceptable()
		}
	}
	if reg != nil {
		if meta.IsListType(obj) {
			obj.GetObjectKind().SetGroupVersionKind(reg.res.GroupVersion().WithKind(reg.res.ListKind))
		} else {
			obj.GetObjectKind().SetGroupVersionKind(reg.res.GroupVersionKind())
		}
	}
	if wantsProtobuf(r) {
		return writeProtobuf(w, code, obj)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	writeJSON(w, code, b)
	return nil
}

// wantsProtobuf reports whether the client prefers Kubernetes protobuf
// (client-go's typed clients: Accept: application/vnd.kubernetes.protobuf,
// application/json) for a plain object, not a Table or metadata.
func wantsProtobuf(r *http.Request) bool {
	first, _, _ := strings.Cut(r.Header.Get("Accept"), ",")
	mt, params, err := mime.ParseMediaType(strings.TrimSpace(first))
	return err == nil && mt == protobufType && params["as"] == ""
}

// writeProtobuf writes obj in Kubernetes' protobuf envelope. Types without
// a protobuf encoding fall back to JSON.
func writeProtobuf(w http.ResponseWriter, code int, obj runtime.Object) error {
	var buf bytes.Buffer
	if err := protobufCodec.Encode(obj, &buf); err != nil {
		b, jerr := json.Marshal(obj)
		if jerr != nil {
			return jerr
		}
		writeJSON(w, code, b)
		return nil
	}
	w.Header().Set("Content-Type", protobufType)
	w.WriteHeader(code)
	w.Write(buf.Bytes())
	return nil
}

func (s *Server) serveGet(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	rv := r.URL.Query().Get("resourceVersion")
	o, err := req.reg.get(ctx, req.ns, req.name, rv)
	if err != nil {
		return err
	}
	if wantsTable(r) || wantsPartial(r) {
		return s.writeObject(w, r, req.reg, http.StatusOK, o.Obj.DeepCopyObject())
	}
	if wantsProtobuf(r) {
		// The cached object is shared: encoding only reads it.
		return writeProtobuf(w, http.StatusOK, o.Obj)
	}
	j, err := o.EncodedJSON()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, j)
	return nil
}

func listOptions(r *http.Request, reg *registry) (*metav1.ListOptions, error) {
	opts := &metav1.ListOptions{}
	if err := catalog.ParameterCodec.DecodeParameters(r.URL.Query(), reg.paramGV(), opts); err != nil {
		return nil, apierrors.NewBadRequest("invalid list options: " + err.Error())
	}
	// kube-apiserver's checks of resourceVersionMatch and
	// sendInitialEvents (WatchList on, as in 1.37): 422 on ListOptions.
	iv := &metainternalversion.ListOptions{Watch: opts.Watch, ResourceVersion: opts.ResourceVersion,
		ResourceVersionMatch: opts.ResourceVersionMatch, Continue: opts.Continue, SendInitialEvents: opts.SendInitialEvents}
	if errs := metainternalversionvalidation.ValidateListOptions(iv, true); len(errs) > 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	return opts, nil
}

func (s *Server) serveList(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	opts, err := listOptions(r, req.reg)
	if err != nil {
		return err
	}
	res, err := req.reg.list(ctx, req.ns, opts)
	if err != nil {
		return err
	}
	if wantsPartial(r) {
		pl := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadataList"},
			ListMeta: metav1.ListMeta{ResourceVersion: strconv.FormatInt(res.rev, 10), Continue: res.cont, RemainingItemCount: res.remain}, Items: []metav1.PartialObjectMetadata{}}
		for _, o := range res.items {
			pl.Items = append(pl.Items, *partialOf(o.Obj))
		}
		b, err := json.Marshal(pl)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, b)
		return nil
	}
	if wantsProtobuf(r) && !wantsTable(r) {
		list := req.reg.res.NewList()
		objs := make([]runtime.Object, len(res.items))
		for i, o := range res.items {
			objs[i] = o.Obj
		}
		if err := setListItems(list, objs); err != nil {
			return err
		}
		lm := list.(metav1.ListInterface)
		lm.SetResourceVersion(strconv.FormatInt(res.rev, 10))
		lm.SetContinue(res.cont)
		lm.SetRemainingItemCount(res.remain)
		list.GetObjectKind().SetGroupVersionKind(req.reg.res.GroupVersion().WithKind(req.reg.res.ListKind))
		return writeProtobuf(w, http.StatusOK, list)
	}
	if wantsTable(r) {
		list := req.reg.res.NewList()
		objs := make([]runtime.Object, len(res.items))
		for i, o := range res.items {
			objs[i] = o.Obj
		}
		if err := setListItems(list, objs); err != nil {
			return err
		}
		lm := list.(metav1.ListInterface)
		lm.SetResourceVersion(strconv.FormatInt(res.rev, 10))
		lm.SetContinue(res.cont)
		lm.SetRemainingItemCount(res.remain)
		return s.writeObject(w, r, req.reg, http.StatusOK, list)
	}
	items := make([][]byte, len(res.items))
	for i, o := range res.items {
		j, err := o.EncodedJSON()
		if err != nil {
			return err
		}
		items[i] = j
	}
	writeJSON(w, http.StatusOK, listJSON(req.reg.res, items, res.rev, res.cont, res.remain))
	return nil
}

// bodyMediaTypes are the media types a create or update body may have, as
// kube-apiserver serves them (no Content-Type means JSON).
var bodyMediaTypes = map[string]bool{"": true, "application/json": true, "application/yaml": true, protobufType: true}

// checkContentType refuses a body in a format the server does not decode
// with 415, before reading it.
func checkContentType(r *http.Request) error {
	if ct := r.Header.Get("Content-Type"); !bodyMediaTypes[mediaType(ct)] {
		return apierrors.NewGenericServerResponse(http.StatusUnsupportedMediaType, strings.ToLower(r.Method), schemaGR, "",
			fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, %s", protobufType), 0, false)
	}
	return nil
}

// decodeWrite reads a create or update: its write options, then its body
// decoded under the request's fieldValidation directive.
func decodeWrite(r *http.Request, req *request) (runtime.Object, writeOpts, []string, error) {
	wo, fv, err := parseWriteOpts(r)
	if err != nil {
		return nil, wo, nil, err
	}
	if err := checkContentType(r); err != nil {
		return nil, wo, nil, err
	}
	body, err := readBody(r)
	if err != nil {
		return nil, wo, nil, err
	}
	obj, warnings, err := req.reg.decode(body, r.Header.Get("Content-Type"), fv)
	return obj, wo, warnings, err
}

func (s *Server) serveCreate(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	obj, wo, warnings, err := decodeWrite(r, req)
	if err != nil {
		return err
	}
	out, err := req.reg.create(ctx, req.ns, obj, wo)
	if err != nil {
		return err
	}
	warn(w, warnings)
	return s.writeObject(w, r, req.reg, http.StatusCreated, out)
}

func (s *Server) serveUpdate(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	obj, wo, warnings, err := decodeWrite(r, req)
	if err != nil {
		return err
	}
	out, err := req.reg.guaranteedUpdate(ctx, req.ns, req.name, req.sub, wo, func(runtime.Object) (runtime.Object, error) {
		return obj.DeepCopyObject(), nil
	})
	if apierrors.IsNotFound(err) && req.sub == "" && createOnUpdate[req.reg.res.Resource] && objectMeta(obj).GetResourceVersion() == "" {
		// As kube-apiserver for these resources: PUT creates.
		if m := objectMeta(obj); m.GetName() == "" {
			m.SetName(req.name)
		} else if m.GetName() != req.name {
			return apierrors.NewBadRequest("the name of the object does not match the name on the URL")
		}
		if out, err = req.reg.create(ctx, req.ns, obj, wo); err != nil {
			return err
		}
		warn(w, warnings)
		return s.writeObject(w, r, req.reg, http.StatusCreated, out)
	}
	if err != nil {
		return err
	}
	warn(w, warnings)
	return s.writeObject(w, r, req.reg, http.StatusOK, out)
}

func deleteOptions(r *http.Request, reg *registry) (*metav1.DeleteOptions, writeOpts, error) {
	opts := &metav1.DeleteOptions{}
	wo, _, err := parseWriteOpts(r)
	if err != nil {
		return nil, wo, err
	}
	body, err := readBody(r)
	if err != nil && r.Body != nil {
		return nil, wo, err
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if _, err := decodeInto(body, opts, r.Header.Get("Content-Type"), decode.Ignore); err != nil {
			return nil, wo, err
		}
	}
	q := r.URL.Query()
	if v := q.Get("gracePeriodSeconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, wo, apierrors.NewBadRequest("invalid gracePeriodSeconds")
		}
		opts.GracePeriodSeconds = &n
	}
	if v := q.Get("propagationPolicy"); v != "" {
		p := metav1.DeletionPropagation(v)
		opts.PropagationPolicy = &p
	}
	if v := q.Get("orphanDependents"); v != "" {
		b := v == "true"
		opts.OrphanDependents = &b
	}
	for _, d := range opts.DryRun {
		if d != metav1.DryRunAll {
			return nil, wo, apierrors.NewBadRequest(fmt.Sprintf("unsupported dryRun value %q", d))
		}
		wo.dryRun = true
	}
	if p := opts.PropagationPolicy; p != nil {
		switch *p {
		case metav1.DeletePropagationBackground, metav1.DeletePropagationForeground, metav1.DeletePropagationOrphan:
		default:
			return nil, wo, apierrors.NewBadRequest(fmt.Sprintf("propagationPolicy must be Orphan, Background or Foreground, not %q", *p))
		}
	}
	if opts.GracePeriodSeconds != nil && *opts.GracePeriodSeconds < 0 {
		return nil, wo, apierrors.NewBadRequest("gracePeriodSeconds must be >= 0")
	}
	return opts, wo, nil
}

func (s *Server) serveDelete(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	opts, wo, err := deleteOptions(r, req.reg)
	if err != nil {
		return err
	}
	obj, gone, err := req.reg.deleteObject(ctx, req.ns, req.name, opts, wo)
	if err != nil {
		return err
	}
	// 202 only for a deletion left pending with orphanDependents=false, as
	// upstream (kept for old clients): a graceful pod deletion or a
	// finalizer-held object is 200 with the object.
	code := http.StatusOK
	//nolint:staticcheck // OrphanDependents is deprecated; upstream still reads it here.
	if !gone && opts.OrphanDependents != nil && !*opts.OrphanDependents {
		code = http.StatusAccepted
	}
	return s.writeObject(w, r, req.reg, code, obj)
}

func (s *Server) serveDeleteCollection(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	opts, wo, err := deleteOptions(r, req.reg)
	if err != nil {
		return err
	}
	lopts, err := listOptions(r, req.reg)
	if err != nil {
		return err
	}
	lopts.ResourceVersion, lopts.Limit, lopts.Continue = "", 0, ""
	res, err := req.reg.list(ctx, req.ns, lopts)
	if err != nil {
		return err
	}
	var deleted []runtime.Object
	for _, o := range res.items {
		m := objectMeta(o.Obj)
		obj, _, err := req.reg.deleteObject(ctx, m.GetNamespace(), m.GetName(), opts, wo)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		deleted = append(deleted, obj)
	}
	list := req.reg.res.NewList()
	if err := setListItems(list, deleted); err != nil {
		return err
	}
	list.GetObjectKind().SetGroupVersionKind(req.reg.res.GroupVersion().WithKind(req.reg.res.ListKind))
	return s.writeObject(w, r, nil, http.StatusOK, list)
}

// setListItems fills a typed list's Items.
func setListItems(list runtime.Object, objs []runtime.Object) error {
	return metaSetList(list, objs)
}

func successStatus(code int) *metav1.Status {
	return &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess, Code: int32(code)}
}

func writeSuccess(w http.ResponseWriter, code int) {
	b, _ := json.Marshal(successStatus(code))
	writeJSON(w, code, b)
}

// serveBinding assigns a pod to a node (pods/binding), as the scheduler
// does: once only, and never for a pod being deleted.
func (s *Server) serveBinding(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var b corev1.Binding
	if _, err := decodeInto(body, &b, r.Header.Get("Content-Type"), decode.Ignore); err != nil {
		return err
	}
	return s.bindPod(ctx, w, r, req, &b)
}

// bindPod assigns the pod req names to the Binding's target node.
func (s *Server) bindPod(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, b *corev1.Binding) error {
	wo, _, err := parseWriteOpts(r)
	if err != nil {
		return err
	}
	if b.Target.Name == "" {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Binding").GroupKind(), req.name, fieldRequired("target", "name"))
	}
	if b.Name != "" && b.Name != req.name {
		return apierrors.NewBadRequest("the name of the binding does not match the pod's")
	}
	_, err = req.reg.guaranteedUpdate(ctx, req.ns, req.name, "binding", wo, func(cur runtime.Object) (runtime.Object, error) {
		pod := cur.(*corev1.Pod)
		if pod.DeletionTimestamp != nil {
			return nil, apierrors.NewConflict(req.reg.gr, req.name, errors.New("pod is being deleted, cannot be assigned to a host"))
		}
		if pod.Spec.NodeName != "" {
			return nil, apierrors.NewConflict(req.reg.gr, req.name, fmt.Errorf("pod %s is already assigned to node %q", req.name, pod.Spec.NodeName))
		}
		if b.UID != "" && b.UID != pod.UID {
			return nil, apierrors.NewConflict(req.reg.gr, req.name, errors.New("precondition failed: UID does not match"))
		}
		pod.Spec.NodeName = b.Target.Name
		for k, v := range b.Annotations {
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Annotations[k] = v
		}
		setPodCondition(pod, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
		pod.ResourceVersion = ""
		return pod, nil
	})
	if err != nil {
		return err
	}
	writeSuccess(w, http.StatusCreated)
	return nil
}

func setPodCondition(p *corev1.Pod, c corev1.PodCondition) {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == c.Type {
			p.Status.Conditions[i] = c
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, c)
}

// scaleOf builds the autoscaling/v1 Scale of a Deployment or ReplicaSet.
func scaleOf(obj runtime.Object) (*autoscalingv1.Scale, error) {
	var spec int32
	var status int32
	var sel *metav1.LabelSelector
	switch o := obj.(type) {
	case *appsv1.Deployment:
		if o.Spec.Replicas != nil {
			spec = *o.Spec.Replicas
		}
		status, sel = o.Status.Replicas, o.Spec.Selector
	case *appsv1.ReplicaSet:
		if o.Spec.Replicas != nil {
			spec = *o.Spec.Replicas
		}
		status, sel = o.Status.Replicas, o.Spec.Selector
	case *appsv1.StatefulSet:
		if o.Spec.Replicas != nil {
			spec = *o.Spec.Replicas
		}
		status, sel = o.Status.Replicas, o.Spec.Selector
	case *corev1.ReplicationController:
		if o.Spec.Replicas != nil {
			spec = *o.Spec.Replicas
		}
		status = o.Status.Replicas
		if len(o.Spec.Selector) > 0 {
			sel = &metav1.LabelSelector{MatchLabels: o.Spec.Selector}
		}
	default:
		return nil, fmt.Errorf("%T has no scale subresource", obj)
	}
	m := objectMeta(obj)
	selector := ""
	if sel != nil {
		if s, err := metav1.LabelSelectorAsSelector(sel); err == nil {
			selector = s.String()
		}
	}
	return &autoscalingv1.Scale{
		TypeMeta: metav1.TypeMeta{Kind: "Scale", APIVersion: "autoscaling/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: m.GetName(), Namespace: m.GetNamespace(), UID: m.GetUID(),
			ResourceVersion: m.GetResourceVersion(), CreationTimestamp: m.GetCreationTimestamp()},
		Spec:   autoscalingv1.ScaleSpec{Replicas: spec},
		Status: autoscalingv1.ScaleStatus{Replicas: status, Selector: selector},
	}, nil
}

func setReplicas(obj runtime.Object, n int32) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		o.Spec.Replicas = &n
	case *appsv1.ReplicaSet:
		o.Spec.Replicas = &n
	case *appsv1.StatefulSet:
		o.Spec.Replicas = &n
	case *corev1.ReplicationController:
		o.Spec.Replicas = &n
	}
}

func (s *Server) serveScale(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	switch r.Method {
	case http.MethodGet:
		o, err := req.reg.get(ctx, req.ns, req.name, "")
		if err != nil {
			return err
		}
		sc, err := req.reg.scaleOf(o.Obj)
		if err != nil {
			return err
		}
		return s.writeObject(w, r, nil, http.StatusOK, sc)
	case http.MethodPut, http.MethodPatch:
	default:
		return apierrors.NewMethodNotSupported(req.reg.gr, r.Method)
	}
	wo, fv, err := parseWriteOpts(r)
	if err != nil {
		return err
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var patchType string
	if r.Method == http.MethodPatch {
		patchType = mediaType(r.Header.Get("Content-Type"))
	}
	var result *autoscalingv1.Scale
	wo.fmSub = "scale"
	_, err = req.reg.guaranteedUpdate(ctx, req.ns, req.name, "", wo, func(cur runtime.Object) (runtime.Object, error) {
		sc, err := req.reg.scaleOf(cur)
		if err != nil {
			return nil, err
		}
		var want autoscalingv1.Scale
		if patchType != "" {
			cj, _ := json.Marshal(sc)
			pj, err := applyPatch(patchType, cj, body, &autoscalingv1.Scale{})
			if err != nil {
				return nil, err
			}
			if _, err := decode.Decode(pj, &want, decode.Ignore); err != nil {
				return nil, apierrors.NewBadRequest(err.Error())
			}
		} else {
			if _, err := decodeInto(body, &want, r.Header.Get("Content-Type"), fv); err != nil {
				return nil, err
			}
			if want.ResourceVersion != "" && want.ResourceVersion != sc.ResourceVersion {
				return nil, apierrors.NewConflict(autoscalingv1.Resource("scale"), req.name, errors.New("the object has been modified; please apply your changes to the latest version and try again"))
			}
		}
		if want.Spec.Replicas < 0 {
			return nil, apierrors.NewInvalid(autoscalingv1.SchemeGroupVersion.WithKind("Scale").GroupKind(), req.name, fieldInvalid(want.Spec.Replicas, "must be greater than or equal to 0", "spec", "replicas"))
		}
		req.reg.setReplicas(cur, want.Spec.Replicas)
		objectMeta(cur).SetResourceVersion("")
		return cur, nil
	})
	if err != nil {
		return err
	}
	o, err := req.reg.get(ctx, req.ns, req.name, "")
	if err != nil {
		return err
	}
	if result, err = req.reg.scaleOf(o.Obj); err != nil {
		return err
	}
	return s.writeObject(w, r, nil, http.StatusOK, result)
}

// serveConnect handles the subresources that reach the node (log, exec,
// proxy) through the connector, when one is configured.
func (s *Server) serveConnect(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	return s.connect(ctx, w, r, req)
}
