// Package cluster runs a whole Waggle cluster in one process for a single
// machine — `waggle up`: embedded etcd and the API server, the scheduler, the
// controller-manager and, unless told otherwise, this machine's node (a
// kubelet on containerd, supervising its own containerd when none runs, and
// the service proxy).
//
// Each component runs exactly as its own `waggle <component>` would, with its
// own kubeconfig identity; this package only wires their configs together. It
// is not a multi-node lab (see package lab).
package cluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/waggle-io/waggle/clusterdns"
	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/controlplane/apiserver/serviceaccount"
	"github.com/waggle-io/waggle/controlplane/controllers"
	"github.com/waggle-io/waggle/controlplane/scheduler"
	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/modes"
	"github.com/waggle-io/waggle/internal/leaderelect"
	"github.com/waggle-io/waggle/internal/ops"
	"github.com/waggle-io/waggle/internal/secureserving"
	"github.com/waggle-io/waggle/kubelet"
	ctrdsup "github.com/waggle-io/waggle/kubelet/containerd"
	"github.com/waggle-io/waggle/kubelet/images"
)

// Config is `waggle up`'s configuration.
type Config struct {
	// EncryptionProviderConfig, Audit and PodSecurityConfigFile are the
	// API server's --encryption-provider-config, --audit-* and
	// --pod-security-config-file. SecretsEncryption, without an
	// EncryptionProviderConfig, encrypts Secrets with an aescbc key
	// generated once under DataDir/pki (EnsureSecretsEncryption).
	EncryptionProviderConfig string
	SecretsEncryption        bool
	Audit                    apiserver.AuditConfig
	PodSecurityConfigFile    string
	// StorageMediaType is the API server's --storage-media-type (empty:
	// protobuf).
	StorageMediaType string
	// DataDir holds etcd, the PKI, the kubeconfigs, the kubelet's state and
	// (when supervised) containerd. Running again with the same DataDir
	// resumes the same cluster.
	DataDir string
	// Node runs this machine's kubelet and proxy too; off, only the control
	// plane runs (the lab's nodes are separate processes).
	Node bool
	// NodeName and NodeIP default to the hostname and the default route's
	// address.
	NodeName, NodeIP string
	// BindAddress, SecurePort and AdvertiseAddress are the API server's.
	BindAddress      string
	SecurePort       int
	AdvertiseAddress string
	// ComponentsBindAddress, SchedulerPort and ControllerManagerPort are
	// where the scheduler and the controller-manager serve /healthz and
	// /metrics over HTTPS (internal/secureserving); a lab binds them to its own bridge address so that several
	// control planes share one host namespace.
	ComponentsBindAddress string
	SchedulerPort         int
	ControllerManagerPort int
	// ClusterCIDR is the pod network (nodes get /24s of it);
	// ServiceClusterIPRange and ServiceNodePortRange the Services'. For a
	// dual-stack cluster ClusterCIDR and ServiceClusterIPRange each hold
	// two comma-separated CIDRs, one per family, the primary first (as
	// upstream's flags: 10.244.0.0/16,fd00:10:244::/56); nodes then get a
	// /64 of the IPv6 pod network too.
	ClusterCIDR           string
	ServiceClusterIPRange string
	ServiceNodePortRange  string
	// ClusterDomain is the cluster DNS zone (default cluster.local). The
	// cluster DNS Service is the tenth address of ServiceClusterIPRange
	// (10.96.0.10), served by the node's proxy.
	ClusterDomain string
	// ContainerdAddress is the containerd socket; empty uses the system's
	// (/run/containerd/containerd.sock) when it serves, else starts one
	// under DataDir.
	ContainerdAddress string
	// ContainerdNamespace is the containerd namespace of the node's images
	// and containers (default waggle).
	ContainerdNamespace string
	// CgroupRoot is the parent cgroup of the node's pods (default /waggle).
	CgroupRoot string
	// BPFCgroupRoot is the cgroup v2 directory the proxy's eBPF programs
	// attach to (empty: the cgroup v2 root, so that every process of the
	// machine reaches Services); BPFPinDir is where the proxy pins its eBPF
	// maps and links (empty: /sys/fs/bpf/waggle/<node>). A machine running
	// several nodes, or a test, confines each to its own.
	BPFCgroupRoot, BPFPinDir string
	// EvictionHard is the kubelet's --eviction-hard (nil: its defaults;
	// given, it replaces the whole set).
	EvictionHard map[string]string
	// ProxyMode is auto, ebpf, iptables or ipvs.
	ProxyMode string
	// NodePortDevices is --nodeport-devices: auto (the device of the node's
	// address), none, or device names (see NodePortDevices).
	NodePortDevices string
	// LBMode is the proxy's --bpf-lb-mode: snat (empty: the proxy's
	// default), dsr or hybrid.
	LBMode string
	// CNIBinDir holds the waggle CNI plugin; ImageDir OCI archives imported
	// at start.
	CNIBinDir, ImageDir string
	LogLevel            string
	// NodeMonitorGracePeriod is how long a node may miss heartbeats before
	// it is NotReady (Kubernetes' default: 40 s).
	NodeMonitorGracePeriod time.Duration
	// LoadBalancerIPPools are the controller-manager's --loadbalancer-ip-pool
	// (empty: LoadBalancer Services stay pending).
	LoadBalancerIPPools []string
	// AuthorizationModes is the API server's --authorization-mode (default
	// Node,RBAC); AnonymousAuth its --anonymous-auth (default on).
	AuthorizationModes []string
	AnonymousAuth      bool
	// MetricsAPI and MetricsResolution are the API server's --metrics-api
	// (default native) and --metrics-resolution (default 15 s).
	MetricsAPI        string
	MetricsResolution time.Duration
	// EventTTL is the API server's --event-ttl (default 1h; 0: Events
	// never expire).
	EventTTL time.Duration
	// LeaseReuse is the API server's --lease-reuse-duration-seconds
	// (default 60 s; at least a second).
	LeaseReuse time.Duration
	// ClusterInit starts the first server of an HA control plane: its
	// embedded etcd member serves peers and clients on AdvertiseAddress so
	// that further servers can join (see ha.go).
	ClusterInit bool
	// Server, Token, CACertHashes and UnsafeSkipCAVerification join this
	// machine to the control plane of Server (https://host:port) as a
	// further server, with a server token from `waggle token create
	// --server`.
	Server                   string
	Token                    string
	CACertHashes             []string
	UnsafeSkipCAVerification bool
	// EtcdPeerPort and EtcdClientPort are the member's ports on
	// AdvertiseAddress (2380, 2379).
	EtcdPeerPort, EtcdClientPort int
	// EtcdServers, with EtcdCAFile/EtcdCertFile/EtcdKeyFile, use an
	// external etcd cluster instead of an embedded member.
	EtcdServers                           []string
	EtcdCAFile, EtcdCertFile, EtcdKeyFile string
	// ServiceAccountIssuer is the issuer of service-account tokens
	// (default https://kubernetes.default.svc.cluster.local); their
	// signing key pair is <data-dir>/pki/sa.key and sa.pub, generated on
	// the first start.
	ServiceAccountIssuer string
	// Out receives the human-facing lines (where the kubeconfig is).
	Out io.Writer
}

// Defaults returns the configuration of a plain `waggle up`.
func Defaults() Config {
	return Config{
		DataDir:                "/var/lib/waggle",
		Node:                   true,
		AnonymousAuth:          true,
		MetricsAPI:             "native",
		MetricsResolution:      15 * time.Second,
		EventTTL:               time.Hour,
		LeaseReuse:             time.Minute,
		BindAddress:            "0.0.0.0",
		SecurePort:             6443,
		ComponentsBindAddress:  "127.0.0.1",
		SchedulerPort:          10259,
		ControllerManagerPort:  controllers.DefaultPort,
		ClusterCIDR:            "10.244.0.0/16",
		ServiceClusterIPRange:  "10.96.0.0/12",
		ServiceNodePortRange:   "30000-32767",
		ClusterDomain:          clusterdns.DefaultClusterDomain,
		ProxyMode:              "auto",
		ContainerdNamespace:    "waggle",
		CgroupRoot:             "/waggle",
		NodePortDevices:        "auto",
		LogLevel:               "info",
		NodeMonitorGracePeriod: 40 * time.Second,
		Out:                    os.Stdout,
	}
}

const systemContainerd = "/run/containerd/containerd.sock"

// Run runs the cluster until ctx ends, then stops every component.
func Run(ctx context.Context, cfg Config) error {
	log, err := ops.NewLogger("up", cfg.LogLevel)
	if err != nil {
		return err
	}
	if cfg.DataDir == "" {
		return errors.New("--data-dir is required")
	}
	clusterCIDRs, err := kubelet.ParseDualStackPrefixes(cfg.ClusterCIDR)
	if err != nil || len(clusterCIDRs) == 0 {
		return fmt.Errorf("--cluster-cidr %q: want a CIDR, or one IPv4 and one IPv6 comma-separated (%v)", cfg.ClusterCIDR, err)
	}
	svcCIDRs, err := kubelet.ParseDualStackPrefixes(cfg.ServiceClusterIPRange)
	if err != nil || len(svcCIDRs) == 0 {
		return fmt.Errorf("--service-cluster-ip-range %q: want a CIDR, or one IPv4 and one IPv6 comma-separated (%v)", cfg.ServiceClusterIPRange, err)
	}
	if err := apiserver.ValidateEventTTL(cfg.EventTTL); err != nil {
		return err
	}
	if err := apiserver.ValidateLeaseReuse(cfg.LeaseReuse); err != nil {
		return err
	}
	// The cluster DNS Service is single-stack in the primary family, as
	// kubeadm's kube-dns of a dual-stack cluster.
	dnsIP := clusterdns.ServiceIP(svcCIDRs[0])
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = clusterdns.DefaultClusterDomain
	}
	fp, err := ClaimDataDir(cfg.DataDir, "up")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	member, err := controlPlaneMember(ctx, &cfg, log)
	if err != nil {
		return err
	}
	encConfig := cfg.EncryptionProviderConfig
	if encConfig == "" && cfg.SecretsEncryption {
		if encConfig, err = EnsureSecretsEncryption(cfg.DataDir); err != nil {
			return err
		}
	}
	saKey, saPub, err := pki.EnsureServiceAccountKey(filepath.Join(cfg.DataDir, "pki"))
	if err != nil {
		return err
	}
	issuer := cfg.ServiceAccountIssuer
	if issuer == "" {
		issuer = serviceaccount.DefaultIssuer
	}
	srv, err := apiserver.New(ctx, apiserver.Config{
		ServiceAccountIssuers:               []string{issuer},
		ServiceAccountSigningKeyFile:        saKey,
		ServiceAccountKeyFiles:              []string{saPub},
		ServiceAccountExtendTokenExpiration: true,
		EtcdMember:                          member,
		EtcdServers:                         cfg.EtcdServers,
		EtcdCAFile:                          cfg.EtcdCAFile,
		EtcdCertFile:                        cfg.EtcdCertFile,
		EtcdKeyFile:                         cfg.EtcdKeyFile,
		DataDir:                             cfg.DataDir,
		BindAddress:                         cfg.BindAddress,
		SecurePort:                          cfg.SecurePort,
		AdvertiseAddress:                    cfg.AdvertiseAddress,
		ServiceClusterIPRange:               cfg.ServiceClusterIPRange,
		ServiceNodePortRange:                cfg.ServiceNodePortRange,
		NodeName:                            cfg.NodeName,
		AuthorizationModes:                  cfg.AuthorizationModes,
		AnonymousAuth:                       cfg.AnonymousAuth,
		EnableBootstrapTokenAuth:            true,
		MetricsAPI:                          cfg.MetricsAPI,
		MetricsResolution:                   cfg.MetricsResolution,
		EventTTL:                            cfg.EventTTL,
		LeaseReuse:                          cfg.LeaseReuse,
		EncryptionProviderConfig:            encConfig,
		StorageMediaType:                    cfg.StorageMediaType,
		Audit:                               cfg.Audit,
		PodSecurityConfigFile:               cfg.PodSecurityConfigFile,
		// componentstatuses probes the ports this machine's components
		// really serve on (a lab binds them to its bridge address).
		ComponentProbes: map[string]string{
			"scheduler":          "https://" + net.JoinHostPort(probeHost(cfg.ComponentsBindAddress), strconv.Itoa(cfg.SchedulerPort)) + "/healthz",
			"controller-manager": "https://" + net.JoinHostPort(probeHost(cfg.ComponentsBindAddress), strconv.Itoa(cfg.ControllerManagerPort)) + "/healthz",
		},
		LogLevel: cfg.LogLevel,
		Log:      componentLog("apiserver", cfg.LogLevel),
	})
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	// The API server stops last: every other component's shutdown still
	// reaches it.
	apiCtx, stopAPI := context.WithCancel(context.WithoutCancel(ctx))
	apiDone := make(chan error, 1)
	go func() { apiDone <- srv.Serve(apiCtx) }()
	defer func() {
		stopAPI()
		if err := <-apiDone; err != nil {
			log.Error("api server shutdown", "err", err)
		}
	}()
	kc := func(name string) string { return filepath.Join(cfg.DataDir, name+".kubeconfig") }
	fmt.Fprintf(cfg.Out, "Waggle is starting: API server at %s\n  export KUBECONFIG=%s\n  kubectl get nodes\nStop it with `waggle down --data-dir %s` (add --purge to remove everything it made).\n", srv.URL(), kc("admin"), cfg.DataDir)

	g.Go(func() error {
		return supervise(gctx, log, "scheduler", func() error {
			return scheduler.Run(gctx, scheduler.Config{
				Kubeconfig:        kc("scheduler"),
				SchedulerName:     scheduler.DefaultSchedulerName,
				SecureServing:     componentServing(cfg, cfg.SchedulerPort),
				LogLevel:          cfg.LogLevel,
				QPS:               200,
				Burst:             400,
				Parallelism:       16,
				PodInitialBackoff: time.Second,
				PodMaxBackoff:     10 * time.Second,
				LeaderElection:    leaderElection("kube-scheduler", cfg.NodeName),
			})
		})
	})
	g.Go(func() error {
		cm := controllers.DefaultConfig()
		cm.Kubeconfig = kc("controller-manager")
		cm.ServiceAccountPrivateKeyFile = saKey
		cm.SecureServing = componentServing(cfg, cfg.ControllerManagerPort)
		cm.AllocateNodeCIDRs = true
		cm.ClusterCIDR = cfg.ClusterCIDR
		cm.NodeMonitorGracePeriod = cfg.NodeMonitorGracePeriod
		cm.ClusterDNSIP, cm.ClusterDNSPort = dnsIP.String(), clusterdns.DefaultPort
		cm.LoadBalancerIPPools = cfg.LoadBalancerIPPools
		// As k3s keeps its local-path volumes under its data dir.
		cm.LocalPathDir = filepath.Join(cfg.DataDir, "storage")
		// Every node of `waggle up` and the labs imports the echo image.
		cm.LocalPathHelperImage = images.EchoImage
		cm.LogLevel = cfg.LogLevel
		cm.Log = componentLog("controller-manager", cfg.LogLevel)
		cm.LeaderElection = leaderElection("kube-controller-manager", cfg.NodeName)
		// As kubeadm: the bootstrap token controllers on, and CSRs signed by
		// the cluster CA.
		cm.Controllers = []string{"*", controllers.BootstrapSignerName, controllers.TokenCleanerName}
		// As kubeadm: each controller as its own ServiceAccount, holding
		// only its system:controller:* role.
		cm.UseServiceAccountCredentials = true
		cm.ClusterSigningCertFile = filepath.Join(cfg.DataDir, "pki", "ca.crt")
		cm.ClusterSigningKeyFile = filepath.Join(cfg.DataDir, "pki", "ca.key")
		return supervise(gctx, log, "controller-manager", func() error { return controllers.Run(gctx, cm) })
	})
	if cfg.Node {
		if err := runNode(gctx, g, cfg, fp, log, kc, dnsIP, clusterCIDRs); err != nil {
			cancel()
			_ = g.Wait()
			return err
		}
	}
	err = g.Wait()
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		log.Info("stopped")
		return nil
	}
	return err
}

// supervise runs a standby component (scheduler, controller-manager) and
// runs it again when it exits on its own, as a supervisor restarts
// kube-scheduler or kube-controller-manager: one that loses its Lease
// exits (as upstream's), which must not take this server's API server and
// etcd member down with it (a server cut off from the others, then healed,
// keeps serving). Only ctx ending stops it.
func supervise(ctx context.Context, log *slog.Logger, name string, run func() error) error {
	for {
		err := run()
		if ctx.Err() != nil || errors.Is(err, controllers.ErrInvalidConfig) {
			return err
		}
		log.Warn("component exited; starting it again", "component", name, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

func leaderElection(name, nodeName string) leaderelect.Config {
	// One instance per process here, but the Lease still shows who leads,
	// and a second `waggle scheduler` may join. The holder identity starts
	// with the server's node name when it has one (as k3s's), not only the
	// hostname: servers sharing a hostname (the lab's, containers) stay
	// told apart in the Lease.
	id := ""
	if nodeName != "" {
		id = nodeName + "_" + string(uuid.NewUUID())
	}
	return leaderelect.Config{
		Enabled: true, LeaseName: name, LeaseNamespace: leaderelect.DefaultLeaseNamespace, Identity: id,
		LeaseDuration: leaderelect.DefaultLeaseDuration, RenewDeadline: leaderelect.DefaultRenewDeadline,
		RetryPeriod: leaderelect.DefaultRetryPeriod,
	}
}

// runNode starts containerd (when needed), the kubelet and the proxy.
func runNode(ctx context.Context, g *errgroup.Group, cfg Config, fp *Footprint, log *slog.Logger, kc func(string) string, dnsIP netip.Addr, clusterCIDRs []netip.Prefix) error {
	nodeName := cfg.NodeName
	if nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return err
		}
		nodeName = h
	}
	pinDir := cfg.BPFPinDir
	if pinDir == "" {
		pinDir = ebpf.DefaultPinRoot + "/" + nodeName
	}
	addr, sup, err := Containerd(ctx, g, cfg.ContainerdAddress, cfg.DataDir, cfg.LogLevel, log)
	if err != nil {
		return err
	}
	n := NodeFootprint{Name: nodeName, ContainerdNamespace: cfg.ContainerdNamespace,
		KubeletRootDir: filepath.Join(cfg.DataDir, "kubelet"), CNIConfDir: filepath.Join(cfg.DataDir, "cni", "net.d"),
		CgroupRoot: cfg.CgroupRoot, BPFCgroupRoot: cfg.BPFCgroupRoot, BPFPinDir: pinDir}
	n.SetContainerd(addr, sup)
	if err := fp.RecordNode(cfg.DataDir, n); err != nil {
		return err
	}
	cniBin := cfg.CNIBinDir
	if cniBin == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		cniBin = filepath.Join(filepath.Dir(exe), "cni")
	}
	kcfg := kubelet.Config{
		NodeName:            cfg.NodeName,
		NodeIP:              cfg.NodeIP,
		Kubeconfig:          kc("kubelet"),
		ContainerdAddress:   addr,
		ContainerdNamespace: n.ContainerdNamespace,
		CNIConfDir:          n.CNIConfDir,
		CNIBinDirs:          []string{cniBin},
		ClusterCIDR:         cfg.ClusterCIDR,
		CgroupRoot:          n.CgroupRoot,
		RootDir:             n.KubeletRootDir,
		ImageDir:            cfg.ImageDir,
		EvictionHard:        cfg.EvictionHard,
		Port:                10250,
		ClientCAFile:        filepath.Join(cfg.DataDir, "pki", "ca.crt"),
		// As long as the controller-manager waits for it (see lab).
		LeaseDuration: cfg.NodeMonitorGracePeriod,
		ClusterDNS:    []string{dnsIP.String()},
		ClusterDomain: cfg.ClusterDomain,
		ResolvConf:    "/etc/resolv.conf",
		// Static pods, as upstream's /etc/kubernetes/manifests.
		PodManifestPath: filepath.Join(cfg.DataDir, "manifests"),
		Log:             componentLog("kubelet", cfg.LogLevel),
	}
	g.Go(func() error { return kubelet.Run(ctx, kcfg) })
	npDevices, err := NodePortDevices(cfg.NodePortDevices, cfg.NodeIP)
	if err != nil {
		return err
	}
	// The node's cluster DNS server, the kube-dns Service's endpoint here
	// (see package clusterdns); like `waggle proxy`, a failure to serve is
	// logged, not fatal to the node.
	g.Go(func() error {
		dlog := componentLog("cluster-dns", cfg.LogLevel)
		if err := clusterdns.Run(ctx, clusterdns.Config{Kubeconfig: kc("proxy"), ClusterDomain: cfg.ClusterDomain,
			ResolvConf: "/etc/resolv.conf", Log: dlog}); err != nil {
			dlog.Error("cluster DNS stopped; pods on this node cannot resolve names", "err", err)
		}
		return nil
	})
	g.Go(func() error {
		return dataplane.Run(ctx, dataplane.Config{
			Kubeconfig:        kc("proxy"),
			NodeName:          nodeName,
			Mode:              cfg.ProxyMode,
			NodePortDevices:   npDevices,
			LBMode:            cmp.Or(cfg.LBMode, ebpf.LBModeSNAT),
			Modes:             modes.All(),
			CgroupRoot:        cfg.BPFCgroupRoot,
			BPFPinDir:         pinDir,
			MaxServices:       ebpf.DefaultMaxServices,
			MaxBackends:       ebpf.DefaultMaxBackends,
			MaxAffinity:       ebpf.DefaultMaxAffinity,
			MaxRevSocks:       ebpf.DefaultMaxReverseSockets,
			IPVSScheduler:     "rr",
			ClusterCIDRs:      clusterCIDRs,
			HealthBindAddress: "127.0.0.1:10256",
			SyncPeriod:        30 * time.Second,
			MinSyncPeriod:     time.Second,
			Log:               componentLog("proxy", cfg.LogLevel),
		})
	})
	return nil
}

// Containerd returns the containerd a node uses: addr if given, else the
// system's if it serves, else one supervised under <dataDir>/containerd
// (stopped when ctx ends; its exit fails g), returned too.
func Containerd(ctx context.Context, g *errgroup.Group, addr, dataDir, logLevel string, log *slog.Logger) (string, *ctrdsup.Daemon, error) {
	if addr == "" && serves(systemContainerd) {
		addr = systemContainerd
	}
	if addr != "" {
		return addr, nil, nil
	}
	d, err := ctrdsup.Start(ctx, ctrdsup.Options{Dir: filepath.Join(dataDir, "containerd"), Log: componentLog("containerd", logLevel)})
	if err != nil {
		return "", nil, fmt.Errorf("start containerd: %w", err)
	}
	log.Info("supervising containerd", "pid", d.PID(), "address", d.Address())
	g.Go(func() error {
		select {
		case <-ctx.Done():
			return d.Stop(context.WithoutCancel(ctx))
		case <-d.Done():
			return fmt.Errorf("containerd exited; see %s", d.Log())
		}
	})
	return d.Address(), d, nil
}

func serves(sock string) bool {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// componentLog is the logger of one component, tagged with its own name as
// when it runs as its own process (the level was validated by Run).
func componentLog(name, level string) *slog.Logger {
	l, err := ops.NewLogger(name, level)
	if err != nil {
		return slog.Default().With("component", name)
	}
	return l
}

// EnsureSecretsEncryption writes, once, DataDir/pki/encryption-config.yaml:
// Secrets encrypted with aescbc under a fresh random 32-byte key, identity
// second so that Secrets written before still read. It returns its path.
func EnsureSecretsEncryption(dataDir string) (string, error) {
	p := filepath.Join(dataDir, "pki", "encryption-config.yaml")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("secrets encryption key: %w", err)
	}
	conf := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: ["secrets"]
    providers:
      - aescbc:
          keys:
            - name: waggle-%s
              secret: %s
      - identity: {}
`, time.Now().UTC().Format("20060102"), base64.StdEncoding.EncodeToString(key))
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return "", err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(conf), 0o600); err != nil {
		return "", fmt.Errorf("secrets encryption config: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", fmt.Errorf("secrets encryption config: %w", err)
	}
	return p, nil
}

// probeHost is where a component bound to addr is reached from this
// machine: loopback for a wildcard address.
func probeHost(addr string) string {
	if ip := net.ParseIP(addr); ip == nil || ip.IsUnspecified() {
		return "127.0.0.1"
	}
	return addr
}

// componentServing is where the scheduler or the controller-manager serves
// HTTPS /healthz and /metrics: the components' bind address, a
// self-signed certificate kept in memory (as upstream's components do with
// no --cert-dir), and delegation through the component's own kubeconfig.
func componentServing(cfg Config, port int) secureserving.Options {
	o := secureserving.Defaults(port)
	o.BindAddress = cfg.ComponentsBindAddress
	return o
}
