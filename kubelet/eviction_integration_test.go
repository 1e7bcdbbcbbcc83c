package kubelet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet"
	"github.com/waggle-io/waggle/kubelet/images"
	"github.com/waggle-io/waggle/kubelet/internal/ktest"
)

// nodeCondition returns the node's condition of type t.
func (n *node) nodeCondition(t v1.NodeConditionType) v1.NodeCondition {
	nd, err := n.client.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
	if err != nil {
		return v1.NodeCondition{}
	}
	for _, c := range nd.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return v1.NodeCondition{}
}

// events lists the Events about object name in namespace default with reason.
func (n *node) events(name, reason string) []v1.Event {
	list, err := n.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return nil
	}
	var out []v1.Event
	for _, e := range list.Items {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

func guaranteed(p *v1.Pod) {
	rl := v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("64Mi")}
	p.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: rl, Limits: rl}
}

// A real node under a memory.available threshold it cannot meet: the
// kubelet reports MemoryPressure as upstream, refuses a new BestEffort pod,
// and evicts the running BestEffort pod before the Guaranteed one.
func TestEvictionMemoryPressureRejectsAndEvictsBestEffort(t *testing.T) {
	// A static pod (critical, as upstream counts it): never evicted.
	manifests := t.TempDir()
	os.WriteFile(filepath.Join(manifests, "ev-static.yaml"), []byte(`apiVersion: v1
kind: Pod
metadata:
  name: ev-static
spec:
  containers:
  - name: echo
    image: waggle.local/waggle-echo:dev
    imagePullPolicy: Never
`), 0o644)
	n := newNode(t, func(c *kubelet.Config) {
		c.EvictionHard = map[string]string{"memory.available": "1Ki"}
		c.EvictionMonitoringInterval = 500 * time.Millisecond
		c.NodeStatusUpdateFrequency = time.Second
		c.PodManifestPath = manifests
	})
	static := "ev-static-" + n.name
	n.waitPod(static, "mirror running", 60*time.Second, runningReady)
	if c := n.nodeCondition(v1.NodeMemoryPressure); c.Status != v1.ConditionFalse || c.Reason != "KubeletHasSufficientMemory" || c.Message != "kubelet has sufficient memory available" {
		t.Fatalf("MemoryPressure without pressure = %+v", c)
	}
	n.create(echoPod(n, "ev-be", nil))
	n.create(echoPod(n, "ev-g", guaranteed))
	n.waitPod("ev-be", "running", 60*time.Second, runningReady)
	n.waitPod("ev-g", "running", 60*time.Second, runningReady)

	// Restart with a threshold no machine meets.
	n.stop()
	n.cfg.EvictionHard = map[string]string{"memory.available": "100Ti"}
	n.start()
	waitFor(t, 30*time.Second, "MemoryPressure True", func() (bool, string) {
		c := n.nodeCondition(v1.NodeMemoryPressure)
		return c.Status == v1.ConditionTrue, fmt.Sprintf("%+v", c)
	})
	if c := n.nodeCondition(v1.NodeMemoryPressure); c.Reason != "KubeletHasInsufficientMemory" || c.Message != "kubelet has insufficient memory available" {
		t.Errorf("MemoryPressure = %+v, want upstream's reason and message", c)
	}
	waitFor(t, 30*time.Second, "NodeHasInsufficientMemory event", func() (bool, string) {
		return len(n.events(n.name, "NodeHasInsufficientMemory")) > 0, ""
	})

	// The BestEffort pod goes first (usage over its zero request).
	be := n.waitPod("ev-be", "evicted", 60*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	g := n.get("ev-g")
	if g.Status.Phase != v1.PodRunning {
		t.Errorf("the Guaranteed pod was evicted before (or with) the BestEffort one: %s %s", g.Status.Phase, g.Status.Reason)
	}
	if be.Status.Reason != "Evicted" || !strings.HasPrefix(be.Status.Message, "The node was low on resource: memory. Threshold quantity: 100Ti, available: ") ||
		!strings.Contains(be.Status.Message, "Container echo was using ") || !strings.Contains(be.Status.Message, "request is 0, has larger consumption of memory.") {
		t.Errorf("evicted pod status: reason %q message %q", be.Status.Reason, be.Status.Message)
	}
	found := false
	for _, c := range be.Status.Conditions {
		if c.Type == v1.DisruptionTarget && c.Status == v1.ConditionTrue && c.Reason == v1.PodReasonTerminationByKubelet && c.Message == be.Status.Message {
			found = true
		}
	}
	if !found {
		t.Errorf("no DisruptionTarget condition: %+v", be.Status.Conditions)
	}
	for _, cs := range be.Status.ContainerStatuses {
		if cs.State.Terminated == nil {
			t.Errorf("container %s of the evicted pod not terminated: %+v", cs.Name, cs.State)
		}
	}
	waitFor(t, 30*time.Second, "Evicted event on the pod", func() (bool, string) {
		evs := n.events("ev-be", "Evicted")
		return len(evs) > 0 && evs[0].Type == v1.EventTypeWarning && evs[0].Message == be.Status.Message, fmt.Sprint(evs)
	})
	if len(n.events(n.name, "EvictionThresholdMet")) == 0 {
		t.Error("no EvictionThresholdMet event on the node")
	}

	// A new BestEffort pod is refused at admission.
	n.create(echoPod(n, "ev-new-be", nil))
	rej := n.waitPod("ev-new-be", "rejected", 30*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if rej.Status.Reason != "Evicted" || rej.Status.Message != "Pod was rejected: The node had condition: [MemoryPressure]. " {
		t.Errorf("rejected pod: reason %q message %q", rej.Status.Reason, rej.Status.Message)
	}
	if len(rej.Status.ContainerStatuses) > 0 && rej.Status.ContainerStatuses[0].State.Running != nil {
		t.Error("the rejected pod runs")
	}

	// Upstream's ranking goes on: the Guaranteed pod is next, and the
	// counter shows both.
	n.waitPod("ev-g", "evicted next", 60*time.Second, func(p *v1.Pod) bool { return p.Status.Reason == "Evicted" })
	// Every pass that ranks pods observes the stats' age; two passes evicted,
	// so a third one has ranked only the static pod.
	waitFor(t, 30*time.Second, "a pass after the last eviction", func() (bool, string) {
		_, metrics := n.httpGet("/metrics")
		var count int
		for _, l := range strings.Split(metrics, "\n") {
			fmt.Sscanf(l, `kubelet_eviction_stats_age_seconds_count{eviction_signal="memory.available"} %d`, &count)
		}
		return count >= 3, grepLines(metrics, "eviction_stats_age_seconds_count")
	})
	_, metrics := n.httpGet("/metrics")
	if !strings.Contains(metrics, `kubelet_evictions{eviction_signal="memory.available"} 2`) {
		t.Errorf("kubelet_evictions not 2 for memory.available:\n%s", grepLines(metrics, "kubelet_evictions"))
	}
	if p := n.get(static); !runningReady(p) || p.Status.Reason == "Evicted" {
		t.Errorf("the static pod was evicted: %s %s", p.Status.Phase, p.Status.Reason)
	}

	// Relaxed again: a restarted kubelet starts without pressure (upstream
	// keeps no state across restarts), and says so.
	before := len(n.events(n.name, "NodeHasSufficientMemory"))
	n.stop()
	n.cfg.EvictionHard = map[string]string{"memory.available": "1Ki"}
	n.start()
	waitFor(t, 30*time.Second, "MemoryPressure False", func() (bool, string) {
		c := n.nodeCondition(v1.NodeMemoryPressure)
		return c.Status == v1.ConditionFalse && c.Reason == "KubeletHasSufficientMemory", fmt.Sprintf("%+v", c)
	})
	waitFor(t, 30*time.Second, "a new NodeHasSufficientMemory event", func() (bool, string) {
		return len(n.events(n.name, "NodeHasSufficientMemory")) > before, ""
	})
	// The static pod goes with its file (the node's cleanup deletes only API
	// pods), once this kubelet has read the file.
	waitFor(t, 30*time.Second, "the static pod adopted", func() (bool, string) {
		_, body := n.httpGet("/pods")
		return strings.Contains(body, static), ""
	})
	os.Remove(filepath.Join(manifests, "ev-static.yaml"))
	n.waitGone(static, 60*time.Second)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The kubelet's root dir on a small tmpfs: filling it past
// nodefs.available<50% raises DiskPressure and refuses every pod; emptying
// it clears the condition only once the transition period has passed.
func TestEvictionDiskPressureHoldsForTransitionPeriod(t *testing.T) {
	testutil.RequiresRoot(t) // before the tmpfs mount
	root := filepath.Join(t.TempDir(), "kubelet")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	const period = 5 * time.Second
	n := newNode(t, func(c *kubelet.Config) {
		c.RootDir = root
		c.EvictionHard = map[string]string{"nodefs.available": "50%"}
		c.EvictionPressureTransitionPeriod = period
		c.EvictionMonitoringInterval = 200 * time.Millisecond
		c.NodeStatusUpdateFrequency = 200 * time.Millisecond
	})
	if c := n.nodeCondition(v1.NodeDiskPressure); c.Status != v1.ConditionFalse || c.Reason != "KubeletHasNoDiskPressure" {
		t.Fatalf("DiskPressure on an empty root dir: %+v", c)
	}
	filler := filepath.Join(root, "ev-filler")
	if err := os.WriteFile(filler, bytes.Repeat([]byte{1}, 40<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "DiskPressure True", func() (bool, string) {
		c := n.nodeCondition(v1.NodeDiskPressure)
		return c.Status == v1.ConditionTrue && c.Reason == "KubeletHasDiskPressure" && c.Message == "kubelet has disk pressure", fmt.Sprintf("%+v", c)
	})
	waitFor(t, 30*time.Second, "NodeHasDiskPressure event", func() (bool, string) {
		return len(n.events(n.name, "NodeHasDiskPressure")) > 0, ""
	})
	// Under disk pressure even a Guaranteed pod is refused.
	n.create(echoPod(n, "ev-disk-g", guaranteed))
	rej := n.waitPod("ev-disk-g", "rejected", 30*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if rej.Status.Reason != "Evicted" || rej.Status.Message != "Pod was rejected: The node had condition: [DiskPressure]. " {
		t.Errorf("rejected pod: reason %q message %q", rej.Status.Reason, rej.Status.Message)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	cleared := time.Now()
	// The kubelet sees the space back (its own summary) ...
	waitFor(t, 30*time.Second, "summary shows the root dir emptied", func() (bool, string) {
		_, body := n.httpGet("/stats/summary")
		var sum statsapi.Summary
		if err := json.Unmarshal([]byte(body), &sum); err != nil || sum.Node.Fs == nil || sum.Node.Fs.AvailableBytes == nil {
			return false, body
		}
		return *sum.Node.Fs.AvailableBytes > 40<<20, fmt.Sprint(*sum.Node.Fs.AvailableBytes)
	})
	// ... yet the condition holds until the period has passed.
	if time.Since(cleared) < period-time.Second {
		if c := n.nodeCondition(v1.NodeDiskPressure); c.Status != v1.ConditionTrue {
			t.Fatalf("DiskPressure cleared %s after the signal did, before the %s transition period", time.Since(cleared), period)
		}
	}
	waitFor(t, 30*time.Second, "DiskPressure False", func() (bool, string) {
		c := n.nodeCondition(v1.NodeDiskPressure)
		return c.Status == v1.ConditionFalse && c.Reason == "KubeletHasNoDiskPressure", fmt.Sprintf("%+v", c)
	})
	if took := time.Since(cleared); took < period {
		t.Errorf("DiskPressure went False %s after the signal cleared, within the %s transition period", took, period)
	}
	waitFor(t, 30*time.Second, "NodeHasNoDiskPressure event", func() (bool, string) {
		return len(n.events(n.name, "NodeHasNoDiskPressure")) > 0, ""
	})
}

// importImage imports an image built from spec into the node's namespace.
func (n *node) importImage(t *testing.T, spec images.Spec) {
	t.Helper()
	var buf bytes.Buffer
	if err := images.Build(&buf, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Import(namespacesCtx(n), n.ctrd.Client, &buf, ""); err != nil {
		t.Fatalf("import %s: %v", spec.Name, err)
	}
}

func (n *node) hasImage(name string) bool {
	_, err := n.ctrd.Client.GetImage(namespacesCtx(n), name)
	return err == nil
}

// Image GC with thresholds no disk meets: an unused imported image is
// removed, the image of a running pod and the node-local echo image (which
// the node could never pull again) are kept, and since that frees too
// little, FreeDiskSpaceFailed is reported on the node.
func TestImageGCRemovesUnusedImagesAndKeepsUsedOnes(t *testing.T) {
	n := newNode(t, nil)
	bin := ktest.EchoBinary(t)
	inUse := images.EchoSpec("docker.io/library/ev-inuse:1", bin)
	inUse.Files = append(inUse.Files, images.File{Path: "/ev-marker", Mode: 0o644, Data: []byte("in use")})
	unused := images.EchoSpec("docker.io/library/ev-unused:1", bin)
	unused.Files = append(unused.Files, images.File{Path: "/ev-marker", Mode: 0o644, Data: []byte("unused")})
	n.importImage(t, inUse)
	n.create(echoPod(n, "ev-img", func(p *v1.Pod) { p.Spec.Containers[0].Image = inUse.Name }))
	n.waitPod("ev-img", "running", 60*time.Second, runningReady)
	n.importImage(t, unused)

	n.stop()
	n.cfg.ImageGCHighThresholdPercent, n.cfg.ImageGCLowThresholdPercent = 2, 1
	n.cfg.ImageMinimumGCAge = time.Nanosecond
	n.cfg.ImageGCPeriod = 300 * time.Millisecond
	n.start()
	waitFor(t, 60*time.Second, "the unused image removed", func() (bool, string) { return !n.hasImage(unused.Name), "" })
	if !n.hasImage(inUse.Name) {
		t.Error("the image of a running pod was removed")
	}
	if !n.hasImage(images.EchoImage) {
		t.Error("the node-local echo image was removed")
	}
	waitFor(t, 30*time.Second, "FreeDiskSpaceFailed event", func() (bool, string) {
		evs := n.events(n.name, "FreeDiskSpaceFailed")
		return len(evs) > 0 && strings.HasPrefix(evs[0].Message, "Insufficient free disk space on the node's image filesystem ("), fmt.Sprint(evs)
	})
	if p := n.get("ev-img"); p.Status.Phase != v1.PodRunning {
		t.Errorf("the pod of the kept image: %s", p.Status.Phase)
	}
}
