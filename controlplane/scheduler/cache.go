package scheduler

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	fwk "k8s.io/kube-scheduler/framework"
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

func (r resources) clone() resources {
	r.Scalar = maps.Clone(r.Scalar)
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
	priority int32
	// aff holds the pod's inter-pod affinity and anti-affinity terms,
	// parsed once (nil: it has none).
	aff *podAffinity
}

// podAffinity is a pod's inter-pod (anti-)affinity terms as upstream's
// framework parses them (namespaces resolved, selectors built).
type podAffinity struct {
	reqAff, reqAnti   []fwk.AffinityTerm
	prefAff, prefAnti []fwk.WeightedAffinityTerm
}

// scoresOthers reports whether the pod's terms count in other pods'
// InterPodAffinity scores (required affinity with the hard weight,
// preferred terms with theirs).
func (a *podAffinity) scoresOthers() bool {
	return a != nil && (len(a.reqAff) > 0 || len(a.prefAff) > 0 || len(a.prefAnti) > 0)
}

func newPodAffinity(pod *v1.Pod) *podAffinity {
	a := pod.Spec.Affinity
	if a == nil || (a.PodAffinity == nil && a.PodAntiAffinity == nil) {
		return nil
	}
	// A term whose selector does not parse is dropped (the API server
	// rejects such pods; upstream fails the pod's PreFilter).
	pa := &podAffinity{}
	pa.reqAff, _ = fwk.GetAffinityTerms(pod, fwk.GetPodAffinityTerms(a))
	pa.reqAnti, _ = fwk.GetAffinityTerms(pod, fwk.GetPodAntiAffinityTerms(a))
	if a.PodAffinity != nil {
		pa.prefAff, _ = fwk.GetWeightedAffinityTerms(pod, a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
	}
	if a.PodAntiAffinity != nil {
		pa.prefAnti, _ = fwk.GetWeightedAffinityTerms(pod, a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
	}
	if len(pa.reqAff)+len(pa.reqAnti)+len(pa.prefAff)+len(pa.prefAnti) == 0 {
		return nil
	}
	return pa
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
	pi := &podInfo{pod: pod, requests: req, nonZero: nz, priority: corev1helpers.PodPriority(pod), aff: newPodAffinity(pod)}
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
	// antiPods counts the pods with required anti-affinity terms,
	// affScorePods those whose terms score other pods (podAffinity.scoresOthers).
	antiPods, affScorePods int
	// nominated are pending pods nominated to this node by preemption: the
	// room freed for them is kept for them against pods of lower priority.
	nominated map[string]*podInfo
}

func newNodeInfo() *nodeInfo {
	return &nodeInfo{pods: map[string]*podInfo{}, ports: map[hostPort]int{}, owners: map[types.UID]int{}}
}

// clone copies what filters read and addPod/removePod change, for a
// what-if evaluation (preemption, nominated pods).
func (n *nodeInfo) clone() *nodeInfo {
	return &nodeInfo{
		node: n.node, allocatable: n.allocatable,
		requested: n.requested.clone(), nonZero: n.nonZero.clone(),
		pods: maps.Clone(n.pods), ports: maps.Clone(n.ports), owners: maps.Clone(n.owners),
		antiPods: n.antiPods, affScorePods: n.affScorePods, nominated: n.nominated,
	}
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
	if pi.aff != nil && len(pi.aff.reqAnti) > 0 {
		n.antiPods++
	}
	if pi.aff.scoresOthers() {
		n.affScorePods++
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
	if pi.aff != nil && len(pi.aff.reqAnti) > 0 {
		n.antiPods--
	}
	if pi.aff.scoresOthers() {
		n.affScorePods--
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
	// nominatedOn is the node each nominated pending pod is nominated to.
	nominatedOn map[string]string
}

func newCache() *cache {
	return &cache{nodes: map[string]*nodeInfo{}, pods: map[string]*podState{}, nominatedOn: map[string]string{}}
}

// Nominate records that pending pod may take node once preemption's
// victims are gone (node "" clears the nomination).
func (c *cache) Nominate(pod *v1.Pod, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nominateLocked(podKey(pod), pod, node)
}

func (c *cache) nominateLocked(key string, pod *v1.Pod, node string) {
	if old, ok := c.nominatedOn[key]; ok {
		if n := c.nodes[old]; n != nil {
			delete(n.nominated, key)
			if len(n.nominated) == 0 {
				n.nominated = nil
			}
		}
		delete(c.nominatedOn, key)
	}
	if node == "" || pod == nil {
		return
	}
	n := c.nodeLocked(node)
	// A new map, not a change in place: clones share it.
	nm := make(map[string]*podInfo, len(n.nominated)+1)
	maps.Copy(nm, n.nominated)
	nm[key] = newPodInfo(pod)
	n.nominated = nm
	c.nominatedOn[key] = node
}

// NominatedNode returns the node pod is nominated to, "" if none.
func (c *cache) NominatedNode(pod *v1.Pod) string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.nominatedOn[podKey(pod)]
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
	if len(n.pods) == 0 && len(n.nominated) == 0 {
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
	c.nominateLocked(key, nil, "")
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
	c.nominateLocked(key, nil, "")
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
	if n.node == nil && len(n.pods) == 0 && len(n.nominated) == 0 {
		delete(c.nodes, st.node)
	}
}

// NodeCount returns how many nodes exist.
func (c *cache) NodeCount() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.nodeNames)
}
