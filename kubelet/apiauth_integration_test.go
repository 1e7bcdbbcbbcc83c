package kubelet_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet"
)

// TestKubeletAPIAuthnAuthz runs a hollow kubelet under its own identity
// (system:node:<name>) against a real API server and calls its API over raw
// HTTPS and with the real kubectl as several identities: only a client
// certificate of the cluster CA authenticates (401 otherwise, /healthz
// included), and each request is allowed only when a SubjectAccessReview for
// the node's subresource says so (403 with upstream's message otherwise). The
// API server itself reaches the kubelet as kube-apiserver-kubelet-client. A
// ServiceAccount token with no nodes/* grant authenticates and gets 403.
func TestKubeletAPIAuthnAuthz(t *testing.T) {
	testutil.Privileged(t)
	s := apiservertest.Start(t, apiservertest.Options{})
	admin, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const nodeName = "hardening-authz-node"
	ports := make(chan int, 1)
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	cfg := kubelet.Config{NodeName: nodeName, RestConfig: s.UserConfig(t, "system:node:"+nodeName, "system:nodes"),
		Runtime: kubelet.RuntimeHollow, PodCIDR: "10.78.0.0/24", RootDir: t.TempDir(), NodeIP: "127.0.0.1",
		Address: "127.0.0.1", Port: 0, ClientCAFile: filepath.Join(s.DataDir, "pki", pki.CACertFile),
		SyncFrequency: 200 * time.Millisecond, Ready: func(p int) { ports <- p }}
	go func() { done <- kubelet.Run(kctx, cfg) }()
	t.Cleanup(func() { cancel(); <-done })
	var port int
	select {
	case port = <-ports:
	case err := <-done:
		t.Fatalf("kubelet exited: %v", err)
	case <-time.After(45 * time.Second):
		t.Fatal("kubelet API did not start")
	}
	base := fmt.Sprintf("https://127.0.0.1:%d", port)

	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "target", Namespace: "default"},
		Spec: v1.PodSpec{NodeName: nodeName, Containers: []v1.Container{{Name: "c", Image: "registry.example/app:v1"}}}}
	if _, err := admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 45*time.Second, "pod target Running", func() (bool, string) {
		p, err := admin.CoreV1().Pods("default").Get(ctx, "target", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == v1.PodRunning, string(p.Status.Phase)
	})

	// stats-reader may get nodes/stats and nothing else; eve has no binding.
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "hardening-stats"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/stats"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "hardening-stats"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "hardening-stats"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "stats-reader"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	certOf := func(rc *rest.Config) []tls.Certificate {
		c, err := tls.X509KeyPair(rc.CertData, rc.KeyData)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{c}
	}
	// A CA the kubelet does not trust.
	other, err := pki.Ensure(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	oc, ok, err := other.IssueClient("system:masters-impostor", []string{"system:masters"})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tls.X509KeyPair(oc, ok)
	if err != nil {
		t.Fatal(err)
	}
	adminCert, err := tls.X509KeyPair(s.Config.CertData, s.Config.KeyData)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string][]tls.Certificate{
		"anonymous":    nil,
		"admin":        {adminCert},
		"eve":          certOf(s.UserConfig(t, "eve")),
		"stats-reader": certOf(s.UserConfig(t, "stats-reader")),
		"foreign-ca":   {foreign},
		"bad-token":    nil,
	}
	// A ServiceAccount token (TokenRequest) authenticates through TokenReview
	// but its ServiceAccount holds no nodes/* grant.
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa-bot"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, "sa-bot", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bearer := map[string]string{"bad-token": "not-a-token", "sa-token": tr.Status.Token}
	do := func(id, method, path string) (int, string) {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{Certificates: ids[id], InsecureSkipVerify: true}} //nolint:gosec // the kubelet's self-signed serving cert
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(method, base+path, nil)
		if tok := bearer[id]; tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("%s %s as %s: %v", method, path, id, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// The positive marker first: admin reaches the pod list.
	if code, body := do("admin", "GET", "/pods"); code != 200 || !strings.Contains(body, `"target"`) {
		t.Fatalf("GET /pods as admin = %d %.200s", code, body)
	}
	for _, tc := range []struct {
		id, method, path string
		code             int
		body             string
	}{
		{"anonymous", "GET", "/healthz", 401, "Unauthorized"},
		{"anonymous", "GET", "/pods", 401, "Unauthorized"},
		{"anonymous", "POST", "/run/default/target/c?cmd=id", 401, "Unauthorized"},
		{"foreign-ca", "GET", "/pods", 401, "Unauthorized"},
		{"foreign-ca", "POST", "/run/default/target/c?cmd=id", 401, "Unauthorized"},
		{"bad-token", "GET", "/pods", 401, "Unauthorized"},
		{"eve", "GET", "/pods", 403, "Forbidden (user=eve, verb=get, resource=nodes, subresource(s)=[pods proxy])"},
		{"eve", "GET", "/healthz", 403, "Forbidden (user=eve, verb=get, resource=nodes, subresource(s)=[healthz proxy])"},
		{"eve", "POST", "/run/default/target/c?cmd=id", 403, "Forbidden (user=eve, verb=create, resource=nodes, subresource(s)=[proxy])"},
		{"eve", "GET", "/containerLogs/default/target/c", 403, "subresource(s)=[proxy]"},
		{"eve", "GET", "/stats/summary", 403, "subresource(s)=[stats]"},
		{"eve", "GET", "/metrics", 403, "subresource(s)=[metrics]"},
		{"sa-token", "GET", "/pods", 403, "Forbidden (user=system:serviceaccount:default:sa-bot, verb=get, resource=nodes, subresource(s)=[pods proxy])"},
		{"sa-token", "POST", "/run/default/target/c?cmd=id", 403, "Forbidden (user=system:serviceaccount:default:sa-bot, verb=create, resource=nodes, subresource(s)=[proxy])"},
		{"sa-token", "GET", "/stats/summary", 403, "subresource(s)=[stats]"},
		{"stats-reader", "GET", "/stats/summary", 200, `"nodeName":"` + nodeName + `"`},
		{"stats-reader", "GET", "/metrics", 403, "subresource(s)=[metrics]"},
		{"stats-reader", "POST", "/run/default/target/c?cmd=id", 403, "Forbidden (user=stats-reader, verb=create, resource=nodes, subresource(s)=[proxy])"},
		{"stats-reader", "GET", "/pods", 403, "subresource(s)=[pods proxy]"},
		{"admin", "GET", "/healthz", 200, "ok"},
		{"admin", "POST", "/run/default/target/c?cmd=id", 200, ""},
	} {
		if code, body := do(tc.id, tc.method, tc.path); code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s %s as %s = %d %q, want %d containing %q", tc.method, tc.path, tc.id, code, body, tc.code, tc.body)
		}
	}

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("no kubectl on PATH: the kubectl half is skipped")
		return
	}
	// The real kubectl, straight at the kubelet as eve: refused.
	dir := t.TempDir()
	kubeconfigFor := func(name, server string, rc *rest.Config) string {
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, InsecureSkipTLSVerify: server == base, CertificateAuthorityData: caIf(server != base, rc)}
		cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData}
		cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
		cfg.CurrentContext = "c"
		p := filepath.Join(dir, name+".kubeconfig")
		if err := clientcmd.WriteToFile(*cfg, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	eve := s.UserConfig(t, "eve")
	out, err := exec.Command(kubectl, "--kubeconfig", kubeconfigFor("eve-kubelet", base, eve), "get", "--raw", "/pods").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Forbidden (user=eve, verb=get, resource=nodes, subresource(s)=[pods proxy])") {
		t.Errorf("kubectl get --raw /pods at the kubelet as eve: %v %s", err, out)
	}
	// Through the API server: eve holds no nodes/proxy (403 there); admin's
	// request reaches the kubelet, which lets the API server's own identity
	// (kube-apiserver-kubelet-client) through.
	out, err = exec.Command(kubectl, "--kubeconfig", kubeconfigFor("eve", s.Config.Host, eve), "get", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/pods").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Forbidden") {
		t.Errorf("kubectl get --raw nodes/proxy as eve: %v %s", err, out)
	}
	adminKC := filepath.Join(s.DataDir, "admin.kubeconfig")
	out, err = exec.Command(kubectl, "--kubeconfig", adminKC, "get", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/pods").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"target"`) {
		t.Errorf("kubectl get --raw nodes/proxy/pods as admin: %v %.300s", err, out)
	}
	if out, err = exec.Command(kubectl, "--kubeconfig", adminKC, "exec", "target", "--", "true").CombinedOutput(); err != nil {
		t.Errorf("kubectl exec as admin: %v %s", err, out)
	}
}

func caIf(want bool, rc *rest.Config) []byte {
	if !want {
		return nil
	}
	return rc.CAData
}
