package version

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The Kubernetes version Waggle claims must be the one of the k8s.io/api it
// is built on (k8s.io/api v0.X.Y is Kubernetes v1.X.Y).
func TestKubeGitVersionMatchesK8sAPIModule(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/api v0\.(\d+)\.(\d+)\s*$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod requires no k8s.io/api v0.X.Y")
	}
	want := "v1." + string(m[1]) + "." + string(m[2])
	if !strings.HasPrefix(KubeGitVersion, want+"+") {
		t.Fatalf("KubeGitVersion %q, but go.mod requires k8s.io/api for %s: want %s+waggle", KubeGitVersion, want, want)
	}
	if KubeMinor != string(m[1]) {
		t.Fatalf("KubeMinor %q, want %q", KubeMinor, m[1])
	}
}
