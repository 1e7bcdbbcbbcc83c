package scheduler

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestAssumedPodCountsUntilForgottenOrConfirmed(t *testing.T) {
	c := cacheWith([]*v1.Node{newNode("n")}, nil)
	p := newPod("p", requests("1", "1Gi"), hostPortOpt(80, ""), ownedBy("rs"))
	assumed := p.DeepCopy()
	assumed.Spec.NodeName = "n"
	if err := c.Assume(assumed); err != nil {
		t.Fatal(err)
	}
	if err := c.Assume(assumed); err == nil {
		t.Fatal("assuming a pod twice succeeded")
	}
	n := c.nodes["n"]
	if n.requested.MilliCPU != 1000 || n.requested.Pods != 1 || n.ports[hostPort{"0.0.0.0", v1.ProtocolTCP, 80}] != 1 || n.owners["rs"] != 1 {
		t.Fatalf("assumed pod not counted: %+v", n.requested)
	}
	if !c.IsAssumed("default/p") {
		t.Fatal("not assumed")
	}
	c.Forget(assumed)
	if n.requested.MilliCPU != 0 || n.requested.Pods != 0 || len(n.ports) != 0 || len(n.owners) != 0 {
		t.Fatalf("forgotten pod still counted: %+v", n.requested)
	}
	// Assume, then the watch confirms: counted once, no longer assumed.
	if err := c.Assume(assumed); err != nil {
		t.Fatal(err)
	}
	c.AddPod(assumed)
	if n.requested.Pods != 1 || c.IsAssumed("default/p") {
		t.Fatalf("confirmed pod: pods %d assumed %v", n.requested.Pods, c.IsAssumed("default/p"))
	}
	c.Forget(assumed) // a confirmed pod is not forgotten
	if n.requested.Pods != 1 {
		t.Fatal("Forget removed a confirmed pod")
	}
	c.RemovePod(assumed)
	if n.requested.Pods != 0 || n.requested.Memory != 0 {
		t.Fatalf("removed pod still counted: %+v", n.requested)
	}
}

func TestPodsOnAMissingNodeAreKeptUntilTheNodeComes(t *testing.T) {
	c := newCache()
	c.AddPod(newPod("p", onNode("late"), requests("1", "1Gi")))
	if c.NodeCount() != 0 {
		t.Fatal("a pod created a schedulable node")
	}
	c.AddNode(newNode("late"))
	if c.NodeCount() != 1 || c.nodes["late"].requested.MilliCPU != 1000 {
		t.Fatal("node did not pick up the pod bound to it before it appeared")
	}
	c.RemoveNode("late")
	if c.NodeCount() != 0 || c.nodes["late"] == nil {
		t.Fatal("removed node should be unschedulable but keep its pods' accounting")
	}
	c.RemovePod(newPod("p", onNode("late")))
	if _, ok := c.nodes["late"]; ok {
		t.Fatal("empty removed node was not dropped")
	}
}

func TestPodRequestsCountInitContainersAndDefaultsForScoring(t *testing.T) {
	p := newPod("p", requests("100m", "100Mi"))
	p.Spec.InitContainers = []v1.Container{{Name: "init", Resources: newPod("x", requests("2", "1Mi")).Spec.Containers[0].Resources}}
	pi := newPodInfo(p)
	if pi.requests.MilliCPU != 2000 || pi.requests.Memory != 100*1024*1024 {
		t.Fatalf("requests = %+v, want max(init, sum) per resource", pi.requests)
	}
	empty := newPodInfo(newPod("e"))
	if empty.requests.MilliCPU != 0 || empty.nonZero.MilliCPU != defaultMilliCPURequest || empty.nonZero.Memory != defaultMemoryRequest {
		t.Fatalf("empty pod: requests %+v nonZero %+v", empty.requests, empty.nonZero)
	}
}
