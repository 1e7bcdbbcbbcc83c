package kubelet_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet"
)

// TestHollowNodes runs several --runtime=hollow kubelets against a real API
// server: they register, and their pods go Running and Ready at once with
// addresses from each node's pod CIDR, as kubemark's hollow nodes do.
func TestHollowNodes(t *testing.T) {
	testutil.Privileged(t)
	const nodes, podsPerNode = 5, 20
	rc, _, _ := apiservertest.StartTestServer(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, nodes)
	t.Cleanup(func() {
		cancel()
		for i := 0; i < nodes; i++ {
			<-done
		}
	})
	for i := 0; i < nodes; i++ {
		cfg := kubelet.Config{NodeName: fmt.Sprintf("hollow-%d", i), RestConfig: rc, Runtime: kubelet.RuntimeHollow,
			PodCIDR: fmt.Sprintf("10.77.%d.0/24", i), RootDir: t.TempDir(), Address: "127.0.0.1", Port: 0, NodeIP: "127.0.0.1",
			SyncFrequency: 200 * time.Millisecond}
		go func() { done <- kubelet.Run(ctx, cfg) }()
	}
	for i := 0; i < nodes; i++ {
		for j := 0; j < podsPerNode; j++ {
			p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("h%d-%d", i, j), Namespace: "default"},
				Spec: v1.PodSpec{NodeName: fmt.Sprintf("hollow-%d", i), Containers: []v1.Container{{Name: "c", Image: "registry.example/app:v1",
					ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/", Port: intOrStr(80)}}}}}}}
			if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, 60*time.Second, "hollow pods Running and Ready", func() (bool, string) {
		list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, p := range list.Items {
			if runningReady(&p) {
				cidr := netip.MustParsePrefix(fmt.Sprintf("10.77.%s.0/24", p.Spec.NodeName[len("hollow-"):]))
				if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !cidr.Contains(ip) {
					return false, fmt.Sprintf("%s has IP %q outside %s", p.Name, p.Status.PodIP, cidr)
				}
				ready++
			}
		}
		return ready == nodes*podsPerNode, fmt.Sprintf("%d of %d ready", ready, nodes*podsPerNode)
	})
	nl, _ := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if len(nl.Items) != nodes {
		t.Errorf("%d nodes registered, want %d", len(nl.Items), nodes)
	}
	if err := cs.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "hollow pods deleted", func() (bool, string) {
		list, _ := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items))
	})
}
