package main

import (
	"time"

	"context"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/internal/cliflag"
)

// runAPIServer parses `waggle apiserver` flags into apiserver.Config and runs
// the API server.
func runAPIServer(ctx context.Context, args []string) error {
	var cfg apiserver.Config
	var etcd cliflag.StringList
	fs := cliflag.NewFlagSet("apiserver", "Run the Kubernetes-compatible API server (HTTPS, etcd storage).")
	fs.StringVar(&cfg.DataDir, "data-dir", "/var/lib/waggle", "directory for the PKI, kubeconfigs and the embedded etcd's data")
	fs.Var(&etcd, "etcd-servers", "external etcd client URLs, comma-separated (default: an embedded etcd on 127.0.0.1)")
	fs.StringVar(&cfg.EtcdCAFile, "etcd-cafile", "", "CA of the external etcd's serving certificate")
	fs.StringVar(&cfg.EtcdCertFile, "etcd-certfile", "", "client certificate for the external etcd")
	fs.StringVar(&cfg.EtcdKeyFile, "etcd-keyfile", "", "key of --etcd-certfile")
	fs.StringVar(&cfg.EncryptionProviderConfig, "encryption-provider-config", "", "EncryptionConfiguration file (apiserver.config.k8s.io/v1): how resources are encrypted at rest in etcd (aescbc, aesgcm, secretbox, identity)")
	fs.StringVar(&cfg.StorageMediaType, "storage-media-type", "application/vnd.kubernetes.protobuf", "how built-in objects are written to etcd: application/vnd.kubernetes.protobuf, or application/json (what Waggle before protobuf storage reads: set it on upgraded servers until every API server sharing the etcd is upgraded); both are read, custom resources are always JSON")
	fs.StringVar(&cfg.Audit.PolicyFile, "audit-policy-file", "", "audit policy (audit.k8s.io/v1 Policy); with --audit-log-path turns on the audit log")
	fs.StringVar(&cfg.Audit.LogPath, "audit-log-path", "", "audit log file (JSON lines of audit.k8s.io/v1 Events; '-' is standard output)")
	fs.IntVar(&cfg.Audit.MaxAge, "audit-log-maxage", 0, "days to keep rotated audit log files (0: no limit)")
	fs.IntVar(&cfg.Audit.MaxBackup, "audit-log-maxbackup", 0, "rotated audit log files to keep (0: no limit)")
	fs.IntVar(&cfg.Audit.MaxSize, "audit-log-maxsize", 0, "megabytes an audit log file reaches before it is rotated (0 with maxage and maxbackup 0: never rotated)")
	fs.StringVar(&cfg.PodSecurityConfigFile, "pod-security-config-file", "", "PodSecurityConfiguration (pod-security.admission.config.k8s.io/v1): cluster defaults for namespaces without pod-security labels, and exemptions (default: privileged)")
	fs.StringVar(&cfg.BindAddress, "bind-address", "0.0.0.0", "address to serve HTTPS on")
	fs.IntVar(&cfg.SecurePort, "secure-port", 6443, "HTTPS port (0 picks a free port, logged and written to <data-dir>/apiserver.addr)")
	fs.StringVar(&cfg.AdvertiseAddress, "advertise-address", "", "address other components reach this server at (default 127.0.0.1)")
	fs.StringVar(&cfg.ServiceClusterIPRange, "service-cluster-ip-range", "10.96.0.0/12", "CIDR of Service cluster IPs")
	fs.StringVar(&cfg.ServiceNodePortRange, "service-node-port-range", "30000-32767", "range of Service node ports")
	fs.StringVar(&cfg.TokenAuthFile, "token-auth-file", "", "static bearer tokens (CSV: token,user,uid,\"group1,group2\")")
	fs.BoolVar(&cfg.EnableBootstrapTokenAuth, "enable-bootstrap-token-auth", true, "authenticate bootstrap tokens (<id>.<secret>, Secrets of type bootstrap.kubernetes.io/token in kube-system), which nodes join with")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "serving certificate (default: generated under <data-dir>/pki)")
	fs.StringVar(&cfg.TLSPrivateKeyFile, "tls-private-key-file", "", "serving certificate's key")
	fs.StringVar(&cfg.ClientCAFile, "client-ca-file", "", "CA bundle that client certificates are verified against")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.BoolVar(&cfg.AnonymousAuth, "anonymous-auth", true, "requests without credentials run as system:anonymous (authorized like any user; RBAC grants only health and version); false: 401")
	fs.StringVar(&cfg.MetricsAPI, "metrics-api", "native", "metrics.k8s.io (kubectl top, HPA): native (scraped from the kubelets by this server) or off (left to an aggregated metrics server)")
	fs.DurationVar(&cfg.EventTTL, "event-ttl", time.Hour, "how long Events are kept after their last write (etcd then deletes them; 0: never)")
	leaseReuse := fs.Int64("lease-reuse-duration-seconds", 60, "longest time (seconds, at least 1) an etcd lease of keys written with a TTL (Events) is reused for, bounded by 5% of the TTL")
	fs.DurationVar(&cfg.MetricsResolution, "metrics-resolution", 15*time.Second, "how often the native metrics API scrapes each kubelet's /metrics/resource")
	var issuers, auds, saKeys, disabled cliflag.StringList
	fs.Var(&issuers, "service-account-issuer", "issuer (iss) of service-account tokens; several, comma-separated: the first signs, all are accepted (default https://kubernetes.default.svc.cluster.local)")
	fs.Var(&auds, "api-audiences", "audiences a token must be meant for to reach this server, and TokenRequest's default (default: the first issuer)")
	fs.StringVar(&cfg.ServiceAccountSigningKeyFile, "service-account-signing-key-file", "", "PEM private key (RSA or ECDSA) that signs service-account tokens (default: <data-dir>/pki/sa.key, generated)")
	fs.Var(&saKeys, "service-account-key-file", "PEM files of public keys that verify service-account tokens, comma-separated (several during a key rotation; default: the signing key's)")
	fs.DurationVar(&cfg.ServiceAccountMaxTokenExpiration, "service-account-max-token-expiration", 0, "longest lifetime a TokenRequest may get (0: no cap)")
	fs.BoolVar(&cfg.ServiceAccountExtendTokenExpiration, "service-account-extend-token-expiration", true, "pods' projected tokens last a year, flagged stale after their hour (upstream's safe roll-out of bound tokens)")
	fs.Var(&disabled, "disable-admission-plugins", "admission plugins to turn off, comma-separated: ServiceAccount, DefaultTolerationSeconds")
	allowPrivileged := fs.Bool("allow-privileged", true, "admit pods that ask for securityContext.privileged (PodSecurity admission restricts them per namespace); false refuses them cluster-wide")
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
	cfg.DenyPrivileged = !*allowPrivileged
	cfg.ServiceAccountIssuers, cfg.APIAudiences, cfg.ServiceAccountKeyFiles, cfg.DisableAdmissionPlugins = issuers, auds, saKeys, disabled
	cfg.EtcdServers = etcd
	return apiserver.Run(ctx, cfg)
}
