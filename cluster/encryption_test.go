package cluster

import (
	"context"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
)

// TestEnsureSecretsEncryption: `waggle up --secrets-encryption` writes one
// key, once (0600), in a file upstream's loader accepts, which encrypts
// Secrets with aescbc.
func TestEnsureSecretsEncryption(t *testing.T) {
	dir := t.TempDir()
	p, err := EnsureSecretsEncryption(dir)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := os.ReadFile(p)
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if p2, err := EnsureSecretsEncryption(dir); err != nil || p2 != p {
		t.Fatalf("second call: %v %s", err, p2)
	}
	if again, _ := os.ReadFile(p); string(again) != string(first) {
		t.Fatal("the key changed on the second start")
	}
	ec, err := encryptionconfig.LoadEncryptionConfig(context.Background(), p, false, "test")
	if err != nil {
		t.Fatal(err)
	}
	tr := encryptionconfig.StaticTransformers(ec.Transformers).TransformerForResource(schema.GroupResource{Resource: "secrets"})
	out, err := tr.TransformToStorage(context.Background(), []byte("x"), value.DefaultContext("/registry/secrets/a/b"))
	if err != nil || len(out) < 20 || string(out[:17]) != "k8s:enc:aescbc:v1" {
		t.Fatalf("transformed: %v %q", err, out)
	}
}
