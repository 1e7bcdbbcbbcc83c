package main

import (
	"context"

	k8sflag "k8s.io/component-base/cli/flag"

	"github.com/waggle-io/waggle/cluster"
	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/internal/cliflag"
)

// runUp runs `waggle up`: the whole single-machine cluster in one process.
func runUp(ctx context.Context, args []string) error {
	cfg := cluster.Defaults()
	fs := cliflag.NewFlagSet("up", "Run a whole Waggle cluster on this machine: etcd, API server, scheduler, controller-manager, kubelet and proxy.")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "cluster state (etcd, PKI, kubeconfigs, kubelet, containerd); the same dir resumes the same cluster")
	fs.BoolVar(&cfg.Node, "node", cfg.Node, "also run this machine's kubelet and proxy (false: control plane only)")
	fs.StringVar(&cfg.NodeName, "node-name", "", "this node's name (default: the hostname)")
	fs.StringVar(&cfg.NodeIP, "node-ip", "", "this node's InternalIP, or IPv4,IPv6 for a dual-stack node (default: the default route's address)")
	fs.StringVar(&cfg.BindAddress, "bind-address", cfg.BindAddress, "address the API server listens on")
	fs.IntVar(&cfg.SecurePort, "secure-port", cfg.SecurePort, "API server HTTPS port")
	fs.StringVar(&cfg.ComponentsBindAddress, "components-bind-address", cfg.ComponentsBindAddress, "address the scheduler and controller-manager serve /healthz and /metrics on")
	fs.IntVar(&cfg.SchedulerPort, "scheduler-port", cfg.SchedulerPort, "scheduler HTTPS /healthz and /metrics port")
	fs.IntVar(&cfg.ControllerManagerPort, "controller-manager-port", cfg.ControllerManagerPort, "controller-manager HTTPS /healthz and /metrics port")
	fs.StringVar(&cfg.AdvertiseAddress, "advertise-address", "", "address the components and kubeconfigs use to reach the API server (default 127.0.0.1)")
	fs.StringVar(&cfg.ClusterCIDR, "cluster-cidr", cfg.ClusterCIDR, "pod network; each node gets a /24 of it (IPv4,IPv6 for dual-stack: a /64 of the IPv6 one too)")
	fs.StringVar(&cfg.ServiceClusterIPRange, "service-cluster-ip-range", cfg.ServiceClusterIPRange, "Service ClusterIP range (IPv4,IPv6 for dual-stack Services; the first is the primary family)")
	fs.StringVar(&cfg.ClusterDomain, "cluster-domain", cfg.ClusterDomain, "cluster DNS zone (the DNS Service is the range's tenth address, 10.96.0.10 by default)")
	fs.StringVar(&cfg.ServiceNodePortRange, "service-node-port-range", cfg.ServiceNodePortRange, "Service NodePort range")
	fs.StringVar(&cfg.ContainerdAddress, "containerd-address", "", "containerd socket (default: the system's if it runs, else a supervised one under the data dir)")
	fs.StringVar(&cfg.ContainerdNamespace, "containerd-namespace", cfg.ContainerdNamespace, "containerd namespace of the node's images and containers")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", cfg.CgroupRoot, "parent cgroup of the node's pods (a cgroup path, or a directory under a cgroup mount)")
	fs.StringVar(&cfg.BPFCgroupRoot, "bpf-cgroup-root", "", "cgroup v2 directory the proxy's eBPF programs attach to (default: the cgroup v2 root, so every process of the machine reaches Services)")
	fs.StringVar(&cfg.BPFPinDir, "bpf-pin-dir", "", "where the proxy pins its eBPF maps and links (default: /sys/fs/bpf/waggle/<node>)")
	fs.Var(k8sflag.NewLangleSeparatedMapStringString(&cfg.EvictionHard), "eviction-hard", "the kubelet's hard eviction thresholds, signal<quantity or percent (e.g. memory.available<100Mi); given, it replaces the kubelet's whole default set")
	fs.StringVar(&cfg.ProxyMode, "proxy-mode", cfg.ProxyMode, "service proxy mode: auto, ebpf, iptables or ipvs")
	fs.StringVar(&cfg.NodePortDevices, "nodeport-devices", cfg.NodePortDevices, "devices on which eBPF serves NodePort, ExternalIP and LoadBalancer traffic from other machines: auto (the device of the node's address), none, or comma-separated names")
	fs.StringVar(&cfg.LBMode, "bpf-lb-mode", "", "the proxy's --bpf-lb-mode with --nodeport-devices: snat (the default), dsr (direct server return; every node must run it) or hybrid (DSR for TCP, SNAT for UDP)")
	fs.StringVar(&cfg.CNIBinDir, "cni-bin-dir", "", "directory of the waggle CNI plugin (default: cni/ beside this binary)")
	fs.StringVar(&cfg.ImageDir, "image-dir", "", "OCI image archives imported at start (e.g. bin/images from make images)")
	fs.DurationVar(&cfg.NodeMonitorGracePeriod, "node-monitor-grace-period", cfg.NodeMonitorGracePeriod, "how long a node may miss heartbeats before it is NotReady")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log level: debug, info, warn or error")
	fs.BoolVar(&cfg.AnonymousAuth, "anonymous-auth", cfg.AnonymousAuth, "requests without credentials run as system:anonymous (authorized like any user); false: 401")
	fs.StringVar(&cfg.MetricsAPI, "metrics-api", cfg.MetricsAPI, "metrics.k8s.io (kubectl top, HPA): native or off")
	fs.DurationVar(&cfg.EventTTL, "event-ttl", cfg.EventTTL, "how long the API server keeps Events after their last write (etcd then deletes them; 0: never)")
	leaseReuse := fs.Int64("lease-reuse-duration-seconds", int64(cfg.LeaseReuse.Seconds()), "longest time (seconds, at least 1) the API server reuses an etcd lease of keys written with a TTL (Events) for, bounded by 5% of the TTL")
	fs.DurationVar(&cfg.MetricsResolution, "metrics-resolution", cfg.MetricsResolution, "how often the native metrics API scrapes each kubelet")
	var pools cliflag.StringList
	fs.Var(&pools, "loadbalancer-ip-pool", "addresses for Services of type LoadBalancer: CIDRs or first-last ranges, comma-separated (empty: they stay pending)")
	fs.BoolVar(&cfg.ClusterInit, "cluster-init", false, "start the first server of an HA control plane: its embedded etcd member serves the other servers on --advertise-address")
	fs.StringVar(&cfg.Server, "server", "", "join the HA control plane of this server (https://<server>:6443) as a further server")
	fs.StringVar(&cfg.Token, "token", "", "server join token (waggle token create --server)")
	var hashes, etcdServers cliflag.StringList
	fs.Var(&hashes, "discovery-token-ca-cert-hash", "pin of the cluster CA's public key, sha256:<hex> (printed by waggle token create)")
	fs.BoolVar(&cfg.UnsafeSkipCAVerification, "discovery-token-unsafe-skip-ca-verification", false, "join without pinning the cluster CA (trust the first answer)")
	fs.IntVar(&cfg.EtcdPeerPort, "etcd-peer-port", 2380, "embedded etcd member's peer port on --advertise-address (HA)")
	fs.IntVar(&cfg.EtcdClientPort, "etcd-client-port", 2379, "embedded etcd member's client port on --advertise-address (HA)")
	fs.Var(&etcdServers, "etcd-servers", "external etcd client URLs, comma-separated, instead of an embedded member")
	fs.StringVar(&cfg.EtcdCAFile, "etcd-cafile", "", "CA of the external etcd")
	fs.StringVar(&cfg.EtcdCertFile, "etcd-certfile", "", "client certificate for the external etcd")
	fs.StringVar(&cfg.EtcdKeyFile, "etcd-keyfile", "", "client key for the external etcd")
	fs.StringVar(&cfg.EncryptionProviderConfig, "encryption-provider-config", "", "EncryptionConfiguration file for encryption at rest (see docs/security.md)")
	fs.StringVar(&cfg.StorageMediaType, "storage-media-type", "application/vnd.kubernetes.protobuf", "how the API server writes built-in objects to etcd: application/vnd.kubernetes.protobuf, or application/json while servers of a build before protobuf storage share the etcd (a rolling upgrade); both are read")
	fs.BoolVar(&cfg.SecretsEncryption, "secrets-encryption", false, "encrypt Secrets in etcd with an aescbc key generated once under <data-dir>/pki/encryption-config.yaml")
	fs.StringVar(&cfg.Audit.PolicyFile, "audit-policy-file", "", "audit policy (audit.k8s.io/v1); with --audit-log-path turns on the audit log")
	fs.StringVar(&cfg.Audit.LogPath, "audit-log-path", "", "audit log file ('-': standard output)")
	fs.IntVar(&cfg.Audit.MaxAge, "audit-log-maxage", 0, "days to keep rotated audit logs")
	fs.IntVar(&cfg.Audit.MaxBackup, "audit-log-maxbackup", 0, "rotated audit logs to keep")
	fs.IntVar(&cfg.Audit.MaxSize, "audit-log-maxsize", 0, "megabytes before the audit log rotates")
	fs.StringVar(&cfg.PodSecurityConfigFile, "pod-security-config-file", "", "PodSecurityConfiguration: cluster default Pod Security levels and exemptions")
	var modes cliflag.StringList
	fs.Var(&modes, "authorization-mode", "authorizers, in order, comma-separated: Node, RBAC, AlwaysAllow, AlwaysDeny (default Node,RBAC)")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	var err error
	if cfg.LeaseReuse, err = apiserver.LeaseReuseSeconds(*leaseReuse); err != nil {
		return err
	}
	cfg.AuthorizationModes = modes
	cfg.LoadBalancerIPPools = pools
	cfg.CACertHashes, cfg.EtcdServers = hashes, etcdServers
	return cluster.Run(ctx, cfg)
}
