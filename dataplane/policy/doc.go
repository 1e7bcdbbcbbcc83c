// Package policy enforces networking.k8s.io/v1 NetworkPolicy on this node's
// pods: a compiler (Compiler) turns NetworkPolicies, Pods and Namespaces into
// numeric label-set identities and per-endpoint policy entries, incrementally
// (a change recompiles only the endpoints it can affect), and a Datapath
// programs them — the eBPF one (tcx programs on each pod's host-side veth,
// bpf/policy.c) on Linux, or the iptables fallback (filter FORWARD chains
// per endpoint, peers in ipsets) where the eBPF one cannot run. The Agent wires informers to both and runs in the
// node agent (`waggle proxy`).
//
// It is not the service load balancer (dataplane/ebpf) and does not touch
// Services: east-west Service traffic reaches the pod veths already
// translated to pod addresses, so policy sees pod-to-pod flows.
package policy
