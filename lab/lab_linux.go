package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/waggle-io/waggle/cluster/join"
	"github.com/waggle-io/waggle/internal/cgroupfs"
	"github.com/waggle-io/waggle/internal/procfs"
	"github.com/waggle-io/waggle/internal/teardown"
	ctrdsup "github.com/waggle-io/waggle/kubelet/containerd"
)

const bpffsRoot = "/sys/fs/bpf/waggle"

// Up creates the lab and starts its processes, printing progress to out.
// Whatever it made before a failure stays recorded for Down.
func Up(ctx context.Context, cfg Config, out io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (network namespaces, cgroups, BPF)")
	}
	if st, err := LoadState(cfg.DataDir); err == nil && st.Initialized {
		return fmt.Errorf("a lab is already up under %s: run `waggle lab down` first", cfg.DataDir)
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, "logs"), 0o755); err != nil {
		return err
	}
	st := &State{Initialized: true, Config: &cfg}
	if err := st.save(cfg.DataDir); err != nil {
		return err
	}
	step := newProgress(out, 5+cfg.Nodes)

	bridgeAddrs := []netip.Prefix{cfg.BridgeAddr()}
	if cfg.DualStack() {
		bridgeAddrs = append(bridgeAddrs, cfg.Addr6(cfg.BridgeAddr()))
	}
	step.next("lab bridge %s %v", cfg.Bridge, bridgeAddrs)
	if err := ensureBridge(cfg.Bridge, bridgeAddrs...); err != nil {
		return err
	}
	st.Bridge, st.BridgeAddr = cfg.Bridge, cfg.BridgeAddr().String()
	cg2, err := cgroupfs.V2Root()
	if err != nil {
		return err
	}
	st.CgroupDir = filepath.Join(cg2, cfg.CgroupParent())
	if err := os.MkdirAll(st.CgroupDir, 0o755); err != nil {
		return fmt.Errorf("lab cgroup: %w", err)
	}
	if err := st.save(cfg.DataDir); err != nil {
		return err
	}

	clientAddrs := cfg.ClientAddr().Addr().String()
	if a := cfg.Addr6(cfg.ClientAddr()); a.IsValid() {
		clientAddrs += "," + a.Addr().String()
	}
	step.next("client %s at %s (an external machine on the lab network)", cfg.ClientName(), clientAddrs)
	if err := makeClient(ctx, &cfg, st); err != nil {
		return fmt.Errorf("client namespace: %w", err)
	}

	step.next("containerd (state under %s)", filepath.Join(cfg.DataDir, "containerd"))
	if err := startContainerd(ctx, &cfg, st); err != nil {
		return err
	}

	step.next("control plane on %s", cfg.APIServer())
	if cfg.Servers > 1 {
		if err := startHAControlPlane(ctx, &cfg, st, out); err != nil {
			return err
		}
	} else if err := startControlPlane(ctx, &cfg, st); err != nil {
		return err
	}

	for i := 1; i <= cfg.Nodes; i++ {
		step.next("node %s at %s", cfg.NodeName(i), cfg.NodeIPs(i))
		if err := addNode(ctx, &cfg, st, i); err != nil {
			return fmt.Errorf("node %s: %w", cfg.NodeName(i), err)
		}
	}

	step.next("waiting for %d nodes to be Ready", cfg.Nodes)
	if err := waitNodesReady(ctx, st.Kubeconfig, cfg.Nodes, cfg.ReadyTimeout, out); err != nil {
		return err
	}
	if err := routePodCIDRs(ctx, &cfg, st); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nThe lab is up. Try:\n  kubectl --kubeconfig %s get nodes -o wide\n", st.Kubeconfig)
	return nil
}

// Down stops every process of the lab and removes everything it made. It is
// idempotent: a lab that is not there is not an error.
func Down(ctx context.Context, dataDir string, out io.Writer) error {
	st, err := LoadState(dataDir)
	if errors.Is(err, ErrNoLab) {
		fmt.Fprintln(out, "no lab to remove")
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	// Node agents first (a joined node's are one process, join), so
	// nothing restarts what is being removed.
	for _, name := range []string{"proxy", "kubelet", "join", "control-plane"} {
		for _, p := range st.Processes {
			if p.Name == name {
				fmt.Fprintf(out, "stopping %s %s (pid %d)\n", p.Node, p.Name, p.PID)
				errs = append(errs, stopProcess(p, 15*time.Second))
			}
		}
	}
	for _, n := range st.Nodes {
		fmt.Fprintf(out, "removing node %s\n", n.Name)
		errs = append(errs, teardown.KillCgroupTree(n.CgroupDir))
	}
	errs = append(errs, removeContainers(ctx, dataDir, st))
	for _, p := range st.Processes {
		if p.Name == "containerd" {
			fmt.Fprintf(out, "stopping containerd (pid %d)\n", p.PID)
			errs = append(errs, stopProcess(p, 15*time.Second))
			errs = append(errs, ctrdsup.KillShims(containerdSocket(dataDir)))
		}
	}
	servers := st.Servers
	if st.Client != nil {
		servers = append(servers, *st.Client)
	}
	for _, n := range servers {
		errs = append(errs, removeNetNS(n.NetNS))
		errs = append(errs, teardown.RemoveLink(n.HostVeth))
	}
	for _, n := range st.Nodes {
		errs = append(errs, os.RemoveAll(n.PinDir))
		if n.NetNS != "" {
			errs = append(errs, removeNetNS(n.NetNS))
		}
		errs = append(errs, teardown.RemoveLink(n.HostVeth))
	}
	if st.CgroupDir != "" {
		errs = append(errs, teardown.RemoveCgroupEverywhere(st.CgroupDir))
	}
	if st.Bridge != "" {
		errs = append(errs, teardown.RemoveLink(st.Bridge))
	}
	errs = append(errs, teardown.UnmountUnder(dataDir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lab down left something behind (run it again): %w", err)
	}
	// Only now forget the lab: a failed down can be repeated.
	if err := os.RemoveAll(dataDir); err != nil {
		return err
	}
	fmt.Fprintln(out, "lab removed")
	return nil
}

// Status describes the running lab.
func Status(ctx context.Context, dataDir string, out io.Writer) error {
	st, err := LoadState(dataDir)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "bridge %s %s, kubeconfig %s\n\n", st.Bridge, st.BridgeAddr, st.Kubeconfig)
	fmt.Fprintf(out, "%-14s %-10s %-15s %-8s %s\n", "NODE", "PROCESS", "ADDRESSES", "PID", "STATE")
	for _, p := range st.Processes {
		state := "running"
		if !alive(p) {
			state = "gone (see " + p.Log + ")"
		}
		node, addr := p.Node, ""
		for _, n := range append(st.Nodes, st.Servers...) {
			if n.Name == p.Node {
				addr = nodeIPs(n)
			}
		}
		if node == "" {
			node, addr = "-", st.BridgeAddr
		}
		fmt.Fprintf(out, "%-14s %-10s %-15s %-8d %s\n", node, p.Name, addr, p.PID, state)
	}
	if c := st.Client; c != nil {
		fmt.Fprintf(out, "%-14s %-10s %-15s %-8s %s\n", c.Name, "-", nodeIPs(*c), "-", "network namespace "+c.NetNS+" (waggle lab exec client -- CMD)")
	}
	if st.Kubeconfig != "" {
		fmt.Fprintln(out)
		return printNodes(ctx, st.Kubeconfig, out)
	}
	return nil
}

// Stop stops one process of the lab (a node's "kubelet" or "proxy", or
// node "" for "control-plane" and "containerd"), as a node failure would.
// The lab keeps its record, so Restart can start it again.
func Stop(dataDir, node, name string) error {
	st, err := LoadState(dataDir)
	if err != nil {
		return err
	}
	i, err := st.process(node, name)
	if err != nil {
		return err
	}
	return stopProcess(st.Processes[i], 15*time.Second)
}

// Restart stops one process of the lab (if it runs) and starts it again
// with the same arguments, as an upgrade or a crash-and-restart would.
func Restart(dataDir, node, name string) error {
	st, err := LoadState(dataDir)
	if err != nil {
		return err
	}
	i, err := st.process(node, name)
	if err != nil {
		return err
	}
	old := st.Processes[i]
	if err := stopProcess(old, 15*time.Second); err != nil {
		return err
	}
	cfg := &Config{DataDir: dataDir}
	p, err := startProcess(cfg, old.Name, old.Node, old.NetNS, old.Args)
	if err != nil {
		return err
	}
	st.Processes[i] = p
	return st.save(dataDir)
}

type progress struct {
	out   io.Writer
	n, of int
	start time.Time
}

func newProgress(out io.Writer, of int) *progress {
	return &progress{out: out, of: of, start: time.Now()}
}

func (p *progress) next(format string, args ...any) {
	p.n++
	fmt.Fprintf(p.out, "[%d/%d %5.1fs] %s\n", p.n, p.of, time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// routePodCIDRs routes each node's pod network from the host through the
// node's lab address, so the control plane reaches pods as upstream's does
// (API server proxy, webhooks, aggregated API servers). The routes go with
// the bridge on down.
func routePodCIDRs(ctx context.Context, cfg *Config, st *State) error {
	cs, err := clientFor(st.Kubeconfig)
	if err != nil {
		return err
	}
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		return err
	}
	for _, n := range st.Nodes {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		for _, c := range append([]string{node.Spec.PodCIDR}, node.Spec.PodCIDRs...) {
			dst, err := netlink.ParseIPNet(c)
			if c == "" || err != nil {
				continue
			}
			gw := n.Addr
			if dst.IP.To4() == nil {
				if gw = n.Addr6; gw == "" {
					continue
				}
			}
			r := netlink.Route{LinkIndex: br.Attrs().Index, Dst: dst, Gw: net.ParseIP(gw)}
			if err := netlink.RouteReplace(&r); err != nil {
				return fmt.Errorf("route pod network %s via %s: %w", c, gw, err)
			}
		}
	}
	return nil
}

func ensureBridge(name string, addrs ...netip.Prefix) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("create bridge %s: %w", name, err)
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return err
		}
	}
	for _, addr := range addrs {
		a, _ := netlink.ParseAddr(addr.String())
		if addr.Addr().Is6() {
			// Nothing else claims a lab address: no duplicate address
			// detection, which would hold the address back for a while.
			a.Flags = unix.IFA_F_NODAD
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("0"), 0o644); err != nil {
				return fmt.Errorf("enable IPv6 on %s: %w", name, err)
			}
		}
		if err := netlink.AddrReplace(l, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", addr, name, err)
		}
	}
	return netlink.LinkSetUp(l)
}

func addNode(ctx context.Context, cfg *Config, st *State, i int) error {
	n, nodeDir, err := makeNode(ctx, cfg, st, i)
	if err != nil {
		return err
	}
	kubeletKC, err := nodeKubeletKubeconfig(cfg, n.Name, nodeDir)
	if err != nil {
		return err
	}
	proxyKC, err := nodeKubeconfig(cfg, "proxy", nodeDir)
	if err != nil {
		return err
	}
	return startNodeProcesses(cfg, st, n, map[string][]string{
		"kubelet": kubeletArgs(cfg, n, nodeDir, kubeletKC),
		"proxy":   proxyArgs(cfg, n, proxyKC),
	})
}

// makeNode makes node i's network namespace (on the lab bridge), cgroup and
// directory, recorded in st as each is made.
func makeNode(ctx context.Context, cfg *Config, st *State, i int) (NodeState, string, error) {
	name := cfg.NodeName(i)
	ns := "waggle-" + name
	n := NodeState{
		Name:      name,
		NetNS:     ns,
		HostVeth:  fmt.Sprintf("wl%s%d", cfg.Name, i),
		Addr:      cfg.NodeAddr(i).Addr().String(),
		Addr6:     addrString(cfg.Addr6(cfg.NodeAddr(i))),
		CgroupDir: filepath.Join(st.CgroupDir, name),
		PinDir:    filepath.Join(bpffsRoot, name),
	}
	st.Nodes = append(st.Nodes, n)
	if err := st.save(cfg.DataDir); err != nil {
		return n, "", err
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return n, "", fmt.Errorf("ip netns add %s: %v: %s", ns, err, out)
	}
	if err := plugNode(cfg, n, cfg.NodeAddr(i), true); err != nil {
		return n, "", err
	}
	if err := os.MkdirAll(n.CgroupDir, 0o755); err != nil {
		return n, "", fmt.Errorf("node cgroup: %w", err)
	}
	nodeDir := filepath.Join(cfg.DataDir, "nodes", name)
	return n, nodeDir, os.MkdirAll(nodeDir, 0o755)
}

// startNodeProcesses starts a node's processes (by name: their argument
// lists) in its namespace, in name order, each recorded in st.
func startNodeProcesses(cfg *Config, st *State, n NodeState, procs map[string][]string) error {
	names := make([]string, 0, len(procs))
	for name := range procs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p, err := startProcess(cfg, name, n.Name, n.NetNS, procs[name])
		if err != nil {
			return err
		}
		st.Processes = append(st.Processes, p)
		if err := st.save(cfg.DataDir); err != nil {
			return err
		}
	}
	return nil
}

// Join adds to the lab under dataDir one node that joins as a new machine
// does: `waggle join` with a fresh bootstrap token and the CA pin, its
// kubelet bootstrapping the node's own certificate through a CSR, the
// proxy running as that node. The node takes the next number and the
// lab's settings; it returns once the node is Ready. `waggle lab down`
// removes it with the rest.
func Join(ctx context.Context, dataDir string, out io.Writer) (string, error) {
	st, err := LoadState(dataDir)
	if err != nil {
		return "", err
	}
	if !st.Initialized || st.Kubeconfig == "" {
		return "", fmt.Errorf("the lab under %s is not up", dataDir)
	}
	if st.Config == nil {
		return "", fmt.Errorf("the lab under %s was made by an older waggle: make it again to join nodes to it", dataDir)
	}
	cfg := *st.Config
	cs, err := clientFor(st.Kubeconfig)
	if err != nil {
		return "", err
	}
	tok, err := join.CreateToken(ctx, cs, join.TokenOptions{TTL: time.Hour, Description: "waggle lab join"})
	if err != nil {
		return "", err
	}
	ca, err := os.ReadFile(filepath.Join(controlPlaneDir(cfg.DataDir), "pki", "ca.crt"))
	if err != nil {
		return "", err
	}
	hash, err := join.CACertHash(ca)
	if err != nil {
		return "", err
	}
	i := len(st.Nodes) + 1
	n, nodeDir, err := makeNode(ctx, &cfg, st, i)
	if err != nil {
		return n.Name, err
	}
	fmt.Fprintf(out, "node %s at %s joins with a bootstrap token\n", n.Name, cfg.NodeIPs(i))
	args := []string{cfg.Binary, "join", "--server", cfg.APIServer(), "--token", tok, "--discovery-token-ca-cert-hash", hash,
		"--data-dir", nodeDir, "--node-name", n.Name, "--node-ip", cfg.NodeIPs(i),
		"--containerd-address", containerdSocket(cfg.DataDir), "--cni-bin-dir", cfg.CNIBinDir,
		"--cluster-cidr", cfg.ClusterCIDRs(), "--service-cluster-ip-range", cfg.ServiceCIDRs(),
		"--proxy-mode", cfg.ProxyMode}
	if cfg.ImageDir != "" {
		args = append(args, "--image-dir", cfg.ImageDir)
	}
	// The lab's own choices for a node (its netns dir, containerd
	// namespace, cgroup, pin dir, ...), passed through as a user passes
	// --kubelet-arg and --proxy-arg; join sets the credentials.
	for flag, from := range map[string][]string{
		"--kubelet-arg": kubeletArgs(&cfg, n, nodeDir, ""),
		"--proxy-arg":   proxyArgs(&cfg, n, ""),
	} {
		for j := 2; j+1 < len(from); j += 2 {
			k := strings.TrimPrefix(from[j], "--")
			switch k {
			case "kubeconfig", "client-ca-file", "node-name", "node-ip", "containerd-address", "cni-conf-dir", "cni-bin-dir",
				"cluster-cidr", "cluster-dns", "root-dir", "image-dir", "mode":
				continue // join's own, from the flags above
			}
			args = append(args, flag, k+"="+from[j+1])
		}
	}
	if err := startNodeProcesses(&cfg, st, n, map[string][]string{"join": args}); err != nil {
		return n.Name, err
	}
	if err := waitNodesReady(ctx, st.Kubeconfig, len(st.Nodes), cfg.ReadyTimeout, out); err != nil {
		return n.Name, err
	}
	return n.Name, routePodCIDRs(ctx, &cfg, st)
}

// makeClient makes the lab's external client: a network namespace on the
// lab bridge that is no node, recorded in st before it is made.
func makeClient(ctx context.Context, cfg *Config, st *State) error {
	c := NodeState{
		Name:     cfg.ClientName(),
		NetNS:    "waggle-" + cfg.ClientName(),
		HostVeth: fmt.Sprintf("wl%sc", cfg.Name),
		Addr:     cfg.ClientAddr().Addr().String(),
		Addr6:    addrString(cfg.Addr6(cfg.ClientAddr())),
	}
	st.Client = &c
	if err := st.save(cfg.DataDir); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", c.NetNS).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %v: %s", c.NetNS, err, out)
	}
	return plugNode(cfg, c, cfg.ClientAddr(), false)
}

// plugNode joins the node's namespace to the lab bridge with a veth whose
// inner end is eth0. A router (a node, a server) forwards and sends what is
// not on the lab network through the bridge; the client does neither: it
// reaches node addresses and LoadBalancer IPs on the lab network only, by
// ARP on the bridge, as a machine on the nodes' switch does.
func plugNode(cfg *Config, n NodeState, addr netip.Prefix, router bool) error {
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		return err
	}
	tmpPeer := n.HostVeth + "p"
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n.HostVeth, MasterIndex: br.Attrs().Index}, PeerName: tmpPeer}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", n.HostVeth, err)
	}
	host, err := netlink.LinkByName(n.HostVeth)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	peer, err := netlink.LinkByName(tmpPeer)
	if err != nil {
		return err
	}
	fd, err := unix.Open(filepath.Join("/run/netns", n.NetNS), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := netlink.LinkSetNsFd(peer, fd); err != nil {
		return fmt.Errorf("move veth into %s: %w", n.NetNS, err)
	}
	cmds := [][]string{
		{"ip", "link", "set", tmpPeer, "name", "eth0"},
		{"ip", "addr", "add", addr.String(), "dev", "eth0"},
	}
	addr6 := cfg.Addr6(addr)
	if addr6.IsValid() {
		// A second address on the lab network, IPv6, without duplicate
		// address detection (which holds an address back for a while;
		// the lab numbers its hosts itself).
		cmds = append(cmds,
			[]string{"sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.eth0.disable_ipv6=0"},
			[]string{"ip", "-6", "addr", "add", addr6.String(), "dev", "eth0", "nodad"})
	}
	cmds = append(cmds,
		[]string{"ip", "link", "set", "eth0", "up"},
		[]string{"ip", "link", "set", "lo", "up"})
	if router {
		cmds = append(cmds,
			[]string{"ip", "route", "add", "default", "via", cfg.BridgeAddr().Addr().String()},
			[]string{"sysctl", "-qw", "net.ipv4.ip_forward=1"})
		if addr6.IsValid() {
			cmds = append(cmds,
				[]string{"ip", "-6", "route", "add", "default", "via", cfg.Addr6(cfg.BridgeAddr()).Addr().String()},
				[]string{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"})
		}
	}
	for _, c := range cmds {
		if out, err := exec.Command("ip", append([]string{"netns", "exec", n.NetNS}, c...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("in %s: %s: %v: %s", n.NetNS, strings.Join(c, " "), err, out)
		}
	}
	return nil
}

func addrString(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.Addr().String()
}

// startProcess starts a lab process in its own session (inside netns, when
// given) with its output in a log file, and records it.
func startProcess(cfg *Config, name, node, netns string, args []string) (Process, error) {
	logName := name + ".log"
	if node != "" {
		logName = node + "-" + logName
	}
	logPath := filepath.Join(cfg.DataDir, "logs", logName)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Process{}, err
	}
	defer logf.Close()
	argv := args
	if netns != "" {
		// nsenter switches only the network namespace; `ip netns exec` would
		// also remount /sys, hiding the cgroup2 and bpffs mounts the kubelet
		// and the proxy need.
		argv = append([]string{"nsenter", "--net=" + filepath.Join("/run/netns", netns), "--"}, args...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return Process{}, err
	}
	// The lab outlives this command: the process is not waited for here.
	if err := cmd.Process.Release(); err != nil {
		return Process{}, err
	}
	return Process{Name: name, Node: node, PID: pid, StartTime: st.StartTime, Log: logPath, NetNS: netns, Args: args}, nil
}

// alive reports whether p is still the process the lab started and has not
// exited (a zombie child of `lab up` has).
func alive(p Process) bool { return teardown.Alive(p.PID, p.StartTime) }

// stopProcess sends SIGTERM, waits up to grace, then SIGKILL — only while the
// PID is still the process the lab started.
func stopProcess(p Process, grace time.Duration) error {
	return teardown.Stop(p.PID, p.StartTime, p.Name, grace, nil)
}

func removeNetNS(name string) error {
	if _, err := os.Stat(filepath.Join("/run/netns", name)); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %v: %s", name, err, out)
	}
	return nil
}

// Exec runs a command in the lab and returns its exit error: in the
// external client's network namespace (target "client" or its name), in a
// node's (and in a cgroup below the node's, so that the node's socket load
// balancer serves it as one of the node's processes), or in an HA
// server's.
func Exec(ctx context.Context, dataDir, target string, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("lab exec: no command")
	}
	st, err := LoadState(dataDir)
	if err != nil {
		return err
	}
	var netns, cgroup string
	var names []string
	if c := st.Client; c != nil {
		names = append(names, "client")
		if target == "client" || target == c.Name {
			netns = c.NetNS
		}
	}
	for _, n := range append(st.Nodes, st.Servers...) {
		names = append(names, n.Name)
		if target == n.Name {
			netns, cgroup = n.NetNS, n.CgroupDir
		}
	}
	if netns == "" {
		return fmt.Errorf("the lab has no %q (have %s)", target, strings.Join(names, ", "))
	}
	argv := append([]string{"nsenter", "--net=" + filepath.Join("/run/netns", netns), "--"}, args...)
	if cgroup != "" {
		cg := filepath.Join(cgroup, fmt.Sprintf("lab-exec-%d", os.Getpid()))
		if err := os.MkdirAll(cg, 0o755); err != nil {
			return err
		}
		defer unix.Rmdir(cg)
		// The shell moves itself into the cgroup before it becomes the
		// command, so everything the command starts is counted there.
		argv = append([]string{"sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cg}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	return cmd.Run()
}
