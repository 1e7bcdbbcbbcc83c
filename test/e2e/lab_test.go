package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/lab"
)

// The lab of these tests: its own name, bridge and subnet, so it never
// touches a lab a user runs beside it.
const (
	labName   = "e2e"
	labBridge = "wge2e0"
	labSubnet = "10.251.0.0/24"
	labNodes  = 2
	echoImage = "waggle.local/waggle-echo:dev"
)

var keepLab = flag.Bool("keep-lab", false, "leave the lab up after the tests (debugging)")

// env is the running lab, shared by the tests of this package.
type env struct {
	bin, dataDir, kubeconfig string
	cfg                      lab.Config
}

// startLab builds the binaries and the echo image, brings a lab up and
// registers its teardown, which also checks that nothing is left behind.
func startLab(t *testing.T) *env {
	t.Helper()
	testutil.RequiresKernelFeature(t, testutil.CgroupSockAddr)
	testutil.RequiresBinary(t, "containerd")
	testutil.RequiresBinary(t, "runc")
	testutil.RequiresBinary(t, "kubectl")
	bin, images := buildBinaries(t)

	cfg := lab.Defaults()
	cfg.Name, cfg.Bridge, cfg.Nodes = labName, labBridge, labNodes
	cfg.Subnet = netip.MustParsePrefix(labSubnet)
	// Dual-stack, as a user's cluster may be: the IPv4 checks run as on an
	// IPv4-only lab (IPv4 is the primary family), and testDualStack checks
	// the IPv6 half.
	cfg.EnableDualStack()
	dataDir := filepath.Join("/var/lib", "waggle-e2e-"+testutil.UniqueName(""))
	e := &env{bin: bin, dataDir: dataDir, kubeconfig: filepath.Join(dataDir, "control-plane", "admin.kubeconfig"), cfg: cfg}
	t.Cleanup(func() {
		if *keepLab {
			t.Logf("lab kept: %s lab down --data-dir %s", e.bin, dataDir)
			return
		}
		if t.Failed() {
			dumpLogs(t, dataDir)
		}
		out, err := exec.Command(e.bin, "lab", "down", "--data-dir", dataDir).CombinedOutput()
		if err != nil {
			t.Errorf("lab down: %v\n%s", err, out)
		}
		checkNothingLeft(t, cfg)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	up := exec.CommandContext(ctx, e.bin, "lab", "up",
		"--name", labName, "--bridge", labBridge, "--subnet", labSubnet,
		"--nodes", strconv.Itoa(labNodes), "--data-dir", dataDir, "--dual-stack",
		"--image-dir", images, "--node-monitor-grace-period", "10s", "--ready-timeout", "3m")
	var out bytes.Buffer
	up.Stdout, up.Stderr = &out, &out
	if err := up.Run(); err != nil {
		t.Fatalf("lab up: %v\n%s", err, out.String())
	}
	t.Logf("lab up:\n%s", out.String())
	return e
}

// built is the binaries and the echo image the package's tests share,
// built once (buildBinaries) under a directory TestMain removes.
var built struct {
	once        sync.Once
	dir         string
	bin, images string
	err         error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildBinaries builds waggle, the CNI plugin (bin/cni/waggle) and the
// waggle-echo image once for the package; it returns the waggle binary and
// the image dir.
func buildBinaries(t *testing.T) (bin, images string) {
	t.Helper()
	root := repoRoot(t)
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "waggle-bin-"); built.err != nil {
			return
		}
		dir := filepath.Join(built.dir, "bin")
		for _, b := range []struct{ out, pkg string }{
			{filepath.Join(dir, "waggle"), "./cmd/waggle"},
			{filepath.Join(dir, "cni", "waggle"), "./cmd/waggle-cni"},
			{filepath.Join(dir, "waggle-echo"), "./cmd/waggle-echo"},
		} {
			cmd := exec.Command("go", "build", "-tags", "static_build", "-o", b.out, b.pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				built.err = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
		built.bin, built.images = filepath.Join(dir, "waggle"), filepath.Join(built.dir, "images")
		out, err := exec.Command(built.bin, "images", "build-echo", "--binary", filepath.Join(dir, "waggle-echo"),
			"--output", filepath.Join(built.images, "waggle-echo.tar")).CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("waggle images build-echo: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin, built.images
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// kubectl runs the real kubectl against the lab.
func (e *env) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.kubectlErr(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (e *env) kubectlErr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", e.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *env) apply(t *testing.T, manifest string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", e.kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, manifest)
	}
}

// eventually polls f every 500ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < timeout {
		if err = f(); err == nil {
			return time.Since(start)
		}
		time.Sleep(500 * time.Millisecond) // poll interval of eventually (lab checks run kubectl; 500 ms keeps the load down)
	}
	t.Fatalf("%s: not within %v: %v", what, timeout, err)
	return 0
}

// nodeExec runs a command inside a lab node's network namespace and cgroup
// (so the node's socket load balancer sees it), as a process on that node.
func (e *env) nodeExec(node string, args ...string) (string, error) {
	cg := filepath.Join(cgroup2(), e.cfg.CgroupParent(), node, "e2e-client")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		return "", err
	}
	defer os.Remove(cg)
	script := fmt.Sprintf("echo $$ > %s/cgroup.procs && exec nsenter --net=/run/netns/waggle-%s -- \"$@\"", cg, node)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "sh", append([]string{"-c", script, "sh"}, args...)...).CombinedOutput()
	return string(out), err
}

func cgroup2() string {
	root, err := testutil.Cgroup2Root()
	if err != nil {
		panic(err)
	}
	return root
}

func dumpLogs(t *testing.T, dataDir string) {
	logs, _ := filepath.Glob(filepath.Join(dataDir, "logs", "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		t.Logf("==== %s (tail) ====\n%s", filepath.Base(l), b)
	}
}

// checkNothingLeft asserts that lab down removed every namespace, link,
// cgroup, pinned object and process of the lab.
func checkNothingLeft(t *testing.T, cfg lab.Config) {
	t.Helper()
	netns := run(t, "ip", "netns", "list")
	links := run(t, "ip", "-o", "link", "show")
	for i := 1; i <= cfg.Nodes; i++ {
		node := cfg.NodeName(i)
		if strings.Contains(netns, "waggle-"+node) {
			t.Errorf("network namespace waggle-%s left behind", node)
		}
		if _, err := os.Stat(filepath.Join("/sys/fs/bpf/waggle", node)); err == nil {
			t.Errorf("pinned BPF state of %s left behind", node)
		}
	}
	if strings.Contains(netns, "waggle-"+cfg.ClientName()) {
		t.Errorf("network namespace waggle-%s (the client) left behind", cfg.ClientName())
	}
	if strings.Contains(links, cfg.Bridge+":") || strings.Contains(links, "wl"+cfg.Name) {
		t.Errorf("lab links left behind:\n%s", links)
	}
	if _, err := os.Stat(filepath.Join(cgroup2(), cfg.CgroupParent())); err == nil {
		t.Errorf("cgroup %s left behind", cfg.CgroupParent())
	}
	if out, _ := exec.Command("pgrep", "-f", "waggle-e2e-").Output(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("processes of the lab left behind: %s", out)
	}
}
