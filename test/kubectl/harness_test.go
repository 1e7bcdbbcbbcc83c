package kubectl

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/waggle-io/waggle/internal/testutil"
)

// waggleBin is bin/waggle built by TestMain for this run.
var waggleBin string

// Kubectl binaries: the default and the versioned ones of the Cloud SDK.
const (
	defaultKubectl = "/usr/bin/kubectl"
	sdkBin         = "/usr/lib/google-cloud-sdk/bin"
)

var versionedKubectls = []string{"1.27", "1.28", "1.29", "1.30", "1.31", "1.32", "1.33"}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// End-to-end tier: every test skips in -short; no build needed.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "waggle-kubectl-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	waggleBin = filepath.Join(dir, "waggle")
	build := exec.Command("go", "build", "-tags", "static_build", "-o", waggleBin, "github.com/waggle-io/waggle/cmd/waggle")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build waggle: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	stopShared()
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is one `waggle apiserver` subprocess.
type server struct {
	kubeconfigPath string
	dataDir        string
	cacheDir       string
	port           int
	cmd            *exec.Cmd
	log            *bytes.Buffer
	logMu          *sync.Mutex
	done           chan error
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startServer starts `waggle apiserver --data-dir dataDir` on a free port and
// waits until /readyz answers ok through the written admin kubeconfig.
func startServer(dataDir string, extraArgs ...string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	return startServerOn(dataDir, port, "", extraArgs...)
}

// startServerOn starts the server on port; kubeconfig, when given, is the
// one clients use instead of the server's <dataDir>/admin.kubeconfig.
func startServerOn(dataDir string, port int, kubeconfig string, extraArgs ...string) (*server, error) {
	s := &server{dataDir: dataDir, cacheDir: filepath.Join(dataDir, "kubectl-cache"), port: port, kubeconfigPath: kubeconfig,
		log: &bytes.Buffer{}, logMu: &sync.Mutex{}, done: make(chan error, 1)}
	s.cmd = exec.Command(waggleBin, "apiserver", "--data-dir", dataDir, "--secure-port", strconv.Itoa(port),
		"--bind-address", "127.0.0.1", "--log-level", "info")
	s.cmd.Args = append(s.cmd.Args, extraArgs...)
	s.cmd.Stdout = lockedWriter{s.logMu, s.log}
	s.cmd.Stderr = lockedWriter{s.logMu, s.log}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start waggle apiserver: %w", err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	if err := s.waitReady(90 * time.Second); err != nil {
		s.stop()
		return nil, fmt.Errorf("%w\nserver log:\n%s", err, s.logs())
	}
	return s, nil
}

func (s *server) kubeconfig() string {
	if s.kubeconfigPath != "" {
		return s.kubeconfigPath
	}
	return filepath.Join(s.dataDir, "admin.kubeconfig")
}

func (s *server) logs() string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return s.log.String()
}

func (s *server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("waggle apiserver exited before ready: %v", err)
		default:
		}
		last = s.readyz()
		if last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond) // poll interval (bounded by the deadline)
	}
	return fmt.Errorf("waggle apiserver not ready after %v: %v", timeout, last)
}

func (s *server) readyz() error {
	if _, err := os.Stat(s.kubeconfig()); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig())
	if err != nil {
		return err
	}
	if !strings.Contains(cfg.Host, ":"+strconv.Itoa(s.port)) {
		return fmt.Errorf("kubeconfig still points at %s", cfg.Host)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	hc.Timeout = 2 * time.Second
	resp, err := hc.Get(cfg.Host + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %d %s", resp.StatusCode, body)
	}
	return nil
}

// stop sends SIGTERM and waits for a graceful exit, killing after 20s.
func (s *server) stop() error {
	if s.cmd.Process == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		s.done <- err
		return err
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		err := <-s.done
		s.done <- err
		return fmt.Errorf("waggle apiserver did not stop on SIGTERM within 20s")
	}
}

// requireE2E gates an end-to-end test: not in -short, needs the kubectl.
func requireE2E(t *testing.T, kubectl string) {
	t.Helper()
	testutil.Privileged(t)
	testutil.RequiresBinary(t, kubectl)
	if waggleBin == "" {
		t.Fatal("waggle binary not built")
	}
}

var (
	sharedOnce sync.Once
	shared     *server
	sharedErr  error
	sharedDir  string
)

// sharedServer is the server most tests share (each in its own namespace).
func sharedServer(t *testing.T) *server {
	t.Helper()
	sharedOnce.Do(func() {
		sharedDir, sharedErr = os.MkdirTemp("", "waggle-kubectl-shared-")
		if sharedErr == nil {
			shared, sharedErr = startServer(sharedDir)
		}
	})
	if sharedErr != nil {
		t.Fatalf("shared apiserver: %v", sharedErr)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("apiserver log (tail):\n%s", tail(shared.logs(), 40))
		}
	})
	return shared
}

func stopShared() {
	if shared != nil {
		shared.stop()
	}
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// kc runs one kubectl binary against a server.
type kc struct {
	t   *testing.T
	bin string
	s   *server
}

func newKC(t *testing.T, bin string, s *server) *kc { return &kc{t: t, bin: bin, s: s} }

// with returns k bound to a subtest's t.
func (k *kc) with(t *testing.T) *kc { return &kc{t: t, bin: k.bin, s: k.s} }

func (k *kc) cmd(ctx context.Context, stdin string, args ...string) *exec.Cmd {
	return k.cmdWithKubeconfig(ctx, k.s.kubeconfig(), stdin, args...)
}

func (k *kc) cmdWithKubeconfig(ctx context.Context, kubeconfig, stdin string, args ...string) *exec.Cmd {
	full := append([]string{"--kubeconfig", kubeconfig, "--cache-dir", k.s.cacheDir}, args...)
	c := exec.CommandContext(ctx, k.bin, full...)
	c.Env = append(os.Environ(), "HOME="+k.s.dataDir, "KUBECONFIG=", "KUBECTL_EXPLAIN_OPENAPIV3=true")
	if stdin != "" {
		c.Stdin = strings.NewReader(stdin)
	}
	return c
}

// try runs kubectl and returns stdout, stderr and the error.
func (k *kc) try(stdin string, args ...string) (string, string, error) {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := k.cmd(ctx, stdin, args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	return out.String(), errb.String(), err
}

// tryWithKubeconfig is try with another kubeconfig file.
func (k *kc) tryWithKubeconfig(kubeconfig string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := k.cmdWithKubeconfig(ctx, kubeconfig, "", args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	return out.String(), errb.String(), err
}

// run runs kubectl and fails the test on error.
func (k *kc) run(args ...string) string {
	k.t.Helper()
	out, errOut, err := k.try("", args...)
	if err != nil {
		k.t.Fatalf("kubectl %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// apply pipes manifest into kubectl apply -f -.
func (k *kc) apply(manifest string, args ...string) string {
	k.t.Helper()
	out, errOut, err := k.try(manifest, append([]string{"apply", "-f", "-"}, args...)...)
	if err != nil {
		k.t.Fatalf("kubectl apply: %v\nstdout: %s\nstderr: %s\nmanifest:\n%s", err, out, errOut, manifest)
	}
	return out
}

// fails runs kubectl expecting an error and returns stderr.
func (k *kc) fails(stdin string, args ...string) string {
	k.t.Helper()
	out, errOut, err := k.try(stdin, args...)
	if err == nil {
		k.t.Fatalf("kubectl %s succeeded, want an error\nstdout: %s", strings.Join(args, " "), out)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		k.t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return errOut
}

// namespace creates a fresh namespace for one test.
func (k *kc) namespace(prefix string) string {
	k.t.Helper()
	ns := strings.ToLower(testutil.UniqueName(prefix))
	if len(ns) > 63 {
		ns = ns[:63]
	}
	ns = strings.Trim(strings.ReplaceAll(ns, "_", "-"), "-")
	k.run("create", "namespace", ns)
	// The harness runs the API server alone, and its ServiceAccount
	// admission (on, as upstream) refuses pods whose ServiceAccount does
	// not exist: create the one the controller-manager's serviceaccount
	// controller would.
	k.run("create", "serviceaccount", "default", "-n", ns)
	return ns
}

// watcher streams a long-running kubectl (get -w) line by line.
type watcher struct {
	cancel context.CancelFunc
	lines  chan string
	cmd    *exec.Cmd
	stderr *bytes.Buffer
}

func (k *kc) watch(timeout time.Duration, args ...string) *watcher {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	c := k.cmd(ctx, "", args...)
	out, err := c.StdoutPipe()
	if err != nil {
		cancel()
		k.t.Fatal(err)
	}
	w := &watcher{cancel: cancel, lines: make(chan string, 1000), cmd: c, stderr: &bytes.Buffer{}}
	c.Stderr = w.stderr
	if err := c.Start(); err != nil {
		cancel()
		k.t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
	}()
	k.t.Cleanup(func() { w.cancel(); c.Wait() })
	return w
}

// expect waits for a line matching all the substrings.
func (w *watcher) expect(t *testing.T, timeout time.Duration, subs ...string) string {
	t.Helper()
	deadline := time.After(timeout)
	var seen []string
	for {
		select {
		case l, ok := <-w.lines:
			if !ok {
				t.Fatalf("watch ended before a line with %q; saw:\n%s\nstderr: %s", subs, strings.Join(seen, "\n"), w.stderr)
			}
			seen = append(seen, l)
			match := true
			for _, s := range subs {
				if !strings.Contains(l, s) {
					match = false
					break
				}
			}
			if match {
				return l
			}
		case <-deadline:
			t.Fatalf("no line with %q within %v; saw:\n%s", subs, timeout, strings.Join(seen, "\n"))
		}
	}
}

// fields splits a table line into its cells.
func fields(line string) []string { return strings.Fields(line) }

// header returns the first line of a table output.
func header(out string) string {
	line, _, _ := strings.Cut(out, "\n")
	return line
}

// rowOf returns the table line whose first cell is name.
func rowOf(t *testing.T, out, name string) []string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if f := fields(l); len(f) > 0 && f[0] == name {
			return f
		}
	}
	t.Fatalf("no row %q in:\n%s", name, out)
	return nil
}

// contextWithTimeout is a context cancelled at the end of the test.
func contextWithTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
