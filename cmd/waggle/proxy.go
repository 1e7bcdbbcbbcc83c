package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/waggle-io/waggle/clusterdns"
	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/modes"
	"github.com/waggle-io/waggle/internal/cliflag"
	"github.com/waggle-io/waggle/internal/ops"
)

// runProxy runs `waggle proxy`, the service proxy (dataplane.Run).
func runProxy(ctx context.Context, args []string) error {
	fs := cliflag.NewFlagSet("proxy", "Run the service proxy: Services and EndpointSlices become eBPF maps, iptables chains or IPVS virtual servers on this node.")
	var cfg dataplane.Config
	var nodeName string
	var cidrs cliflag.StringList
	var logLevel string
	var dnsCfg clusterdns.Config
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "path of the kubeconfig to reach the API server (empty: in-cluster)")
	fs.StringVar(&cfg.NodeName, "hostname-override", "", "this node's name (default: the host name, lower-cased, as the kubelet registers it)")
	fs.StringVar(&nodeName, "node-name", "", "alias of --hostname-override")
	fs.StringVar(&cfg.Mode, "mode", dataplane.ModeAuto, "proxy mode: auto (ebpf where the kernel allows, else iptables), ebpf, iptables or ipvs")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", "", "cgroup v2 directory the eBPF programs attach to (default: the cgroup2 mount's root)")
	fs.StringVar(&cfg.BPFPinDir, "bpf-pin-dir", "", "where eBPF maps and links are pinned (default: "+ebpf.DefaultPinRoot+"/<node>)")
	fs.IntVar(&cfg.MaxServices, "bpf-lb-map-max", ebpf.DefaultMaxServices, "size of the eBPF services map (one entry per frontend, plus one per backend of a frontend with more than 16)")
	fs.IntVar(&cfg.MaxBackends, "bpf-lb-backends-max", ebpf.DefaultMaxBackends, "size of the eBPF backends map")
	fs.IntVar(&cfg.MaxAffinity, "bpf-lb-affinity-max", ebpf.DefaultMaxAffinity, "size of the eBPF session-affinity map")
	fs.IntVar(&cfg.MaxRevSocks, "bpf-lb-sock-rev-max", ebpf.DefaultMaxReverseSockets, "size of the eBPF reverse-socket map")
	var npDevices cliflag.StringList
	fs.Var(&npDevices, "nodeport-devices", "external devices (comma-separated) on which eBPF serves NodePort, ExternalIP and LoadBalancer traffic from outside the node (tc, Maglev, SNAT to the device's address for remote backends); empty: off")
	fs.IntVar(&cfg.MaglevTableSize, "bpf-lb-maglev-table-size", ebpf.DefaultMaglevTableSize, "entries of each eBPF Maglev table, a prime (251, 509, 1021, 2039, 4093, 8191, 16381, ...); aim for 100x the backends of the largest Service")
	fs.StringVar(&cfg.LBAcceleration, "bpf-lb-acceleration", ebpf.AccelDisabled, "with --nodeport-devices: also run the north-south ingress in XDP (new flows to remote backends and their replies; the rest stays in tc): disabled, native (driver XDP, or fail), generic (any device, slower) or best-effort (native where the driver supports it, else generic)")
	fs.StringVar(&cfg.LBMode, "bpf-lb-mode", ebpf.LBModeSNAT, "with --nodeport-devices: how traffic from outside reaches a backend on another node: snat (to the node's address; replies come back through this node), dsr (direct server return: the client's address is kept, the frontend travels in an IPv4 option or an IPv6 destination option and the backend's node answers the client directly; every node must run Waggle's eBPF proxy with --nodeport-devices) or hybrid (DSR for TCP, SNAT for UDP)")
	enableTCX := fs.Bool("enable-tcx", true, "with --nodeport-devices: attach the north-south tc programs as tcx links (false: as clsact filters, which kernels before 6.6 get anyway)")
	fs.BoolVar(&cfg.NoL2Announcements, "no-l2-announcements", false, "with --nodeport-devices: do not answer ARP for LoadBalancer IPs (one node per IP, chosen by a Lease)")
	fs.BoolVar(&cfg.NoHealthCheckNodePorts, "no-healthcheck-node-ports", false, "do not serve LoadBalancer Services' healthCheckNodePort (externalTrafficPolicy Local)")
	fs.StringVar(&cfg.IPVSScheduler, "ipvs-scheduler", "rr", "IPVS scheduler (rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh)")
	fs.Var(&cidrs, "cluster-cidr", "pod network CIDR(s), comma-separated; traffic from outside them to ClusterIPs is masqueraded (iptables, ipvs)")
	fs.StringVar(&cfg.HealthBindAddress, "health-bind-address", ":10256", "address of /healthz, /readyz and /metrics (0 disables)")
	fs.BoolVar(&cfg.Cleanup, "cleanup", false, "remove everything every proxy mode programmed on this node, then exit")
	fs.DurationVar(&cfg.SyncPeriod, "sync-period", 30*time.Minute, "period of the full reconcile that rewrites whatever drifted (changes are synced as they come)")
	fs.DurationVar(&cfg.MinSyncPeriod, "min-sync-period", time.Second, "shortest time between syncs of the modes that rewrite everything per sync (iptables, ipvs); ebpf syncs each change at once")
	fs.DurationVar(&cfg.UnhealthyAfter, "unhealthy-after", time.Minute, "/healthz fails once syncs have kept failing this long")
	fs.StringVar(&cfg.NetworkPolicy, "network-policy", "auto", "NetworkPolicy enforcement: auto (eBPF where the kernel allows, else iptables+ipset, else a loud warning), ebpf or iptables (or fail), off")
	fs.BoolVar(&cfg.PolicyMonitorAllows, "policy-monitor-allows", false, "also report allowed new flows to `waggle bpf monitor` (drops always are)")
	fs.StringVar(&dnsCfg.ListenAddress, "cluster-dns-address", fmt.Sprintf(":%d", clusterdns.DefaultPort), "address (UDP and TCP) of this node's cluster DNS server, the kube-dns Service's endpoint here (empty: none)")
	fs.StringVar(&dnsCfg.ClusterDomain, "cluster-domain", clusterdns.DefaultClusterDomain, "the cluster DNS zone")
	fs.StringVar(&dnsCfg.ResolvConf, "resolv-conf", "/etc/resolv.conf", "resolver configuration whose nameservers answer names outside the cluster")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if cfg.NodeName == "" {
		cfg.NodeName = nodeName
	}
	if cfg.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --hostname-override and no host name: %w", err)
		}
		cfg.NodeName = strings.ToLower(h)
	}
	cfg.NodePortDevices = npDevices
	cfg.DisableTCX = !*enableTCX
	if !slices.Contains(ebpf.Accelerations, cfg.LBAcceleration) {
		return fmt.Errorf("--bpf-lb-acceleration %q: want one of %s", cfg.LBAcceleration, strings.Join(ebpf.Accelerations, ", "))
	}
	if cfg.LBAcceleration != ebpf.AccelDisabled && len(npDevices) == 0 {
		return fmt.Errorf("--bpf-lb-acceleration=%s needs --nodeport-devices", cfg.LBAcceleration)
	}
	if !slices.Contains(ebpf.LBModes, cfg.LBMode) {
		return fmt.Errorf("--bpf-lb-mode %q: want one of %s", cfg.LBMode, strings.Join(ebpf.LBModes, ", "))
	}
	if cfg.LBMode != ebpf.LBModeSNAT && len(npDevices) == 0 {
		return fmt.Errorf("--bpf-lb-mode=%s needs --nodeport-devices", cfg.LBMode)
	}
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("--cluster-cidr %q: %w", c, err)
		}
		cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, p.Masked())
	}
	log, err := ops.NewLogger("proxy", logLevel)
	if err != nil {
		return err
	}
	cfg.Log = log
	cfg.Modes = modes.All()
	if dnsCfg.ListenAddress == "" || cfg.Cleanup {
		return dataplane.Run(ctx, cfg)
	}
	dnsCfg.Kubeconfig, dnsCfg.Log = cfg.Kubeconfig, log.With("part", "cluster-dns")
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return dataplane.Run(gctx, cfg) })
	g.Go(func() error {
		// A DNS server that cannot run must not take the dataplane down.
		if err := clusterdns.Run(gctx, dnsCfg); err != nil {
			log.Error("cluster DNS stopped; pods on this node cannot resolve names", "err", err)
		}
		return nil
	})
	return g.Wait()
}
