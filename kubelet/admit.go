package kubelet

import (
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeports"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
)

// admitLocked is the kubelet's admission of a pod newly bound to this node,
// in upstream's order of admit handlers:
//
//   - the eviction manager's (eviction.Manager.Admit): under memory pressure
//     a BestEffort pod (unless it tolerates the memory-pressure taint), under
//     disk or PID pressure every pod, is rejected with reason Evicted and
//     "The node had condition: [<conditions>]. "; critical pods pass;
//   - the host-port part of upstream's lifecycle.PredicateAdmitHandler
//     (GeneralPredicates): a pod asking for a host port, protocol and address
//     that an active pod of this node already holds is rejected (NodePorts),
//     as a pod placed with spec.nodeName, which no scheduler checked, can be.
//
// It returns the rejection (reason and message, upstream's; the status
// message is "Pod was rejected: " and it) or nil.
//
// Left out, as yet: upstream's resource fit, node name, node affinity and
// NoExecute-taint checks; the scheduler makes them for every pod it binds.
//
// Pods already running (a restarted kubelet adopting them) or finished
// are admitted; k.mu is held.
func (k *Kubelet) admitLocked(p *v1.Pod) *waitReason {
	if p.DeletionTimestamp != nil || (p.Status.Phase != "" && p.Status.Phase != v1.PodPending) || len(k.snapshot[p.UID]) > 0 {
		return nil
	}
	if k.eviction != nil {
		if ok, reason, message := k.eviction.Admit(p); !ok {
			return &waitReason{reason: reason, message: message}
		}
	}
	want := schedutil.GetHostPorts(p)
	if len(want) == 0 {
		return nil
	}
	used := fwk.HostPortInfo{}
	for _, w := range k.workers {
		if w.rejected != nil {
			continue
		}
		w.mu.Lock()
		op, gone := w.pod, w.gone
		w.mu.Unlock()
		if gone || isTerminalPhase(op.Status.Phase) {
			continue
		}
		for _, cp := range schedutil.GetHostPorts(op) {
			used.Add(cp.HostIP, string(cp.Protocol), cp.HostPort)
		}
	}
	for _, cp := range want {
		if used.CheckConflict(cp.HostIP, string(cp.Protocol), cp.HostPort) {
			return &waitReason{reason: nodeports.Name, message: nodeports.ErrReason}
		}
	}
	return nil
}
