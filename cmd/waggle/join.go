package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/waggle-io/waggle/cluster"
	"github.com/waggle-io/waggle/cluster/join"
	"github.com/waggle-io/waggle/clusterdns"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/internal/cliflag"
	"github.com/waggle-io/waggle/internal/ops"
	"github.com/waggle-io/waggle/kubelet"
)

// runJoin runs `waggle join`: this machine becomes a node of a running
// cluster, as `kubeadm join` or k3s's agent make one. The first run
// discovers the cluster through any server with a bootstrap token and pins
// its CA, then the kubelet's TLS bootstrap gets the node its own client
// certificate (system:node:<name>) through a CertificateSigningRequest,
// and the server issues the proxy its system:kube-proxy certificate (as
// k3s's agent gets one); the kubelet, the proxy and the node's cluster DNS
// server then run in this process. Run again on the same --data-dir, it resumes
// without a token (the kubelet rotates the certificate).
func runJoin(ctx context.Context, args []string) error {
	def := cluster.Defaults()
	fs := cliflag.NewFlagSet("join", "Join this machine to a running Waggle cluster as a node: discover the cluster with a bootstrap token and pin its CA, get the node's own certificate through a CSR (TLS bootstrap), run the kubelet and the proxy.")
	server := fs.String("server", "", "any server of the cluster, https://<host>:6443 (first join only)")
	token := fs.String("token", "", "bootstrap token from waggle token create (first join only)")
	var hashes cliflag.StringList
	fs.Var(&hashes, "discovery-token-ca-cert-hash", "pin of the cluster CA's public key, sha256:<hex> (printed by waggle token create)")
	unsafeSkip := fs.Bool("discovery-token-unsafe-skip-ca-verification", false, "join without pinning the cluster CA (trust the first answer)")
	dataDir := fs.String("data-dir", def.DataDir, "the node's state: CA, certificates, kubelet, CNI; the same dir resumes the same node")
	nodeName := fs.String("node-name", "", "this node's name (default: the hostname, lower-cased)")
	nodeIP := fs.String("node-ip", "", "this node's InternalIP, or IPv4,IPv6 for a dual-stack node (default: the default route's address)")
	containerd := fs.String("containerd-address", "", "containerd socket (default: the system's if it runs, else a supervised one under the data dir)")
	cniBin := fs.String("cni-bin-dir", "", "directory of the waggle CNI plugin (default: cni/ beside this binary)")
	imageDir := fs.String("image-dir", "", "OCI image archives imported at start")
	clusterCIDR := fs.String("cluster-cidr", def.ClusterCIDR, "the cluster's pod network (the servers' --cluster-cidr; IPv4,IPv6 for dual-stack)")
	serviceRange := fs.String("service-cluster-ip-range", def.ServiceClusterIPRange, "the cluster's Service range (the servers'; IPv4,IPv6 for dual-stack); the tenth address of the first is the cluster DNS Service")
	clusterDomain := fs.String("cluster-domain", def.ClusterDomain, "the cluster DNS zone")
	proxyMode := fs.String("proxy-mode", def.ProxyMode, "service proxy mode: auto, ebpf, iptables or ipvs")
	npDevices := fs.String("nodeport-devices", def.NodePortDevices, "devices on which eBPF serves NodePort, ExternalIP and LoadBalancer traffic from other machines: auto (the device of the node's address), none, or comma-separated names")
	logLevel := fs.String("log-level", def.LogLevel, "log level: debug, info, warn or error")
	var kubeletArgs, proxyArgs passThrough
	fs.Var(&kubeletArgs, "kubelet-arg", "a further waggle kubelet flag as name=value (repeatable); it overrides join's own choice")
	fs.Var(&proxyArgs, "proxy-arg", "a further waggle proxy flag as name=value (repeatable); it overrides join's own choice")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	log, err := ops.NewLogger("join", *logLevel)
	if err != nil {
		return err
	}
	devices, err := cluster.NodePortDevices(*npDevices, *nodeIP)
	if err != nil {
		return err
	}
	svcs, err := kubelet.ParseDualStackPrefixes(*serviceRange)
	if err != nil || len(svcs) == 0 {
		return fmt.Errorf("--service-cluster-ip-range %q: want a CIDR, or one IPv4 and one IPv6 comma-separated (%v)", *serviceRange, err)
	}
	svc := svcs[0] // the cluster DNS Service is in the primary range
	if cidrs, err := kubelet.ParseDualStackPrefixes(*clusterCIDR); err != nil || len(cidrs) == 0 {
		return fmt.Errorf("--cluster-cidr %q: want a CIDR, or one IPv4 and one IPv6 comma-separated (%v)", *clusterCIDR, err)
	}
	if _, err := kubelet.ParseNodeIPs(*nodeIP); err != nil {
		return fmt.Errorf("--node-ip: %w", err)
	}
	name := *nodeName
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --node-name and no host name: %w", err)
		}
		name = strings.ToLower(h)
	}
	cni := *cniBin
	if cni == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		cni = filepath.Join(filepath.Dir(exe), "cni")
	}

	fp, err := cluster.ClaimDataDir(*dataDir, "join")
	if err != nil {
		return err
	}
	n := join.NodeFiles(*dataDir)
	if n.Joined() {
		log.Info("this machine joined already; resuming as the node it is (no token needed)", "dataDir", *dataDir, "node", name)
	} else {
		if *server == "" || *token == "" {
			return errors.New("the first join needs --server https://<server>:6443 and --token (from waggle token create on a server)")
		}
		log.Info("discovering the cluster and pinning its CA", "server", *server)
		if n, err = join.Bootstrap(ctx, *dataDir, *server, *token, hashes, *unsafeSkip); err != nil {
			return err
		}
		log.Info("TLS bootstrap: asking for the node's client certificate (CSR)", "node", name)
		if err := kubelet.TLSBootstrap(ctx, kubelet.Config{NodeName: name, Kubeconfig: n.Kubeconfig,
			BootstrapKubeconfig: n.BootstrapKubeconfig, CertDir: n.CertDir, Log: log}); err != nil {
			return err
		}
		log.Info("joined: the node has its own certificate", "node", name, "kubeconfig", n.Kubeconfig)
	}

	g, gctx := errgroup.WithContext(ctx)
	addr, sup, err := cluster.Containerd(gctx, g, *containerd, *dataDir, *logLevel, log)
	if err != nil {
		return err
	}
	kubeletFlags := map[string]string{
		"node-name":            name,
		"kubeconfig":           n.Kubeconfig,
		"bootstrap-kubeconfig": n.BootstrapKubeconfig,
		"cert-dir":             n.CertDir,
		"client-ca-file":       n.CAFile,
		"root-dir":             filepath.Join(*dataDir, "kubelet"),
		"containerd-address":   addr,
		"cni-conf-dir":         filepath.Join(*dataDir, "cni", "net.d"),
		"cni-bin-dir":          cni,
		"cluster-cidr":         *clusterCIDR,
		"cluster-dns":          clusterdns.ServiceIP(svc).String(),
		"cluster-domain":       *clusterDomain,
		"pod-manifest-path":    filepath.Join(*dataDir, "manifests"),
		"log-level":            *logLevel,
	}
	if *nodeIP != "" {
		kubeletFlags["node-ip"] = *nodeIP
	}
	if *imageDir != "" {
		kubeletFlags["image-dir"] = *imageDir
	}
	// The proxy and the cluster DNS server run as system:kube-proxy, with
	// the certificate the server issued to the join token.
	proxyFlags := map[string]string{
		"kubeconfig":     n.ProxyKubeconfig,
		"node-name":      name,
		"mode":           *proxyMode,
		"cluster-cidr":   *clusterCIDR,
		"cluster-domain": *clusterDomain,
		"log-level":      *logLevel,
	}
	if len(devices) > 0 {
		proxyFlags["nodeport-devices"] = strings.Join(devices, ",")
	}
	kflags, pflags := kubeletArgs.over(kubeletFlags), proxyArgs.over(proxyFlags)
	// What the node uses, for `waggle down`: the kubelet's and the proxy's
	// own defaults where neither join nor --kubelet-arg/--proxy-arg chose.
	nf := cluster.NodeFootprint{Name: name, ContainerdNamespace: or(kflags["containerd-namespace"], "waggle"),
		KubeletRootDir: kflags["root-dir"], CNIConfDir: kflags["cni-conf-dir"],
		CgroupRoot: or(kflags["cgroup-root"], "/waggle/"+kflags["node-name"]), BPFCgroupRoot: pflags["cgroup-root"],
		BPFPinDir: or(pflags["bpf-pin-dir"], ebpf.DefaultPinRoot+"/"+pflags["node-name"])}
	nf.SetContainerd(kflags["containerd-address"], sup)
	if err := fp.RecordNode(*dataDir, nf); err != nil {
		return err
	}
	kargs, pargs := asFlags(kflags), asFlags(pflags)
	log.Info("starting the kubelet and the proxy", "node", name, "containerd", addr)
	g.Go(func() error { return runKubelet(gctx, kargs) })
	g.Go(func() error { return runProxy(gctx, pargs) })
	return g.Wait()
}

// or returns v, or def when v is empty.
func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// passThrough is a repeatable name=value flag whose values are handed to
// another command's flags verbatim (commas included), as k3s's
// --kubelet-arg.
type passThrough []string

func (p *passThrough) String() string { return strings.Join(*p, " ") }

func (p *passThrough) Set(v string) error {
	name, _, ok := strings.Cut(strings.TrimLeft(v, "-"), "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: want name=value", v)
	}
	*p = append(*p, strings.TrimLeft(v, "-"))
	return nil
}

// over returns defaults with p's values over them.
func (p passThrough) over(defaults map[string]string) map[string]string {
	flags := make(map[string]string, len(defaults)+len(p))
	for k, v := range defaults {
		flags[k] = v
	}
	for _, a := range p {
		k, v, _ := strings.Cut(a, "=")
		flags[k] = v
	}
	return flags
}

// asFlags returns flags as --name=value arguments in a stable order.
func asFlags(flags map[string]string) []string {
	names := make([]string, 0, len(flags))
	for k := range flags {
		names = append(names, k)
	}
	sort.Strings(names)
	out := make([]string, 0, len(names))
	for _, k := range names {
		out = append(out, "--"+k+"="+flags[k])
	}
	return out
}
