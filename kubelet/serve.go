package kubelet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/containerd/namespaces"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/waggle-io/waggle/cni/routes"
	"github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/network"
	"github.com/waggle-io/waggle/kubelet/runtime"
	"github.com/waggle-io/waggle/kubelet/server"
)

func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} } //nolint:gosec // probes, as Kubernetes

// servingCert loads the configured serving cert or makes a self-signed one
// under RootDir/pki, as the kubelet does without --tls-cert-file.
func (k *Kubelet) servingCert() (tls.Certificate, error) {
	if k.cfg.TLSCertFile != "" {
		c, err := tls.LoadX509KeyPair(k.cfg.TLSCertFile, k.cfg.TLSPrivateKeyFile)
		if err != nil {
			return c, fmt.Errorf("kubelet serving cert: %w", err)
		}
		return c, nil
	}
	dir := filepath.Join(k.cfg.RootDir, "pki")
	certPath, keyPath := filepath.Join(dir, "kubelet.crt"), filepath.Join(dir, "kubelet.key")
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: k.cfg.NodeName + "@" + fmt.Sprint(time.Now().Unix())},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{k.cfg.NodeName, "localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	for _, a := range k.nodeIPs {
		if ip := net.ParseIP(a); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	if err := os.MkdirAll(dir, 0o700); err == nil {
		os.WriteFile(certPath, certPEM, 0o644)
		os.WriteFile(keyPath, keyPEM, 0o600)
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

func (k *Kubelet) startServer(ctx context.Context) (*server.Server, error) {
	cert, err := k.servingCert()
	if err != nil {
		return nil, err
	}
	auth, pool, err := k.apiAuth(ctx)
	if err != nil {
		return nil, err
	}
	srv, err := server.Start(server.Config{Address: k.cfg.Address, Port: k.cfg.Port, Cert: cert, ClientCAs: pool, Auth: auth, Log: k.log}, (*provider)(k))
	if err != nil {
		return nil, err
	}
	k.apiPortV.Store(int32(srv.Port()))
	if k.cfg.Ready != nil {
		k.cfg.Ready(srv.Port())
	}
	return srv, nil
}

// webhookBackoff is upstream's DefaultAuthWebhookRetryBackoff.
var webhookBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// apiAuth builds the kubelet API's authenticator and authorizer as
// upstream's kubelet does (cmd/kubelet/app/auth.go) with k8s.io/apiserver's
// delegating factories: client certificates of --client-ca-file (the file
// reloaded on change), bearer tokens by TokenReview, anonymous only with
// --anonymous-auth; authorization by SubjectAccessReview, answers cached.
// The returned pool is what the TLS handshake advertises.
func (k *Kubelet) apiAuth(ctx context.Context) (*server.Auth, *x509.CertPool, error) {
	ac := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:           &apiserver.AnonymousAuthConfig{Enabled: k.cfg.AnonymousAuth},
		CacheTTL:            k.cfg.TokenWebhookCacheTTL,
		WebhookRetryBackoff: &webhookBackoff,
	}
	if !k.cfg.DisableTokenWebhook {
		ac.TokenAccessReviewClient = k.client.AuthenticationV1()
	}
	var pool *x509.CertPool
	if k.cfg.ClientCAFile != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca-bundle", k.cfg.ClientCAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("kubelet --client-ca-file: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca.CurrentCABundleContent()) {
			return nil, nil, fmt.Errorf("kubelet --client-ca-file %s holds no PEM certificate", k.cfg.ClientCAFile)
		}
		go ca.Run(ctx, 1)
		ac.ClientCertificateCAContentProvider = ca
	} else {
		k.log.Warn("no --client-ca-file: the kubelet API accepts no client certificate (the API server cannot reach it for logs, exec, port-forward)")
	}
	authn, _, err := ac.New()
	if err != nil {
		return nil, nil, fmt.Errorf("kubelet API authenticator: %w", err)
	}
	var authz authorizer.Authorizer
	switch k.cfg.AuthorizationMode {
	case AuthzAlwaysAllow:
		k.log.Warn("--authorization-mode=AlwaysAllow: every authenticated client may exec into, read the logs of and port-forward to every pod of this node")
		authz = authorizerfactory.NewAlwaysAllowAuthorizer()
	default:
		authz, err = authorizerfactory.DelegatingAuthorizerConfig{
			SubjectAccessReviewClient: k.client.AuthorizationV1(),
			AllowCacheTTL:             k.cfg.AuthorizedCacheTTL,
			DenyCacheTTL:              k.cfg.UnauthorizedCacheTTL,
			WebhookRetryBackoff:       &webhookBackoff,
		}.New()
		if err != nil {
			return nil, nil, fmt.Errorf("kubelet API authorizer: %w", err)
		}
	}
	return &server.Auth{Authenticator: authn, Authorizer: authz, NodeName: k.cfg.NodeName}, pool, nil
}

// provider is the Kubelet seen by the API server.
type provider Kubelet

func (p *provider) Runtime() runtime.Runtime { return p.rt }

func (p *provider) Metrics() http.Handler {
	return promhttp.HandlerFor(p.health.Registry, promhttp.HandlerOpts{})
}

func (p *provider) Healthy(ctx context.Context) error {
	_, _, err := p.rt.Version(ctx)
	return err
}

func (p *provider) Pods() []*v1.Pod {
	k := (*Kubelet)(p)
	k.mu.Lock()
	ws := make([]*podWorker, 0, len(k.workers))
	for _, w := range k.workers {
		ws = append(ws, w)
	}
	k.mu.Unlock()
	out := make([]*v1.Pod, 0, len(ws))
	for _, w := range ws {
		pod, _ := w.snapshot()
		out = append(out, pod)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })
	return out
}

func (p *provider) PodUID(ns, pod string) (types.UID, error) {
	k := (*Kubelet)(p)
	w := k.workerByName(ns, pod)
	if w == nil {
		return "", fmt.Errorf("%w: pod %s/%s on node %s", server.ErrNotFound, ns, pod, k.cfg.NodeName)
	}
	return w.uid, nil
}

// PortForwardDial dials the port on the pod's loopback from inside its
// network namespace, as Kubernetes' kubelet does; a host-network pod is
// dialled on the node's loopback.
func (p *provider) PortForwardDial(ctx context.Context, ns, pod string, port int32) (net.Conn, error) {
	k := (*Kubelet)(p)
	uid, err := p.PodUID(ns, pod)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	if sb, err := k.loadSandbox(uid); err == nil && sb.NetNS != "" && !sb.Torn {
		return network.DialInNetNS(ctx, sb.NetNS, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (p *provider) Container(ns, pod, container string, previous bool) (runtime.Container, types.UID, error) {
	k := (*Kubelet)(p)
	w := k.workerByName(ns, pod)
	if w == nil {
		return runtime.Container{}, "", fmt.Errorf("%w: pod %s/%s on node %s", server.ErrNotFound, ns, pod, k.cfg.NodeName)
	}
	if container == "" {
		podObj, _ := w.snapshot()
		if len(podObj.Spec.Containers) > 0 {
			container = podObj.Spec.Containers[0].Name
		}
	}
	lookup := func() []runtime.Container {
		k.mu.Lock()
		defer k.mu.Unlock()
		return byName(k.snapshot[w.uid])[container]
	}
	l := lookup()
	c, ok := logInstance(l, previous)
	if !ok || (!previous && c.State != runtime.StateRunning) {
		// Just started or just exited: the last relist may lag behind.
		k.relist(context.Background())
		c, ok = logInstance(lookup(), previous)
	}
	if !ok {
		what := "container"
		if previous {
			what = "previous terminated container"
		}
		return runtime.Container{}, "", fmt.Errorf("%w: %s %q in pod %s/%s", server.ErrNotFound, what, container, ns, pod)
	}
	return c, w.uid, nil
}

// logInstance picks, among one container's instances (newest first), the
// one whose log /containerLogs serves: the newest, or with previous the one
// before it. A newest instance that a restart created but has not started
// yet has an empty log, and its container is waiting to start: then the
// last terminated instance is served, as upstream's kubelet answers from the
// container status's lastState.
func logInstance(l []runtime.Container, previous bool) (runtime.Container, bool) {
	idx := 0
	if previous {
		idx = 1
	} else if len(l) > 1 && l[0].State == runtime.StateCreated {
		idx = 1
	}
	if len(l) <= idx {
		return runtime.Container{}, false
	}
	return l[idx], true
}

// Summary implements /stats/summary: the node's figures from the machine
// (nodestats.go), each running container's from its cgroup, a pod's as the
// sum of its containers', CPU rates from the previous read of each counter.
func (p *provider) Summary(ctx context.Context) (*statsapi.Summary, error) {
	k := (*Kubelet)(p)
	now := metav1.Now()
	sum := &statsapi.Summary{Node: statsapi.NodeStats{NodeName: k.cfg.NodeName, StartTime: metav1.NewTime(k.startedAt)}}
	k.mu.Lock()
	snap := map[types.UID][]runtime.Container{}
	for uid, l := range k.snapshot {
		snap[uid] = append([]runtime.Container(nil), l...)
	}
	k.mu.Unlock()
	for uid, list := range snap {
		var ps statsapi.PodStats
		var podCPU, podMem, podWS, podRSS uint64
		var podRate *uint64
		for _, c := range list {
			if c.State != runtime.StateRunning {
				continue
			}
			ps.PodRef = statsapi.PodReference{Name: c.PodName, Namespace: c.PodNamespace, UID: string(uid)}
			st, err := k.rt.Stats(ctx, c.ID)
			if err != nil {
				continue
			}
			t := metav1.NewTime(st.Time)
			cpu, mem, ws, rss := st.CPUUsageNanos, st.MemoryUsage, st.MemoryWorkingSet, st.MemoryRSS
			rate := k.cpu.rate("c/"+c.ID, st.Time, cpu)
			cs := statsapi.ContainerStats{
				Name:      c.Name,
				StartTime: metav1.NewTime(c.StartedAt),
				CPU:       &statsapi.CPUStats{Time: t, UsageCoreNanoSeconds: &cpu, UsageNanoCores: rate},
				Memory:    &statsapi.MemoryStats{Time: t, UsageBytes: &mem, WorkingSetBytes: &ws, RSSBytes: &rss},
			}
			k.podDiskStats(ctx, c, &cs)
			if st.MemoryLimit > 0 && st.MemoryLimit < 1<<62 && st.MemoryLimit > ws {
				avail := st.MemoryLimit - ws
				cs.Memory.AvailableBytes = &avail
			}
			ps.Containers = append(ps.Containers, cs)
			podCPU += cpu
			podMem += mem
			podWS += ws
			podRSS += rss
			if rate != nil {
				r := *rate
				if podRate != nil {
					r += *podRate
				}
				podRate = &r
			}
			if ps.Network == nil && (st.RxBytes > 0 || st.TxBytes > 0) {
				rx, tx, rxe, txe := st.RxBytes, st.TxBytes, st.RxErrors, st.TxErrors
				ps.Network = &statsapi.NetworkStats{Time: t, InterfaceStats: statsapi.InterfaceStats{
					Name: "eth0", RxBytes: &rx, TxBytes: &tx, RxErrors: &rxe, TxErrors: &txe}}
			}
		}
		if len(ps.Containers) == 0 {
			continue
		}
		sort.Slice(ps.Containers, func(i, j int) bool { return ps.Containers[i].Name < ps.Containers[j].Name })
		ps.StartTime = ps.Containers[0].StartTime
		for _, c := range ps.Containers {
			if c.StartTime.Before(&ps.StartTime) {
				ps.StartTime = c.StartTime
			}
		}
		ps.CPU = &statsapi.CPUStats{Time: now, UsageCoreNanoSeconds: &podCPU, UsageNanoCores: podRate}
		ps.Memory = &statsapi.MemoryStats{Time: now, UsageBytes: &podMem, WorkingSetBytes: &podWS, RSSBytes: &podRSS}
		ps.ProcessStats = k.podProcesses(uid)
		sum.Pods = append(sum.Pods, ps)
	}
	sort.Slice(sum.Pods, func(i, j int) bool {
		return sum.Pods[i].PodRef.Namespace+"/"+sum.Pods[i].PodRef.Name < sum.Pods[j].PodRef.Namespace+"/"+sum.Pods[j].PodRef.Name
	})
	if cpu, ok := nodeCPUNanos(); ok {
		sum.Node.CPU = &statsapi.CPUStats{Time: now, UsageCoreNanoSeconds: &cpu, UsageNanoCores: k.cpu.rate("node", now.Time, cpu)}
	}
	if mem, ok := nodeMemory(); ok {
		mem.Time = now
		sum.Node.Memory = mem
	}
	sum.Node.Fs = fsStats(k.cfg.RootDir, now)
	// The image filesystem is the one holding the snapshotter's root (the
	// node's own when they are the same, or the runtime cannot say).
	imageFs := sum.Node.Fs
	if dir := k.imageFsDir(ctx); dir != "" {
		if st := fsStats(dir, now); st != nil {
			imageFs = st
		}
	}
	sum.Node.Runtime = &statsapi.RuntimeStats{ImageFs: imageFs}
	sum.Node.Rlimit = nodeRlimit(now)
	return sum, nil
}

func importImageDir(ctx context.Context, c *runtime.Containerd, dir string, log *slog.Logger) error {
	ictx := namespaces.WithNamespace(ctx, c.Namespace())
	names, err := images.ImportDir(ictx, c.Client(), dir, "")
	if err != nil {
		return fmt.Errorf("import --image-dir: %w", err)
	}
	if len(names) > 0 {
		log.Info("imported images", "dir", dir, "images", names)
	}
	return nil
}

func (k *Kubelet) startRouteController(ctx context.Context, wg *sync.WaitGroup) {
	if k.cfg.Runtime == RuntimeHollow || k.cfg.DisableRouteController {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := routes.Run(ctx, k.client, routes.Config{NodeName: k.cfg.NodeName, Log: k.log}); err != nil && ctx.Err() == nil {
			k.log.Error("route controller", "err", err)
		}
	}()
}
