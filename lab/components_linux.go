package lab

import (
	"context"
	"errors"
	"fmt"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd"

	"github.com/waggle-io/waggle/clusterdns"
	"github.com/waggle-io/waggle/internal/teardown"
	ctrdsup "github.com/waggle-io/waggle/kubelet/containerd"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func containerdDir(dataDir string) string { return filepath.Join(dataDir, "containerd") }

func containerdSocket(dataDir string) string { return ctrdsup.Address(containerdDir(dataDir)) }

// startContainerd runs the lab's own containerd (the kubelet's supervised
// configuration: CRI off, root and state under the data dir) as a detached
// process, so it outlives `waggle lab up`.
func startContainerd(ctx context.Context, cfg *Config, st *State) error {
	dir := containerdDir(cfg.DataDir)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	confPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(ctrdsup.Config(dir)), 0o644); err != nil {
		return err
	}
	p, err := startProcess(cfg, "containerd", "", "", []string{"containerd", "--config", confPath})
	if err != nil {
		return err
	}
	st.Processes = append(st.Processes, p)
	if err := st.save(cfg.DataDir); err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, "containerd socket", func() error {
		if !alive(p) {
			return fmt.Errorf("containerd exited (see %s)", p.Log)
		}
		c, err := containerd.New(containerdSocket(cfg.DataDir), containerd.WithTimeout(time.Second))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Version(ctx)
		return err
	})
}

func controlPlaneDir(dataDir string) string { return filepath.Join(dataDir, "control-plane") }

// startControlPlane runs `waggle up` without a node part, listening on the
// lab bridge, and waits for its admin kubeconfig and readiness.
func startControlPlane(ctx context.Context, cfg *Config, st *State) error {
	dir := controlPlaneDir(cfg.DataDir)
	args := []string{cfg.Binary, "up",
		"--data-dir", dir,
		"--node=false",
		"--advertise-address", cfg.BridgeAddr().Addr().String(),
		"--bind-address", cfg.BridgeAddr().Addr().String(),
		"--secure-port", strconv.Itoa(cfg.APIPort),
		"--components-bind-address", cfg.BridgeAddr().Addr().String(),
		"--scheduler-port", strconv.Itoa(cfg.SchedulerPort),
		"--controller-manager-port", strconv.Itoa(cfg.ControllerManagerPort),
		"--cluster-cidr", cfg.ClusterCIDRs(),
		"--service-cluster-ip-range", cfg.ServiceCIDRs(),
		"--node-monitor-grace-period", cfg.NodeMonitorGracePeriod.String(),
	}
	pool := cfg.LoadBalancerIPPool
	if pool == "" {
		pool = cfg.DefaultLoadBalancerPool()
	}
	if pool != "none" {
		args = append(args, "--loadbalancer-ip-pool", pool)
	}
	p, err := startProcess(cfg, "control-plane", "", "", args)
	if err != nil {
		return err
	}
	st.Processes = append(st.Processes, p)
	st.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := st.save(cfg.DataDir); err != nil {
		return err
	}
	return waitFor(ctx, 90*time.Second, "the API server", func() error {
		if !alive(p) {
			return fmt.Errorf("control plane exited (see %s)", p.Log)
		}
		cs, err := clientFor(st.Kubeconfig)
		if err != nil {
			return err
		}
		_, err = cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
}

// nodeKubeconfig copies the control plane's kubeconfig for component into the
// node's directory, pointed at the API server's lab address.
func nodeKubeconfig(cfg *Config, component, nodeDir string) (string, error) {
	src := filepath.Join(controlPlaneDir(cfg.DataDir), component+".kubeconfig")
	kc, err := clientcmd.LoadFromFile(src)
	if err != nil {
		return "", fmt.Errorf("%s kubeconfig: %w", component, err)
	}
	for _, c := range kc.Clusters {
		c.Server = cfg.APIServer()
	}
	dst := filepath.Join(nodeDir, component+".kubeconfig")
	return dst, clientcmd.WriteToFile(*kc, dst)
}

// nodeKubeletKubeconfig writes the node's own kubelet kubeconfig: a client
// certificate for system:node:<name> in system:nodes, issued by the control
// plane's CA, so the Node authorizer limits each node to itself (nodes do
// not share one identity).
func nodeKubeletKubeconfig(cfg *Config, name, nodeDir string) (string, error) {
	ca, err := pki.LoadCA(filepath.Join(controlPlaneDir(cfg.DataDir), "pki"))
	if err != nil {
		return "", fmt.Errorf("kubelet kubeconfig: %w", err)
	}
	dst := filepath.Join(nodeDir, "kubelet.kubeconfig")
	if err := ca.WriteKubeconfig(dst, cfg.APIServer(), "system:node:"+name, []string{"system:nodes"}); err != nil {
		return "", fmt.Errorf("kubelet kubeconfig: %w", err)
	}
	return dst, nil
}

func kubeletArgs(cfg *Config, n NodeState, nodeDir, kc string) []string {
	return []string{cfg.Binary, "kubelet",
		"--kubeconfig", kc,
		"--node-name", n.Name,
		"--node-ip", nodeIPs(n),
		"--root-dir", filepath.Join(nodeDir, "kubelet"),
		"--netns-dir", filepath.Join(nodeDir, "netns"),
		"--containerd-address", containerdSocket(cfg.DataDir),
		"--containerd-namespace", "waggle-" + n.Name,
		"--cgroup-root", n.CgroupDir,
		"--cni-conf-dir", filepath.Join(nodeDir, "cni", "net.d"),
		"--cni-bin-dir", cfg.CNIBinDir,
		"--cluster-cidr", cfg.ClusterCIDRs(),
		"--port", "10250",
		"--client-ca-file", filepath.Join(controlPlaneDir(cfg.DataDir), "pki", "ca.crt"),
		"--image-dir", cfg.ImageDir,
		"--cluster-dns", clusterdns.ServiceIP(cfg.ServiceCIDR).String(),
		"--pod-manifest-path", filepath.Join(nodeDir, "manifests"),
		// The Lease lasts as long as the controller-manager waits for it
		// (renewed every quarter of that), as upstream's 40 s and 40 s: with
		// a shorter grace (the e2e tests' 10 s) and the default 10 s renewal,
		// one late renewal made a healthy node Unknown.
		"--node-lease-duration", cfg.NodeMonitorGracePeriod.String(),
		"--local-registries", strings.Join(cfg.LocalRegistries, ","),
	}
}

// nodeIPs is the node's --node-ip: its lab address, and its IPv6 one after
// a comma in a dual-stack lab (as upstream's dual-stack kubelets).
func nodeIPs(n NodeState) string {
	if n.Addr6 != "" {
		return n.Addr + "," + n.Addr6
	}
	return n.Addr
}

func proxyArgs(cfg *Config, n NodeState, kc string) []string {
	return []string{cfg.Binary, "proxy",
		"--kubeconfig", kc,
		"--node-name", n.Name,
		"--mode", cfg.ProxyMode,
		"--cgroup-root", n.CgroupDir,
		"--bpf-pin-dir", n.PinDir,
		"--cluster-cidr", cfg.ClusterCIDRs(),
		// Traffic from outside the node (the host, other machines on
		// the lab bridge) to NodePorts, ExternalIPs and LoadBalancer IPs:
		// eBPF on the node's eth0 (ignored in iptables mode).
		"--nodeport-devices", "eth0",
	}
}

func clientFor(kubeconfig string) (*kubernetes.Clientset, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(rc)
}

func waitNodesReady(ctx context.Context, kubeconfig string, want int, timeout time.Duration, out io.Writer) error {
	cs, err := clientFor(kubeconfig)
	if err != nil {
		return err
	}
	last := -1
	return waitFor(ctx, timeout, fmt.Sprintf("%d Ready nodes", want), func() error {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		ready := 0
		for _, n := range nodes.Items {
			if nodeReady(&n) {
				ready++
			}
		}
		if ready != last {
			fmt.Fprintf(out, "      %d/%d nodes Ready\n", ready, want)
			last = ready
		}
		if ready < want {
			return fmt.Errorf("%d of %d nodes Ready", ready, want)
		}
		return nil
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func printNodes(ctx context.Context, kubeconfig string, out io.Writer) error {
	cs, err := clientFor(kubeconfig)
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	fmt.Fprintf(out, "%-14s %-8s %s\n", "NODE", "READY", "POD CIDRS")
	for _, n := range nodes.Items {
		cidrs := strings.Join(n.Spec.PodCIDRs, ",")
		if cidrs == "" {
			cidrs = n.Spec.PodCIDR
		}
		fmt.Fprintf(out, "%-14s %-8v %s\n", n.Name, nodeReady(&n), cidrs)
	}
	return nil
}

// removeContainers kills and deletes every task and container in the lab's
// containerd, so no shim, mount or snapshot outlives the lab.
func removeContainers(ctx context.Context, dataDir string, st *State) error {
	running := false
	for _, p := range st.Processes {
		if p.Name == "containerd" && alive(p) {
			running = true
		}
	}
	if !running {
		return nil
	}
	c, err := containerd.New(containerdSocket(dataDir), containerd.WithTimeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("connect to the lab's containerd: %w", err)
	}
	defer c.Close()
	nss, err := c.NamespaceService().List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		_, err := teardown.RemoveContainers(ctx, c, ns)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// waitFor polls check until it succeeds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, check func() error) error {
	return pollFor(ctx, timeout, 500*time.Millisecond, what, check)
}

// pollFor is waitFor checking every interval (measurements want it short).
func pollFor(ctx context.Context, timeout, interval time.Duration, what string, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	for {
		if err = check(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}
