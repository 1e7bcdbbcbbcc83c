package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/waggle-io/waggle/internal/testutil"
)

// upNode is one `waggle up` confined for a test: its own network
// namespace (API server on 17443, scheduler 17259, controller-manager
// 17257, the kubelet's and proxy's ports inside it), its own cgroup
// subtree (the proxy's eBPF programs attach there, the pods' cgroups are
// made below it), BPF pin dir, containerd namespace and data dir.
type upNode struct {
	bin, images string
	name        string // dn-<unique>: netns, node, containerd namespace
	netns       string // /run/netns/<name>
	cgroup      string // cgroup v2 dir of the node
	dataDir     string
	pinDir      string
	cmd         *exec.Cmd
	done        chan error
	log         string
}

func newUpNode(t *testing.T) *upNode {
	t.Helper()
	bin, images := buildBinaries(t)
	name := "dn-" + testutil.UniqueName("")
	n := &upNode{bin: bin, images: images, name: name, netns: filepath.Join("/run/netns", name),
		cgroup: filepath.Join(cgroup2(), name), dataDir: filepath.Join("/var/lib", "waggle-"+name),
		pinDir: filepath.Join("/sys/fs/bpf", "waggle-"+name), log: filepath.Join(t.TempDir(), "up.log")}
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	// Safety net, last: whatever the test's own checks found, nothing of
	// it stays on the machine.
	t.Cleanup(func() {
		if t.Failed() {
			if out, err := n.kubectl("describe", "pods", "-A"); err == nil {
				t.Logf("pods:\n%s", out)
			}
			t.Logf("waggle up's log (tail):\n%s", n.logTail())
		}
		n.stop()
		if _, err := os.Stat(n.dataDir); err == nil {
			out, err := exec.Command("nsenter", "--net="+n.netns, "--", n.bin, "down", "--purge", "--data-dir", n.dataDir).CombinedOutput()
			if err != nil {
				t.Errorf("cleanup: waggle down --purge: %v\n%s", err, out)
			}
		}
		os.RemoveAll(n.dataDir)
		exec.Command("ip", "netns", "del", name).Run()
		for _, m := range []string{"*", "*/*"} {
			dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", m, name))
			for _, d := range dirs {
				// Bottom-up: cgroup directories go with rmdir.
				exec.Command("find", d, "-depth", "-type", "d", "-exec", "rmdir", "{}", ";").Run()
			}
		}
	})
	// The node's address and default route, on a veth pair inside the
	// namespace: nothing of the host's network is touched.
	n.in(t, "sh", "-c", "ip link set lo up && ip link add dn0 type veth peer name dn1 && ip link set dn1 up && "+
		"ip addr add 10.252.0.2/24 dev dn0 && ip link set dn0 up && ip route add default via 10.252.0.1")
	if err := os.MkdirAll(filepath.Join(n.cgroup, "up"), 0o755); err != nil {
		t.Fatal(err)
	}
	return n
}

// in runs a command in the node's network namespace (nsenter: /sys, with
// the cgroup and BPF file systems, stays as it is).
func (n *upNode) in(t *testing.T, args ...string) string {
	t.Helper()
	out, err := n.inErr(args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (n *upNode) inErr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.netns, "--"}, args...)...).CombinedOutput()
	return string(out), err
}

func (n *upNode) kubectl(args ...string) (string, error) {
	return n.inErr(append([]string{"kubectl", "--kubeconfig", filepath.Join(n.dataDir, "admin.kubeconfig")}, args...)...)
}

// start runs `waggle up` in the node's namespace and cgroup.
func (n *upNode) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	script := fmt.Sprintf("echo $$ > %s/cgroup.procs && exec nsenter --net=%s -- \"$@\"", filepath.Join(n.cgroup, "up"), n.netns)
	n.cmd = exec.Command("sh", "-c", script, "sh", n.bin, "up", "--data-dir", n.dataDir,
		"--node-name", n.name, "--node-ip", "10.252.0.2",
		"--secure-port", "17443", "--scheduler-port", "17259", "--controller-manager-port", "17257",
		"--cgroup-root", filepath.Join(n.cgroup, "pods"), "--bpf-cgroup-root", n.cgroup, "--bpf-pin-dir", n.pinDir,
		"--containerd-namespace", n.name, "--cni-bin-dir", filepath.Join(filepath.Dir(n.bin), "cni"),
		"--image-dir", n.images, "--node-monitor-grace-period", "10s", "--log-level", "warn",
		// The machine's own disk may be past the kubelet's default disk
		// thresholds (a shared CI host): no disk-pressure taint for the pod.
		"--eviction-hard", "memory.available<1Mi")
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	cmd := n.cmd
	go func() { done <- cmd.Wait() }()
	n.done = done
	took := eventually(t, 90*time.Second, "the node Ready", func() error {
		select {
		case err := <-n.done:
			n.done = nil
			t.Fatalf("waggle up exited: %v\n%s", err, n.logTail())
		default:
		}
		out, err := n.kubectl("get", "node", n.name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil || out != "True" {
			return fmt.Errorf("node Ready=%q: %v", out, err)
		}
		return nil
	})
	t.Logf("waggle up: node Ready after %.1fs", took.Seconds())
}

// stop kills `waggle up` if it still runs (the test's own cleanup).
func (n *upNode) stop() {
	if n.done == nil {
		return
	}
	select {
	case <-n.done:
	default:
		n.cmd.Process.Kill()
		<-n.done
	}
	n.done = nil
}

// exited waits for `waggle up` to have exited (waggle down stopped it).
func (n *upNode) exited(t *testing.T) {
	t.Helper()
	select {
	case <-n.done:
		n.done = nil
	case <-time.After(5 * time.Second):
		t.Fatalf("waggle up (pid %d) still runs after waggle down", n.cmd.Process.Pid)
	}
}

func (n *upNode) logTail() string {
	b, _ := os.ReadFile(n.log)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

func (n *upNode) down(t *testing.T, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := n.inErr(append([]string{n.bin, "down", "--data-dir", n.dataDir}, args...)...)
	if err != nil {
		t.Fatalf("waggle down %s: %v\n%s\nwaggle up's log:\n%s", strings.Join(args, " "), err, out, n.logTail())
	}
	t.Logf("waggle down %s (%.1fs):\n%s", strings.Join(args, " "), time.Since(start).Seconds(), out)
	return out
}

// runPod runs one echo pod and waits for it to run; it returns its UID
// and its container's ID.
func (n *upNode) runPod(t *testing.T) (uid, container string) {
	t.Helper()
	if out, err := n.kubectl("run", "echo", "--image=waggle.local/waggle-echo:dev", "--image-pull-policy=Never"); err != nil {
		t.Fatalf("kubectl run: %v\n%s", err, out)
	}
	container = n.podRunning(t, "")
	uid, err := n.kubectl("get", "pod", "echo", "-o", "jsonpath={.metadata.uid}")
	if err != nil {
		t.Fatal(err, uid)
	}
	return uid, container
}

// podRunning waits for pod echo to run and be ready in a container other
// than old, and returns that container's ID.
func (n *upNode) podRunning(t *testing.T, old string) string {
	t.Helper()
	var id string
	took := eventually(t, 90*time.Second, "pod echo Running", func() error {
		out, err := n.kubectl("get", "pod", "echo", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].ready} {.status.containerStatuses[0].containerID}")
		f := strings.Fields(out)
		if err != nil || len(f) != 3 || f[0] != "Running" || f[1] != "true" || f[2] == old {
			return fmt.Errorf("pod: %q: %v", out, err)
		}
		id = f[2]
		return nil
	})
	t.Logf("pod echo running in %s after %.1fs", id, took.Seconds())
	return id
}

// bpfOnCgroup lists the programs attached to the node's cgroup, as
// bpftool sees them.
func (n *upNode) bpfOnCgroup(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("bpftool", "-j", "cgroup", "show", n.cgroup).Output()
	if err != nil {
		t.Fatalf("bpftool cgroup show %s: %v", n.cgroup, err)
	}
	var progs []struct {
		Name       string `json:"name"`
		AttachType string `json:"attach_type"`
	}
	if len(bytes.TrimSpace(out)) > 0 {
		if err := json.Unmarshal(out, &progs); err != nil {
			t.Fatalf("bpftool output %q: %v", out, err)
		}
	}
	var names []string
	for _, p := range progs {
		names = append(names, p.Name+" ("+p.AttachType+")")
	}
	return names
}

// containers lists the containers of the node's containerd namespace
// (nil when its containerd is gone, with its socket).
func (n *upNode) containers(t *testing.T) []string {
	t.Helper()
	sock := filepath.Join(n.dataDir, "containerd", "containerd.sock")
	if _, err := os.Stat(sock); err != nil {
		return nil
	}
	c, err := containerd.New(sock, containerd.WithTimeout(2*time.Second))
	if err != nil {
		return nil // not serving: no containers run through it
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), n.name), 5*time.Second)
	defer cancel()
	if ok, err := c.IsServing(ctx); !ok || err != nil {
		return nil
	}
	ctrs, err := c.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ctr := range ctrs {
		ids = append(ids, ctr.ID())
	}
	return ids
}

// processesOf lists the live processes whose command line names the data
// dir (waggle up, its containerd, the shims).
func (n *upNode) processesOf() []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(n.dataDir)) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && bytes.Contains(st, []byte(") Z ")) {
			continue // a zombie has exited
		}
		out = append(out, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
	}
	return out
}

// footprint is what a running node has made, for the checks: each must be
// there while it runs (so that "gone" afterwards means something).
type footprint struct {
	podNetNS    string
	podCgroups  []string
	bpf         []string
	pins        bool
	containers  []string
	bridge, nft bool
	dataDir     bool
	processes   []string
}

func (n *upNode) footprint(t *testing.T, podUID string) footprint {
	t.Helper()
	var f footprint
	if _, err := os.Stat(filepath.Join("/run/netns", "waggle-"+podUID)); err == nil {
		f.podNetNS = "waggle-" + podUID
	}
	podCg := "pod" + strings.ReplaceAll(podUID, "-", "_")
	f.podCgroups, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", n.name, "pods", podCg))
	f.bpf = n.bpfOnCgroup(t)
	_, err := os.Stat(n.pinDir)
	f.pins = err == nil
	f.containers = n.containers(t)
	_, err = n.inErr("ip", "link", "show", "waggle0")
	f.bridge = err == nil
	out, _ := n.inErr("nft", "list", "tables")
	f.nft = strings.Contains(out, "waggle-cni")
	_, err = os.Stat(n.dataDir)
	f.dataDir = err == nil
	f.processes = n.processesOf()
	return f
}

// `waggle up` on a confined machine with a pod running: `waggle down`
// stops it and the pod's containers and keeps the state, so up resumes
// the pod; `waggle down --purge` then leaves nothing — no process, no
// container in its namespace, no pod netns or cgroup, no bridge or nft
// table, no BPF program on its cgroup and no pins, no data dir — and says
// so again when run twice; and `waggle up` starts clean after it, and
// killed, is purged with the containerd it left.
func TestDownPurgeLeavesNothing(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresKernelFeature(t, testutil.CgroupSockAddr)
	for _, b := range []string{"containerd", "runc", "kubectl", "nsenter", "bpftool", "nft"} {
		testutil.RequiresBinary(t, b)
	}
	n := newUpNode(t)
	n.start(t)
	uid, ctr := n.runPod(t)

	running := n.footprint(t, uid)
	if running.podNetNS == "" || len(running.podCgroups) == 0 || len(running.bpf) == 0 || !running.pins ||
		len(running.containers) == 0 || !running.bridge || !running.nft || len(running.processes) == 0 {
		t.Fatalf("while up runs, expected a pod netns, pod cgroups, BPF programs on %s, pins, containers, bridge, nft table and processes; got %+v",
			n.cgroup, running)
	}

	// Stop only: the state stays and up resumes the pod.
	n.down(t)
	n.exited(t)
	if ps := n.processesOf(); len(ps) > 0 {
		t.Errorf("processes left after waggle down:\n%s", strings.Join(ps, "\n"))
	}
	if _, err := os.Stat(filepath.Join(n.dataDir, "admin.kubeconfig")); err != nil {
		t.Fatalf("waggle down without --purge removed the state: %v", err)
	}
	n.start(t)
	n.podRunning(t, ctr)
	if ctrs := n.containers(t); len(ctrs) == 0 {
		t.Fatalf("the resumed pod has no container in namespace %s", n.name)
	}

	out := n.down(t, "--purge")
	n.exited(t)
	if !strings.Contains(out, "nothing Waggle made") {
		t.Errorf("waggle down --purge did not say it purged:\n%s", out)
	}
	n.checkNothingLeft(t, uid)

	// Idempotent: a second purge has nothing to do and says so.
	if out := n.down(t, "--purge"); !strings.Contains(out, "nothing to stop or remove") {
		t.Errorf("second waggle down --purge:\n%s", out)
	}

	// The machine can be reused: up starts a fresh cluster.
	n.start(t)
	if out, err := n.kubectl("get", "pods", "-A", "-o", "name"); err != nil || strings.Contains(out, "pod/echo") {
		t.Errorf("a fresh waggle up lists %q (%v): the purged cluster came back", out, err)
	}
	// Killed, up leaves its supervised containerd running (its own process
	// group): the purge stops that too.
	n.cmd.Process.Kill()
	<-n.done
	n.done = nil
	if out := n.down(t, "--purge"); !strings.Contains(out, "left by its supervisor") {
		t.Errorf("waggle down --purge after up was killed did not stop its containerd:\n%s", out)
	}
	n.checkNothingLeft(t, uid)
}

func (n *upNode) checkNothingLeft(t *testing.T, uid string) {
	t.Helper()
	f := n.footprint(t, uid)
	if f.podNetNS != "" {
		t.Errorf("pod network namespace %s left", f.podNetNS)
	}
	if len(f.podCgroups) > 0 {
		t.Errorf("pod cgroups left: %v", f.podCgroups)
	}
	if pods, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", n.name, "pods")); len(pods) > 0 {
		t.Errorf("the kubelet's cgroup root left: %v", pods)
	}
	if len(f.bpf) > 0 {
		t.Errorf("BPF programs still attached to %s: %v", n.cgroup, f.bpf)
	}
	if f.pins {
		t.Errorf("BPF pin dir %s left", n.pinDir)
	}
	if len(f.containers) > 0 {
		t.Errorf("containers left in namespace %s: %v", n.name, f.containers)
	}
	if f.bridge || f.nft {
		t.Errorf("CNI left: bridge waggle0 %v, nft table inet waggle-cni %v", f.bridge, f.nft)
	}
	if f.dataDir {
		t.Errorf("data dir %s left", n.dataDir)
	}
	if len(f.processes) > 0 {
		t.Errorf("processes left:\n%s", strings.Join(f.processes, "\n"))
	}
}
