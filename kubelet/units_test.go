package kubelet

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/waggle-io/waggle/kubelet/network"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "x", "B": "y"}
	for in, want := range map[string]string{
		"plain":        "plain",
		"$(A)-$(B)":    "x-y",
		"$(MISSING)":   "$(MISSING)",
		"$$(A)":        "$(A)",
		"cost $5":      "cost $5",
		"open $(A":     "open $(A",
		"trailing $":   "trailing $",
		"$(A)$(A)$(B)": "xxy",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMakeEnvResolvesEverySource(t *testing.T) {
	cs := fake.NewSimpleClientset(
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "ns"}, Data: map[string]string{"k": "cmv", "ALL": "1"}},
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns"}, Data: map[string][]byte{"k": []byte("sv")}},
	)
	k := &Kubelet{client: cs, nodeIP: "192.0.2.1", nodeIPs: []string{"192.0.2.1"}}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"app": "x"}},
		Spec: v1.PodSpec{NodeName: "n1"}}
	c := &v1.Container{
		EnvFrom: []v1.EnvFromSource{{Prefix: "CM_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}}},
		Env: []v1.EnvVar{
			{Name: "NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "APP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "HOST", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
			{Name: "CMK", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "k"}}},
			{Name: "SK", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "s"}, Key: "k"}}},
			{Name: "OPT", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "none"}, Key: "k", Optional: ptrBool(true)}}},
			{Name: "MIX", Value: "$(NAME)@$(HOST)"},
		},
		Args: []string{"--name=$(NAME)"},
	}
	env, err := k.makeEnv(context.Background(), pod, c, &sandboxState{Sandbox: network.Sandbox{IPs: []string{"10.0.0.7"}}})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(env, " ")
	want := "CM_k=cmv CM_ALL=1 NAME=p APP=x IP=10.0.0.7 HOST=192.0.2.1 CMK=cmv SK=sv MIX=p@192.0.2.1"
	for _, w := range strings.Fields(want) {
		if !strings.Contains(" "+got+" ", " "+w+" ") {
			t.Errorf("env %q lacks %s", got, w)
		}
	}
	if strings.Contains(got, "OPT=") {
		t.Errorf("optional missing secret set OPT: %q", got)
	}
	if c.Args[0] != "--name=p" {
		t.Errorf("args not expanded: %v", c.Args)
	}
	// A missing required key is an error naming it.
	c2 := &v1.Container{Env: []v1.EnvVar{{Name: "X", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "nokey"}}}}}
	if _, err := k.makeEnv(context.Background(), pod, c2, nil); err == nil || !strings.Contains(err.Error(), "nokey") {
		t.Errorf("missing key: err = %v", err)
	}
}

func ptrBool(b bool) *bool { return &b }

func TestDecodeManifest(t *testing.T) {
	good := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: i\n"
	p, err := DecodeManifest([]byte(good), "n1", "/etc/manifests/web.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "web-n1" || p.Namespace != "default" || p.Spec.NodeName != "n1" || p.UID == "" || p.Annotations[AnnotationConfigSource] != "file" {
		t.Errorf("decoded = %s/%s node %s uid %s ann %v", p.Namespace, p.Name, p.Spec.NodeName, p.UID, p.Annotations)
	}
	again, _ := DecodeManifest([]byte(good), "n1", "/etc/manifests/web.yaml")
	if again.UID != p.UID {
		t.Error("the same manifest gave two UIDs")
	}
	other, _ := DecodeManifest([]byte(good), "n2", "/etc/manifests/web.yaml")
	if other.UID == p.UID {
		t.Error("two nodes gave the same UID")
	}
	for name, bad := range map[string]string{
		"not yaml":      "{{{",
		"no name":       "kind: Pod\nspec:\n  containers:\n  - name: c\n    image: i\n",
		"no containers": "kind: Pod\nmetadata:\n  name: x\n",
		"wrong kind":    "kind: Service\nmetadata:\n  name: x\n",
		"no image":      "kind: Pod\nmetadata:\n  name: x\nspec:\n  containers:\n  - name: c\n",
	} {
		if _, err := DecodeManifest([]byte(bad), "n1", "f"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzDecodeManifest(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: i\n"))
	f.Add([]byte(`{"kind":"Pod","metadata":{"name":"x"},"spec":{"containers":[{"name":"c","image":"i"}]}}`))
	f.Add([]byte("kind: Pod\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := DecodeManifest(data, "n1", "f")
		if err != nil {
			return
		}
		if p.Name == "" || p.Namespace == "" || len(p.Spec.Containers) == 0 || p.Spec.NodeName != "n1" || p.UID == "" {
			t.Fatalf("accepted an unusable pod: %+v", p)
		}
	})
}

func TestWriteConfigOnlyWhenAbsent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "net.d")
	wrote, err := network.WriteConfig(dir, netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("10.244.0.0/16"))
	if err != nil || !wrote {
		t.Fatalf("first write: %v %v", wrote, err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "10-waggle.conflist"))
	if !strings.Contains(string(b), `"podCIDR":"10.244.3.0/24"`) && !strings.Contains(string(b), `"podCIDR": "10.244.3.0/24"`) {
		t.Errorf("config = %s", b)
	}
	wrote, err = network.WriteConfig(dir, netip.MustParsePrefix("10.9.9.0/24"), netip.Prefix{})
	if err != nil || wrote {
		t.Errorf("second write: %v %v (must keep the existing config)", wrote, err)
	}
	if _, err := network.WriteConfig(filepath.Join(t.TempDir(), "x"), netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("10.9.0.0/16")); err == nil {
		t.Error("pod CIDR outside the cluster CIDR accepted")
	}
}
