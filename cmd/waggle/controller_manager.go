package main

import (
	"context"

	"github.com/waggle-io/waggle/controlplane/controllers"
	"github.com/waggle-io/waggle/internal/apiclient"
	"github.com/waggle-io/waggle/internal/cliflag"
)

// runControllerManager parses `waggle controller-manager` flags (named as
// kube-controller-manager's) into controllers.Config and runs it.
func runControllerManager(ctx context.Context, args []string) error {
	cfg := controllers.DefaultConfig()
	fs := cliflag.NewFlagSet("controller-manager", "Run the controllers (ReplicaSet, Deployment, DaemonSet, EndpointSlice, HorizontalPodAutoscaler, garbage collector, node and namespace controllers) under leader election.")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server (empty: in-cluster)")
	fs.StringVar(&cfg.KubeAPIContentType, "kube-api-content-type", cfg.KubeAPIContentType, "media type of the typed clients' requests to the API server: "+apiclient.Protobuf+" (JSON accepted too, as upstream's default) or "+apiclient.JSON+" (custom resources are always JSON)")
	cfg.SecureServing.AddFlags(fs)
	fs.IntVar(&cfg.SecureServing.SecurePort, "port", cfg.SecureServing.SecurePort, "deprecated: the same as --secure-port (the port now serves HTTPS)")
	ctrls := cliflag.StringList{}
	fs.Var(&ctrls, "controllers", "controllers to run: '*' all, 'foo' enable, '-foo' disable (default '*'); known: "+joinNames())
	fs.BoolVar(&cfg.UseServiceAccountCredentials, "use-service-account-credentials", false, "run each controller as its own kube-system ServiceAccount (bound tokens through TokenRequest) instead of this process's identity")
	cfg.LeaderElection.AddFlags(fs, "kube-controller-manager")
	fs.IntVar(&cfg.ConcurrentReplicaSetSyncs, "concurrent-replicaset-syncs", cfg.ConcurrentReplicaSetSyncs, "ReplicaSet workers")
	fs.IntVar(&cfg.ConcurrentDeploymentSyncs, "concurrent-deployment-syncs", cfg.ConcurrentDeploymentSyncs, "Deployment workers")
	fs.IntVar(&cfg.ConcurrentDaemonSetSyncs, "concurrent-daemonset-syncs", cfg.ConcurrentDaemonSetSyncs, "DaemonSet workers")
	fs.IntVar(&cfg.ConcurrentEndpointSliceSyncs, "concurrent-service-endpoint-syncs", cfg.ConcurrentEndpointSliceSyncs, "EndpointSlice workers")
	fs.IntVar(&cfg.ConcurrentEndpointSyncs, "concurrent-endpoint-syncs", cfg.ConcurrentEndpointSyncs, "workers writing the legacy Endpoints objects")
	fs.IntVar(&cfg.ConcurrentGCSyncs, "concurrent-gc-syncs", cfg.ConcurrentGCSyncs, "garbage collector workers")
	fs.IntVar(&cfg.ConcurrentNamespaceSyncs, "concurrent-namespace-syncs", cfg.ConcurrentNamespaceSyncs, "namespace workers")
	fs.IntVar(&cfg.TerminatedPodGCThreshold, "terminated-pod-gc-threshold", cfg.TerminatedPodGCThreshold, "terminated pods kept before the pod garbage collector deletes the oldest (<= 0: keep all)")
	fs.IntVar(&cfg.ConcurrentRCSyncs, "concurrent-rc-syncs", cfg.ConcurrentRCSyncs, "ReplicationController workers")
	fs.IntVar(&cfg.ConcurrentStatefulSetSyncs, "concurrent-statefulset-syncs", cfg.ConcurrentStatefulSetSyncs, "StatefulSet workers")
	fs.IntVar(&cfg.ConcurrentJobSyncs, "concurrent-job-syncs", cfg.ConcurrentJobSyncs, "Job workers")
	fs.IntVar(&cfg.ConcurrentCronJobSyncs, "concurrent-cron-job-syncs", cfg.ConcurrentCronJobSyncs, "CronJob workers")
	fs.IntVar(&cfg.ConcurrentTTLSyncs, "concurrent-ttl-after-finished-syncs", cfg.ConcurrentTTLSyncs, "TTL-after-finished workers")
	fs.DurationVar(&cfg.JobPodFailureBackoff, "job-pod-failure-backoff", cfg.JobPodFailureBackoff, "delay before a Job's first failed pod is replaced (doubles per consecutive failure, at most 10m)")
	fs.IntVar(&cfg.ConcurrentResourceQuotaSyncs, "concurrent-resource-quota-syncs", cfg.ConcurrentResourceQuotaSyncs, "ResourceQuota workers")
	fs.DurationVar(&cfg.ResourceQuotaSyncPeriod, "resource-quota-sync-period", cfg.ResourceQuotaSyncPeriod, "how often every quota's usage is recalculated in full")
	fs.IntVar(&cfg.ConcurrentHPASyncs, "concurrent-horizontal-pod-autoscaler-syncs", cfg.ConcurrentHPASyncs, "HorizontalPodAutoscaler workers")
	fs.DurationVar(&cfg.HPASyncPeriod, "horizontal-pod-autoscaler-sync-period", cfg.HPASyncPeriod, "how often every HorizontalPodAutoscaler is synced")
	fs.DurationVar(&cfg.HPADownscaleStabilization, "horizontal-pod-autoscaler-downscale-stabilization", cfg.HPADownscaleStabilization, "the autoscaler scales down no lower than any recommendation it made this far back")
	fs.Float64Var(&cfg.HPATolerance, "horizontal-pod-autoscaler-tolerance", cfg.HPATolerance, "smallest change (from 1.0) of the desired-to-actual metrics ratio the autoscaler acts on")
	fs.DurationVar(&cfg.HPACPUInitializationPeriod, "horizontal-pod-autoscaler-cpu-initialization-period", cfg.HPACPUInitializationPeriod, "after a pod starts, its CPU samples count only once it has been ready a whole metrics window, for this long")
	fs.DurationVar(&cfg.HPAInitialReadinessDelay, "horizontal-pod-autoscaler-initial-readiness-delay", cfg.HPAInitialReadinessDelay, "readiness changes this soon after a pod starts are taken as its initial readiness")
	fs.IntVar(&cfg.ConcurrentServiceAccountSyncs, "concurrent-serviceaccount-syncs", cfg.ConcurrentServiceAccountSyncs, "service account workers")
	fs.IntVar(&cfg.MaxEndpointsPerSlice, "max-endpoints-per-slice", cfg.MaxEndpointsPerSlice, "most endpoints in one EndpointSlice")
	fs.BoolVar(&cfg.AllocateNodeCIDRs, "allocate-node-cidrs", cfg.AllocateNodeCIDRs, "allocate a podCIDR to every node from --cluster-cidr")
	fs.StringVar(&cfg.ClusterCIDR, "cluster-cidr", cfg.ClusterCIDR, "CIDR of the cluster's pods (IPv4,IPv6 for dual-stack)")
	fs.StringVar(&cfg.ClusterDNSIP, "cluster-dns-ip", "", "ClusterIP of the kube-dns Service the clusterdns controller publishes (empty: not published)")
	var dnsPort int
	fs.StringVar(&cfg.ServiceAccountPrivateKeyFile, "service-account-private-key-file", "", "PEM private key the serviceaccount-token controller signs legacy Secret tokens with (empty: that controller does not run)")
	fs.StringVar(&cfg.RootCAFile, "root-ca-file", cfg.RootCAFile, "CA bundle published as every namespace's kube-root-ca.crt ConfigMap (default: the CA of --kubeconfig)")
	fs.IntVar(&dnsPort, "cluster-dns-port", 10053, "port of each node's cluster DNS server (waggle proxy --cluster-dns-address)")
	fs.IntVar(&cfg.NodeCIDRMaskSize, "node-cidr-mask-size", cfg.NodeCIDRMaskSize, "prefix length of each node's (IPv4) podCIDR")
	fs.IntVar(&cfg.NodeCIDRMaskSize, "node-cidr-mask-size-ipv4", cfg.NodeCIDRMaskSize, "prefix length of each node's IPv4 podCIDR in a dual-stack cluster (upstream's name for --node-cidr-mask-size there)")
	fs.IntVar(&cfg.NodeCIDRMaskSizeIPv6, "node-cidr-mask-size-ipv6", cfg.NodeCIDRMaskSizeIPv6, "prefix length of each node's IPv6 podCIDR in a dual-stack cluster (0: 64)")
	fs.DurationVar(&cfg.NodeMonitorGracePeriod, "node-monitor-grace-period", cfg.NodeMonitorGracePeriod, "how long a node may go without renewing its Lease before it is marked unhealthy")
	fs.DurationVar(&cfg.NodeMonitorPeriod, "node-monitor-period", cfg.NodeMonitorPeriod, "how often node health is checked")
	fs.DurationVar(&cfg.NodeStartupGracePeriod, "node-startup-grace-period", cfg.NodeStartupGracePeriod, "grace of a node that never reported Ready")
	fs.StringVar(&cfg.ClusterSigningCertFile, "cluster-signing-cert-file", "", "CA certificate the csrsigning controller signs approved CSRs with (the cluster CA, <data-dir>/pki/ca.crt)")
	fs.StringVar(&cfg.ClusterSigningKeyFile, "cluster-signing-key-file", "", "the signing CA's private key")
	fs.DurationVar(&cfg.ClusterSigningDuration, "cluster-signing-duration", cfg.ClusterSigningDuration, "longest validity of a certificate csrsigning issues")
	pools := cliflag.StringList{}
	fs.Var(&pools, "loadbalancer-ip-pool", "addresses for Services of type LoadBalancer: CIDRs or first-last ranges, comma-separated or repeated (empty: no LoadBalancer IPAM)")
	fs.StringVar(&cfg.LocalPathDir, "local-path-dir", cfg.LocalPathDir, "directory on every node holding the volumes of the built-in local-path provisioner (StorageClass local-path)")
	fs.StringVar(&cfg.LocalPathHelperImage, "local-path-helper-image", cfg.LocalPathHelperImage, "image every node has, with /waggle-echo (waggle.local/waggle-echo:dev), for the helper pods that remove deleted local-path volumes' directories (empty: directories are left on the nodes)")
	fs.DurationVar(&cfg.ResyncPeriod, "min-resync-period", cfg.ResyncPeriod, "informer resync period (0: none)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log level: debug, info, warn, error")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	cfg.ClusterDNSPort = int32(dnsPort)
	cfg.LoadBalancerIPPools = pools
	if len(ctrls) > 0 {
		cfg.Controllers = ctrls
	}
	return controllers.Run(ctx, cfg)
}

func joinNames() string {
	s := ""
	for i, n := range controllers.KnownControllers() {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s
}
