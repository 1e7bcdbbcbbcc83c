package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/waggle-io/waggle/internal/cliflag"
	"github.com/waggle-io/waggle/lab"
)

func runLab(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: waggle lab up|status|join|exec|stop|restart|down [flags]")
	}
	cfg := lab.Defaults()
	fs := cliflag.NewFlagSet("lab "+args[0], "Run a multi-node Waggle lab on this machine: a control plane and N nodes in network namespaces.")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "where the lab keeps its state, logs and data")
	switch args[0] {
	case "up":
		fs.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "number of nodes")
		fs.IntVar(&cfg.Servers, "servers", cfg.Servers, "control plane servers: 1 (in the host namespace), or 3 or 5 for an HA control plane (each in its own namespace, an etcd member, API server, scheduler and controller-manager)")
		fs.StringVar(&cfg.Name, "name", cfg.Name, "lab name: prefixes node names and the lab's cgroup")
		fs.StringVar(&cfg.Bridge, "bridge", cfg.Bridge, "name of the lab bridge")
		subnet := fs.String("subnet", cfg.Subnet.String(), "lab network: IPv4, or IPv4,IPv6 for a dual-stack lab (default IPv6 with --dual-stack: fd00:A:B:C::/64 for the IPv4 A.B.C.0)")
		clusterCIDR := fs.String("cluster-cidr", cfg.ClusterCIDR.String(), "pod network; each node gets a /24 of it (and a /64 of the IPv6 one), routed from the host: IPv4, or IPv4,IPv6 (default IPv6 with --dual-stack: "+lab.DefaultClusterCIDR6.String()+")")
		serviceCIDR := fs.String("service-cidr", cfg.ServiceCIDR.String(), "Service ClusterIP range: IPv4, or IPv4,IPv6 (default IPv6 with --dual-stack: "+lab.DefaultServiceCIDR6.String()+")")
		dualStack := fs.Bool("dual-stack", false, "a dual-stack lab: every node, the bridge and the client get an IPv6 address too, each node a pod CIDR of each family, and Services may be IPv6 or dual-stack (implied by an IPv6 CIDR in --subnet, --cluster-cidr or --service-cidr)")
		fs.IntVar(&cfg.APIPort, "api-port", cfg.APIPort, "API server port (on the bridge address)")
		fs.IntVar(&cfg.SchedulerPort, "scheduler-port", cfg.SchedulerPort, "scheduler HTTPS health/metrics port (on the bridge address)")
		fs.IntVar(&cfg.ControllerManagerPort, "controller-manager-port", cfg.ControllerManagerPort, "controller-manager HTTPS health/metrics port (on the bridge address)")
		fs.StringVar(&cfg.ProxyMode, "proxy-mode", cfg.ProxyMode, "proxy mode of every node: auto, ebpf or iptables")
		fs.DurationVar(&cfg.ReadyTimeout, "ready-timeout", cfg.ReadyTimeout, "how long to wait for the nodes to be Ready")
		fs.StringVar(&cfg.ImageDir, "image-dir", "", "OCI image archives every node imports at start (e.g. bin/images)")
		fs.Var((*cliflag.StringList)(&cfg.LocalRegistries), "local-registries", "registries whose images the nodes have only from --image-dir (passed to every kubelet: never pulled, imagePullPolicy Always takes the imported copy)")
		fs.DurationVar(&cfg.NodeMonitorGracePeriod, "node-monitor-grace-period", cfg.NodeMonitorGracePeriod, "how long a node may miss heartbeats before it is NotReady")
		fs.StringVar(&cfg.LoadBalancerIPPool, "loadbalancer-ip-pool", "", "LoadBalancer Service addresses (CIDRs or first-last ranges; default: the last 16 addresses of --subnet; none: off)")
		fs.StringVar(&cfg.CNIBinDir, "cni-bin-dir", "", "directory holding the waggle CNI plugin (default: beside the waggle binary)")
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return err
		}
		var err error
		if cfg.Subnet, cfg.Subnet6, err = lab.ParseDualStack("--subnet", *subnet); err != nil {
			return err
		}
		if cfg.ClusterCIDR, cfg.ClusterCIDR6, err = lab.ParseDualStack("--cluster-cidr", *clusterCIDR); err != nil {
			return err
		}
		if cfg.ServiceCIDR, cfg.ServiceCIDR6, err = lab.ParseDualStack("--service-cidr", *serviceCIDR); err != nil {
			return err
		}
		if *dualStack || cfg.Subnet6.IsValid() || cfg.ClusterCIDR6.IsValid() || cfg.ServiceCIDR6.IsValid() {
			cfg.EnableDualStack()
		}
		if cfg.Binary, err = os.Executable(); err != nil {
			return err
		}
		if cfg.CNIBinDir == "" {
			cfg.CNIBinDir = filepath.Join(filepath.Dir(cfg.Binary), "cni")
		}
		return lab.Up(ctx, cfg, os.Stdout)
	case "join":
		// One more node, joining as a new machine does (waggle join).
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return err
		}
		_, err := lab.Join(ctx, cfg.DataDir, os.Stdout)
		return err
	case "status":
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return err
		}
		return lab.Status(ctx, cfg.DataDir, os.Stdout)
	case "exec":
		// waggle lab exec [--data-dir D] client|NODE -- CMD [ARG...]
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) > 1 && rest[1] == "--" {
			rest = append(rest[:1:1], rest[2:]...)
		}
		if len(rest) < 2 {
			return errors.New("usage: waggle lab exec [--data-dir DIR] client|NODE [--] CMD [ARG...]")
		}
		err := lab.Exec(ctx, cfg.DataDir, rest[0], rest[1:], os.Stdin, os.Stdout, os.Stderr)
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.Exited() {
			return childExit(ee.ExitCode())
		}
		return err
	case "stop", "restart":
		node := fs.String("node", "", "the node (empty: the control plane's processes)")
		component := fs.String("component", "proxy", "kubelet, proxy, control-plane or containerd")
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return err
		}
		if args[0] == "stop" {
			return lab.Stop(cfg.DataDir, *node, *component)
		}
		return lab.Restart(cfg.DataDir, *node, *component)
	case "ha-test":
		scenario := fs.String("scenario", lab.ScenarioKillEtcdLeader, strings.Join(lab.Scenarios, ", "))
		duration := fs.Duration("duration", 15*time.Second, "how long the write load runs (the fault comes at a third of it)")
		writeTimeout := fs.Duration("write-timeout", 250*time.Millisecond, "timeout of each of the writer's writes (a write to a dying server waits it out before it is retried)")
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return err
		}
		r, err := lab.RunHAScenario(ctx, cfg.DataDir, *scenario, *duration, *writeTimeout, os.Stdout)
		if r != nil {
			fmt.Printf("scenario %s, victim %s: %d writes acknowledged, %d failed, %d acknowledged writes lost; writes paused %v at the fault (longest gap of the run %v); survivors' informers converged %v after the last write",
				r.Scenario, r.Victim, r.Acked, r.Failed, r.Lost, r.Resume.Round(time.Millisecond), r.MaxGap.Round(time.Millisecond), r.Converge.Round(time.Millisecond))
			if r.Scenario == lab.ScenarioPartition {
				fmt.Printf("; minority refused writes: %v; healed member caught up: %v (%v)", r.MinorityRefused, r.CaughtUp, r.CatchUp.Round(time.Millisecond))
			}
			ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
			fmt.Printf("; the victim led %v; nodes NotReady during the run: %d; node agents restarted: %v; every node renewed its Lease %v after the fault (longest renewal gap %v); node agents' connections at the end: %v",
				r.VictimLeads, r.NotReady, r.Restarted, ms(r.LeaseRenewed), ms(r.LeaseGap), r.AgentsAfter)
			switch r.Scenario {
			case lab.ScenarioKillAPIServer:
				fmt.Printf("; %d node agent connections were on the victim; a Service created after the kill was programmed on every node %v after it", r.AgentsOnVictim, ms(r.ProxyProgrammed))
			case lab.ScenarioDualStack:
				fmt.Printf("; %d node agent connections were on the victim", r.AgentsOnVictim)
				fmt.Printf("; the dual-stack Service answered on its IPv6 ClusterIP from a pod and on every node's IPv6 NodePort from the client, every backend, %v after the kill; a backend replaced then (%s) answered on both %v after it", ms(r.DualStackKept), r.DualStackNewBackend, ms(r.DualStackReplaced))
			case lab.ScenarioKillLeader:
				fmt.Printf("; another server took the controller-manager Lease %v after the kill, the ReplicaSet scaled at the kill had its pods %v after it, bound %v after it", ms(r.Takeover), ms(r.FirstAction), ms(r.Scheduled))
				if r.SchedulerTakeover > 0 {
					fmt.Printf(" (scheduler Lease taken over %v after it)", ms(r.SchedulerTakeover))
				}
			}
			fmt.Println()
		}
		return err
	case "down":
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return err
		}
		return lab.Down(context.WithoutCancel(ctx), cfg.DataDir, os.Stdout)
	}
	return fmt.Errorf("unknown lab command %q: want up, status, join, exec, stop, restart or down", args[0])
}
