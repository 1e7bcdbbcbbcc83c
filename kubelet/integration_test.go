package kubelet_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	wcni "github.com/waggle-io/waggle/cni"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet"
	"github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/internal/ktest"
	kruntime "github.com/waggle-io/waggle/kubelet/runtime"
)

var (
	cniOnce sync.Once
	cniDir  string
	cniErr  error
)

// cniBinDir builds cmd/waggle-cni as the CNI plugin "waggle" (once).
func cniBinDir(t testing.TB) string {
	cniOnce.Do(func() {
		cniDir, cniErr = os.MkdirTemp("", "waggle-cni-bin-")
		if cniErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(cniDir, "waggle"), "./cmd/waggle-cni")
		cmd.Dir = filepath.Join("..")
		if out, err := cmd.CombinedOutput(); err != nil {
			cniErr = fmt.Errorf("build waggle-cni: %v: %s", err, out)
		}
	})
	if cniErr != nil {
		t.Fatal(cniErr)
	}
	return cniDir
}

var (
	loggerOnce sync.Once
	loggerPath string
	loggerErr  error
)

// containerLogger builds cmd/waggle-container-logger (once): the logger a
// node uses beside bin/waggle, so that the tests start the one users get.
func containerLogger(t testing.TB) string {
	loggerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "waggle-logger-bin-")
		if err != nil {
			loggerErr = err
			return
		}
		loggerPath = filepath.Join(dir, kruntime.LoggerBinary)
		cmd := exec.Command("go", "build", "-o", loggerPath, "./cmd/waggle-container-logger")
		cmd.Dir = filepath.Join("..")
		if out, err := cmd.CombinedOutput(); err != nil {
			loggerErr = fmt.Errorf("build waggle-container-logger: %v: %s", err, out)
		}
	})
	if loggerErr != nil {
		t.Fatal(loggerErr)
	}
	return loggerPath
}

// node is one kubelet on real containerd, runc and waggle-cni, against a
// real API server.
type node struct {
	t         testing.TB
	name      string
	cfg       kubelet.Config
	ctrd      *ktest.Containerd
	client    kubernetes.Interface
	rc        *rest.Config
	bridge    string
	podCIDR   netip.Prefix
	ipamDir   string
	apiPort   int
	cancel    context.CancelFunc
	done      chan error
	kubelet   *kubelet.Kubelet
	clientTLS *tls.Config
	apiDir    string
}

var cidrSeq = time.Now().UnixNano() % 200

func newNode(t testing.TB, mutate func(*kubelet.Config)) *node {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresKernelFeature(t, testutil.Cgroup2)
	ctrd := ktest.StartContainerd(t)
	ns := testutil.UniqueName("wk")
	rc, apiDir, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cidrSeq++
	n := &node{t: t, name: testutil.UniqueName("node-"), ctrd: ctrd, client: cs, rc: rc,
		bridge: testutil.UniqueName("wgk"), podCIDR: netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 150+cidrSeq%50, cidrSeq%250))}
	dir := t.TempDir()
	// The echo image reaches the node's namespace through --image-dir.
	imageDir := filepath.Join(dir, "images")
	os.MkdirAll(imageDir, 0o755)
	if err := os.Rename(ktest.EchoArchive(t), filepath.Join(imageDir, "waggle-echo.tar")); err != nil {
		t.Fatal(err)
	}
	n.ipamDir = filepath.Join(dir, "ipam")
	confDir := filepath.Join(dir, "net.d")
	os.MkdirAll(confDir, 0o755)
	conf, err := wcni.ConfList(n.podCIDR, netip.Prefix{}, wcni.WithBridge(n.bridge), wcni.WithDataDir(n.ipamDir), wcni.WithMasquerade(false), wcni.WithName("wk"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(confDir, "10-waggle.conflist"), conf, 0o644)
	t.Cleanup(func() { exec.Command("ip", "link", "del", n.bridge).Run() })

	// The kubelet API's client CA and the "API server's" client cert.
	bundle, err := pki.Ensure(filepath.Join(dir, "pki"), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	// Clients: the test's own certificate and the API server's (its
	// cluster CA signs the certificate it presents to kubelets).
	caFile := filepath.Join(dir, "client-ca.crt")
	apiCA, err := os.ReadFile(filepath.Join(apiDir, "pki", "ca.crt"))
	if err != nil {
		t.Fatalf("API server CA: %v", err)
	}
	os.WriteFile(caFile, append(bundle.CAPEM(), apiCA...), 0o644)
	n.apiDir = apiDir
	certPEM, keyPEM, err := bundle.IssueClient("kube-apiserver-kubelet-client", []string{"system:masters"})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	n.clientTLS = &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}

	n.cfg = kubelet.Config{
		NodeName: n.name, RestConfig: rc, NodeIP: "127.0.0.1",
		ContainerdAddress: ctrd.Address(), ContainerdNamespace: ns,
		CNIConfDir: confDir, CNIBinDirs: []string{cniBinDir(t)}, CNICacheDir: filepath.Join(dir, "cni-cache"),
		CgroupRoot: "/" + testutil.UniqueName("wkt") + "/" + n.name, RootDir: filepath.Join(dir, "kubelet"),
		Address: "127.0.0.1", Port: 0, ClientCAFile: caFile,
		SyncFrequency: 200 * time.Millisecond, BackoffBase: time.Second, BackoffMax: 4 * time.Second,
		DisableRouteController: true, ImageDir: imageDir, ContainerLogger: containerLogger(t),
	}
	if os.Getenv("WAGGLE_TEST_KUBELET_LOG") != "" {
		n.cfg.Log = newLogger()
	}
	if mutate != nil {
		mutate(&n.cfg)
	}
	n.start()
	t.Cleanup(func() {
		n.stop()
		// Whatever a failed test left: stop pods so netns and IPs go.
		ctx := context.Background()
		pods, _ := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if len(pods.Items) > 0 {
			n.start()
			for _, p := range pods.Items {
				cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			}
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) && len(n.netnsLeft()) > 0 {
				time.Sleep(200 * time.Millisecond) // poll interval of the cleanup wait (netns removal has no event)
			}
			n.stop()
		}
		// runc made the node's cgroup in every hierarchy (v1 controllers
		// and v2): remove what is left, deepest first.
		for _, m := range cgroupMounts() {
			removeTree(filepath.Join(m, filepath.Dir(n.cfg.CgroupRoot)))
		}
	})
	return n
}

func (n *node) start() {
	n.t.Helper()
	ports := make(chan int, 1)
	cfg := n.cfg
	cfg.Ready = func(p int) { ports <- p }
	k, err := kubelet.New(cfg, kubelet.Deps{})
	if err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done, n.kubelet = cancel, make(chan error, 1), k
	go func() { n.done <- k.Run(ctx) }()
	select {
	case n.apiPort = <-ports:
	case err := <-n.done:
		n.t.Fatalf("kubelet exited: %v", err)
	case <-time.After(30 * time.Second):
		n.t.Fatal("kubelet API did not start")
	}
	waitFor(n.t, 30*time.Second, "node Ready", func() (bool, string) {
		nd, err := n.client.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range nd.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprint(nd.Status.Conditions)
	})
}

func (n *node) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	select {
	case err := <-n.done:
		if err != nil {
			n.t.Errorf("kubelet Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		n.t.Error("kubelet did not stop")
	}
	n.cancel = nil
}

// netnsLeft lists the pod network namespaces of this node's pods left in
// /run/netns.
func (n *node) netnsLeft() []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "waggle-") {
			if _, err := os.Stat(filepath.Join(n.cfg.RootDir, "pods", strings.TrimPrefix(e.Name(), "waggle-"))); err == nil {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// ipsAllocated counts the IPAM store's allocations.
func (n *node) ipsAllocated() int {
	ents, _ := os.ReadDir(filepath.Join(n.ipamDir, "wk"))
	c := 0
	for _, e := range ents {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			c++
		}
	}
	return c
}

func waitFor(t testing.TB, d time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) {
		ok, msg := f()
		if ok {
			return
		}
		last = msg
		time.Sleep(100 * time.Millisecond) // poll interval (bounded by the deadline above)
	}
	// The goroutines tell where a stuck pod worker waits.
	dump, _ := os.CreateTemp("", "kubelet-goroutines-*.txt")
	if dump != nil {
		pprof.Lookup("goroutine").WriteTo(dump, 2)
		dump.Close()
		t.Fatalf("timed out after %s waiting for %s: %s (goroutines in %s)", d, what, last, dump.Name())
	}
	t.Fatalf("timed out after %s waiting for %s: %s", d, what, last)
}

func echoPod(n *node, name string, mutate func(*v1.Pod)) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": name}},
		Spec: v1.PodSpec{NodeName: n.name, TerminationGracePeriodSeconds: ptrInt64(2), Containers: []v1.Container{{
			Name: "echo", Image: images.EchoImage, ImagePullPolicy: v1.PullNever,
			Env:   []v1.EnvVar{{Name: "POD_NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		}}},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func ptrInt64(v int64) *int64 { return &v }

func (n *node) create(p *v1.Pod) *v1.Pod {
	n.t.Helper()
	out, err := n.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

func (n *node) get(name string) *v1.Pod {
	p, err := n.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return &v1.Pod{}
	}
	return p
}

func (n *node) waitPod(name, what string, d time.Duration, f func(*v1.Pod) bool) *v1.Pod {
	n.t.Helper()
	var p *v1.Pod
	waitFor(n.t, d, name+" "+what, func() (bool, string) {
		p = n.get(name)
		return f(p), fmt.Sprintf("phase=%s ip=%s containers=%+v", p.Status.Phase, p.Status.PodIP, p.Status.ContainerStatuses)
	})
	return p
}

func podCond(p *v1.Pod, t v1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func runningReady(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning && podCond(p, v1.PodReady) }

func (n *node) delete(name string) {
	n.t.Helper()
	if err := n.client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) waitGone(name string, d time.Duration) {
	n.t.Helper()
	waitFor(n.t, d, name+" removed", func() (bool, string) {
		_, err := n.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		return err != nil, "still in the API"
	})
}

// kubeletURL is the kubelet API base URL.
func (n *node) kubeletURL() string { return fmt.Sprintf("https://127.0.0.1:%d", n.apiPort) }

func (n *node) httpGet(path string) (int, string) {
	n.t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: n.clientTLS}, Timeout: 30 * time.Second}
	resp, err := c.Get(n.kubeletURL() + path)
	if err != nil {
		n.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// restConfigForKubelet is a client-go config presenting the client cert.
func (n *node) restConfigForKubelet() *rest.Config {
	c := n.clientTLS.Certificates[0]
	certPEM := pemCert(c)
	return &rest.Config{Host: n.kubeletURL(), TLSClientConfig: rest.TLSClientConfig{Insecure: true, CertData: certPEM.cert, KeyData: certPEM.key}}
}

// exec runs cmd in a container through the kubelet API with client-go's
// executor: SPDY (kubectl ≤ 1.29) or WebSocket v5 (kubectl ≥ 1.30).
func (n *node) exec(pod, container string, websocket bool, stdin string, cmd ...string) (string, string, error) {
	n.t.Helper()
	// The kubelet's own parameter names (the API server maps
	// stdin/stdout/stderr of pods/exec to them).
	q := "?output=1&error=1"
	if stdin != "" {
		q += "&input=1"
	}
	for _, c := range cmd {
		q += "&command=" + urlQuery(c)
	}
	u := mustURL(n.kubeletURL() + "/exec/default/" + pod + "/" + container + q)
	var ex remotecommand.Executor
	var err error
	if websocket {
		ex, err = remotecommand.NewWebSocketExecutor(n.restConfigForKubelet(), "GET", u.String())
	} else {
		ex, err = remotecommand.NewSPDYExecutor(n.restConfigForKubelet(), "POST", u)
	}
	if err != nil {
		n.t.Fatal(err)
	}
	var out, errb bytes.Buffer
	opts := remotecommand.StreamOptions{Stdout: &out, Stderr: &errb}
	if stdin != "" {
		opts.Stdin = strings.NewReader(stdin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = ex.StreamWithContext(ctx, opts)
	return out.String(), errb.String(), err
}

func dialEcho(t testing.TB, addr string) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	var last error
	for i := 0; i < 50; i++ {
		resp, err := c.Get("http://" + addr + "/")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(b)
		}
		last = err
		time.Sleep(100 * time.Millisecond) // poll interval (bounded by the deadline above)
	}
	t.Fatalf("GET http://%s/: %v", addr, last)
	return ""
}

var _ = x509.NewCertPool
var _ = net.JoinHostPort
