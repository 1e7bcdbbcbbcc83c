package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/waggle-io/waggle/cluster/join"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
)

// serverDir is server i's data dir (the first is the single-server lab's
// control-plane dir: its PKI is where node certificates come from).
func serverDir(dataDir string, i int) string {
	if i == 1 {
		return controlPlaneDir(dataDir)
	}
	return fmt.Sprintf("%s-%d", controlPlaneDir(dataDir), i)
}

// startHAControlPlane starts cfg.Servers servers, each `waggle up
// --node=false` in its own network namespace on the lab bridge: the first
// with --cluster-init, the others joining it with a server token, as a user
// would on separate machines.
func startHAControlPlane(ctx context.Context, cfg *Config, st *State, out io.Writer) error {
	var token, hash string
	for i := 1; i <= cfg.Servers; i++ {
		name := cfg.ServerName(i)
		n := NodeState{Name: name, NetNS: "waggle-" + name, HostVeth: fmt.Sprintf("wl%ss%d", cfg.Name, i), Addr: cfg.ServerAddr(i).Addr().String(),
			Addr6: addrString(cfg.Addr6(cfg.ServerAddr(i)))}
		st.Servers = append(st.Servers, n)
		if err := st.save(cfg.DataDir); err != nil {
			return err
		}
		if b, err := exec.CommandContext(ctx, "ip", "netns", "add", n.NetNS).CombinedOutput(); err != nil {
			return fmt.Errorf("ip netns add %s: %v: %s", n.NetNS, err, b)
		}
		if err := plugNode(cfg, n, cfg.ServerAddr(i), true); err != nil {
			return err
		}
		dir := serverDir(cfg.DataDir, i)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		args := []string{cfg.Binary, "up",
			"--data-dir", dir,
			"--node=false",
			"--node-name", name,
			"--advertise-address", n.Addr,
			"--bind-address", n.Addr,
			"--secure-port", strconv.Itoa(cfg.APIPort),
			"--components-bind-address", n.Addr,
			"--scheduler-port", strconv.Itoa(cfg.SchedulerPort),
			"--controller-manager-port", strconv.Itoa(cfg.ControllerManagerPort),
			"--cluster-cidr", cfg.ClusterCIDRs(),
			"--service-cluster-ip-range", cfg.ServiceCIDRs(),
			"--node-monitor-grace-period", cfg.NodeMonitorGracePeriod.String(),
		}
		if i == 1 {
			args = append(args, "--cluster-init")
		} else {
			args = append(args, "--server", cfg.APIServer(), "--token", token, "--discovery-token-ca-cert-hash", hash)
		}
		p, err := startProcess(cfg, "control-plane", name, n.NetNS, args)
		if err != nil {
			return err
		}
		st.Processes = append(st.Processes, p)
		kc := filepath.Join(dir, "admin.kubeconfig")
		if i == 1 {
			st.Kubeconfig = kc
		}
		if err := st.save(cfg.DataDir); err != nil {
			return err
		}
		if err := waitFor(ctx, 120*time.Second, "API server "+name, func() error {
			if !alive(p) {
				return fmt.Errorf("%s exited (see %s)", name, p.Log)
			}
			cs, err := clientFor(kc)
			if err != nil {
				return err
			}
			_, err = cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			return err
		}); err != nil {
			return err
		}
		fmt.Fprintf(out, "      %s ready at https://%s:%d\n", name, n.Addr, cfg.APIPort)
		if i == 1 {
			rc, err := clientcmd.BuildConfigFromFlags("", kc)
			if err != nil {
				return err
			}
			cs, err := clientFor(kc)
			if err != nil {
				return err
			}
			if token, err = join.CreateToken(ctx, cs, join.TokenOptions{TTL: time.Hour, Description: "lab servers",
				Groups: []string{bootstrap.BootstrapServerGroup}}); err != nil {
				return err
			}
			if hash, err = join.CACertHash(rc.TLSClientConfig.CAData); err != nil {
				return err
			}
		}
	}
	return nil
}
