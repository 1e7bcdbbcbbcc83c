package kubelet_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/waggle-io/waggle/internal/cgroupfs"
)

// TestInPlaceResizeChangesTheCgroups: a resize through the API's
// pods/resize subresource reaches the running container's cgroups (CFS
// quota, shares, memory limit) without a restart, and the pod's status
// says so.
func TestInPlaceResizeChangesTheCgroups(t *testing.T) {
	n := newNode(t, nil)
	res := func(cpuReq, cpuLim, memLim string) v1.ResourceRequirements {
		return v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpuReq), v1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpuLim), v1.ResourceMemory: resource.MustParse(memLim)},
		}
	}
	n.create(echoPod(n, "resize", func(p *v1.Pod) { p.Spec.Containers[0].Resources = res("100m", "200m", "64Mi") }))
	p := n.waitPod("resize", "Running and Ready", 60*time.Second, runningReady)
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	podDir := filepath.Join(n.cfg.CgroupRoot, "pod"+strings.ReplaceAll(string(p.UID), "-", "_"))
	read, readPod := cgroupReader(t, filepath.Join(podDir, id)), cgroupReader(t, podDir)
	if q, s, m := read(); q != "20000" || s != "102" || m != "67108864" {
		t.Fatalf("before the resize: quota %s shares %s memory %s", q, s, m)
	}
	// The pod's cgroup carries the pod's sums (one container: the same).
	if q, s, m := readPod(); q != "20000" || s != "102" || m != "67108864" {
		t.Fatalf("pod cgroup before the resize: quota %s shares %s memory %s", q, s, m)
	}

	// The kubelet may still be writing the status (startedAt follows the
	// relist after Running and Ready): resize the newest version.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := n.client.CoreV1().Pods("default").Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.Containers[0].Resources = res("300m", "500m", "128Mi")
		_, err = n.client.CoreV1().Pods("default").UpdateResize(context.Background(), p.Name, cur, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	p = n.waitPod("resize", "resized", 60*time.Second, func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return p.Status.ObservedGeneration == p.Generation && len(cs) == 1 && cs[0].Resources != nil &&
			cs[0].Resources.Limits.Cpu().String() == "500m" && cs[0].AllocatedResources.Cpu().String() == "300m"
	})
	if cs := p.Status.ContainerStatuses[0]; cs.RestartCount != 0 || cs.ContainerID != "containerd://"+id {
		t.Errorf("the resize restarted the container: %+v", cs)
	}
	if q, s, m := read(); q != "50000" || s != "307" || m != "134217728" {
		t.Errorf("after the resize: quota %s shares %s memory %s, want 50000 307 134217728", q, s, m)
	}
	if q, s, m := readPod(); q != "50000" || s != "307" || m != "134217728" {
		t.Errorf("pod cgroup after the resize: quota %s shares %s memory %s, want 50000 307 134217728", q, s, m)
	}

	// The container sees its own cgroups at /sys/fs/cgroup, read-only, as
	// under a CRI runtime (upstream's resize tests read them from inside).
	file := "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
	if _, v1 := cgroupfs.V1Controller("cpu"); !v1 {
		file = "/sys/fs/cgroup/cpu.max"
	}
	out, _, err := n.exec("resize", "echo", false, "", "/waggle-echo", "cat", file)
	if err != nil || !strings.HasPrefix(out, "50000") {
		t.Errorf("%s inside the container: %q %v", file, out, err)
	}
	if _, _, err := n.exec("resize", "echo", false, "", "/waggle-echo", "write", file, "1"); err == nil {
		t.Errorf("a container could write its own %s", file)
	}
}

// cgroupReader reads a cgroup's (rel, a cgroup path) CFS quota, CPU
// shares and memory limit from the host's cgroup filesystems: the v1 controllers' files, or
// on a pure v2 host cpu.max, cpu.weight (as the shares it stands for) and
// memory.max.
func cgroupReader(t *testing.T, rel string) func() (quota, shares, mem string) {
	read := func(root, name string) string {
		b, err := os.ReadFile(filepath.Join(root, rel, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	return func() (string, string, string) {
		cpu, v1cpu := cgroupfs.V1Controller("cpu")
		memory, v1mem := cgroupfs.V1Controller("memory")
		if v1cpu && v1mem {
			return read(cpu, "cpu.cfs_quota_us"), read(cpu, "cpu.shares"), read(memory, "memory.limit_in_bytes")
		}
		root, err := cgroupfs.V2Root()
		if err != nil {
			t.Fatal(err)
		}
		quota, _, _ := strings.Cut(read(root, "cpu.max"), " ")
		// runc's shares-to-weight conversion, inverted (rounding down).
		w, _ := strconv.ParseUint(read(root, "cpu.weight"), 10, 64)
		shares := 2 + ((w-1)*262142+9998)/9999
		return quota, strconv.FormatUint(shares, 10), read(root, "memory.max")
	}
}
