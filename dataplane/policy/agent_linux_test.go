package policy

import (
	"context"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// agentEnv runs the Agent on a fake API (client-go's fake clientset) over
// the real node: veths found by their CNI alias, the eBPF datapath.
type agentEnv struct {
	*env
	client *fake.Clientset
	mu     sync.Mutex
	cond   *sync.Cond
	syncs  uint64
}

func newAgentEnv(t *testing.T) *agentEnv {
	e := newEnv(t)
	e.c = nil // the agent compiles
	ae := &agentEnv{env: e, client: fake.NewClientset()}
	ae.cond = sync.NewCond(&ae.mu)
	a, err := NewAgent(AgentConfig{NodeName: "node-a", Datapath: e.dp, Links: NetlinkLinks{NetNS: "/run/netns/" + e.node.Name}, Client: ae.client})
	if err != nil {
		t.Fatal(err)
	}
	a.OnSync = func(n uint64, ch Changes, err error) {
		if err != nil {
			t.Errorf("agent sync: %v", err)
		}
		ae.mu.Lock()
		ae.syncs = n
		ae.cond.Broadcast()
		ae.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	for _, n := range []string{"x", "y"} {
		ae.client.CoreV1().Namespaces().Create(context.Background(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"ns": n}}}, metav1.CreateOptions{})
	}
	return ae
}

// waitFor waits until the agent synced and cond holds (checked after every
// sync).
func (ae *agentEnv) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	timer := time.AfterFunc(30*time.Second, func() { ae.mu.Lock(); ae.cond.Broadcast(); ae.mu.Unlock() })
	defer timer.Stop()
	ae.mu.Lock()
	defer ae.mu.Unlock()
	for {
		ae.mu.Unlock()
		ok := cond()
		ae.mu.Lock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		ae.cond.Wait()
	}
}

// addAPIPod makes the pod's netns and veth (alias as waggle-cni sets it),
// then creates the Pod object.
func (ae *agentEnv) addAPIPod(t *testing.T, ns, name string, lbls map[string]string) *tpod {
	p := ae.addPod(ns, name, lbls) // the netns, veth (with waggle-cni's alias) and servers
	if _, err := ae.client.CoreV1().Pods(ns).Create(context.Background(), p.obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ae.waitFor(t, "endpoint "+ns+"/"+name, func() bool {
		var v polBPFPolEndpoint
		return ae.bpf.objs.WagglePolEndpoints.Lookup(p.ifindex, &v) == nil
	})
	return p
}

// TestAgentEnforcesFromTheAPI: policies, pods and namespaces from the API
// are enforced on the node's veths, and a policy's deletion lifts it.
func TestAgentEnforcesFromTheAPI(t *testing.T) {
	ae := newAgentEnv(t)
	server := ae.addAPIPod(t, "x", "server", map[string]string{"app": "server"})
	client := ae.addAPIPod(t, "y", "client", map[string]string{"app": "client"})
	if !ae.reach(client, server, "tcp", 80) {
		t.Fatal("no policy, yet client cannot reach server")
	}
	pol := np("x", "deny", sel(), ingress)
	if _, err := ae.client.NetworkingV1().NetworkPolicies("x").Create(context.Background(), pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ae.waitFor(t, "server isolated", func() bool {
		var v polBPFPolEndpoint
		return ae.bpf.objs.WagglePolEndpoints.Lookup(server.ifindex, &v) == nil && v.Flags&1 != 0
	})
	if ae.reach(client, server, "tcp", 80) {
		t.Error("deny-all ingress from the API not enforced")
	}
	allow := np("x", "allow-y", sel("app", "server"), ingress)
	allow.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("ns", "y")}}}}
	if _, err := ae.client.NetworkingV1().NetworkPolicies("x").Create(context.Background(), allow, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var policyID uint32
	ae.waitFor(t, "allow-y programmed", func() bool {
		var k polBPFPolKey
		var v polBPFPolEntry
		it := ae.bpf.objs.WagglePolPolicy.Iterate()
		for it.Next(&k, &v) {
			if k.Ep == server.ifindex && v.Policy != 0 {
				policyID = v.Policy
				return true
			}
		}
		return false
	})
	if !ae.reach(client, server, "tcp", 80) {
		t.Error("allow from namespace y not enforced")
	}
	_ = policyID
	for _, n := range []string{"deny", "allow-y"} {
		ae.client.NetworkingV1().NetworkPolicies("x").Delete(context.Background(), n, metav1.DeleteOptions{})
	}
	ae.waitFor(t, "server no longer isolated", func() bool {
		var v polBPFPolEndpoint
		return ae.bpf.objs.WagglePolEndpoints.Lookup(server.ifindex, &v) == nil && v.Flags == 0
	})
	// The pod goes: its endpoint goes.
	ae.client.CoreV1().Pods("x").Delete(context.Background(), "server", metav1.DeleteOptions{})
	ae.waitFor(t, "server endpoint removed", func() bool {
		var v polBPFPolEndpoint
		return ae.bpf.objs.WagglePolEndpoints.Lookup(server.ifindex, &v) != nil
	})
}
