package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	wcni "github.com/waggle-io/waggle/cni"
)

// CNIOptions configure the CNI network manager.
type CNIOptions struct {
	// ConfDir holds *.conflist / *.conf (the first in name order is used).
	ConfDir string
	// BinDirs are searched for plugin executables.
	BinDirs []string
	// CacheDir is libcni's result cache (default /var/lib/cni).
	CacheDir string
	// NetNSDir is where pod namespaces are bind-mounted (default /run/netns).
	NetNSDir string
	// NetNSPrefix starts every namespace's name (default "waggle-").
	NetNSPrefix string
	// IPAMDataDir is the IPAM store written into the configuration Configure
	// writes: the node's own (under its root dir), so that clusters and lab
	// nodes on one machine never share allocations ("" keeps the plugin's
	// default, /var/lib/cni/networks).
	IPAMDataDir string
	Log         *slog.Logger
}

// CNI is the Manager that runs the node's CNI plugin.
type CNI struct {
	opts CNIOptions
	cni  *libcni.CNIConfig
}

var _ Manager = (*CNI)(nil)

// NewCNI returns a CNI manager.
func NewCNI(opts CNIOptions) *CNI {
	if opts.CacheDir == "" {
		opts.CacheDir = "/var/lib/cni"
	}
	if opts.NetNSDir == "" {
		opts.NetNSDir = "/run/netns"
	}
	if opts.NetNSPrefix == "" {
		opts.NetNSPrefix = "waggle-"
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	// An explicit exec: libcni sets its default lazily, which races when
	// pods are set up in parallel.
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return &CNI{opts: opts, cni: libcni.NewCNIConfigWithCacheDir(opts.BinDirs, opts.CacheDir, exec)}
}

// confFiles lists the config dir's network configurations in name order.
func confFiles(dir string) ([]string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, fmt.Errorf("read CNI config dir %s: %w", dir, err)
	}
	sort.Strings(files)
	return files, nil
}

func (c *CNI) loadConf() (*libcni.NetworkConfigList, error) {
	files, err := confFiles(c.opts.ConfDir)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoConfig, c.opts.ConfDir)
	}
	f := files[0]
	if strings.HasSuffix(f, ".conflist") {
		l, err := libcni.ConfListFromFile(f)
		if err != nil {
			return nil, fmt.Errorf("CNI config %s: %w", f, err)
		}
		return l, nil
	}
	one, err := libcni.ConfFromFile(f)
	if err != nil {
		return nil, fmt.Errorf("CNI config %s: %w", f, err)
	}
	l, err := libcni.ConfListFromConf(one)
	if err != nil {
		return nil, fmt.Errorf("CNI config %s: %w", f, err)
	}
	return l, nil
}

// Ready implements Manager.
func (c *CNI) Ready() error {
	_, err := c.loadConf()
	return err
}

func (c *CNI) runtimeConf(pod Pod, sb Sandbox) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: sb.ContainerID,
		NetNS:       sb.NetNS,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", sb.ContainerID},
			{"K8S_POD_UID", pod.UID},
		},
	}
}

// SetUp implements Manager.
func (c *CNI) SetUp(ctx context.Context, pod Pod) (Sandbox, error) {
	conf, err := c.loadConf()
	if err != nil {
		return Sandbox{}, err
	}
	name := c.opts.NetNSPrefix + pod.UID
	sb := Sandbox{Name: name, NetNS: filepath.Join(c.opts.NetNSDir, name), ContainerID: "waggle-" + pod.UID}
	if err := createNetNS(sb.NetNS); err != nil {
		return Sandbox{}, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	res, err := c.cni.AddNetworkList(ctx, conf, c.runtimeConf(pod, sb))
	if err != nil {
		// Undo: DEL releases whatever ADD allocated before failing.
		c.cni.DelNetworkList(context.WithoutCancel(ctx), conf, c.runtimeConf(pod, sb))
		RemoveNetNS(sb.NetNS)
		return Sandbox{}, fmt.Errorf("CNI ADD for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		c.cni.DelNetworkList(context.WithoutCancel(ctx), conf, c.runtimeConf(pod, sb))
		RemoveNetNS(sb.NetNS)
		return Sandbox{}, fmt.Errorf("CNI result for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	var v4, v6 []string
	for _, ip := range r.IPs {
		if ip.Address.IP.To4() != nil {
			v4 = append(v4, ip.Address.IP.String())
		} else {
			v6 = append(v6, ip.Address.IP.String())
		}
	}
	sb.IPs = append(v4, v6...)
	if len(sb.IPs) == 0 {
		c.cni.DelNetworkList(context.WithoutCancel(ctx), conf, c.runtimeConf(pod, sb))
		RemoveNetNS(sb.NetNS)
		return Sandbox{}, fmt.Errorf("CNI ADD for pod %s/%s returned no address", pod.Namespace, pod.Name)
	}
	return sb, nil
}

// TearDown implements Manager. The namespace goes first: while it cannot be
// removed it may still hold the pod's interface and address, so CNI DEL —
// which releases the address to the IPAM store — runs only once it is gone
// (with no netns, which the CNI spec requires plugins to accept).
func (c *CNI) TearDown(ctx context.Context, pod Pod, sb Sandbox) error {
	if sb.NetNS != "" {
		if err := RemoveNetNS(sb.NetNS); err != nil {
			return fmt.Errorf("pod %s/%s: %w (its address stays reserved)", pod.Namespace, pod.Name, err)
		}
	}
	if sb.ContainerID == "" {
		return nil
	}
	conf, err := c.loadConf()
	if err != nil {
		if errors.Is(err, ErrNoConfig) {
			return nil
		}
		return err
	}
	rc := c.runtimeConf(pod, sb)
	rc.NetNS = ""
	if err := c.cni.DelNetworkList(ctx, conf, rc); err != nil {
		return fmt.Errorf("CNI DEL for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// WriteConfig writes the waggle CNI configuration list for podCIDR into dir
// (as 10-waggle.conflist) unless dir already holds a configuration. It
// reports whether it wrote one.
func WriteConfig(dir string, podCIDR, clusterCIDR netip.Prefix, opts ...wcni.ConfListOption) (bool, error) {
	files, err := confFiles(dir)
	if err != nil && !os.IsNotExist(errors.Unwrap(err)) {
		if _, serr := os.Stat(dir); serr == nil {
			return false, err
		}
	}
	if len(files) > 0 {
		return false, nil
	}
	data, err := wcni.ConfList(podCIDR, clusterCIDR, opts...)
	if err != nil {
		return false, fmt.Errorf("render CNI config for %s: %w", podCIDR, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("CNI config dir: %w", err)
	}
	tmp := filepath.Join(dir, ".10-waggle.conflist.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return false, fmt.Errorf("write CNI config: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "10-waggle.conflist")); err != nil {
		return false, fmt.Errorf("write CNI config: %w", err)
	}
	return true, nil
}

var _ Configurer = (*CNI)(nil)

// Configure implements Configurer: it writes the waggle configuration for
// the node's pod CIDRs into the config dir unless one is there. A
// dual-stack node's pods get an address of each family (the primary
// first); the cluster CIDR of each family is kept from masquerading.
func (c *CNI) Configure(podCIDRs, clusterCIDRs []netip.Prefix) (bool, error) {
	if len(podCIDRs) == 0 {
		return false, errors.New("configure pod network: no pod CIDR")
	}
	primary := podCIDRs[0]
	cluster := func(is4 bool) netip.Prefix {
		for _, p := range clusterCIDRs {
			if p.Addr().Is4() == is4 {
				return p
			}
		}
		return netip.Prefix{}
	}
	var opts []wcni.ConfListOption
	if c.opts.IPAMDataDir != "" {
		opts = append(opts, wcni.WithDataDir(c.opts.IPAMDataDir))
	}
	for _, p := range podCIDRs[1:] {
		opts = append(opts, wcni.WithDualStack(p, cluster(p.Addr().Is4())))
	}
	return WriteConfig(c.opts.ConfDir, primary, cluster(primary.Addr().Is4()), opts...)
}
