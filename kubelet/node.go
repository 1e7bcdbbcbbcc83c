package kubelet

import (
	"context"
	"fmt"
	"net"
	"os"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/internal/version"
)

// ParseTaints parses "key=value:Effect" or "key:Effect" taints.
func ParseTaints(specs []string) ([]v1.Taint, error) {
	var out []v1.Taint
	for _, s := range specs {
		kv, effect, ok := strings.Cut(s, ":")
		if !ok {
			return nil, fmt.Errorf("taint %q: want key=value:Effect", s)
		}
		switch v1.TaintEffect(effect) {
		case v1.TaintEffectNoSchedule, v1.TaintEffectPreferNoSchedule, v1.TaintEffectNoExecute:
		default:
			return nil, fmt.Errorf("taint %q: effect %q is not NoSchedule, PreferNoSchedule or NoExecute", s, effect)
		}
		k, v, _ := strings.Cut(kv, "=")
		if k == "" {
			return nil, fmt.Errorf("taint %q: empty key", s)
		}
		out = append(out, v1.Taint{Key: k, Value: v, Effect: v1.TaintEffect(effect)})
	}
	return out, nil
}

// ParseLabels parses "k=v,k2=v2" into a map.
func ParseLabels(specs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, s := range specs {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("node label %q: want key=value", s)
		}
		out[k] = v
	}
	return out, nil
}

// machineCapacity reads CPU, memory and ephemeral storage of the machine.
func machineCapacity(rootDir string, maxPods int) v1.ResourceList {
	rl := v1.ResourceList{
		v1.ResourceCPU:  *resource.NewQuantity(int64(goruntime.NumCPU()), resource.DecimalSI),
		v1.ResourcePods: *resource.NewQuantity(int64(maxPods), resource.DecimalSI),
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			var kb int64
			if n, _ := fmt.Sscanf(line, "MemTotal: %d kB", &kb); n == 1 {
				rl[v1.ResourceMemory] = *resource.NewQuantity(kb*1024, resource.BinarySI)
			}
		}
	}
	dir := rootDir
	for dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = dirOf(dir)
	}
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) == nil {
		rl[v1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(st.Blocks)*int64(st.Bsize), resource.BinarySI)
	}
	return rl
}

func dirOf(p string) string {
	i := strings.LastIndex(strings.TrimSuffix(p, "/"), "/")
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

// DefaultNodeIP is the InternalIP a kubelet without --node-ip registers: the
// address of the interface of the default route, or the first non-loopback
// IPv4 address.
func DefaultNodeIP() string {
	if c, err := net.Dial("udp4", "192.0.2.1:9"); err == nil {
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).IP.String()
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return "127.0.0.1"
}

func osImage() string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return goruntime.GOOS
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return goruntime.GOOS
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

func kernelVersion() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// initialNode is the Node the kubelet registers.
func (k *Kubelet) initialNode() (*v1.Node, error) {
	taints, err := ParseTaints(k.cfg.RegisterWithTaints)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		v1.LabelHostname:   k.cfg.NodeName,
		v1.LabelOSStable:   goruntime.GOOS,
		v1.LabelArchStable: goruntime.GOARCH,
	}
	for key, v := range k.cfg.NodeLabels {
		labels[key] = v
	}
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName, Labels: labels},
		Spec:       v1.NodeSpec{Taints: taints, PodCIDR: k.cfg.PodCIDR},
	}
	if k.cfg.PodCIDR != "" {
		n.Spec.PodCIDRs = []string{k.cfg.PodCIDR}
	}
	k.fillStatus(n)
	return n, nil
}

// fillStatus sets capacity, addresses, conditions, node info and the
// daemon endpoint.
//
// Extended resources another writer put in the capacity (a device plugin's
// stand-in, `kubectl patch --subresource=status`) are kept and mirrored in
// allocatable, as upstream's kubelet does; the machine's own resources are
// the kubelet's.
func (k *Kubelet) fillStatus(n *v1.Node) {
	capacity := machineCapacity(k.cfg.RootDir, k.cfg.MaxPods)
	for name, q := range n.Status.Capacity {
		if v1helper.IsExtendedResourceName(name) {
			capacity[name] = q
		}
	}
	n.Status.Capacity = capacity
	n.Status.Allocatable = capacity.DeepCopy()
	n.Status.Addresses = nil
	for _, ip := range k.nodeIPs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
	}
	n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeHostName, Address: k.cfg.NodeName})
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(k.apiPort())
	rtName, rtVersion, _ := k.rt.Version(context.Background())
	n.Status.NodeInfo = v1.NodeSystemInfo{
		MachineID:               readTrim("/etc/machine-id"),
		BootID:                  readTrim("/proc/sys/kernel/random/boot_id"),
		KernelVersion:           kernelVersion(),
		OSImage:                 osImage(),
		ContainerRuntimeVersion: rtName + "://" + rtVersion,
		KubeletVersion:          version.KubeGitVersion,
		KubeProxyVersion:        version.KubeGitVersion,
		OperatingSystem:         goruntime.GOOS,
		Architecture:            goruntime.GOARCH,
	}
	now := metav1.Now()
	ready := v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"}
	if err := k.runtimeHealthy(); err != nil {
		ready.Status, ready.Reason, ready.Message = v1.ConditionFalse, "KubeletNotReady", err.Error()
	}
	old := map[v1.NodeConditionType]v1.NodeCondition{}
	for _, c := range n.Status.Conditions {
		old[c.Type] = c
	}
	// The pressure conditions from the eviction manager, each with upstream's
	// event when its status changes (or it is new).
	var conds []v1.NodeCondition
	if k.eviction != nil {
		for _, p := range k.pressureConditions() {
			var prev *v1.NodeCondition
			if o, ok := old[p.typ]; ok {
				prev = &o
			}
			c, event := p.condition(prev)
			if event != "" {
				k.nodeEvent(v1.EventTypeNormal, event, "Node %s status is now: %s", k.cfg.NodeName, event)
			}
			conds = append(conds, c)
		}
	}
	conds = append(conds, ready)
	if o, had := old[v1.NodeReady]; !had || o.Status != ready.Status {
		if ready.Status == v1.ConditionTrue {
			k.nodeEvent(v1.EventTypeNormal, EventNodeReady, "Node %s status is now: NodeReady", k.cfg.NodeName)
		} else {
			k.nodeEvent(v1.EventTypeNormal, EventNodeNotReady, "Node %s status is now: NodeNotReady", k.cfg.NodeName)
		}
	}
	for i := range conds {
		conds[i].LastHeartbeatTime = now
		conds[i].LastTransitionTime = now
		if o, ok := old[conds[i].Type]; ok && o.Status == conds[i].Status {
			conds[i].LastTransitionTime = o.LastTransitionTime
		}
	}
	// Keep conditions other writers own (e.g. NetworkUnavailable).
	for _, c := range n.Status.Conditions {
		switch c.Type {
		case v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure, v1.NodeReady:
		default:
			conds = append(conds, c)
		}
	}
	n.Status.Conditions = conds
}

// registerNode creates the Node, or reconciles labels of an existing one.
func (k *Kubelet) registerNode(ctx context.Context) (*v1.Node, error) {
	n, err := k.initialNode()
	if err != nil {
		return nil, err
	}
	for {
		created, err := k.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err == nil {
			k.log.Info("registered node", "node", k.cfg.NodeName)
			return created, nil
		}
		if apierrors.IsAlreadyExists(err) {
			var out *v1.Node
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, err := k.client.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
				if err != nil {
					return err
				}
				changed := false
				if cur.Labels == nil {
					cur.Labels = map[string]string{}
				}
				for key, v := range n.Labels {
					if cur.Labels[key] != v {
						cur.Labels[key] = v
						changed = true
					}
				}
				if cur.Spec.PodCIDR == "" && n.Spec.PodCIDR != "" {
					cur.Spec.PodCIDR, cur.Spec.PodCIDRs = n.Spec.PodCIDR, n.Spec.PodCIDRs
					changed = true
				}
				out = cur
				if !changed {
					return nil
				}
				out, err = k.client.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{})
				return err
			})
			if err == nil {
				k.log.Info("node already registered", "node", k.cfg.NodeName)
				return out, nil
			}
		}
		k.log.Warn("register node", "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// updateNodeStatus writes the node's status (retrying on conflict).
func (k *Kubelet) updateNodeStatus(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.client.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = k.registerNode(ctx)
			return err
		}
		if err != nil {
			return err
		}
		k.setNode(n)
		k.fillStatus(n)
		_, err = k.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// renewLease creates or renews the node's Lease in kube-node-lease.
func (k *Kubelet) renewLease(ctx context.Context) error {
	leases := k.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName, Namespace: v1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(k.cfg.NodeName),
				LeaseDurationSeconds: ptr.To(int32(k.cfg.LeaseDuration / time.Second)),
				RenewTime:            &now,
			},
		}
		if n := k.node(); n != nil {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.HolderIdentity = ptr.To(k.cfg.NodeName)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(k.cfg.LeaseDuration / time.Second))
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// heartbeat renews the lease every LeaseDuration/4 and the status every
// NodeStatusUpdateFrequency until ctx ends.
func (k *Kubelet) heartbeat(ctx context.Context) {
	leaseEvery := k.cfg.LeaseDuration / 4
	if err := k.renewLease(ctx); err != nil {
		k.log.Warn("renew lease", "err", err)
	}
	leaseT := time.NewTicker(leaseEvery)
	statusT := time.NewTicker(k.cfg.NodeStatusUpdateFrequency)
	defer leaseT.Stop()
	defer statusT.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-leaseT.C:
			if err := k.renewLease(ctx); err != nil && ctx.Err() == nil {
				k.log.Warn("renew lease", "err", err)
			}
		case <-statusT.C:
			if err := k.updateNodeStatus(ctx); err != nil && ctx.Err() == nil {
				k.log.Warn("update node status", "err", err)
			}
		}
	}
}

// hostNetNS is the network namespace hostNetwork pods join: "" (the
// runtime's own, the host's) when the kubelet runs in the init network
// namespace, as on a real node; else the kubelet's, the node's network as
// the kubelet sees it (a `waggle lab` node is a network namespace while
// containerd runs outside it, so "the host's" would be the wrong machine).
//
// The kubelet's namespace is named by an open descriptor,
// /proc/<pid>/fd/<n>, not by /proc/<pid>/ns/net: that is the main
// thread's namespace at the moment runc reads it, and the main thread is
// one the kubelet's in-process network code (CNI, probes) may have
// switched into a pod's namespace for a moment. The descriptor is opened
// on a locked thread, which no other goroutine can have switched; the
// caller keeps the file open for the kubelet's life.
//
// From another network namespace, /proc/1/ns/net cannot even be stat'ed
// (EACCES): that, too, means the kubelet's own.
func hostNetNS() (string, *os.File) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return "", nil
	}
	self, err := f.Stat()
	if err != nil {
		f.Close()
		return "", nil
	}
	if root, err := os.Stat("/proc/1/ns/net"); err == nil && os.SameFile(self, root) {
		f.Close()
		return "", nil
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd()), f
}
