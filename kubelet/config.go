// Package kubelet is Waggle's node agent: it registers its Node (capacity,
// labels, taints), renews its Lease and NodeStatus, watches the pods bound to
// it (and static pods from a manifest dir, mirrored into the API), and runs
// them on containerd: a network namespace and CNI per pod, a cgroup under the
// node's cgroup root, init and app containers with restart policies and
// back-off, probes, graceful termination, and status written through
// pods/status. It reports node pressure (MemoryPressure, DiskPressure,
// PIDPressure), refuses and evicts pods under it and collects unused images,
// as upstream's eviction and image GC managers (kubelet/internal/eviction).
// It serves the kubelet API on 10250 (kubelet/server).
//
// Config and Run let `waggle kubelet`, `waggle up` and the lab run it, as a
// process or in-process. It is not the container runtime (kubelet/runtime),
// the pod network (kubelet/network, the CNI plugin in cni/) or the scheduler:
// it runs what is bound to it.
package kubelet

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"time"

	"k8s.io/client-go/rest"

	"github.com/waggle-io/waggle/internal/apiclient"
	"github.com/waggle-io/waggle/kubelet/internal/eviction"
)

// ErrInvalidConfig marks a configuration the kubelet cannot run with.
var ErrInvalidConfig = errors.New("invalid kubelet config")

// The modes of Config.AuthorizationMode.
const (
	AuthzWebhook     = "Webhook"
	AuthzAlwaysAllow = "AlwaysAllow"
)

// The runtimes of Config.Runtime.
const (
	RuntimeContainerd = "containerd"
	RuntimeHollow     = "hollow"
)

// The media types of Config.KubeAPIContentType.
const (
	ContentTypeProtobuf = apiclient.Protobuf
	ContentTypeJSON     = apiclient.JSON
)

// Config is everything the kubelet runs with.
type Config struct {
	// NodeName is the Node's name (default: the hostname).
	NodeName string
	// Kubeconfig is the path of the API client config; RestConfig, when set,
	// is used instead (in-process).
	Kubeconfig string
	RestConfig *rest.Config
	// BootstrapKubeconfig, when set, is a kubeconfig with a bootstrap token
	// the kubelet requests its own client certificate with (TLS bootstrap,
	// see tlsBootstrap) before it writes and uses Kubeconfig; CertDir is
	// where the key and certificate go (default <root-dir>/pki).
	BootstrapKubeconfig string
	CertDir             string
	// RotateCertificates rotates the client certificate of Kubeconfig
	// before it expires through new CSRs, and switches the kubelet's API
	// client to each new certificate without a restart (kubelet
	// --rotate-certificates; see rotatingClientConfig). `waggle kubelet`
	// turns it on with a bootstrap kubeconfig. Only with Kubeconfig, not
	// RestConfig.
	RotateCertificates bool
	// NodeIP is the node's InternalIP (default: the address of the default
	// route's interface), or, as upstream's --node-ip, two comma-separated
	// addresses of different families for a dual-stack node (the first is
	// the primary: status.hostIP and the first InternalIP).
	NodeIP string
	// NodeLabels are extra labels; RegisterWithTaints are taints set at
	// registration ("key=value:Effect").
	NodeLabels         map[string]string
	RegisterWithTaints []string
	// MaxPods is the pods capacity (default 110).
	MaxPods int
	// Runtime is RuntimeContainerd (default) or RuntimeHollow (a hollow
	// node for control-plane scale tests: in-memory containers and
	// addresses, probes pass). "fake" is accepted as an older name of hollow.
	Runtime string
	// ContainerdAddress and ContainerdNamespace select containerd and the
	// namespace of this node's images and containers.
	ContainerdAddress   string
	ContainerdNamespace string
	// ContainerLogger is the binary the containerd shim starts as
	// `<ContainerLogger> container-logger <log>` to write each container's
	// CRI-format log (default: waggle-container-logger beside this
	// executable, else this executable, the waggle binary).
	ContainerLogger string
	// CNIConfDir and CNIBinDirs are the CNI plugin's config and binaries;
	// CNICacheDir libcni's cache (default under RootDir).
	CNIConfDir  string
	CNIBinDirs  []string
	CNICacheDir string
	// PodCIDR is used to write the CNI config when the Node has no
	// spec.podCIDR; ClusterCIDR goes into that config (no masquerade inside).
	// ClusterCIDR may be dual-stack: one comma-separated CIDR per family,
	// as the controller-manager's --cluster-cidr.
	PodCIDR     string
	ClusterCIDR string
	// CgroupRoot is the cgroup path (relative to the hierarchy roots, or
	// an absolute path under the cgroup2 mount) under which pod cgroups are
	// made, e.g. /waggle/node1.
	CgroupRoot string
	// RootDir holds the kubelet's state: pods' volumes, logs and sandboxes
	// (default /var/lib/waggle/kubelet/<node>).
	RootDir string
	// NetNSDir is where pod network namespaces are bind-mounted.
	NetNSDir string
	// PodManifestPath is the static pods' directory ("" disables).
	PodManifestPath string
	// ClusterDNS are the nameservers of ClusterFirst pods (the kube-dns
	// Service's ClusterIP); ClusterDomain the cluster's DNS zone (default
	// cluster.local); ResolvConf the node's resolver configuration, used by
	// dnsPolicy Default and appended to ClusterFirst's search path (default
	// /etc/resolv.conf; "" means none).
	ClusterDNS    []string
	ClusterDomain string
	ResolvConf    string

	// ImageDir is imported into containerd at start ("" disables).
	ImageDir string
	// LocalRegistries are registries whose images this node has only from
	// ImageDir (or `waggle images`), like waggle.local's: never pulled, and
	// imagePullPolicy Always takes the node's copy (a node that cannot
	// reach them, as the air-gapped conformance lab and registry.k8s.io).
	LocalRegistries []string
	// Address and Port of the kubelet API (Port 0 picks a free port).
	Address string
	Port    int
	// TLSCertFile/TLSPrivateKeyFile serve the API (generated self-signed
	// under RootDir when empty); ClientCAFile authenticates clients by
	// certificate (reloaded when the file changes; no file: no client
	// certificate is accepted).
	TLSCertFile, TLSPrivateKeyFile, ClientCAFile string
	// AnonymousAuth lets requests without a credential through as
	// system:anonymous, to be authorized like any other (default false: 401).
	AnonymousAuth bool
	// DisableTokenWebhook stops bearer tokens from being checked by
	// TokenReview against the API server (upstream's
	// --authentication-token-webhook, on by default here).
	DisableTokenWebhook bool
	// AuthorizationMode is AuthzWebhook (default: a SubjectAccessReview per
	// request) or AuthzAlwaysAllow (every authenticated request).
	AuthorizationMode string
	// TokenWebhookCacheTTL caches TokenReview answers (default 2 m);
	// AuthorizedCacheTTL and UnauthorizedCacheTTL cache SubjectAccessReview
	// answers (defaults 5 m and 30 s), as upstream's kubelet.
	TokenWebhookCacheTTL, AuthorizedCacheTTL, UnauthorizedCacheTTL time.Duration
	// HealthAddress serves /healthz, /readyz, /metrics over plain HTTP
	// ("" or "0" disables).
	HealthAddress string
	// NodeStatusUpdateFrequency and LeaseDuration (defaults 10 s and 40 s);
	// the Lease is renewed every LeaseDuration/4.
	NodeStatusUpdateFrequency time.Duration
	LeaseDuration             time.Duration
	// SyncFrequency is how often every pod is resynced (default 1 s, the
	// relist of the runtime).
	SyncFrequency time.Duration
	// BackoffBase and BackoffMax bound CrashLoopBackOff (10 s and 5 min).
	BackoffBase, BackoffMax time.Duration
	// ParallelStarts caps the container starts in flight on the node (0, the
	// default: no cap). Upstream's kubelet has no such cap — every pod
	// worker starts its containers at once, only image pulls are bounded
	// (serializeImagePulls, maxParallelImagePulls) — and none is needed:
	// with a cap of 4 per CPU a burst of 100 pods waited ~7 s per pod for a
	// slot and started at a third of the rate containerd + runc reach with
	// all 100 in flight. --max-parallel-container-starts sets it.
	ParallelStarts int
	// KubeAPIContentType is the media type of the kubelet's requests to
	// the API server and the one it asks for first (kubelet
	// --kube-api-content-type): protobuf by default, as upstream's
	// kubelet, with JSON accepted too; "application/json" for JSON only.
	// A client given in Deps keeps its own.
	KubeAPIContentType string
	// StartNetwork starts the cross-node route controller (default true
	// with the containerd runtime).
	DisableRouteController bool
	// Node pressure and eviction, upstream's flags (kubelet/eviction.go):
	// EvictionHard, EvictionSoft ("signal" → "quantity" or "percent%") and
	// EvictionSoftGracePeriod ("signal" → duration), EvictionMinimumReclaim
	// ("signal" → quantity or percent). A nil EvictionHard is upstream's
	// default (memory.available<100Mi, nodefs.available<10%,
	// nodefs.inodesFree<5%, imagefs.available<15%, imagefs.inodesFree<5%);
	// an empty one sets no hard threshold.
	EvictionHard, EvictionSoft, EvictionSoftGracePeriod, EvictionMinimumReclaim map[string]string
	// EvictionPressureTransitionPeriod is how long a pressure condition
	// stays after its signal clears (default 5 m).
	EvictionPressureTransitionPeriod time.Duration
	// EvictionMaxPodGracePeriod bounds, in seconds, a soft eviction's grace
	// period (0, upstream's default: the pod is killed at once).
	EvictionMaxPodGracePeriod int32
	// EvictionMonitoringInterval is how often the eviction manager looks
	// (default 10 s, upstream's fixed period; tests shorten it).
	EvictionMonitoringInterval time.Duration
	// ImageGCHighThresholdPercent and ImageGCLowThresholdPercent: at or
	// over the high disk usage of the image filesystem, unused images are
	// removed down to the low one (defaults 85 and 80, a zero value takes
	// the default; 100 disables). ImageMinimumGCAge is the age an unused
	// image must have (default 2 m); ImageGCPeriod how often usage is
	// checked (default 5 m, upstream's fixed period).
	ImageGCHighThresholdPercent, ImageGCLowThresholdPercent int
	ImageMinimumGCAge, ImageGCPeriod                        time.Duration
	// Log is the logger (default: a discard logger).
	Log *slog.Logger
	// Ready, when set, receives the bound API port once serving (tests).
	Ready func(apiPort int)
}

// WithDefaults returns c with every unset field defaulted.
func (c Config) WithDefaults() Config {
	if c.MaxPods == 0 {
		c.MaxPods = 110
	}
	if c.ClusterDomain == "" {
		c.ClusterDomain = "cluster.local"
	}
	if c.Runtime == "" {
		c.Runtime = RuntimeContainerd
	}
	if c.Runtime == "fake" {
		c.Runtime = RuntimeHollow
	}
	if c.ContainerdAddress == "" {
		c.ContainerdAddress = "/run/containerd/containerd.sock"
	}
	if c.ContainerdNamespace == "" {
		c.ContainerdNamespace = "waggle"
	}
	if c.CNIConfDir == "" {
		c.CNIConfDir = "/etc/cni/net.d"
	}
	if len(c.CNIBinDirs) == 0 {
		c.CNIBinDirs = []string{"/opt/cni/bin", "/usr/lib/cni"}
	}
	if c.CgroupRoot == "" {
		c.CgroupRoot = "/waggle/" + c.NodeName
	}
	if c.RootDir == "" {
		c.RootDir = "/var/lib/waggle/kubelet/" + c.NodeName
	}
	if c.CNICacheDir == "" {
		c.CNICacheDir = c.RootDir + "/cni-cache"
	}
	if c.NetNSDir == "" {
		c.NetNSDir = "/run/netns"
	}
	if c.NodeStatusUpdateFrequency == 0 {
		c.NodeStatusUpdateFrequency = 10 * time.Second
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 40 * time.Second
	}
	if c.KubeAPIContentType == "" {
		c.KubeAPIContentType = ContentTypeProtobuf
	}
	if c.SyncFrequency == 0 {
		c.SyncFrequency = time.Second
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = 10 * time.Second
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = 5 * time.Minute
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.EvictionHard == nil {
		c.EvictionHard = maps.Clone(eviction.DefaultEvictionHard)
	}
	if c.EvictionPressureTransitionPeriod == 0 {
		c.EvictionPressureTransitionPeriod = eviction.DefaultPressureTransitionPeriod
	}
	if c.EvictionMonitoringInterval == 0 {
		c.EvictionMonitoringInterval = eviction.DefaultMonitoringInterval
	}
	if c.ImageGCHighThresholdPercent == 0 {
		c.ImageGCHighThresholdPercent = eviction.DefaultImageGCHighThreshold
	}
	if c.ImageGCLowThresholdPercent == 0 {
		c.ImageGCLowThresholdPercent = eviction.DefaultImageGCLowThreshold
	}
	if c.ImageMinimumGCAge == 0 {
		c.ImageMinimumGCAge = eviction.DefaultImageMinimumGCAge
	}
	if c.ImageGCPeriod == 0 {
		c.ImageGCPeriod = 5 * time.Minute
	}
	if c.AuthorizationMode == "" {
		c.AuthorizationMode = AuthzWebhook
	}
	if c.TokenWebhookCacheTTL == 0 {
		c.TokenWebhookCacheTTL = 2 * time.Minute
	}
	if c.AuthorizedCacheTTL == 0 {
		c.AuthorizedCacheTTL = 5 * time.Minute
	}
	if c.UnauthorizedCacheTTL == 0 {
		c.UnauthorizedCacheTTL = 30 * time.Second
	}
	return c
}

// Validate reports the first problem of a defaulted config.
func (c Config) Validate() error {
	if c.NodeName == "" {
		return fmt.Errorf("%w: node name is empty", ErrInvalidConfig)
	}
	if c.ParallelStarts < 0 {
		return fmt.Errorf("%w: --max-parallel-container-starts=%d (want 0, no cap, or more)", ErrInvalidConfig, c.ParallelStarts)
	}
	if c.KubeAPIContentType != ContentTypeProtobuf && c.KubeAPIContentType != ContentTypeJSON {
		return fmt.Errorf("%w: --kube-api-content-type=%q (want %s or %s)", ErrInvalidConfig, c.KubeAPIContentType, ContentTypeProtobuf, ContentTypeJSON)
	}
	if c.Kubeconfig == "" && c.RestConfig == nil {
		return fmt.Errorf("%w: no kubeconfig given (--kubeconfig)", ErrInvalidConfig)
	}
	if c.Runtime != RuntimeContainerd && c.Runtime != RuntimeHollow {
		return fmt.Errorf("%w: --runtime=%q (want containerd or hollow)", ErrInvalidConfig, c.Runtime)
	}
	if c.PodCIDR != "" {
		if _, err := netip.ParsePrefix(c.PodCIDR); err != nil {
			return fmt.Errorf("%w: --pod-cidr: %v", ErrInvalidConfig, err)
		}
	}
	if _, err := ParseDualStackPrefixes(c.ClusterCIDR); err != nil {
		return fmt.Errorf("%w: --cluster-cidr: %v", ErrInvalidConfig, err)
	}
	for _, ip := range c.ClusterDNS {
		if _, err := netip.ParseAddr(ip); err != nil {
			return fmt.Errorf("%w: --cluster-dns: %v", ErrInvalidConfig, err)
		}
	}
	if _, err := ParseNodeIPs(c.NodeIP); err != nil {
		return fmt.Errorf("%w: --node-ip: %v", ErrInvalidConfig, err)
	}
	if _, err := ParseTaints(c.RegisterWithTaints); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if c.AuthorizationMode != AuthzWebhook && c.AuthorizationMode != AuthzAlwaysAllow {
		return fmt.Errorf("%w: --authorization-mode=%q (want Webhook or AlwaysAllow)", ErrInvalidConfig, c.AuthorizationMode)
	}
	if _, err := eviction.ParseThresholdConfig(c.EvictionHard, c.EvictionSoft, c.EvictionSoftGracePeriod, c.EvictionMinimumReclaim); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if c.ImageGCHighThresholdPercent < 0 || c.ImageGCHighThresholdPercent > 100 {
		return fmt.Errorf("%w: --image-gc-high-threshold %d must be within [0, 100]", ErrInvalidConfig, c.ImageGCHighThresholdPercent)
	}
	if c.ImageGCLowThresholdPercent < 0 || c.ImageGCLowThresholdPercent > 100 {
		return fmt.Errorf("%w: --image-gc-low-threshold %d must be within [0, 100]", ErrInvalidConfig, c.ImageGCLowThresholdPercent)
	}
	if c.ImageGCLowThresholdPercent > c.ImageGCHighThresholdPercent {
		return fmt.Errorf("%w: --image-gc-low-threshold %d can not be higher than --image-gc-high-threshold %d", ErrInvalidConfig, c.ImageGCLowThresholdPercent, c.ImageGCHighThresholdPercent)
	}
	if c.ImageMinimumGCAge < 0 || c.EvictionPressureTransitionPeriod < 0 {
		return fmt.Errorf("%w: --image-minimum-gc-age and --eviction-pressure-transition-period must not be negative", ErrInvalidConfig)
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("%w: --port %d", ErrInvalidConfig, c.Port)
	}
	return nil
}
