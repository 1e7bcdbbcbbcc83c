package apiserver_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

type warnings struct {
	mu sync.Mutex
	l  []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.l = append(w.l, text)
}

func (w *warnings) take() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := strings.Join(w.l, "\n")
	w.l = nil
	return s
}

func privilegedPod(name string) *corev1.Pod {
	t := true
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:v1",
			SecurityContext: &corev1.SecurityContext{Privileged: &t}}}}}
}

// TestPodSecurityAdmission runs k8s.io/pod-security-admission through the
// API server: a privileged pod is refused in a restricted namespace with
// upstream's 403 and message (and not created), allowed with a warning in a
// warn=baseline namespace, allowed in an exempt namespace; relabelling a
// namespace warns about its existing pods; the cluster default comes from
// the configuration file.
func TestPodSecurityAdmission(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "podsecurity.yaml")
	os.WriteFile(conf, []byte(`apiVersion: pod-security.admission.config.k8s.io/v1
kind: PodSecurityConfiguration
defaults:
  enforce: baseline
  enforce-version: latest
exemptions:
  namespaces: ["exempt"]
`), 0o600)
	srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) { c.PodSecurityConfigFile = conf }})
	w := &warnings{}
	rc := rest.CopyConfig(srv.Config)
	rc.WarningHandler = w
	cs := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()
	mkns := func(name string, labels map[string]string) {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkns("restricted", map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	mkns("warned", map[string]string{"pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/warn": "baseline", "pod-security.kubernetes.io/warn-version": "v1.30"})
	mkns("plain", nil)
	mkns("exempt", nil)

	_, err := cs.CoreV1().Pods("restricted").Create(ctx, privilegedPod("priv"), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `pods "priv" is forbidden: violates PodSecurity "restricted:latest": privileged (container "c" must not set securityContext.privileged=true)`) {
		t.Fatalf("privileged pod in a restricted namespace: %v", err)
	}
	if _, err := cs.CoreV1().Pods("restricted").Get(ctx, "priv", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused pod exists: %v", err)
	}
	// The cluster default (baseline) applies to unlabelled namespaces.
	if _, err := cs.CoreV1().Pods("plain").Create(ctx, privilegedPod("priv"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), `violates PodSecurity "baseline:latest"`) {
		t.Fatalf("privileged pod in an unlabelled namespace with default enforce=baseline: %v", err)
	}
	if _, err := cs.CoreV1().Pods("exempt").Create(ctx, privilegedPod("priv"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("privileged pod in an exempt namespace: %v", err)
	}
	w.take()
	if _, err := cs.CoreV1().Pods("warned").Create(ctx, privilegedPod("priv"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("privileged pod in a warn-only namespace: %v", err)
	}
	if got := w.take(); !strings.Contains(got, `would violate PodSecurity "baseline:v1.30": privileged (container "c" must not set securityContext.privileged=true)`) {
		t.Fatalf("warnings: %q", got)
	}
	// A deployment's template is checked too (warn/audit only, as upstream).
	// Relabelling a namespace that holds a privileged pod warns. The
	// plugin finds the namespace's pods through its own informer, which may
	// not hold the pod just created yet: relabel until it does (back to
	// privileged, then restricted again, so each try is a change of level).
	testutil.Eventually(t, 30*time.Second, func() error {
		var got string
		for _, level := range []string{"privileged", "restricted"} {
			ns, err := cs.CoreV1().Namespaces().Get(ctx, "warned", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if ns.Labels["pod-security.kubernetes.io/enforce"] == level {
				continue
			}
			ns.Labels["pod-security.kubernetes.io/enforce"] = level
			if _, err := cs.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
				return err
			}
			got = w.take()
		}
		if !strings.Contains(got, `existing pods in namespace "warned" violate the new PodSecurity enforce level "restricted:latest"`) ||
			!strings.Contains(got, "priv: privileged") {
			return fmt.Errorf("warnings after relabelling to restricted: %q", got)
		}
		return nil
	})

	// The real kubectl gets the same refusal.
	kc, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("no kubectl: skipping its half")
		return
	}
	cmd := exec.Command(kc, "--kubeconfig", filepath.Join(srv.DataDir, "admin.kubeconfig"), "-n", "restricted", "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(`apiVersion: v1
kind: Pod
metadata: {name: kpriv}
spec:
  containers:
  - name: c
    image: registry.example/app:v1
    securityContext: {privileged: true}
`)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `Error from server (Forbidden)`) || !strings.Contains(string(out), `violates PodSecurity "restricted:latest": privileged`) {
		t.Fatalf("kubectl apply of a privileged pod: %v %s", err, out)
	}
	if _, err := cs.CoreV1().Pods("restricted").Get(ctx, "kpriv", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the pod kubectl was refused exists: %v", err)
	}
}

// TestBadPodSecurityConfig: an invalid configuration stops the server.
func TestBadPodSecurityConfig(t *testing.T) {
	testutil.Privileged(t)
	conf := filepath.Join(t.TempDir(), "podsecurity.yaml")
	os.WriteFile(conf, []byte("apiVersion: pod-security.admission.config.k8s.io/v1\nkind: PodSecurityConfiguration\ndefaults:\n  enforce: strict\n"), 0o600)
	_, err := apiserver.New(context.Background(), apiserver.Config{DataDir: t.TempDir(), EtcdUnsafeNoFsync: true, PodSecurityConfigFile: conf})
	if err == nil || !strings.Contains(err.Error(), "--pod-security-config-file") || !strings.Contains(err.Error(), "strict") {
		t.Fatalf("invalid PodSecurityConfiguration: %v", err)
	}
}
