package apiserver_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

func encryptionConfig(t *testing.T, dir, name, providers string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	cfg := `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: ["secrets"]
    providers:
` + providers
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func aesKey(name string, b byte) string {
	return fmt.Sprintf("          - name: %s\n            secret: %s\n", name, base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)))
}

// TestSecretsEncryptedAtRest: with --encryption-provider-config a Secret is
// stored encrypted (the raw etcd value carries upstream's
// k8s:enc:<provider>:v1:<key>: prefix and not the data) while the API serves
// it decrypted; unconfigured resources stay as they were. Rotation as
// upstream documents it: add the new key first and keep the old one (old
// data still reads), re-write every Secret (kubectl replace), then drop the
// old key.
func TestSecretsEncryptedAtRest(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	data := t.TempDir()
	const plain = "hunter2-very-secret"
	for _, provider := range []string{"aescbc", "aesgcm", "secretbox"} {
		t.Run(provider, func(t *testing.T) {
			cfg := encryptionConfig(t, dir, provider+".yaml", "      - "+provider+":\n          keys:\n"+aesKey("k1", 1)+"      - identity: {}\n")
			srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) { c.EncryptionProviderConfig = cfg }})
			cs := kubernetes.NewForConfigOrDie(srv.Config)
			ctx := context.Background()
			if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"},
				StringData: map[string]string{"password": plain}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			raw := rawEtcd(t, srv, "/registry/secrets/default/s")
			if !strings.HasPrefix(raw, "k8s:enc:"+provider+":v1:k1:") || strings.Contains(raw, plain) || strings.Contains(raw, base64.StdEncoding.EncodeToString([]byte(plain))) {
				t.Fatalf("raw etcd value of the Secret: %.80q", raw)
			}
			got, err := cs.CoreV1().Secrets("default").Get(ctx, "s", metav1.GetOptions{})
			if err != nil || string(got.Data["password"]) != plain {
				t.Fatalf("GET the Secret: %v %q", err, got.Data)
			}
			if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"},
				Data: map[string]string{"k": "visible"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if raw := rawEtcd(t, srv, "/registry/configmaps/default/c"); !strings.Contains(raw, "visible") {
				t.Fatalf("a ConfigMap (not in the config) was transformed: %.80q", raw)
			}
		})
	}

	t.Run("rotation", func(t *testing.T) {
		ctx := context.Background()
		cfgPath := filepath.Join(dir, "rotate.yaml")
		write := func(providers string) {
			encryptionConfig(t, dir, "rotate.yaml", providers)
		}
		write("      - aescbc:\n          keys:\n" + aesKey("old", 1) + "      - identity: {}\n")
		start := func(addr string) *apiservertest.Server {
			return apiservertest.Start(t, apiservertest.Options{DataDir: data, Addr: addr, Configure: func(c *apiserver.Config) { c.EncryptionProviderConfig = cfgPath }})
		}
		srv := start("")
		addr := strings.TrimPrefix(srv.Config.Host, "https://")
		cs := kubernetes.NewForConfigOrDie(srv.Config)
		for _, n := range []string{"a", "b"} {
			if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: n},
				StringData: map[string]string{"password": plain}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		srv.Stop()

		// New key first, old key kept: old data reads, new writes use the new key.
		write("      - aescbc:\n          keys:\n" + aesKey("new", 2) + aesKey("old", 1) + "      - identity: {}\n")
		srv = start(addr)
		cs = kubernetes.NewForConfigOrDie(srv.Config)
		for _, n := range []string{"a", "b"} {
			if got, err := cs.CoreV1().Secrets("default").Get(ctx, n, metav1.GetOptions{}); err != nil || string(got.Data["password"]) != plain {
				t.Fatalf("read %s (old key) after adding the new key: %v", n, err)
			}
			if raw := rawEtcd(t, srv, "/registry/secrets/default/"+n); !strings.HasPrefix(raw, "k8s:enc:aescbc:v1:old:") {
				t.Fatalf("%s before the re-write: %.40q", n, raw)
			}
		}
		if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "c"},
			StringData: map[string]string{"password": plain}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if raw := rawEtcd(t, srv, "/registry/secrets/default/c"); !strings.HasPrefix(raw, "k8s:enc:aescbc:v1:new:") {
			t.Fatalf("a new Secret after rotation: %.40q", raw)
		}
		// Re-write unchanged Secrets: upstream's `kubectl get secrets -A -o
		// json | kubectl replace -f -` (an unchanged object written with an
		// old key is still rewritten).
		rewrite := func(name string) {
			if kc, err := exec.LookPath("kubectl"); err == nil {
				kubeconfig := filepath.Join(srv.DataDir, "admin.kubeconfig")
				get := exec.Command(kc, "--kubeconfig", kubeconfig, "get", "secret", name, "-o", "json")
				out, err := get.Output()
				if err != nil {
					t.Fatalf("kubectl get: %v", err)
				}
				rep := exec.Command(kc, "--kubeconfig", kubeconfig, "replace", "-f", "-")
				rep.Stdin = bytes.NewReader(out)
				if b, err := rep.CombinedOutput(); err != nil {
					t.Fatalf("kubectl replace: %v %s", err, b)
				}
				return
			}
			cur, err := cs.CoreV1().Secrets("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cs.CoreV1().Secrets("default").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		rewrite("a")
		rewrite("b")
		for _, n := range []string{"a", "b"} {
			if raw := rawEtcd(t, srv, "/registry/secrets/default/"+n); !strings.HasPrefix(raw, "k8s:enc:aescbc:v1:new:") {
				t.Fatalf("%s after the re-write: %.40q", n, raw)
			}
		}
		srv.Stop()

		// Old key dropped: everything still reads.
		write("      - aescbc:\n          keys:\n" + aesKey("new", 2) + "      - identity: {}\n")
		srv = start(addr)
		cs = kubernetes.NewForConfigOrDie(srv.Config)
		for _, n := range []string{"a", "b", "c"} {
			if got, err := cs.CoreV1().Secrets("default").Get(ctx, n, metav1.GetOptions{}); err != nil || string(got.Data["password"]) != plain {
				t.Fatalf("read %s after dropping the old key: %v", n, err)
			}
		}
	})
}

// TestBadEncryptionConfigStopsTheServer: a config the library rejects keeps
// the server from starting, with an error that names the flag and the
// problem.
func TestBadEncryptionConfigStopsTheServer(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	for name, tc := range map[string]struct{ providers, want string }{
		"short key":        {"      - aescbc:\n          keys:\n          - name: k\n            secret: c2hvcnQ=\n", "aescbc"},
		"not base64":       {"      - aesgcm:\n          keys:\n          - name: k\n            secret: '!!!'\n", "secret"},
		"no keys":          {"      - secretbox:\n          keys: []\n", "keys"},
		"kms":              {"      - kms:\n          apiVersion: v2\n          name: vault\n          endpoint: unix:///tmp/kms.sock\n", "not supported by Waggle"},
		"unknown provider": {"      - rot13: {}\n", "--encryption-provider-config"},
	} {
		t.Run(name, func(t *testing.T) {
			p := encryptionConfig(t, dir, strings.ReplaceAll(name, " ", "-")+".yaml", tc.providers)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv, err := apiserver.New(ctx, apiserver.Config{DataDir: t.TempDir(), EtcdUnsafeNoFsync: true, EncryptionProviderConfig: p})
			if err == nil {
				srv.Close()
				t.Fatal("the server started")
			}
			if !strings.Contains(err.Error(), "--encryption-provider-config") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to name the flag and %q", err, tc.want)
			}
		})
	}
	ctx := context.Background()
	if _, err := apiserver.New(ctx, apiserver.Config{DataDir: t.TempDir(), EncryptionProviderConfig: filepath.Join(dir, "missing.yaml")}); err == nil ||
		!strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("missing config file: %v", err)
	}
}

func rawEtcd(t *testing.T, srv *apiservertest.Server, key string) string {
	t.Helper()
	resp, err := srv.Store().Client().Get(context.Background(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("raw etcd get %s: %v %v", key, err, resp)
	}
	return string(resp.Kvs[0].Value)
}

// TestLostEncryptionKeyFailsOnlyThatResource: a Secret written with a key
// the encryption config no longer holds cannot be decrypted; as upstream,
// the server still becomes ready and only reads that touch that value fail
// (500 InternalError), while other Secrets and other resources are served
// and writes go on.
func TestLostEncryptionKeyFailsOnlyThatResource(t *testing.T) {
	testutil.Privileged(t)
	dir, data := t.TempDir(), t.TempDir()
	ctx := context.Background()
	cfgPath := encryptionConfig(t, dir, "lost.yaml", "      - aescbc:\n          keys:\n"+aesKey("old", 1)+"      - identity: {}\n")
	start := func(addr string) (*apiservertest.Server, kubernetes.Interface) {
		srv := apiservertest.Start(t, apiservertest.Options{DataDir: data, Addr: addr, Configure: func(c *apiserver.Config) { c.EncryptionProviderConfig = cfgPath }})
		return srv, kubernetes.NewForConfigOrDie(srv.Config)
	}
	srv, cs := start("")
	addr := strings.TrimPrefix(srv.Config.Host, "https://")
	if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "lost"},
		StringData: map[string]string{"password": "x"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	srv.Stop()

	// The old key is gone (no rotation): the server must still start.
	encryptionConfig(t, dir, "lost.yaml", "      - aescbc:\n          keys:\n"+aesKey("new", 2)+"      - identity: {}\n")
	srv, cs = start(addr)
	if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "fresh"},
		StringData: map[string]string{"password": "y"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create a Secret with the new key: %v", err)
	}
	if got, err := cs.CoreV1().Secrets("default").Get(ctx, "fresh", metav1.GetOptions{}); err != nil || string(got.Data["password"]) != "y" {
		t.Fatalf("get the new Secret: %v", err)
	}
	if _, err := cs.CoreV1().Secrets("default").Get(ctx, "lost", metav1.GetOptions{}); !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "transform") {
		t.Errorf("get the undecryptable Secret: %v, want 500 InternalError naming the transform", err)
	}
	if _, err := cs.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsInternalError(err) {
		t.Errorf("list Secrets: %v, want 500 InternalError", err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list ConfigMaps: %v", err)
	}
	if raw := rawEtcd(t, srv, "/registry/secrets/default/lost"); !strings.HasPrefix(raw, "k8s:enc:aescbc:v1:old:") {
		t.Errorf("the undecryptable Secret changed in etcd: %.40q", raw)
	}
	// readyz is green (apiservertest.Start waited for it); say so explicitly.
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		t.Errorf("/readyz: %v %s", err, body)
	}
}
