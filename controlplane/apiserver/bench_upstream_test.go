package apiserver_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/controlplane/storage"
	"github.com/waggle-io/waggle/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The upstream peer of BenchmarkWritePathVsUpstream: kube-apiserver built
// from the k8s.io/kubernetes module go.mod pins, as its own binary
// (./upstreampeer/kube-apiserver), into a cache directory. Building it at
// run time rather than linking it into this test binary keeps kube-apiserver
// out of `make test`'s compile and link: only this benchmark, when asked
// for, pays for it (a few minutes on 2 cores the first time, nothing after).
// The main package carries the build tag upstreamPeerTag, so `go vet ./...`
// and `go test ./...` do not compile kube-apiserver's ~300 packages either.
const (
	envUpstreamBench = "WRITE_BENCH_KUBE_APISERVER"
	// envUpstreamCache overrides the cache directory of the built binary
	// (default /var/cache/waggle/kube-apiserver/<version>).
	envUpstreamCache = "WAGGLE_KUBE_APISERVER_CACHE"
	// envUpstreamPorts, when set to a port P, fixes the ports the benchmark
	// listens on: P Waggle, P+1 the peer's etcd, P+2 kube-apiserver
	// (otherwise free ports are picked).
	envUpstreamPorts = "WRITE_BENCH_PORT_BASE"
	// upstreamPeerTag is the build tag of ./upstreampeer/kube-apiserver.
	upstreamPeerTag = "waggle_upstream_peer"
)

// BenchmarkWritePathVsUpstream measures, in one run, 16-worker pod creates
// through Waggle's API server and through upstream kube-apiserver (the
// same Kubernetes version, its admission plugins at their defaults), each
// on an embedded etcd of the same configuration (fsync on, data under
// <dir>/etcd, TLS with client certificates), beside each etcd's raw puts
// of the bytes its API server stored for such a pod. The four kinds of
// writes alternate in rounds so that the shared machine's load weighs on
// all alike. It prints creates/s, p50/p99 and the ratio to raw etcd of
// each, and the CPU per write (client, server and etcd together).
//
// It builds and runs kube-apiserver, so it runs only when
// WRITE_BENCH_KUBE_APISERVER=1 or WAGGLE_PRIVILEGED_TESTS=1, and then
// fails, never skips, if kube-apiserver cannot be built or started:
//
//	WRITE_BENCH_KUBE_APISERVER=1 go test -run '^$' -bench WritePathVsUpstream -benchtime 1x ./controlplane/apiserver/
func BenchmarkWritePathVsUpstream(b *testing.B) {
	if os.Getenv(envUpstreamBench) != "1" && os.Getenv("WAGGLE_PRIVILEGED_TESTS") != "1" {
		b.Skipf("set %s=1 (or WAGGLE_PRIVILEGED_TESTS=1) to build upstream kube-apiserver and measure against it", envUpstreamBench)
	}
	bin, version := buildKubeAPIServer(b)
	for i := 0; i < b.N; i++ {
		runWritePathVsUpstream(b, bin, version)
	}
}

// buildKubeAPIServer builds (once per version) upstream kube-apiserver
// from the module graph of this repository and returns its path and the
// k8s.io/kubernetes version.
func buildKubeAPIServer(b *testing.B) (string, string) {
	b.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes").Output()
	version := strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(version, "v1.") {
		b.Fatalf("kube-apiserver peer: the k8s.io/kubernetes version of go.mod (go list -m): %q, %v", version, err)
	}
	dir := os.Getenv(envUpstreamCache)
	if dir == "" {
		dir = filepath.Join("/var/cache/waggle/kube-apiserver", version)
	}
	bin := filepath.Join(dir, "kube-apiserver")
	if _, err := os.Stat(bin); err == nil {
		return bin, version
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatalf("kube-apiserver peer: %v", err)
	}
	maj, min, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	min, _, _ = strings.Cut(min, ".")
	ld := fmt.Sprintf("-X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=%s -X k8s.io/component-base/version.gitMinor=%s",
		version, maj, min)
	tmp := bin + ".tmp"
	start := time.Now()
	cmd := exec.Command("go", "build", "-tags", upstreamPeerTag, "-ldflags", ld, "-o", tmp, "./upstreampeer/kube-apiserver")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("kube-apiserver peer: go build: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		b.Fatalf("kube-apiserver peer: %v", err)
	}
	b.Logf("built kube-apiserver %s into %s in %s", version, bin, time.Since(start).Round(time.Second))
	return bin, version
}

// benchAddr is the address of the i-th port of the benchmark: fixed when
// WRITE_BENCH_PORT_BASE is set, else a free one.
func benchAddr(b *testing.B, i int) string {
	if s := os.Getenv(envUpstreamPorts); s != "" {
		p, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("%s=%q: %v", envUpstreamPorts, s, err)
		}
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(p+i))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// upstreamPeer is a running kube-apiserver with its own embedded etcd.
type upstreamPeer struct {
	config *rest.Config
	etcd   *clientv3.Client
	pid    int
}

func startUpstreamPeer(b *testing.B, bin string) *upstreamPeer {
	b.Helper()
	dir := b.TempDir()
	// The etcd: as Waggle's embedded one (storage.StartEmbedded, data in
	// <dir>/etcd, fsync on, TLS with client certificates of its own CA).
	ep, err := pki.EnsureEtcd(filepath.Join(dir, "pki"), nil)
	if err != nil {
		b.Fatal(err)
	}
	etcd, err := storage.StartEmbedded(context.Background(), storage.EmbeddedConfig{DataDir: dir, ClientAddr: benchAddr(b, 1),
		CertFile: ep.ServerCertFile, KeyFile: ep.ServerKeyFile, TrustedCAFile: ep.CAFile})
	if err != nil {
		b.Fatalf("kube-apiserver peer: etcd: %v", err)
	}
	b.Cleanup(etcd.Close)
	// kube-apiserver's serving certificate, client CA, admin client
	// certificate (system:masters) and service-account key pair.
	ca, err := pki.Ensure(filepath.Join(dir, "kube"), []string{"127.0.0.1", "localhost"})
	if err != nil {
		b.Fatal(err)
	}
	saKey, saPub, err := pki.EnsureServiceAccountKey(filepath.Join(dir, "kube"))
	if err != nil {
		b.Fatal(err)
	}
	adminCert, adminKey, err := ca.IssueClient("kubernetes-admin", []string{"system:masters"})
	if err != nil {
		b.Fatal(err)
	}
	addr := benchAddr(b, 2)
	host, port, _ := net.SplitHostPort(addr)
	kd := filepath.Join(dir, "kube")
	args := []string{
		"--bind-address=" + host, "--secure-port=" + port,
		// The address the kubernetes Service's endpoints name: the
		// endpoint reconciler refuses loopback, and nothing dials it here
		// (a TEST-NET-1 address, as upstream's integration servers use a
		// fixed non-local one).
		"--advertise-address=192.0.2.1",
		"--tls-cert-file=" + filepath.Join(kd, pki.ServerCertFile), "--tls-private-key-file=" + filepath.Join(kd, pki.ServerKeyFile),
		"--client-ca-file=" + filepath.Join(kd, pki.CACertFile),
		"--etcd-servers=" + etcd.ClientURL, "--etcd-cafile=" + ep.CAFile, "--etcd-certfile=" + ep.ClientCertFile, "--etcd-keyfile=" + ep.ClientKeyFile,
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/16",
		// Waggle's default authorization chain (and kubeadm's).
		"--authorization-mode=Node,RBAC",
		"--v=0",
	}
	logPath := filepath.Join(dir, "kube-apiserver.log")
	logf, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Killed with the test process, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		b.Fatalf("kube-apiserver peer: start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); logf.Close(); close(exited) }()
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	logTail := func() string {
		data, _ := os.ReadFile(logPath)
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		return string(data)
	}
	rc := &rest.Config{Host: "https://" + addr, QPS: -1,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca.CAPEM(), CertData: adminCert, KeyData: adminKey}}
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var last string
		resp, err := hc.Get(rc.Host + "/readyz")
		if err == nil {
			body := new(bytes.Buffer)
			body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		select {
		case <-exited:
			b.Fatalf("kube-apiserver peer exited before it was ready (%v); its log:\n%s", exitErr, logTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Fatalf("kube-apiserver peer: not ready after 3 minutes (/readyz: %s); its log:\n%s", last, logTail())
		}
	}
	cert, err := tls.X509KeyPair(mustRead(b, ep.ClientCertFile), mustRead(b, ep.ClientKeyFile))
	if err != nil {
		b.Fatal(err)
	}
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.ClientURL}, DialTimeout: 10 * time.Second,
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ep.CA.CAPool(), MinVersion: tls.VersionTLS12}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { kv.Close() })
	return &upstreamPeer{config: rc, etcd: kv, pid: cmd.Process.Pid}
}

func mustRead(b *testing.B, path string) []byte {
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// childCPU is the CPU time (user and system) process pid has used.
func childCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces): utime and
	// stime are the 14th and 15th fields of the line, in clock ticks
	// (100 per second on Linux).
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// storedEncoding names what an API server wrote to etcd.
func storedEncoding(v []byte) string {
	switch {
	case bytes.HasPrefix(v, []byte("k8s\x00")):
		return "protobuf"
	case bytes.HasPrefix(v, []byte("{")):
		return "JSON"
	}
	return "other"
}

// createTemplatePod creates the default ServiceAccount (no controller
// manager runs here; the ServiceAccount admission plugin needs it) and a
// first pod, retrying while admission's caches catch up, and returns the
// bytes the server stored for that pod.
func createTemplatePod(b *testing.B, cs kubernetes.Interface, kv *clientv3.Client) []byte {
	ctx := context.Background()
	_, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	testutil.Eventually(b, 30*time.Second, func() error {
		_, err := cs.CoreV1().Pods("default").Create(ctx, benchPod("template"), metav1.CreateOptions{})
		return err
	})
	got, err := kv.Get(ctx, "/registry/pods/default/template")
	if err != nil || len(got.Kvs) != 1 {
		b.Fatalf("read the stored pod: %v", err)
	}
	return got.Kvs[0].Value
}

type writeSeries struct {
	name  string
	took  time.Duration
	lats  []time.Duration
	errs  int64
	cpu   time.Duration
	bytes int
	enc   string
}

func (s *writeSeries) rate() float64 { return float64(len(s.lats)) / s.took.Seconds() }

func runWritePathVsUpstream(b *testing.B, bin, version string) {
	const workers, perRound, rounds = 16, 500, 4
	loadBefore := loadavg()
	ctx := context.Background()

	// Waggle, with its default admission plugins (apiservertest leaves
	// ServiceAccount out) and fsync on.
	wsrv := apiservertest.Start(b, apiservertest.Options{Addr: benchAddr(b, 0), Configure: func(c *apiserver.Config) {
		c.EtcdUnsafeNoFsync = false
		c.DisableAdmissionPlugins = nil
	}})
	wcs := kubernetes.NewForConfigOrDie(wsrv.Config)
	wkv := wsrv.Store().Client()
	peer := startUpstreamPeer(b, bin)
	ucs := kubernetes.NewForConfigOrDie(peer.config)
	wval := createTemplatePod(b, wcs, wkv)
	uval := createTemplatePod(b, ucs, peer.etcd)

	run := func(s *writeSeries, cpu func() time.Duration, op func(i int) error) {
		cpu0 := cpu()
		took, lats, errs, first := concurrently(workers, perRound, op)
		if first != nil {
			b.Logf("%s: %v", s.name, first)
		}
		s.lats = append(s.lats, lats...)
		s.took += took
		s.cpu += cpu() - cpu0
		s.errs += errs
	}
	self := func() time.Duration { return processCPU(b) }
	// The upstream side's CPU: this process (client-go, the peer's etcd)
	// and kube-apiserver's.
	withPeer := func() time.Duration { return processCPU(b) + childCPU(b, peer.pid) }
	wc := &writeSeries{name: "Waggle creates", bytes: len(wval), enc: storedEncoding(wval)}
	we := &writeSeries{name: "Waggle's etcd puts", bytes: len(wval)}
	uc := &writeSeries{name: "kube-apiserver creates", bytes: len(uval), enc: storedEncoding(uval)}
	ue := &writeSeries{name: "kube-apiserver's etcd puts", bytes: len(uval)}
	// WRITE_BENCH_KUBE_APISERVER_CPUPROFILE=file takes kube-apiserver's
	// own CPU profile (its /debug/pprof) over the rounds.
	profDone := make(chan struct{})
	if path := os.Getenv("WRITE_BENCH_KUBE_APISERVER_CPUPROFILE"); path != "" {
		hc, err := rest.HTTPClientFor(peer.config)
		if err != nil {
			b.Fatal(err)
		}
		started := make(chan struct{})
		go func() {
			defer close(profDone)
			close(started)
			resp, err := hc.Get(peer.config.Host + "/debug/pprof/profile?seconds=" + strconv.Itoa(4*rounds))
			if err != nil {
				b.Errorf("kube-apiserver CPU profile: %v", err)
				return
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != 200 {
				err = fmt.Errorf("%s: %s", resp.Status, data)
			}
			if err == nil {
				err = os.WriteFile(path, data, 0o644)
			}
			if err != nil {
				b.Errorf("kube-apiserver CPU profile: %v", err)
			}
		}()
		<-started
	} else {
		close(profDone)
	}
	defer func() { <-profDone }()
	for r := 0; r < rounds; r++ {
		base := r * perRound
		run(wc, self, func(i int) error {
			_, err := wcs.CoreV1().Pods("default").Create(ctx, benchPod(fmt.Sprintf("w-%06d", base+i)), metav1.CreateOptions{})
			return err
		})
		run(we, self, func(i int) error {
			_, err := wkv.Put(ctx, fmt.Sprintf("/bench/raw/w-%06d", base+i), string(wval))
			return err
		})
		run(uc, withPeer, func(i int) error {
			_, err := ucs.CoreV1().Pods("default").Create(ctx, benchPod(fmt.Sprintf("w-%06d", base+i)), metav1.CreateOptions{})
			return err
		})
		run(ue, withPeer, func(i int) error {
			_, err := peer.etcd.Put(ctx, fmt.Sprintf("/bench/raw/w-%06d", base+i), string(uval))
			return err
		})
	}
	n := perRound * rounds
	fmt.Fprintf(os.Stdout, "\nwrite path: Waggle vs upstream kube-apiserver %s vs raw etcd (%d writes each, %d concurrent, %d rounds alternating, fsync on; load average before %s, after %s on %d CPUs)\n",
		version, n, workers, rounds, loadBefore, loadavg(), runtime.NumCPU())
	fmt.Fprintf(os.Stdout, "  %-28s %8s  %9s  %9s  %-9s %s\n", "", "writes/s", "p50", "p99", "vs etcd", "CPU/write (client+server+etcd), stored")
	results := map[string]any{"loadavg_before": loadBefore, "loadavg_after": loadavg(), "kube_apiserver_version": version}
	row := func(key string, s, raw *writeSeries) {
		ratio := "-"
		if raw != nil {
			ratio = fmt.Sprintf("%.2f×", s.rate()/raw.rate())
			results[key+"_ratio_to_etcd"] = s.rate() / raw.rate()
		}
		stored := fmt.Sprintf("%d B", s.bytes)
		if s.enc != "" {
			stored += " " + s.enc
		}
		cpu := float64(s.cpu.Microseconds()) / 1000 / float64(len(s.lats))
		fmt.Fprintf(os.Stdout, "  %-28s %6.0f/s  %9s  %9s  %-9s %.3f ms, %s  (%d errors)\n", s.name, s.rate(),
			ms(percentile(s.lats, .5)), ms(percentile(s.lats, .99)), ratio, cpu, stored, s.errs)
		results[key+"_per_s"] = s.rate()
		results[key+"_p50_ms"] = float64(percentile(s.lats, .5).Microseconds()) / 1000
		results[key+"_p99_ms"] = float64(percentile(s.lats, .99).Microseconds()) / 1000
		results[key+"_cpu_ms"] = cpu
		results[key+"_stored_bytes"] = s.bytes
	}
	row("waggle_creates", wc, we)
	row("waggle_etcd_puts", we, nil)
	row("kube_apiserver_creates", uc, ue)
	row("kube_apiserver_etcd_puts", ue, nil)
	fmt.Fprintf(os.Stdout, "  %-28s %.2f×\n", "Waggle / kube-apiserver", wc.rate()/uc.rate())
	results["waggle_vs_kube_apiserver"] = wc.rate() / uc.rate()
	results["waggle_stored"], results["kube_apiserver_stored"] = wc.enc, uc.enc
	j, _ := json.Marshal(results)
	fmt.Fprintf(os.Stdout, "BENCH_JSON %s\n", j)
	var failed []string
	for _, s := range []*writeSeries{wc, we, uc, ue} {
		if s.errs > 0 {
			failed = append(failed, fmt.Sprintf("%d %s", s.errs, s.name))
		}
	}
	if len(failed) > 0 {
		b.Fatal(errors.New("failed writes: " + strings.Join(failed, ", ")))
	}
}
