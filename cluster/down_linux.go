package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containerd/containerd"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/containerd/namespaces"
	"golang.org/x/sys/unix"

	wcni "github.com/waggle-io/waggle/cni"
	"github.com/waggle-io/waggle/cni/routes"
	"github.com/waggle-io/waggle/dataplane"
	webpf "github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/modes"
	"github.com/waggle-io/waggle/internal/cgroupfs"
	"github.com/waggle-io/waggle/internal/teardown"
	ctrdsup "github.com/waggle-io/waggle/kubelet/containerd"
	"github.com/waggle-io/waggle/kubelet/network"
)

// Down stops what `waggle up` or `waggle join` runs from cfg.DataDir and
// the pods' containers and, with Purge, removes everything it made: pod
// network namespaces and cgroups, the CNI bridge, masquerade chain and
// routes, the proxy's rules and its pinned BPF objects (detaching its
// programs from the cgroup and the devices), Waggle's containerd namespace
// (or its whole supervised containerd) and the data dir. It touches only
// what the data dir's footprint names (see Footprint). It is idempotent;
// it returns an error listing whatever it could not stop or remove.
func Down(ctx context.Context, cfg DownConfig) error {
	if cfg.DataDir == "" {
		return errors.New("--data-dir is required")
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultDownGrace
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := preflight(); err != nil {
		return err
	}
	d := &downer{cfg: cfg}
	if _, err := os.Stat(cfg.DataDir); errors.Is(err, os.ErrNotExist) {
		if procs := findProcesses(cfg.DataDir); len(procs) == 0 {
			fmt.Fprintf(cfg.Out, "nothing to stop or remove: %s does not exist\n", cfg.DataDir)
			return nil
		}
	}
	fp, err := LoadFootprint(cfg.DataDir)
	switch {
	case errors.Is(err, ErrNoFootprint):
		// A data dir from before footprints: up's layout and defaults —
		// if it is one. A mistyped --data-dir (/, /var/lib) must not be
		// purged: up and join both write pki/ca.crt first.
		if !exists(filepath.Join(cfg.DataDir, "pki", "ca.crt")) && len(findProcesses(cfg.DataDir)) == 0 {
			return fmt.Errorf("%s holds no footprint.json and no pki/ca.crt: not a data dir of waggle up or join; nothing stopped or removed", cfg.DataDir)
		}
		fp = legacyFootprint(cfg.DataDir)
		d.step("no footprint in %s: assuming `waggle up`'s defaults", cfg.DataDir)
	case err != nil:
		return err
	}
	d.stopProcesses(fp)
	if fp.Node != nil {
		d.removeContainers(ctx, fp.Node)
	}
	if !cfg.Purge {
		if len(d.failed) > 0 {
			return d.result()
		}
		fmt.Fprintf(cfg.Out, "stopped; the state stays in %s (waggle up resumes it; waggle down --purge removes it)\n", cfg.DataDir)
		return nil
	}
	if n := fp.Node; n != nil {
		d.removePodNetworks(n)
		d.removePodCgroups(n)
		d.removeCNI(n)
		d.removeProxyState(ctx, n)
	}
	d.step("removing %s", cfg.DataDir)
	d.check("mounts under "+cfg.DataDir, teardown.UnmountUnder(cfg.DataDir))
	d.check(cfg.DataDir, os.RemoveAll(cfg.DataDir))
	if len(d.failed) > 0 {
		return d.result()
	}
	fmt.Fprintf(cfg.Out, "purged: nothing Waggle made from %s is left\n", cfg.DataDir)
	return nil
}

// preflight checks that this process sees the machine's cgroup and BPF
// file systems: `ip netns exec` remounts /sys, hiding both, and a purge
// run there would find nothing to detach and leave the programs attached.
func preflight() error {
	if _, err := cgroupfs.V2Root(); err != nil {
		return fmt.Errorf("no cgroup v2 file system in sight (%w): run waggle down where /sys/fs/cgroup is mounted (`nsenter --net=`, not `ip netns exec`, which remounts /sys)", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(bpffsRoot, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("%s is not a BPF file system here: run waggle down where it is mounted (`nsenter --net=`, not `ip netns exec`, which remounts /sys)", bpffsRoot)
	}
	return nil
}

const bpffsRoot = "/sys/fs/bpf"

// downer carries Down's progress: its step count and what failed.
type downer struct {
	cfg    DownConfig
	n      int
	start  time.Time
	failed []string
}

func (d *downer) step(format string, args ...any) {
	if d.start.IsZero() {
		d.start = time.Now()
	}
	d.n++
	fmt.Fprintf(d.cfg.Out, "[%d %5.1fs] %s\n", d.n, time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// check records err (if any) as something left behind.
func (d *downer) check(what string, err error) {
	if err == nil {
		return
	}
	fmt.Fprintf(d.cfg.Out, "  FAILED: %s: %v\n", what, err)
	d.failed = append(d.failed, fmt.Sprintf("%s: %v", what, err))
}

func (d *downer) result() error {
	return fmt.Errorf("could not stop or remove %d thing(s) (fix and run waggle down again):\n  %s",
		len(d.failed), strings.Join(d.failed, "\n  "))
}

// legacyFootprint is what a `waggle up` made before it recorded a
// footprint: its defaults, with the data dir's layout.
func legacyFootprint(dataDir string) *Footprint {
	def := Defaults()
	name, _ := os.Hostname()
	n := &NodeFootprint{Name: name, ContainerdNamespace: def.ContainerdNamespace,
		KubeletRootDir: filepath.Join(dataDir, "kubelet"), CNIConfDir: filepath.Join(dataDir, "cni", "net.d"),
		CgroupRoot: def.CgroupRoot, BPFPinDir: webpf.DefaultPinRoot + "/" + name}
	if dir := filepath.Join(dataDir, "containerd"); exists(dir) {
		n.ContainerdDir, n.ContainerdAddress = dir, ctrdsup.Address(dir)
	} else {
		n.ContainerdAddress = systemContainerd
	}
	if !exists(n.KubeletRootDir) {
		n = nil // control plane only
	}
	return &Footprint{Command: "up", Node: n}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// stopProcesses stops the recorded process and any other `waggle up` or
// `waggle join` of the data dir, then a supervised containerd that
// outlived them (its parent killed).
func (d *downer) stopProcesses(fp *Footprint) {
	procs := findProcesses(d.cfg.DataDir)
	if fp.Running() {
		found := false
		for _, p := range procs {
			found = found || p.PID == fp.PID
		}
		if !found {
			procs = append(procs, procPID{PID: fp.PID, StartTime: fp.StartTime, Command: fp.Command})
		}
	}
	if len(procs) == 0 {
		d.step("no waggle up or join runs on %s", d.cfg.DataDir)
	}
	for _, p := range procs {
		what := "waggle " + p.Command
		d.step("stopping %s (pid %d): SIGTERM, SIGKILL after %s", what, p.PID, d.cfg.Grace)
		d.check(what, teardown.Stop(p.PID, p.StartTime, what, d.cfg.Grace, d.cfg.Out))
	}
	if n := fp.Node; n != nil && n.ContainerdPID > 0 && teardown.Alive(n.ContainerdPID, n.ContainerdStartTime) {
		d.step("stopping the supervised containerd (pid %d), left by its supervisor", n.ContainerdPID)
		d.check("containerd", teardown.Stop(n.ContainerdPID, n.ContainerdStartTime, "containerd", 10*time.Second, d.cfg.Out))
	}
}

// removeContainers kills and deletes the containers of the node's
// containerd namespace (with Purge, its images and the namespace too). A
// supervised containerd, stopped with its supervisor, is started for this
// and stopped again, and its shims that are left are killed; another
// containerd is only asked about Waggle's namespace.
func (d *downer) removeContainers(ctx context.Context, n *NodeFootprint) {
	addr := n.ContainerdAddress
	if n.ContainerdDir != "" {
		if !exists(n.ContainerdDir) {
			return
		}
		d.step("starting the supervised containerd under %s to remove the pods' containers", n.ContainerdDir)
		daemon, err := ctrdsup.Start(ctx, ctrdsup.Options{Dir: n.ContainerdDir})
		if err != nil {
			d.check("containerd", err)
			d.check("containerd shims", ctrdsup.KillShims(ctrdsup.Address(n.ContainerdDir)))
			return
		}
		addr = daemon.Address()
		defer func() {
			d.step("stopping the supervised containerd (pid %d) and any shim left", daemon.PID())
			d.check("containerd", daemon.Stop(context.WithoutCancel(ctx)))
			d.check("containerd shims", ctrdsup.KillShims(addr))
		}()
	}
	c, err := containerd.New(addr, containerd.WithTimeout(5*time.Second))
	if err != nil {
		d.check("containerd at "+addr, err)
		return
	}
	defer c.Close()
	if ok, err := c.IsServing(ctx); !ok || err != nil {
		d.check("containers of namespace "+n.ContainerdNamespace, fmt.Errorf("containerd at %s does not answer: %v", addr, err))
		return
	}
	nss, err := c.NamespaceService().List(ctx)
	if err != nil {
		d.check("containerd namespaces", err)
		return
	}
	if !contains(nss, n.ContainerdNamespace) {
		d.step("containerd %s has no namespace %s", addr, n.ContainerdNamespace)
		return
	}
	d.step("removing the containers of containerd namespace %s", n.ContainerdNamespace)
	count, err := teardown.RemoveContainers(ctx, c, n.ContainerdNamespace)
	fmt.Fprintf(d.cfg.Out, "  %d container(s) removed\n", count)
	d.check("containers of namespace "+n.ContainerdNamespace, err)
	if d.cfg.Purge && n.ContainerdDir == "" && err == nil {
		// A containerd Waggle does not own keeps running: empty and
		// delete Waggle's namespace in it. A supervised one goes whole
		// with the data dir.
		d.step("removing containerd namespace %s (images, leases)", n.ContainerdNamespace)
		d.check("containerd namespace "+n.ContainerdNamespace, removeNamespace(ctx, c, n.ContainerdNamespace))
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// removeNamespace deletes a containerd namespace's images and leases, then
// the namespace (containerd's garbage collector removes the content and
// snapshots nothing refers to any more).
func removeNamespace(ctx context.Context, c *containerd.Client, ns string) error {
	nctx := namespaces.WithNamespace(ctx, ns)
	imgs, err := c.ImageService().List(nctx)
	if err != nil {
		return err
	}
	for i, img := range imgs {
		var opts []images.DeleteOpt
		if i == len(imgs)-1 {
			opts = append(opts, images.SynchronousDelete())
		}
		if err := c.ImageService().Delete(nctx, img.Name, opts...); err != nil {
			return fmt.Errorf("delete image %s: %w", img.Name, err)
		}
	}
	ls, err := c.LeasesService().List(nctx)
	if err != nil {
		return err
	}
	for _, l := range ls {
		if err := c.LeasesService().Delete(nctx, l, leases.SynchronousDelete); err != nil {
			return fmt.Errorf("delete lease %s: %w", l.ID, err)
		}
	}
	return c.NamespaceService().Delete(ctx, ns)
}

// sandboxRecord is what the kubelet records of a pod's sandbox
// (<root>/pods/<uid>/sandbox.json) that down needs.
type sandboxRecord struct {
	NetNS  string `json:"netns"`
	Cgroup string `json:"cgroup"`
}

func podSandboxes(kubeletRoot string) []sandboxRecord {
	files, _ := filepath.Glob(filepath.Join(kubeletRoot, "pods", "*", "sandbox.json"))
	var out []sandboxRecord
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var s sandboxRecord
		if json.Unmarshal(b, &s) == nil {
			out = append(out, s)
		}
	}
	return out
}

// removePodNetworks removes the pods' network namespaces the kubelet
// recorded (their veths go with them).
func (d *downer) removePodNetworks(n *NodeFootprint) {
	var netns []string
	for _, s := range podSandboxes(n.KubeletRootDir) {
		if s.NetNS != "" && exists(s.NetNS) {
			netns = append(netns, s.NetNS)
		}
	}
	d.step("removing %d pod network namespace(s)", len(netns))
	for _, p := range netns {
		d.check("pod network namespace "+p, network.RemoveNetNS(p))
	}
}

// cgroupV2Dir returns the cgroup v2 directory of a cgroup path ("/waggle")
// or of a directory under any cgroup mount ("": the v2 root).
func cgroupV2Dir(p string) (string, error) {
	root, err := cgroupfs.V2Root()
	if err != nil {
		return "", err
	}
	if p == "" {
		return root, nil
	}
	rel, err := teardown.RelativeCgroup(p)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, rel), nil
}

// removePodCgroups kills what still runs in the pods' cgroups (pod<uid>
// under the kubelet's cgroup root) and removes them, on every cgroup mount
// (runc makes them in the v1 hierarchies of a hybrid host), then the
// kubelet's cgroup root where nothing else is in it.
func (d *downer) removePodCgroups(n *NodeFootprint) {
	rel, err := teardown.RelativeCgroup(n.CgroupRoot)
	if err != nil {
		d.check("pod cgroups", err)
		return
	}
	if rel == "/" {
		d.check("pod cgroups", fmt.Errorf("the pod cgroup root %q is the machine's root cgroup: not removing it", n.CgroupRoot))
		return
	}
	roots, err := teardown.CgroupDirs(rel)
	if err != nil {
		d.check("pod cgroups", err)
		return
	}
	var pods []string
	names := map[string]bool{}
	for _, r := range roots {
		ps, _ := filepath.Glob(filepath.Join(r, "pod*"))
		for _, p := range ps {
			names[filepath.Base(p)] = true
		}
		pods = append(pods, ps...)
	}
	d.step("removing %d pod cgroup(s) under %s (on %d cgroup mount(s))", len(names), rel, len(roots))
	for _, p := range pods {
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			continue
		}
		d.check("processes in cgroup "+p, teardown.KillCgroupTree(p))
		d.check("cgroup "+p, teardown.RemoveCgroupEverywhere(p))
	}
	// The root itself, unless it holds something that is not this node's
	// (another node's cgroups under /waggle).
	for _, r := range roots {
		err := unix.Rmdir(r)
		switch {
		case err == nil || errors.Is(err, unix.ENOENT):
		case errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EBUSY):
			fmt.Fprintf(d.cfg.Out, "  kept %s: it holds cgroups that are not this node's pods\n", r)
		default:
			d.check("cgroup "+r, err)
		}
	}
}

// removeCNI removes the bridge and the masquerade chain of the node's
// waggle CNI networks, and the cross-node routes and vxlan device.
func (d *downer) removeCNI(n *NodeFootprint) {
	nets := cniNetworks(n.CNIConfDir)
	for _, net := range nets {
		d.step("removing CNI network %s: bridge %s, nft chain masq-%s in table inet %s", net.name, net.bridge, net.name, wcni.MasqueradeTable)
		d.check("bridge "+net.bridge, teardown.RemoveLink(net.bridge))
		d.check("masquerade chain of "+net.name, wcni.RemoveMasquerade(net.name))
	}
	if len(nets) == 0 {
		d.step("no CNI configuration in %s: no bridge to remove", n.CNIConfDir)
	}
	d.step("removing the cross-node pod routes (protocol %d) and the vxlan device", routes.RouteProtocol)
	c, err := routes.New(routes.Config{NodeName: n.Name})
	if err == nil {
		err = c.Cleanup()
	}
	d.check("pod routes", err)
}

type cniNetwork struct{ name, bridge string }

// cniNetworks reads the waggle networks of the conflists in dir.
func cniNetworks(dir string) []cniNetwork {
	files, _ := filepath.Glob(filepath.Join(dir, "*.conflist"))
	var out []cniNetwork
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var l struct {
			Name    string `json:"name"`
			Plugins []struct {
				Type   string `json:"type"`
				Bridge string `json:"bridge"`
			} `json:"plugins"`
		}
		if json.Unmarshal(b, &l) != nil {
			continue
		}
		for _, p := range l.Plugins {
			if p.Type != wcni.PluginType {
				continue
			}
			br := p.Bridge
			if br == "" {
				br = wcni.DefaultBridge
			}
			out = append(out, cniNetwork{name: l.Name, bridge: br})
		}
	}
	return out
}

// removeProxyState removes what every proxy mode and NetworkPolicy
// enforcement programmed (as `waggle proxy --cleanup`): the pinned BPF
// links (detached from the cgroup and the devices) and maps, the iptables
// chains and IPVS services; then checks that no Waggle program is still
// attached to the cgroup the proxy used.
func (d *downer) removeProxyState(ctx context.Context, n *NodeFootprint) {
	d.step("removing the proxy's state: BPF links and pins under %s, iptables and IPVS rules", n.BPFPinDir)
	err := dataplane.Run(ctx, dataplane.Config{Cleanup: true, NodeName: n.Name, CgroupRoot: n.BPFCgroupRoot,
		BPFPinDir: n.BPFPinDir, Modes: modes.All(), Log: d.cfg.Log})
	d.check("proxy state", err)
	if exists(n.BPFPinDir) {
		ents, _ := os.ReadDir(n.BPFPinDir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		d.check("BPF pin dir "+n.BPFPinDir, fmt.Errorf("still holds %v", names))
	}
	cg, err := cgroupV2Dir(n.BPFCgroupRoot)
	if err != nil {
		d.check("BPF cgroup", err)
		return
	}
	d.step("checking that no Waggle BPF program is attached to cgroup %s", cg)
	left, err := WagglePrograms(cg)
	if err != nil {
		d.check("BPF programs on "+cg, err)
		return
	}
	for _, l := range left {
		d.check("BPF program on "+cg, errors.New(l))
	}
}

// cgroupAttachTypes are the cgroup hooks the proxy attaches to (the
// socket-level load balancer's sock_addr programs).
var cgroupAttachTypes = []ebpf.AttachType{
	ebpf.AttachCGroupInet4Bind, ebpf.AttachCGroupInet6Bind, ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect,
	ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg, ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCGroupUDP6Recvmsg,
	ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername,
}

// WagglePrograms lists the BPF programs named waggle_* attached to the
// cgroup v2 directory dir, directly or by a link (as `bpftool cgroup show
// dir` shows them), one line each.
func WagglePrograms(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	for _, at := range cgroupAttachTypes {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			if errors.Is(err, ebpf.ErrNotSupported) {
				return nil, err
			}
			continue // a hook this kernel does not have
		}
		for _, ap := range res.Programs {
			name := ""
			if p, err := ebpf.NewProgramFromID(ap.ID); err == nil {
				if info, err := p.Info(); err == nil {
					name = info.Name
				}
				p.Close()
			}
			if !strings.HasPrefix(name, "waggle") {
				continue
			}
			l := fmt.Sprintf("program %s (id %d) attached to %s as %s", name, ap.ID, dir, at)
			if id, ok := ap.LinkID(); ok {
				l += fmt.Sprintf(" by link %d", id)
			}
			out = append(out, l)
		}
	}
	return out, nil
}
