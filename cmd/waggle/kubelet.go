package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	k8sflag "k8s.io/component-base/cli/flag"

	"github.com/waggle-io/waggle/internal/cliflag"
	"github.com/waggle-io/waggle/internal/ops"
	"github.com/waggle-io/waggle/kubelet"
)

// runKubelet parses `waggle kubelet` flags into kubelet.Config and runs it.
func runKubelet(ctx context.Context, args []string) error {
	fs := cliflag.NewFlagSet("kubelet", "Run the node agent: register the node, run its pods on containerd, serve the kubelet API.")
	var cfg kubelet.Config
	var labels, taints, cniBin, clusterDNS, localRegistries cliflag.StringList
	logLevel := fs.String("log-level", "info", "log level (debug, info, warn, error)")
	fs.StringVar(&cfg.NodeName, "hostname-override", "", "node name (default: the hostname)")
	fs.StringVar(&cfg.NodeName, "node-name", "", "node name (alias of --hostname-override)")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	fs.StringVar(&cfg.BootstrapKubeconfig, "bootstrap-kubeconfig", "", "kubeconfig with a bootstrap token: while --kubeconfig has no valid client certificate, request one through a CertificateSigningRequest and write --kubeconfig (TLS bootstrap)")
	fs.StringVar(&cfg.CertDir, "cert-dir", "", "where the TLS-bootstrapped key and certificate are kept (default <root-dir>/pki)")
	rotate := ""
	fs.BoolFunc("rotate-certificates", "rotate the client certificate through CSRs before it expires and switch to each new one without a restart (default: true with --bootstrap-kubeconfig)", func(v string) error {
		if _, err := strconv.ParseBool(v); err != nil {
			return fmt.Errorf("--rotate-certificates %q: %w", v, err)
		}
		rotate = v
		return nil
	})
	fs.StringVar(&cfg.NodeIP, "node-ip", "", "the node's InternalIP, or two comma-separated (IPv4,IPv6) for a dual-stack node (default: the default route's source address)")
	fs.Var(&labels, "node-labels", "extra node labels, key=value[,key=value...]")
	fs.Var(&taints, "register-with-taints", "taints set at registration, key=value:Effect[,...]")
	fs.IntVar(&cfg.MaxPods, "max-pods", 110, "pods capacity")
	fs.StringVar(&cfg.Runtime, "runtime", "containerd", "container runtime: containerd, or hollow (in-memory containers and addresses, probes pass: a hollow node for control-plane scale tests)")
	fs.StringVar(&cfg.ContainerdAddress, "containerd-address", "/run/containerd/containerd.sock", "containerd socket")
	fs.StringVar(&cfg.ContainerdNamespace, "containerd-namespace", "waggle", "containerd namespace of this node's images and containers")
	fs.StringVar(&cfg.ContainerLogger, "container-logger", "", "binary the containerd shim runs as `<binary> container-logger <log>` to write containers' CRI logs (default: waggle-container-logger beside this binary, else this waggle binary)")
	fs.StringVar(&cfg.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "CNI network configuration dir (written from the node's pod CIDR when empty)")
	fs.Var(&cniBin, "cni-bin-dir", "CNI plugin dirs (default /opt/cni/bin,/usr/lib/cni)")
	fs.StringVar(&cfg.CNICacheDir, "cni-cache-dir", "", "libcni result cache (default <root-dir>/cni-cache)")
	fs.StringVar(&cfg.PodCIDR, "pod-cidr", "", "pod CIDR when the Node has no spec.podCIDR (standalone)")
	fs.StringVar(&cfg.ClusterCIDR, "cluster-cidr", "", "cluster pod CIDR (IPv4,IPv6 for dual-stack), not masqueraded (goes into the CNI config)")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", "", "cgroup under which pods' cgroups are made (default /waggle/<node>)")
	fs.StringVar(&cfg.RootDir, "root-dir", "", "kubelet state dir (default /var/lib/waggle/kubelet/<node>)")
	fs.StringVar(&cfg.NetNSDir, "netns-dir", "/run/netns", "where pod network namespaces are bind-mounted")
	fs.StringVar(&cfg.PodManifestPath, "pod-manifest-path", "", "static pod manifests dir")
	fs.StringVar(&cfg.ImageDir, "image-dir", "", "dir of OCI/Docker image archives imported at start")
	fs.Var(&localRegistries, "local-registries", "registries (e.g. registry.k8s.io) whose images the node has only from --image-dir, as waggle.local's: never pulled; imagePullPolicy Always takes the node's copy")
	fs.StringVar(&cfg.Address, "address", "0.0.0.0", "kubelet API address")
	fs.IntVar(&cfg.Port, "port", 10250, "kubelet API port (0 picks a free port)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "kubelet API serving cert (default: self-signed under the root dir)")
	fs.StringVar(&cfg.TLSPrivateKeyFile, "tls-private-key-file", "", "kubelet API serving key")
	fs.StringVar(&cfg.ClientCAFile, "client-ca-file", "", "CA that signs the client certificates of the kubelet API (the API server's); reloaded when it changes")
	fs.BoolVar(&cfg.AnonymousAuth, "anonymous-auth", false, "let requests to the kubelet API without a credential through as system:anonymous (still authorized)")
	tokenWebhook := fs.Bool("authentication-token-webhook", true, "authenticate bearer tokens to the kubelet API by TokenReview against the API server")
	fs.DurationVar(&cfg.TokenWebhookCacheTTL, "authentication-token-webhook-cache-ttl", 2*time.Minute, "how long TokenReview answers are cached")
	fs.StringVar(&cfg.AuthorizationMode, "authorization-mode", kubelet.AuthzWebhook, "kubelet API authorization: Webhook (a SubjectAccessReview per request) or AlwaysAllow")
	fs.DurationVar(&cfg.AuthorizedCacheTTL, "authorization-webhook-cache-authorized-ttl", 5*time.Minute, "how long allowed SubjectAccessReview answers are cached")
	fs.DurationVar(&cfg.UnauthorizedCacheTTL, "authorization-webhook-cache-unauthorized-ttl", 30*time.Second, "how long denied SubjectAccessReview answers are cached")
	fs.StringVar(&cfg.HealthAddress, "healthz-address", "127.0.0.1:10248", "plain-HTTP /healthz, /readyz, /metrics (0 disables)")
	fs.DurationVar(&cfg.NodeStatusUpdateFrequency, "node-status-update-frequency", 10*time.Second, "node status update period")
	fs.DurationVar(&cfg.LeaseDuration, "node-lease-duration", 40*time.Second, "duration of the node's Lease (kubelet config nodeLeaseDurationSeconds); it is renewed every quarter of it, so keep it at the controller-manager's --node-monitor-grace-period")
	fs.IntVar(&cfg.ParallelStarts, "max-parallel-container-starts", 0, "cap on container starts in flight on the node (0: none, as upstream's kubelet, which bounds only image pulls)")
	fs.StringVar(&cfg.KubeAPIContentType, "kube-api-content-type", kubelet.ContentTypeProtobuf, "media type of the requests to the API server: "+kubelet.ContentTypeProtobuf+" (JSON accepted too, as upstream's default) or "+kubelet.ContentTypeJSON)
	fs.DurationVar(&cfg.SyncFrequency, "sync-frequency", time.Second, "pod resync and runtime relist period")
	fs.Var(&clusterDNS, "cluster-dns", "nameserver(s) of ClusterFirst pods, comma-separated: the kube-dns Service's ClusterIP (empty: pods use the node's resolvers)")
	fs.StringVar(&cfg.ClusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain, for pods' search path")
	fs.StringVar(&cfg.ResolvConf, "resolv-conf", "/etc/resolv.conf", "the node's resolver configuration, for dnsPolicy Default and ClusterFirst's search path (empty: none)")
	fs.Var(k8sflag.NewLangleSeparatedMapStringString(&cfg.EvictionHard), "eviction-hard", "hard eviction thresholds, signal<quantity or percent (e.g. memory.available<1Gi); default memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%; given, it replaces the whole set")
	fs.Var(k8sflag.NewLangleSeparatedMapStringString(&cfg.EvictionSoft), "eviction-soft", "soft eviction thresholds (e.g. memory.available<1.5Gi), each met for its --eviction-soft-grace-period before a pod is evicted")
	fs.Var(k8sflag.NewMapStringString(&cfg.EvictionSoftGracePeriod), "eviction-soft-grace-period", "grace periods of the soft thresholds (e.g. memory.available=1m30s)")
	fs.Var(k8sflag.NewMapStringString(&cfg.EvictionMinimumReclaim), "eviction-minimum-reclaim", "minimum reclaims (e.g. imagefs.available=2Gi): how far past a threshold the kubelet reclaims once it acts")
	fs.DurationVar(&cfg.EvictionPressureTransitionPeriod, "eviction-pressure-transition-period", 5*time.Minute, "how long a pressure condition stays after its signal clears")
	evictionMaxGrace := fs.Int("eviction-max-pod-grace-period", 0, "maximum grace period (seconds) of a pod evicted for a soft threshold (0: killed at once)")
	fs.IntVar(&cfg.ImageGCHighThresholdPercent, "image-gc-high-threshold", 85, "image filesystem usage percent at which unused images are removed (100 disables image garbage collection)")
	fs.IntVar(&cfg.ImageGCLowThresholdPercent, "image-gc-low-threshold", 80, "image filesystem usage percent image garbage collection frees down to")
	fs.DurationVar(&cfg.ImageMinimumGCAge, "image-minimum-gc-age", 2*time.Minute, "minimum age of an unused image before it is garbage collected")
	fs.BoolVar(&cfg.DisableRouteController, "disable-route-controller", false, "do not run the cross-node pod route controller")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	// As kubeadm's KubeletConfiguration (rotateCertificates: true) for a
	// kubelet that bootstraps its certificate.
	cfg.RotateCertificates = cfg.BootstrapKubeconfig != ""
	if rotate != "" {
		cfg.RotateCertificates, _ = strconv.ParseBool(rotate)
	}
	var err error
	if cfg.NodeLabels, err = kubelet.ParseLabels(labels); err != nil {
		return err
	}
	cfg.RegisterWithTaints = taints
	cfg.DisableTokenWebhook = !*tokenWebhook
	cfg.EvictionMaxPodGracePeriod = int32(*evictionMaxGrace) //nolint:gosec // seconds
	cfg.CNIBinDirs = cniBin
	cfg.ClusterDNS = clusterDNS
	cfg.LocalRegistries = localRegistries
	if cfg.Log, err = ops.NewLogger("kubelet", *logLevel); err != nil {
		return err
	}
	return kubelet.Run(ctx, cfg)
}
