package scheduler

import (
	"fmt"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/resource"
)

// Default requests counted for scoring a container that asks for none, as
// Kubernetes does, so that many "free" pods still spread.
const (
	defaultMilliCPURequest = 100
	defaultMemoryRequest   = 200 * 1024 * 1024
)

// resources is a pod's request or a node's allocatable/requested total.
type resources struct {
	MilliCPU         int64
	Memory           int64
	EphemeralStorage int64
	Pods             int64
	Scalar           map[v1.ResourceName]int64
}

func resourcesFromList(rl v1.ResourceList) resources {
	var r resources
	for name, q := range rl {
		switch name {
		case v1.ResourceCPU:
			r.MilliCPU = q.MilliValue()
		case v1.ResourceMemory:
			r.Memory = q.Value()
		case v1.ResourceEphemeralStorage:
			r.EphemeralStorage = q.Value()
		case v1.ResourcePods:
			r.Pods = q.Value()
		default:
			if r.Scalar == nil {
				r.Scalar = map[v1.ResourceName]int64{}
			}
			r.Scalar[name] = q.Value()
		}
	}
	return r
}

func (r *resources) add(o resources, sign int64) {
	r.MilliCPU += sign * o.MilliCPU
	r.Memory += sign * o.Memory
	r.EphemeralStorage += sign * o.EphemeralStorage
	r.Pods += sign * o.Pods
	for k, v := range o.Scalar {
		if r.Scalar == nil {
			r.Scalar = map[v1.ResourceName]int64{}
		}
		r.Scalar[k] += sign * v
	}
}

// hostPort is one host port a pod uses; HostIP "0.0.0.0" means all addresses.
type hostPort struct {
	IP       string
	Protocol v1.Protocol
	Port     int32
}

// podInfo is what the scheduler derives once from a pod.
type podInfo struct {
	pod      *v1.Pod
	requests resources // with Pods = 1
	nonZero  resources // CPU and memory with defaults for empty requests
	ports    []hostPort
	owner    types.UID // controller owner, "" if none
}

func newPodInfo(pod *v1.Pod) *podInfo {
	req := resourcesFromList(resource.PodRequests(pod, resource.PodResourcesOptions{}))
	req.Pods = 1
	var nz resources // per container, as Kubernetes' scoring counts
	for _, c := range pod.Spec.Containers {
		cpu, mem := c.Resources.Requests.Cpu().MilliValue(), c.Resources.Requests.Memory().Value()
		if _, ok := c.Resources.Requests[v1.ResourceCPU]; !ok {
			cpu = defaultMilliCPURequest
		}
		if _, ok := c.Resources.Requests[v1.ResourceMemory]; !ok {
			mem = defaultMemoryRequest
		}
		nz.MilliCPU += cpu
		nz.Memory += mem
	}
	pi := &podInfo{pod: pod, requests: req, nonZero: nz}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort <= 0 {
				continue
			}
			hp := hostPort{IP: p.HostIP, Protocol: p.Protocol, Port: p.HostPort}
			if hp.IP == "" {
				hp.IP = "0.0.0.0"
			}
			if hp.Protocol == "" {
				hp.Protocol = v1.ProtocolTCP
			}
			pi.ports = append(pi.ports, hp)
		}
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller != nil && *ref.Controller {
			pi.owner = ref.UID
		}
	}
	return pi
}

// nodeInfo is a node and what the pods on it (bound or assumed) use.
type nodeInfo struct {
	node        *v1.Node // nil while only pods name the node
	allocatable resources
	requested   resources
	nonZero     resources
	pods        map[string]*podInfo
	ports       map[hostPort]int
	owners      map[types.UID]int
}

func newNodeInfo() *nodeInfo {
	return &nodeInfo{pods: map[string]*podInfo{}, ports: map[hostPort]int{}, owners: map[types.UID]int{}}
}

func (n *nodeInfo) addPod(key string, pi *podInfo) {
	n.pods[key] = pi
	n.requested.add(pi.requests, 1)
	n.nonZero.add(pi.nonZero, 1)
	for _, p := range pi.ports {
		n.ports[p]++
	}
	if pi.owner != "" {
		n.owners[pi.owner]++
	}
}

func (n *nodeInfo) removePod(key string) {
	pi, ok := n.pods[key]
	if !ok {
		return
	}
	delete(n.pods, key)
	n.requested.add(pi.requests, -1)
	n.nonZero.add(pi.nonZero, -1)
	for _, p := range pi.ports {
		if n.ports[p]--; n.ports[p] <= 0 {
			delete(n.ports, p)
		}
	}
	if pi.owner != "" {
		if n.owners[pi.owner]--; n.owners[pi.owner] <= 0 {
			delete(n.owners, pi.owner)
		}
	}
}

// portInUse reports whether hp conflicts with a port already used on the node.
func (n *nodeInfo) portInUse(hp hostPort) bool {
	if len(n.ports) == 0 {
		return false
	}
	if hp.IP == "0.0.0.0" {
		for used := range n.ports {
			if used.Port == hp.Port && used.Protocol == hp.Protocol {
				return true
			}
		}
		return false
	}
	return n.ports[hp] > 0 || n.ports[hostPort{IP: "0.0.0.0", Protocol: hp.Protocol, Port: hp.Port}] > 0
}

type podState struct {
	node    string
	assumed bool // decided by us, not yet seen bound by the watch
}

// cache is the scheduler's view of nodes and the pods placed on them. A pod
// is assumed on a node as soon as it is decided, so the next decision sees
// its resources before the watch reports the binding; a failed binding
// forgets the assumption.
type cache struct {
	mu        sync.RWMutex
	nodes     map[string]*nodeInfo
	nodeNames []string    // sorted names of nodes that exist
	infos     []*nodeInfo // nodes[nodeNames[i]], kept aligned
	pods      map[string]*podState
}

func newCache() *cache {
	return &cache{nodes: map[string]*nodeInfo{}, pods: map[string]*podState{}}
}

func podKey(p *v1.Pod) string { return p.Namespace + "/" + p.Name }

func (c *cache) nodeLocked(name string) *nodeInfo {
	n, ok := c.nodes[name]
	if !ok {
		n = newNodeInfo()
		c.nodes[name] = n
	}
	return n
}

// AddNode adds or updates a node.
func (c *cache) AddNode(node *v1.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodeLocked(node.Name)
	if n.node == nil {
		i, _ := slices.BinarySearch(c.nodeNames, node.Name)
		c.nodeNames = slices.Insert(c.nodeNames, i, node.Name)
		c.infos = slices.Insert(c.infos, i, n)
	}
	n.node = node
	n.allocatable = resourcesFromList(node.Status.Allocatable)
}

// RemoveNode forgets a node; pods still bound to it keep their accounting
// until they are deleted (they are, by the node lifecycle controller).
func (c *cache) RemoveNode(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nodes[name]
	if !ok || n.node == nil {
		return
	}
	n.node = nil
	if i, found := slices.BinarySearch(c.nodeNames, name); found {
		c.nodeNames = slices.Delete(c.nodeNames, i, i+1)
		c.infos = slices.Delete(c.infos, i, i+1)
	}
	if len(n.pods) == 0 {
		delete(c.nodes, name)
	}
}

// Assume places pod (whose Spec.NodeName is set) on its node before binding.
func (c *cache) Assume(pod *v1.Pod) error {
	key := podKey(pod)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.pods[key]; ok {
		return fmt.Errorf("pod %s is already in the scheduler cache", key)
	}
	c.nodeLocked(pod.Spec.NodeName).addPod(key, newPodInfo(pod))
	c.pods[key] = &podState{node: pod.Spec.NodeName, assumed: true}
	return nil
}

// Forget removes an assumed pod whose binding failed.
func (c *cache) Forget(pod *v1.Pod) {
	key := podKey(pod)
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.pods[key]; ok && st.assumed {
		c.removeLocked(key, st)
	}
}

// IsAssumed reports whether the pod is assumed and not yet confirmed.
func (c *cache) IsAssumed(key string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	st, ok := c.pods[key]
	return ok && st.assumed
}

// AddPod records a pod seen bound by the watch, confirming an assumption.
func (c *cache) AddPod(pod *v1.Pod) {
	key := podKey(pod)
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.pods[key]; ok {
		c.removeLocked(key, st)
	}
	c.nodeLocked(pod.Spec.NodeName).addPod(key, newPodInfo(pod))
	c.pods[key] = &podState{node: pod.Spec.NodeName}
}

// RemovePod removes a bound pod that was deleted or finished.
func (c *cache) RemovePod(pod *v1.Pod) {
	key := podKey(pod)
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.pods[key]; ok {
		c.removeLocked(key, st)
	}
}

func (c *cache) removeLocked(key string, st *podState) {
	delete(c.pods, key)
	n, ok := c.nodes[st.node]
	if !ok {
		return
	}
	n.removePod(key)
	if n.node == nil && len(n.pods) == 0 {
		delete(c.nodes, st.node)
	}
}

// NodeCount returns how many nodes exist.
func (c *cache) NodeCount() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.nodeNames)
}
