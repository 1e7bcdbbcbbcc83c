package kubectl

import (
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certutil "k8s.io/client-go/util/cert"
)

// TestAdmissionWebhookAndPolicyWithKubectl: a real HTTPS validating webhook
// and a ValidatingAdmissionPolicy, configured with kubectl apply, deny
// kubectl's writes with upstream's messages; nothing denied is stored.
func TestAdmissionWebhookAndPolicyWithKubectl(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("admission-")

	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var rev admissionv1.AdmissionReview
		if json.Unmarshal(body, &rev) != nil || rev.Request == nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		resp := &admissionv1.AdmissionResponse{UID: rev.Request.UID, Allowed: true}
		if strings.Contains(string(rev.Request.Object.Raw), "forbidden-value") {
			resp.Allowed = false
			resp.Result = &metav1.Status{Message: "forbidden-value is not welcome", Code: http.StatusForbidden}
		}
		rev.Request, rev.Response = nil, resp
		out, _ := json.Marshal(&rev)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	hook := "kubectl-" + ns
	t.Cleanup(func() {
		_, _, _ = k.try("", "delete", "validatingwebhookconfiguration", hook, "--ignore-not-found")
		_, _, _ = k.try("", "delete", "validatingadmissionpolicy,validatingadmissionpolicybinding", hook, "--ignore-not-found")
	})
	k.apply(fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: %[1]s
webhooks:
- name: deny.kubectl.waggle.test
  clientConfig:
    url: https://%[2]s/validate
    caBundle: %[3]s
  rules:
  - operations: ["CREATE", "UPDATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["configmaps"]
  namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: %[4]s
  sideEffects: None
  admissionReviewVersions: ["v1"]
  timeoutSeconds: 5
`, hook, ln.Addr().String(), base64.StdEncoding.EncodeToString(certPEM), ns))
	testutil.Eventually(t, 45*time.Second, func() error {
		_, errOut, err := k.try("", "create", "configmap", "probe", "-n", ns, "--from-literal=k=forbidden-value", "--dry-run=server")
		if err == nil {
			return fmt.Errorf("not denied yet")
		}
		if !strings.Contains(errOut, `admission webhook "deny.kubectl.waggle.test" denied the request: forbidden-value is not welcome`) {
			return fmt.Errorf("stderr: %s", errOut)
		}
		return nil
	})
	errOut := k.fails("", "create", "configmap", "denied", "-n", ns, "--from-literal=k=forbidden-value")
	if !strings.Contains(errOut, `admission webhook "deny.kubectl.waggle.test" denied the request: forbidden-value is not welcome`) {
		t.Errorf("kubectl create: %s", errOut)
	}
	if _, errOut, err := k.try("", "get", "configmap", "denied", "-n", ns); err == nil || !strings.Contains(errOut, "NotFound") {
		t.Errorf("denied configmap stored: %v %s", err, errOut)
	}
	k.run("create", "configmap", "allowed", "-n", ns, "--from-literal=k=fine")

	// A ValidatingAdmissionPolicy on the same namespace.
	k.apply(fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: %[1]s
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE"]
      resources: ["configmaps"]
  validations:
  - expression: "!has(object.data) || object.data.all(k, k != 'banned')"
    message: the key banned is not allowed
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: %[1]s
spec:
  policyName: %[1]s
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: %[2]s
`, hook, ns))
	want := fmt.Sprintf("ValidatingAdmissionPolicy '%[1]s' with binding '%[1]s' denied request: the key banned is not allowed", hook)
	testutil.Eventually(t, 45*time.Second, func() error {
		_, errOut, err := k.try("", "create", "configmap", "probe2", "-n", ns, "--from-literal=banned=x", "--dry-run=server")
		if err == nil || !strings.Contains(errOut, want) {
			return fmt.Errorf("not denied yet: %v %s", err, errOut)
		}
		return nil
	})
	if errOut := k.fails("", "create", "configmap", "banned", "-n", ns, "--from-literal=banned=x"); !strings.Contains(errOut, want) {
		t.Errorf("kubectl create past the policy: %s", errOut)
	}
	if out := k.run("get", "validatingadmissionpolicies,validatingwebhookconfigurations", "-o", "name"); !strings.Contains(out, "validatingadmissionpolicy.admissionregistration.k8s.io/"+hook) ||
		!strings.Contains(out, "validatingwebhookconfiguration.admissionregistration.k8s.io/"+hook) {
		t.Errorf("kubectl get: %s", out)
	}
}

// TestAPIServicesWithKubectl: local APIServices are Available, one pointing
// nowhere is Available=False with upstream's reason and its group version
// answers 503 "service unavailable"; nothing else is disturbed.
func TestAPIServicesWithKubectl(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	testutil.Eventually(t, 45*time.Second, func() error {
		out := k.run("get", "apiservice", "v1.apps")
		if f := strings.Fields(tail(strings.TrimSpace(out), 1)); len(f) < 4 || f[0] != "v1.apps" || f[1] != "Local" || f[2] != "True" {
			return fmt.Errorf("kubectl get apiservice v1.apps: %q", out)
		}
		return nil
	})
	name := "v1alpha1.nowhere-" + strings.ToLower(testutil.UniqueName("k")) + ".waggle.test"
	group := strings.TrimPrefix(name, "v1alpha1.")
	t.Cleanup(func() { _, _, _ = k.try("", "delete", "apiservice", name, "--ignore-not-found") })
	k.apply(fmt.Sprintf(`apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: %s
spec:
  group: %s
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  insecureSkipTLSVerify: true
  service:
    namespace: default
    name: nowhere
    port: 443
`, name, group))
	testutil.Eventually(t, 45*time.Second, func() error {
		out := k.run("get", "apiservice", name)
		if !strings.Contains(out, "default/nowhere") || !strings.Contains(out, "False (ServiceNotFound)") {
			return fmt.Errorf("kubectl get apiservice: %q", out)
		}
		return nil
	})
	_, errOut, err := k.try("", "get", "--raw", "/apis/"+group+"/v1alpha1")
	if err == nil || !strings.Contains(errOut, "ServiceUnavailable") && !strings.Contains(errOut, "service unavailable") {
		t.Errorf("kubectl get --raw of an unavailable group version: %v %s", err, errOut)
	}
	// The rest of the API is unaffected: kubectl's discovery still works.
	k.run("get", "configmaps", "-n", "default")
}
