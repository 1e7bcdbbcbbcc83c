package kubelet_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/waggle-io/waggle/internal/testutil"
)

func TestEchoPodRunsAnswersAndServesLogsExecStats(t *testing.T) {
	n := newNode(t, nil)
	n.create(echoPod(n, "echo", func(p *v1.Pod) {
		p.Spec.Containers[0].ReadinessProbe = &v1.Probe{PeriodSeconds: 1,
			ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}}
	}))
	p := n.waitPod("echo", "Running and Ready", 60*time.Second, runningReady)
	if !n.podCIDR.Contains(mustAddr(t, p.Status.PodIP)) {
		t.Errorf("pod IP %s not in the node's pod CIDR %s", p.Status.PodIP, n.podCIDR)
	}
	body := dialEcho(t, p.Status.PodIP+":8080")
	if !strings.HasPrefix(body, "pod=echo client=") {
		t.Errorf("echo answered %q", body)
	}
	cs := p.Status.ContainerStatuses[0]
	if cs.RestartCount != 0 || cs.State.Running == nil || !cs.Ready || cs.ImageID == "" {
		t.Errorf("container status = %+v", cs)
	}

	// The container lives in the pod's cgroup under the node's cgroup root,
	// in the cgroup v2 hierarchy where the eBPF proxy attaches.
	root, _ := testutil.Cgroup2Root()
	matches, _ := filepath.Glob(filepath.Join(root, n.cfg.CgroupRoot, "pod*", "*", "cgroup.procs"))
	procs := 0
	for _, m := range matches {
		b, _ := os.ReadFile(m)
		procs += len(strings.Fields(string(b)))
	}
	if procs == 0 {
		t.Errorf("no process under %s (found %v)", filepath.Join(root, n.cfg.CgroupRoot), matches)
	}

	// Logs.
	code, logs := n.httpGet("/containerLogs/default/echo/echo")
	if code != 200 || !strings.Contains(logs, "serving http") {
		t.Errorf("logs: %d %q", code, logs)
	}
	code, tail := n.httpGet("/containerLogs/default/echo/echo?tailLines=1")
	if code != 200 || strings.Count(strings.TrimSpace(tail), "\n") != 0 {
		t.Errorf("tailLines=1: %d %q", code, tail)
	}
	if code, _ := n.httpGet("/containerLogs/default/echo/echo?tailLines=-3"); code != 400 {
		t.Errorf("bad tailLines answered %d", code)
	}
	if code, _ := n.httpGet("/containerLogs/default/nope/echo"); code != 404 {
		t.Errorf("unknown pod answered %d", code)
	}

	// Exec in both stream protocols, with stdin and an exit code.
	for _, ws := range []bool{false, true} {
		t.Run(fmt.Sprintf("exec websocket=%v", ws), func(t *testing.T) {
			out, _, err := n.exec("echo", "echo", ws, "", "/waggle-echo", "env")
			if err != nil || !strings.Contains(out, "POD_NAME=echo") {
				t.Errorf("exec env: %v %q", err, out)
			}
			out, _, err = n.exec("echo", "echo", ws, "hello stdin\n", "/waggle-echo", "stdin-echo")
			if err != nil || out != "hello stdin\n" {
				t.Errorf("exec stdin-echo: %v %q", err, out)
			}
			_, _, err = n.exec("echo", "echo", ws, "", "/waggle-echo", "exit", "3")
			if err == nil || !strings.Contains(err.Error(), "3") {
				t.Errorf("exec exit 3: err = %v", err)
			}
		})
	}

	// Port forwarding (SPDY, as kubectl port-forward).
	t.Run("port-forward", func(t *testing.T) {
		rt, upgrader, err := spdy.RoundTripperFor(n.restConfigForKubelet())
		if err != nil {
			t.Fatal(err)
		}
		dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, "POST", mustURL(n.kubeletURL()+"/portForward/default/echo"))
		stop, ready := make(chan struct{}), make(chan struct{})
		fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:8080"}, stop, ready, io.Discard, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- fw.ForwardPorts() }()
		defer func() { close(stop); <-errc }()
		select {
		case <-ready:
		case err := <-errc:
			t.Fatalf("port-forward: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("port-forward not ready")
		}
		ports, _ := fw.GetPorts()
		body := dialEcho(t, fmt.Sprintf("127.0.0.1:%d", ports[0].Local))
		// Dialled inside the pod, on its loopback, as Kubernetes does.
		if !strings.HasPrefix(body, "pod=echo client=127.0.0.1:") {
			t.Errorf("through port-forward: %q", body)
		}
	})

	// Stats.
	code, sum := n.httpGet("/stats/summary")
	var s statsapi.Summary
	if code != 200 || json.Unmarshal([]byte(sum), &s) != nil {
		t.Fatalf("stats/summary: %d %s", code, sum)
	}
	found := false
	for _, ps := range s.Pods {
		if ps.PodRef.Name == "echo" && len(ps.Containers) == 1 && ps.Memory != nil && *ps.Memory.WorkingSetBytes > 0 && ps.CPU != nil {
			found = true
		}
	}
	if !found {
		t.Errorf("stats/summary has no usage for pod echo: %s", sum)
	}
	// The node's own figures are the machine's, not the sum of its pods,
	// and its start time is the node's, not the request's.
	var podsWS uint64
	for _, ps := range s.Pods {
		if ps.Memory != nil && ps.Memory.WorkingSetBytes != nil {
			podsWS += *ps.Memory.WorkingSetBytes
		}
	}
	if m := s.Node.Memory; m == nil || m.WorkingSetBytes == nil || *m.WorkingSetBytes < 64<<20 || *m.WorkingSetBytes <= podsWS || m.AvailableBytes == nil {
		t.Errorf("node memory %+v: want the machine's working set (pods use %d)", m, podsWS)
	}
	if c := s.Node.CPU; c == nil || c.UsageCoreNanoSeconds == nil || *c.UsageCoreNanoSeconds < uint64(time.Second) {
		t.Errorf("node CPU %+v: want the machine's cumulative usage", c)
	}
	if f := s.Node.Fs; f == nil || f.CapacityBytes == nil || *f.CapacityBytes == 0 {
		t.Errorf("node fs %+v", f)
	}
	_, sum2 := n.httpGet("/stats/summary")
	var s2 statsapi.Summary
	json.Unmarshal([]byte(sum2), &s2)
	if !s2.Node.StartTime.Equal(&s.Node.StartTime) || !s.Node.StartTime.Time.Before(s.Node.CPU.Time.Time) {
		t.Errorf("node startTime %v then %v (read at %v): want the node's start", s.Node.StartTime, s2.Node.StartTime, s.Node.CPU.Time)
	}
	if code, body := n.httpGet("/metrics/resource"); code != 200 || !strings.Contains(body, `container_cpu_usage_seconds_total{container="echo",namespace="default",pod="echo"}`) ||
		!strings.Contains(body, "node_memory_working_set_bytes ") {
		t.Errorf("/metrics/resource: %d\n%s", code, body)
	}
	if code, body := n.httpGet("/metrics"); code != 200 || !strings.Contains(body, "waggle_kubelet_container_starts_total") {
		t.Errorf("metrics: %d", code)
	}

	// Deletion frees the address and the netns.
	n.delete("echo")
	n.waitGone("echo", 30*time.Second)
	waitFor(t, 10*time.Second, "no leaks", func() (bool, string) {
		return n.ipsAllocated() == 0 && len(n.netnsLeft()) == 0, fmt.Sprintf("ips=%d netns=%v", n.ipsAllocated(), n.netnsLeft())
	})
}

func TestKubeletAPIRequiresClientCert(t *testing.T) {
	n := newNode(t, nil)
	saved := n.clientTLS
	n.clientTLS = &tlsConfigNoCert
	defer func() { n.clientTLS = saved }()
	if code, _ := n.httpGet("/pods"); code != 401 {
		t.Errorf("/pods without a client cert answered %d, want 401", code)
	}
	// As upstream, the secure port's /healthz needs a credential too (the
	// unauthenticated one is the health address, 127.0.0.1:10248).
	if code, _ := n.httpGet("/healthz"); code != 401 {
		t.Errorf("/healthz without a client cert answered %d, want 401", code)
	}
}
