package lab

import "time"

// HA failure scenarios of `waggle lab ha-test`, on a lab with --servers 3
// or more, under a steady write load (one client-go writer creating
// ConfigMaps one after another, each with a short timeout, through the
// failover dialer, recording every acknowledged write).
const (
	ScenarioKillEtcdLeader = "kill-etcd-leader" // kill -9 the server whose etcd member leads
	ScenarioPartition      = "partition"        // take one non-leader server's lab link down, then heal it
	// ScenarioKillAPIServer kills -9 the server most node agents (kubelets,
	// proxies) are connected to: they must fail over without a restart,
	// every node keep renewing its Lease (none NotReady), and a Service
	// created after the kill be programmed by every node's proxy.
	ScenarioKillAPIServer = "kill-apiserver"
	// ScenarioKillLeader kills -9 the server whose controller-manager holds
	// its Lease and, at the same moment, scales a ReplicaSet: the time to
	// the new leader's first action is the time to the new pods.
	ScenarioKillLeader = "kill-leader"
	// ScenarioDualStack, on a dual-stack lab (--dual-stack), kills -9 the
	// server most node agents are connected to while a RequireDualStack
	// NodePort Service (IPv6 first, a backend on every node) serves: its
	// IPv6 ClusterIP from a pod and its NodePort on every node's IPv6
	// address from the client must keep answering, from every backend,
	// and a backend replaced after the kill must answer on both.
	ScenarioDualStack = "dual-stack"
)

// Scenarios lists the scenarios, for usage messages.
var Scenarios = []string{ScenarioKillEtcdLeader, ScenarioPartition, ScenarioKillAPIServer, ScenarioKillLeader, ScenarioDualStack}

// HAResult is what a scenario measured.
type HAResult struct {
	Scenario string
	Victim   string
	// Acked and Failed count the writer's writes; Lost the acknowledged
	// writes a surviving server does not hold afterwards (must be 0).
	Acked, Failed, Lost int
	// Resume is the pause the fault caused: the longest time between two
	// acknowledged writes that ends after the fault; MaxGap the longest
	// time between two acknowledged writes in the whole run.
	Resume, MaxGap time.Duration
	// Converge is from the last write to every survivor's informer holding
	// exactly what the store holds.
	Converge time.Duration
	// MinorityRefused: the partitioned server refused a write while cut
	// off; CaughtUp: once healed, it lists every acknowledged write, after
	// CatchUp.
	MinorityRefused, CaughtUp bool
	CatchUp                   time.Duration

	// Every scenario: NotReady counts the nodes seen with a Ready
	// condition other than True during the run; Restarted names the lab's
	// kubelets and proxies that are no longer the processes they were
	// before the fault. LeaseRenewed is from the fault to the last node's
	// first Lease renewal after it; LeaseGap the longest time between two
	// renewals of one node's Lease in the run.
	NotReady     int
	Restarted    []string
	LeaseRenewed time.Duration
	LeaseGap     time.Duration
	// AgentsOnVictim counts the node agents' connections to the victim's
	// API server before the fault (kill-apiserver), AgentsAfter the
	// servers they were connected to at the end.
	AgentsOnVictim int
	AgentsAfter    map[string]int
	// ProxyProgrammed (kill-apiserver) is from the fault to every node's
	// proxy having programmed a Service created just after it.
	ProxyProgrammed time.Duration

	// kill-leader: VictimLeads names the Leases the victim held;
	// Takeover is from the fault to another server holding the
	// controller-manager's Lease, FirstAction to the pods of the ReplicaSet
	// scaled at the fault existing, Scheduled to all of them being bound
	// (SchedulerTakeover when the victim also led the scheduler).
	VictimLeads       []string
	Takeover          time.Duration
	SchedulerTakeover time.Duration
	FirstAction       time.Duration
	Scheduled         time.Duration

	// dual-stack: DualStackKept is from the fault to the Service having
	// answered on its IPv6 ClusterIP and every node's IPv6 NodePort from
	// every backend; DualStackReplaced to DualStackNewBackend, the pod
	// replacing one deleted after that, having answered on both too.
	DualStackKept       time.Duration
	DualStackReplaced   time.Duration
	DualStackNewBackend string
}
