package kubelet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRestartsRestartNoContainer restarts the kubelet five times and
// containerd once under 20 running pods: no container restarts, every pod
// keeps its address and answers, and deleting the pods leaks no address
// and no network namespace.
func TestRestartsRestartNoContainer(t *testing.T) {
	const pods = 20
	n := newNode(t, nil)
	for i := 0; i < pods; i++ {
		n.create(echoPod(n, fmt.Sprintf("r%02d", i), nil))
	}
	type seen struct{ id, ip string }
	before := map[string]seen{}
	for i := 0; i < pods; i++ {
		name := fmt.Sprintf("r%02d", i)
		p := n.waitPod(name, "running", 120*time.Second, runningReady)
		before[name] = seen{p.Status.ContainerStatuses[0].ContainerID, p.Status.PodIP}
	}
	for round := 0; round < 5; round++ {
		n.stop()
		n.start()
		if round == 2 {
			// containerd restarts under a running kubelet: the kubelet
			// waits (no relist, no action) and carries on.
			n.ctrd.Restart(t)
		}
		time.Sleep(time.Second) // the restarted kubelet runs a while before the next restart: the test is restarts under a live kubelet, the final check waits for each pod
	}
	for name, b := range before {
		p := n.waitPod(name, "running after restarts", 60*time.Second, runningReady)
		cs := p.Status.ContainerStatuses[0]
		if cs.RestartCount != 0 || cs.ContainerID != b.id || p.Status.PodIP != b.ip {
			t.Errorf("%s: restarts %d, container %s -> %s, IP %s -> %s", name, cs.RestartCount, b.id, cs.ContainerID, b.ip, p.Status.PodIP)
		}
		if body := dialEcho(t, p.Status.PodIP+":8080"); !strings.HasPrefix(body, "pod="+name+" ") {
			t.Errorf("%s answers %q", name, body)
		}
	}
	if got := n.ipsAllocated(); got != pods {
		t.Errorf("%d addresses allocated, want %d", got, pods)
	}
	if got := len(n.netnsLeft()); got != pods {
		t.Errorf("%d pod network namespaces, want %d", got, pods)
	}
	if err := n.client.CoreV1().Pods("default").DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		for name := range before {
			n.delete(name)
		}
	}
	for name := range before {
		n.waitGone(name, 60*time.Second)
	}
	waitFor(t, 20*time.Second, "no leaked address or netns", func() (bool, string) {
		return n.ipsAllocated() == 0 && len(n.netnsLeft()) == 0, fmt.Sprintf("ips=%d netns=%v", n.ipsAllocated(), n.netnsLeft())
	})
	list, _ := n.ctrd.Client.Containers(namespacesCtx(n))
	if len(list) != 0 {
		t.Errorf("%d containers left in containerd", len(list))
	}
	_ = v1.PodRunning
}
