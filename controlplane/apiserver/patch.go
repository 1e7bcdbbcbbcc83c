package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/decode"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/yaml"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// maxJSONPatchOps bounds the operations of one JSON patch.
const maxJSONPatchOps = 10000

func mediaType(ct string) string {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return ct
	}
	return mt
}

// applyPatch applies a patch body of the given type to the current JSON.
// schema is a typed object of the patched kind (strategic merge needs it).
func applyPatch(patchType string, current, patch []byte, schema runtime.Object) ([]byte, error) {
	pj, err := toJSON(patch, patchType)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	switch types.PatchType(patchType) {
	case types.JSONPatchType:
		p, err := jsonpatch.DecodePatch(pj)
		if err != nil {
			return nil, apierrors.NewBadRequest("invalid JSON patch: " + err.Error())
		}
		if len(p) > maxJSONPatchOps {
			return nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("the JSON patch has %d operations, the limit is %d", len(p), maxJSONPatchOps))
		}
		out, err := p.Apply(current)
		if err != nil {
			return nil, apierrors.NewInvalid(schema.GetObjectKind().GroupVersionKind().GroupKind(), "", field.ErrorList{field.Invalid(field.NewPath(""), string(patch), err.Error())})
		}
		return out, nil
	case types.MergePatchType:
		out, err := jsonpatch.MergePatch(current, pj)
		if err != nil {
			return nil, apierrors.NewBadRequest("invalid merge patch: " + err.Error())
		}
		return out, nil
	case types.StrategicMergePatchType:
		out, err := strategicpatch.StrategicMergePatch(current, pj, schema)
		if err != nil {
			return nil, apierrors.NewBadRequest("invalid strategic merge patch: " + err.Error())
		}
		return out, nil
	}
	return nil, unsupportedPatch(patchType)
}

func unsupportedPatch(ct string) error {
	return apierrors.NewGenericServerResponse(http.StatusUnsupportedMediaType, "patch", schemaGR, "",
		fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got %q", ct), 0, false)
}

// patchOptions decodes and validates the PatchOptions of a request (force
// only with apply, fieldManager required for apply), as kube-apiserver.
func patchOptions(r *http.Request, req *request, pt types.PatchType) (*metav1.PatchOptions, error) {
	opts := &metav1.PatchOptions{}
	if err := catalog.ParameterCodec.DecodeParameters(r.URL.Query(), req.reg.paramGV(), opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if errs := metav1validation.ValidatePatchOptions(opts, pt); len(errs) > 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "PatchOptions"}, "", errs)
	}
	return opts, nil
}

// serveApply serves a server-side apply (application/apply-patch+yaml):
// the field manager merges the applied configuration into the live object
// (or a new one: apply creates), owning what it sets and answering 409
// with the conflicting managers and fields unless force is set.
func (s *Server) serveApply(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, wo writeOpts, fv string, body []byte, opts *metav1.PatchOptions) error {
	fm := req.reg.fms[req.sub]
	if fm == nil {
		return apierrors.NewMethodNotSupported(req.reg.gr, "apply")
	}
	applied := &unstructured.Unstructured{Object: map[string]any{}}
	// Integers stay integers (custom resources are validated as decoded).
	aj, err := yaml.YAMLToJSON(body)
	if err == nil {
		err = utiljson.Unmarshal(aj, &applied.Object)
	}
	if err != nil {
		return apierrors.NewBadRequest(fmt.Sprintf("error decoding patch: %v", err))
	}
	var warnings []string
	if fv == decode.Strict || fv == decode.Warn {
		if err := yaml.UnmarshalStrict(body, &map[string]any{}); err != nil {
			if fv == decode.Strict {
				return apierrors.NewBadRequest(fmt.Sprintf("error strict decoding patch: %v", err))
			}
			warnings = append(warnings, err.Error())
		}
	}
	force := opts.Force != nil && *opts.Force
	pinned := applied.GetResourceVersion() != ""
	wo.manager, wo.applied = opts.FieldManager, true
	merge := func(live runtime.Object) (runtime.Object, error) {
		var obj runtime.Object
		var err error
		fieldManagerStacks.do(func() { obj, err = fm.Apply(live, applied.DeepCopy(), opts.FieldManager, force) })
		if err != nil {
			// Conflicts and bad patches are Status errors; the rest (a
			// field the schema does not declare) answer 500, as upstream.
			return nil, err
		}
		if !pinned {
			objectMeta(obj).SetResourceVersion("")
		}
		if u, ok := obj.(*unstructured.Unstructured); ok && req.reg.cr != nil {
			// As a custom resource's other writes: pruned, defaulted.
			if _, err := req.reg.cr.Coerce(u, false); err != nil {
				return nil, apierrors.NewBadRequest(err.Error())
			}
			req.reg.cr.Default(u)
		}
		return obj, nil
	}
	for attempt := 0; ; attempt++ {
		out, err := req.reg.guaranteedUpdate(ctx, req.ns, req.name, req.sub, wo, merge)
		if err == nil {
			warn(w, warnings)
			return s.writeObject(w, r, req.reg, http.StatusOK, out)
		}
		if !apierrors.IsNotFound(err) || req.sub != "" || attempt > 3 {
			return err
		}
		// Apply to a missing object creates it.
		live := req.reg.res.New()
		live.GetObjectKind().SetGroupVersionKind(req.reg.res.GroupVersionKind())
		obj, err := merge(live)
		if err != nil {
			return err
		}
		m := objectMeta(obj)
		if m.GetName() == "" {
			m.SetName(req.name)
		} else if m.GetName() != req.name {
			return apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", m.GetName(), req.name))
		}
		if pinned {
			return apierrors.NewNotFound(req.reg.gr, req.name)
		}
		out, err = req.reg.create(ctx, req.ns, obj, wo)
		if apierrors.IsAlreadyExists(err) {
			continue // created meanwhile: apply to it
		}
		if err != nil {
			return err
		}
		warn(w, warnings)
		return s.writeObject(w, r, req.reg, http.StatusCreated, out)
	}
}

func (s *Server) servePatch(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	wo, fv, err := parseWriteOpts(r)
	if err != nil {
		return err
	}
	pt := mediaType(r.Header.Get("Content-Type"))
	switch types.PatchType(pt) {
	case types.JSONPatchType, types.MergePatchType, types.StrategicMergePatchType, types.ApplyYAMLPatchType:
	default:
		return unsupportedPatch(pt)
	}
	opts, err := patchOptions(r, req, types.PatchType(pt))
	if err != nil {
		return err
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	if err := checkDepth(body); err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	if types.PatchType(pt) == types.ApplyYAMLPatchType {
		return s.serveApply(ctx, w, r, req, wo, fv, body, opts)
	}
	var warnings []string
	out, err := req.reg.guaranteedUpdate(ctx, req.ns, req.name, req.sub, wo, func(cur runtime.Object) (runtime.Object, error) {
		// The patch applies to the current object; a resourceVersion in
		// the patch pins it (conflict if stale), otherwise conflicts retry.
		cj, err := json.Marshal(cur)
		if err != nil {
			return nil, err
		}
		pj, err := applyPatch(pt, cj, body, req.reg.res.New())
		if err != nil {
			return nil, err
		}
		next, ws, err := req.reg.decode(pj, "application/json", fv)
		if err != nil {
			return nil, err
		}
		warnings = ws
		// Keep the resourceVersion only when the patch set one.
		var probe struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		_ = json.Unmarshal(body, &probe)
		if probe.Metadata.ResourceVersion == "" {
			if m, err := meta.Accessor(next); err == nil {
				m.SetResourceVersion("")
			}
		}
		return next, nil
	})
	if err != nil {
		return err
	}
	warn(w, warnings)
	return s.writeObject(w, r, req.reg, http.StatusOK, out)
}
