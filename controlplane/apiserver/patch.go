package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"

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
	case types.ApplyYAMLPatchType, types.ApplyCBORPatchType:
		return nil, unsupportedPatch(patchType)
	}
	return nil, unsupportedPatch(patchType)
}

func unsupportedPatch(ct string) error {
	return apierrors.NewGenericServerResponse(http.StatusUnsupportedMediaType, "patch", schemaGR, "",
		fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json; got %q", ct), 0, false)
}

func (s *Server) servePatch(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	wo, fv, err := parseWriteOpts(r)
	if err != nil {
		return err
	}
	pt := mediaType(r.Header.Get("Content-Type"))
	switch types.PatchType(pt) {
	case types.JSONPatchType, types.MergePatchType, types.StrategicMergePatchType:
	default:
		return unsupportedPatch(pt)
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	if err := checkDepth(body); err != nil {
		return apierrors.NewBadRequest(err.Error())
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
		next, ws, err := decodeObject(req.reg.res, pj, "application/json", fv)
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
