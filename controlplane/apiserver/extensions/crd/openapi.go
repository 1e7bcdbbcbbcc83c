package crd

import (
	"encoding/json"
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// MergeOpenAPIV2 adds the served versions of crds to the built-in v2
// document (JSON), as upstream's openapi controller publishes them:
// builder.BuildOpenAPIV2 per version, merged with builder.MergeSpecs.
func MergeOpenAPIV2(static []byte, crds []*apiextensionsv1.CustomResourceDefinition) ([]byte, error) {
	if len(crds) == 0 {
		return static, nil
	}
	base := &spec.Swagger{}
	if err := json.Unmarshal(static, base); err != nil {
		return nil, fmt.Errorf("openapi v2: %w", err)
	}
	var specs []*spec.Swagger
	for _, crd := range crds {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			s, err := builder.BuildOpenAPIV2(crd, v.Name, builder.Options{V2: true, IncludeSelectableFields: true})
			if err != nil {
				return nil, fmt.Errorf("openapi v2 of %s %s: %w", crd.Name, v.Name, err)
			}
			specs = append(specs, s)
		}
	}
	merged, err := builder.MergeSpecs(base, specs...)
	if err != nil {
		return nil, fmt.Errorf("openapi v2: %w", err)
	}
	return json.Marshal(merged)
}

// OpenAPIV3 builds one v3 document per group version the served versions
// of crds make up (CRDs of one group version merged, as upstream).
func OpenAPIV3(crds []*apiextensionsv1.CustomResourceDefinition) (map[schema.GroupVersion][]byte, error) {
	byGV := map[schema.GroupVersion][]*spec3.OpenAPI{}
	for _, crd := range crds {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			s, err := builder.BuildOpenAPIV3(crd, v.Name, builder.Options{IncludeSelectableFields: true})
			if err != nil {
				return nil, fmt.Errorf("openapi v3 of %s %s: %w", crd.Name, v.Name, err)
			}
			gv := schema.GroupVersion{Group: crd.Spec.Group, Version: v.Name}
			byGV[gv] = append(byGV[gv], s)
		}
	}
	out := make(map[schema.GroupVersion][]byte, len(byGV))
	for gv, specs := range byGV {
		merged, err := builder.MergeSpecsV3(specs...)
		if err != nil {
			return nil, fmt.Errorf("openapi v3 %s: %w", gv, err)
		}
		b, err := json.Marshal(merged)
		if err != nil {
			return nil, err
		}
		out[gv] = b
	}
	return out, nil
}
