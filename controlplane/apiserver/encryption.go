package apiserver

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
	"sigs.k8s.io/yaml"
)

// loadEncryption reads --encryption-provider-config with k8s.io/apiserver's
// encryptionconfig (upstream's EncryptionConfiguration format and
// validation): aescbc, aesgcm, secretbox and identity providers, the first
// of a resource's providers writing and every one reading. KMS providers
// (v1 and v2) need an external plugin Waggle does not run and are refused.
// The result maps a storage key to its resource's transformer.
func (s *Server) loadEncryption(ctx context.Context, path string) (func(key string) value.Transformer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--encryption-provider-config: %w", err)
	}
	var probe apiserverv1.EncryptionConfiguration
	if err := yaml.Unmarshal(data, &probe); err == nil {
		for _, r := range probe.Resources {
			for _, p := range r.Providers {
				if p.KMS != nil {
					return nil, fmt.Errorf("--encryption-provider-config %s: provider kms (%q) for %v is not supported by Waggle: use aescbc, aesgcm or secretbox (KMS v1/v2 need an external plugin)",
						path, p.KMS.Name, r.Resources)
				}
			}
		}
	}
	ec, err := encryptionconfig.LoadEncryptionConfig(ctx, path, false, s.cfg.NodeName)
	if err != nil {
		return nil, fmt.Errorf("--encryption-provider-config %s: %w", path, err)
	}
	tf := encryptionconfig.StaticTransformers(ec.Transformers)
	var byResource sync.Map // storage resource name → value.Transformer
	return func(key string) value.Transformer {
		res, ok := strings.CutPrefix(key, "/registry/")
		if !ok {
			return nil
		}
		if i := strings.IndexByte(res, '/'); i >= 0 {
			res = res[:i]
		}
		if t, ok := byResource.Load(res); ok {
			return t.(value.Transformer)
		}
		gr, ok := s.storageGroupResource(res)
		if !ok {
			// Not a served kind (the health key, allocator state): as
			// upstream, only resources are encrypted.
			return nil
		}
		t := tf.TransformerForResource(gr)
		byResource.Store(res, t)
		return t
	}, nil
}

// storageGroupResource finds the group of the resource stored under
// /registry/<res>/.
func (s *Server) storageGroupResource(res string) (schema.GroupResource, bool) {
	for _, r := range s.catalog.All() {
		if gvr := r.StorageResource(); gvr.Resource == res {
			return gvr.GroupResource(), true
		}
	}
	return schema.GroupResource{}, false
}
